# Copyright: dlock.fleet contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Counts the test suite's ansible-playbook runs for its budget table.

scripts/test.sh enables this callback in the lab stages only (the
ANSIBLE_CALLBACK_PLUGINS and ANSIBLE_CALLBACKS_ENABLED it exports there) and
names the file in DLOCK_SUITE_COUNT; every playbook run then appends one JSON
line: the playbook's file name, check mode or not, failed or not, and the
stage that ran it. scripts/budget.py reads the lines back. Not part of the
collection (tests/ is left out of the tarball).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = """
    name: dlock_suite_count
    type: aggregate
    short_description: one JSON line per playbook run, for the test suite's budget table
    description:
      - Appends the playbook's file name, check mode, the outcome and the suite's stage to the file DLOCK_SUITE_COUNT names.
      - Does nothing when DLOCK_SUITE_COUNT is not set.
    requirements:
      - enabled in callbacks_enabled
"""

import os
import sys

from ansible import context
from ansible.plugins.callback import CallbackBase

# The one writer of the suite's count lines (scripts/budget.py), found by path.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "scripts"))
import budget  # noqa: E402  pylint: disable=wrong-import-position


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "dlock_suite_count"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super(CallbackModule, self).__init__()
        self._playbook = None

    def v2_playbook_on_start(self, playbook):
        self._playbook = os.path.basename(playbook._file_name)

    def v2_playbook_on_stats(self, stats):
        if self._playbook is None:  # an ad-hoc run
            return
        budget.append({  # nothing when counting is off (no DLOCK_SUITE_COUNT)
            "event": "playbook",
            "playbook": self._playbook,
            "check": bool(context.CLIARGS.get("check")),
            "failed": any(stats.failures.values()) or any(stats.dark.values()),
            "hosts": len(stats.processed),
        })
