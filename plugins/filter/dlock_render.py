# Copyright: dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters the templates put around every user-supplied value: the second
wall after the preflight checks. Each refuses what could start a new line
in its format, and escapes what the format would otherwise interpret
(dlock_unit_value and dlock_conf_token: the rules of
module_utils/dlock_rendering.py, which the job units' renderer calls too).
dlock_pg_address and dlock_conf_line apply a role variable's rule
(plugins/plugin_utils/role_rules/) again where the value is rendered."""

from __future__ import annotations

import math

from ansible.errors import AnsibleFilterError

from ansible_collections.dlock.fleet.plugins.module_utils import dlock_rendering as rendering
from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules.chrony import conf_line
from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules.postgresql import pg_client


def _text(value, what):
    try:
        return rendering.single_value(value, what)
    except ConfigError as exc:
        raise AnsibleFilterError(str(exc))


def dlock_unit_value(value, what="unit setting", specifiers=False):
    """A value for a systemd unit line (module_utils/dlock_rendering.py:
    one line, no trailing backslash, % doubled unless specifiers=true)."""
    try:
        return rendering.unit_value(value, what, specifiers)
    except ConfigError as exc:
        raise AnsibleFilterError(str(exc))


def dlock_conf_token(value, what="setting"):
    """One token of a line-oriented configuration file."""
    try:
        return rendering.conf_token(value, what)
    except ConfigError as exc:
        raise AnsibleFilterError(str(exc))


def dlock_pg_string(value, what="setting"):
    """A quoted string value of postgresql.conf: one line, ' and \\ escaped."""
    text = _text(value, what)
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


def dlock_seconds(value, what="duration"):
    """A duration as the engine reads it (500ms, 90, 90s, 5m, 1h, 1d), in
    whole seconds rounded up (what timeout(1) and a task's retries count in):
    one parser for the roles and the runner alike."""
    try:
        return int(math.ceil(validate.duration(value, what)))
    except ConfigError as exc:
        raise AnsibleFilterError(str(exc))


def dlock_pg_address(value, what="address"):
    """pg_hba's address column: the canonical CIDR of an address or network
    (a bare address becomes /32 or /128), or a host name; never a keyword.
    The dlock_postgresql role's rule for dlock_postgresql_clients."""
    try:
        return pg_client(value, what)
    except ConfigError as exc:
        raise AnsibleFilterError(str(exc))


def dlock_conf_line(value, what="line"):
    """One whole line of a line-oriented configuration file: a string
    without any control character (so without a line break)."""
    if not isinstance(value, str):
        raise AnsibleFilterError("%s: %s must be a string" % (what, validate.shown(value)))
    try:
        return conf_line(value, what)
    except ConfigError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule(object):
    def filters(self):
        return {
            "dlock_unit_value": dlock_unit_value,
            "dlock_conf_token": dlock_conf_token,
            "dlock_pg_string": dlock_pg_string,
            "dlock_seconds": dlock_seconds,
            "dlock_pg_address": dlock_pg_address,
            "dlock_conf_line": dlock_conf_line,
        }
