# Copyright: dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter `dlock.fleet.dlock_jobs`: validates the dlock_jobs role's job list
on the controller, once for the whole list, before anything is written on any
node. The rules live in module_utils/dlock_jobs.py, which the node module
dlock_job_units runs again."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_jobs import validate_jobs


def dlock_jobs(jobs, defaults=None, randomized_delay=0, backend_url="", accuracy="1s"):
    """Validated jobs: only checked values, each present job with `file` (the
    job file's content). `randomized_delay` and `accuracy` are the role's
    defaults for the timers;
    `backend_url` the runners' backend, whose scheme decides the timing rule
    ('' when not known: the stricter rule of a backend on a wall clock)."""
    try:
        return validate_jobs(jobs, defaults, randomized_delay, backend_url, accuracy)
    except ConfigError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule(object):
    def filters(self):
        return {"dlock_jobs": dlock_jobs}
