# Copyright: dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rules for a value put into a rendered file: the filters of
plugins/filter/dlock_render.py (in the roles' templates) and the job units
that module_utils/dlock_job_files.py renders both call these, so each
escaping rule has one home. Each refuses what could start a new line in its
format, and escapes what the format would otherwise interpret; ConfigError
names the field. Beside the engine, not in module_utils/dlock/, whose
every file the runner role installs on the nodes."""

from __future__ import annotations

import re

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError

# One token of a line-oriented format (redis.conf, chrony.conf, pg_hba.conf,
# a unit's directive name): no white space, no quote, no comment sign, no backslash.
TOKEN = re.compile(r"[A-Za-z0-9_.,:/@+=~*\[\]-]+")
MAX_VALUE = 4096


def single_value(value, what):
    """A string, number or integer as its text: one line, at most MAX_VALUE characters."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError("%s: %s is not a single value" % (what, validate.shown(value)))
    return validate.text(str(value), what, MAX_VALUE, allow_empty=True)


def unit_value(value, what="unit setting", specifiers=False):
    """A value for a systemd unit line: one line, no trailing backslash (a
    line continuation), and % doubled so no specifier is expanded. With
    specifiers=True (unit_settings: directives the operator writes, some of
    which, like CPUQuota=50%, take no specifiers at all) % is left as is."""
    text = validate.unit_value(single_value(value, what), what, MAX_VALUE)
    return text if specifiers else text.replace("%", "%%")


def conf_token(value, what="setting"):
    """One token of a line-oriented configuration file."""
    text = single_value(value, what)
    if not TOKEN.fullmatch(text):
        raise ConfigError("%s: %s is not a single plain token (no spaces, quotes, # or backslash)"
                          % (what, validate.shown(text)))
    return text
