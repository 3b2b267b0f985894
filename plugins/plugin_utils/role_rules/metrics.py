# Copyright: dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The dlock_metrics role's variables: their table and the rules between them."""

from __future__ import annotations

import re

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules.kinds import (
    account, boolean, duration, empty_or, items, kind, path)

# node_exporter flags: --name or --name=value, the value one plain token (no
# white space, quotes, backslash, $ or `): they go into a double-quoted
# variable of a file that systemd reads (EnvironmentFile) and shells source.
EXPORTER_FLAG = re.compile(r"--[a-z0-9][a-z0-9._-]*(=[A-Za-z0-9_.,:/@+=~*\[\]-]*)?")
# The flags the role sets itself: node_exporter refuses a repeated flag.
EXPORTER_OWN_FLAGS = ("--web.listen-address", "--collector.textfile.directory")


def _listen_address(value, field):
    """HOST:PORT, [IPV6]:PORT or :PORT (every address)."""
    validate.text(value, field, 260)
    if value.startswith("["):
        host, bracket, rest = value[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise ConfigError("%s: %s: use [IPV6]:PORT" % (field, validate.shown(value)))
        try:
            validate.address(host, field)
        except ConfigError:
            raise ConfigError("%s: %s: %s is not an IPv6 address" % (field, validate.shown(value), validate.shown(host)))
        port_text = rest[1:]
    else:
        host, colon, port_text = value.rpartition(":")
        if not colon:
            raise ConfigError("%s: %s: use HOST:PORT or :PORT" % (field, validate.shown(value)))
        if host:
            if ":" in host:
                raise ConfigError("%s: %s: write an IPv6 address in brackets, [ADDRESS]:PORT"
                                  % (field, validate.shown(value)))
            validate.hostname(host, field)
    if not re.fullmatch(r"[0-9]{1,5}", port_text):
        raise ConfigError("%s: %s: the port must be a number from 1 to 65535" % (field, validate.shown(value)))
    validate.port(int(port_text), field + ": port")
    return value


def _exporter_flag(value, field):
    validate.text(value, field, 1024, EXPORTER_FLAG,
                  "--flag or --flag=value; the value of letters, digits and _ . , : / @ + = ~ * [ ] -", kind="node_exporter flag")
    if value.split("=", 1)[0] in EXPORTER_OWN_FLAGS:
        raise ConfigError("%s: %s is set by the role (dlock_metrics_listen_address, dlock_metrics_textfile_dir); "
                          "node_exporter refuses a repeated flag" % (field, validate.shown(value)))
    return value


TABLE = {
    "dlock_metrics_textfile_dir": path,
    "dlock_metrics_listen_address": kind(_listen_address, "str"),
    "dlock_metrics_node_exporter_args": items(kind(_exporter_flag, "str")),
    "dlock_metrics_node_exporter_hardening": boolean,
    "dlock_metrics_refresh": boolean,
    "dlock_metrics_refresh_interval": duration(1.0, 86400.0),
    "dlock_metrics_refresh_user": account,
    "dlock_metrics_runner_bin": path,
    "dlock_metrics_group": account,
    "dlock_metrics_jobs_dir": path,
    "dlock_metrics_password_path": path,
    "dlock_metrics_unit_dir": path,
    "dlock_metrics_rules_path": empty_or(path),
}

SECRETS = ()


def rules(values):
    """The rules between variables (run only on values that passed the table)."""
    if values.get("dlock_metrics_refresh_user") == "root":
        yield ("dlock_metrics_refresh_user: must not be root (the role makes it a system user without a shell "
               "or home, and the refresh runs unprivileged)")
