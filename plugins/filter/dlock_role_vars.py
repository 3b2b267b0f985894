# Copyright: dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The roles' variables, checked once: filter `dlock.fleet.dlock_role_problems`.

For each role a table says, for every public variable, which validator of
the engine's validation core (plugins/module_utils/dlock/validate.py) it
must pass, with its bounds; a few rules then relate variables to each other.
Each role's preflight hands the filter all its variables (under no_log: the
passwords are among them) and reports the problems it returns. No rule is
restated in Jinja, and no variable is left out: the filter refuses a set of
variables that is not exactly its table.

Also the render filters that only the role templates need:
`dlock_pg_address` (pg_hba's address column, in canonical CIDR form) and
`dlock_conf_line` (one verbatim line of a line-oriented configuration).
"""

from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError
from jinja2 import Undefined

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.epoch import switch_problems
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.options import LockOptions

# Names the roles create (users, groups) must be names, never numeric ids.
ACCOUNT = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
REDIS_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
# Plain lower-case SQL identifiers: no quoting is ever needed.
SQL_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
PG_CLUSTER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
# Printable ASCII without space: the role computes the SCRAM verifier itself,
# and PostgreSQL would SASLprep-normalise anything else.
PG_PASSWORD = re.compile(r"[!-~]+")
# Non-blank characters without control characters (passwords).
NO_SPACE = re.compile(r"\S+")
# PostgreSQL time units (its 'm' is not minutes: it is refused).
PG_TIME = re.compile(r"([0-9]{1,10})(ms|s|min|h|d)?")
PG_TIME_UNITS = {"ms": 0.001, None: 0.001, "s": 1, "min": 60, "h": 3600, "d": 86400}
REDIS_MEMORY = re.compile(r"(?i)([0-9]{1,16})(b|k|kb|m|mb|g|gb)?")
# chrony's options of server and pool lines (chrony 4): flags, and options
# taking a number. Anything else would stop chronyd from starting.
CHRONY_FLAGS = ("iburst", "burst", "prefer", "noselect", "trust", "require", "xleave", "offline", "auto_offline",
                "nts", "copy")
CHRONY_INTEGER_OPTIONS = {"minpoll": (-6, 24), "maxpoll": (-6, 24), "polltarget": (6, 60), "port": (1, 65535),
                          "presend": (-6, 24), "minsamples": (0, 64), "maxsamples": (0, 64), "filter": (1, 1024),
                          "version": (1, 4), "key": (1, 2 ** 32 - 1), "certset": (0, 2 ** 31 - 1),
                          "ntsport": (1, 65535)}
CHRONY_NUMBER_OPTIONS = ("maxdelay", "maxdelayratio", "maxdelaydevratio", "mindelay", "asymmetry", "offset")
DECIMAL = re.compile(r"-?[0-9]{1,9}(\.[0-9]{1,9})?")
# node_exporter flags: --name or --name=value, the value one plain token (no
# white space, quotes, backslash, $ or `): they go into a double-quoted
# variable of a file that systemd reads (EnvironmentFile) and shells source.
EXPORTER_FLAG = re.compile(r"--[a-z0-9][a-z0-9._-]*(=[A-Za-z0-9_.,:/@+=~*\[\]-]*)?")
# The flags the role sets itself: node_exporter refuses a repeated flag.
EXPORTER_OWN_FLAGS = ("--web.listen-address", "--collector.textfile.directory")
# pg_hba keywords that would widen an entry: in the address column to more
# than one host or network, in the database and user columns to every one.
PG_HBA_KEYWORDS = ("all", "samehost", "samenet")
PG_HBA_NAME_KEYWORDS = ("all", "sameuser", "samerole", "samegroup", "replication")
# An Ansible inventory group name.
GROUP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# etcd user and role names (the URL's user too) and the bootstrap token.
ETCD_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


# -- value kinds built on validate.py -----------------------------------------
def _empty_or(check):
    """'' (the role's 'none') or a value passing `check`."""
    def run(value, field):
        if isinstance(value, str) and value == "":
            return value
        return check(value, field)
    return run


def _items(check, min_items=0, max_items=64):
    def run(value, field):
        return validate.items(value, field, check, max_items=max_items, min_items=min_items)
    return run


def _integer(minimum, maximum):
    return lambda value, field: validate.integer(value, field, minimum, maximum)


def _number(minimum, maximum):
    return lambda value, field: validate.number(value, field, minimum, maximum)


def _duration(minimum=0.0, maximum=validate.MAX_DURATION, positive=False):
    return lambda value, field: validate.duration(value, field, minimum, maximum, positive)


def _choice(*choices):
    return lambda value, field: validate.choice(value, field, choices)


def _pattern(pattern, hint, max_len=validate.MAX_TEXT, kind="value"):
    return lambda value, field: validate.text(value, field, max_len, pattern, hint, kind=kind)


def _account(value, field):
    """A user or group name the role creates: a name, not a numeric id."""
    return validate.text(value, field, 32, ACCOUNT,
                         "letters, digits and _ . -, starting with a letter or _, at most 32 characters",
                         kind="user or group name")


def _password(min_len, pattern, hint):
    def run(value, field):
        validate.text(value, field, 1024, allow_empty=True, secret=True)
        if len(value) < min_len:
            raise ConfigError("%s: must be set, %d+ characters" % (field, min_len))
        if not pattern.fullmatch(value):
            raise ConfigError("%s: may hold only %s" % (field, hint))
        return value
    return run


def _pg_time(maximum):
    """A PostgreSQL time setting: milliseconds as a number, or digits with
    one of PostgreSQL's units (ms, s, min, h, d), from 0 to `maximum` seconds."""
    def run(value, field):
        if isinstance(value, int) and not isinstance(value, bool):
            seconds = validate.integer(value, field, 0, int(maximum * 1000)) / 1000.0
        else:
            validate.text(value, field, 16, PG_TIME, "digits and a PostgreSQL unit: ms, s, min, h or d",
                          kind="time")
            digits, unit = PG_TIME.fullmatch(value).groups()
            seconds = int(digits) * PG_TIME_UNITS[unit]
        if seconds > maximum:
            raise ConfigError("%s: %s is above the maximum of %s"
                              % (field, validate.shown(value), validate.format_duration(maximum)))
        return value
    return run


REDIS_UNITS = {None: 1, "b": 1, "k": 1000, "kb": 1024, "m": 1000 ** 2, "mb": 1024 ** 2, "g": 1000 ** 3,
               "gb": 1024 ** 3}
MAX_MEMORY = 2 ** 50  # 1 PiB: far from any server, and far from Redis' 64-bit arithmetic


def redis_memory_bytes(value):
    """Bytes of an accepted maxmemory value (Redis: 1k = 1000, 1kb = 1024)."""
    if isinstance(value, int):
        return value
    digits, unit = REDIS_MEMORY.fullmatch(value).groups()
    return int(digits) * REDIS_UNITS[unit.lower() if unit else None]


def _redis_memory(value, field):
    if isinstance(value, int) and not isinstance(value, bool):
        return validate.integer(value, field, 0, MAX_MEMORY)
    validate.text(value, field, 24, REDIS_MEMORY, "bytes, or a number with b, k, kb, m, mb, g or gb",
                  kind="memory size")
    if redis_memory_bytes(value) > MAX_MEMORY:
        raise ConfigError("%s: %s is more than 1 PiB" % (field, validate.shown(value)))
    return value


def _pg_listen(value, field):
    """listen_addresses item: *, a host name or an address."""
    if value == "*":
        return value
    return validate.hostname(value, field)


def _pg_client(value, field):
    """pg_hba address column: an address, a network or a host name, never a
    keyword that widens it (all, samehost, samenet)."""
    if isinstance(value, str) and value.lower() in PG_HBA_KEYWORDS:
        raise ConfigError("%s: %s is a pg_hba keyword, not an address: list the fleet's addresses or "
                          "networks" % (field, validate.shown(value)))
    return validate.host_or_network(value, field)


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


def _source_options(value, field):
    """Options of chrony's server and pool lines, e.g. 'iburst minpoll 4':
    known flags, and known options each followed by a number."""
    validate.text(value, field, 200, allow_empty=True)
    words = value.split(" ")
    index = 0
    while index < len(words):
        word = words[index]
        if word in CHRONY_FLAGS:
            index += 1
            continue
        if word in CHRONY_INTEGER_OPTIONS or word in CHRONY_NUMBER_OPTIONS:
            if index + 1 >= len(words):
                raise ConfigError("%s: %s: %s needs a number" % (field, validate.shown(value), word))
            argument = words[index + 1]
            if word in CHRONY_INTEGER_OPTIONS:
                minimum, maximum = CHRONY_INTEGER_OPTIONS[word]
                if not re.fullmatch(r"-?[0-9]{1,10}", argument):
                    raise ConfigError("%s: %s: %s needs a whole number" % (field, validate.shown(value), word))
                validate.integer(int(argument), "%s: %s" % (field, word), minimum, maximum)
            elif not DECIMAL.fullmatch(argument):
                raise ConfigError("%s: %s: %s needs a number" % (field, validate.shown(value), word))
            index += 2
            continue
        raise ConfigError("%s: %s: %s is not an option of chrony's server and pool lines (flags: %s; with a number: "
                          "%s)" % (field, validate.shown(value), validate.shown(word), ", ".join(CHRONY_FLAGS),
                                   ", ".join(sorted(CHRONY_INTEGER_OPTIONS) + list(CHRONY_NUMBER_OPTIONS))))
    return value


def _conf_line(value, field):
    """One verbatim line of a line-oriented configuration file."""
    return validate.text(value, field, 1024)


_ETCD_USER_HINT = "letters, digits and _ . -, not starting with . or -"
_ETCD_PREFIX_HINT = "a path such as /dlock: segments of letters, digits and _ . -, no trailing /"
_etcd_user = _pattern(ETCD_NAME, _ETCD_USER_HINT, 64, "user name")
# The engine's rule for the path of an etcd URL.
_etcd_prefix = _pattern(validate.ETCD_PREFIX, _ETCD_PREFIX_HINT, 200, "key prefix")
_etcd_password = _password(16, NO_SPACE, "characters other than white space")
ETCD_ACCOUNT = {"name": _etcd_user, "password": _etcd_password, "prefix": _etcd_prefix}


def _etcd_account(value, field):
    """One of dlock_etcd_extra_users: exactly name, password and prefix (the
    value is never shown: it holds a password)."""
    if not isinstance(value, dict) or sorted(value) != sorted(ETCD_ACCOUNT):
        raise ConfigError("%s: must be a mapping of exactly %s" % (field, ", ".join(sorted(ETCD_ACCOUNT))))
    for key, check in ETCD_ACCOUNT.items():
        check(value[key], "%s.%s" % (field, key))
    return value


ETCD_ENDPOINT = re.compile(r"(https?)://(\[[0-9A-Fa-f:.]+\]|[^/:\[\]]+):([0-9]{1,5})")


def _etcd_endpoint(value, field):
    """An etcd member's client URL: http(s)://HOST:PORT, nothing more."""
    validate.text(value, field, 300, ETCD_ENDPOINT, "http://ADDRESS:PORT or https://ADDRESS:PORT", kind="etcd URL")
    _scheme, host, port_text = ETCD_ENDPOINT.fullmatch(value).groups()
    if host.startswith("["):
        validate.address(host[1:-1], field)
    else:
        validate.hostname(host, field)
    validate.port(int(port_text), field + ": port")
    return value


def _prefix_within(inner, outer):
    """Whether etcd prefix `inner` is `outer` or under it (segment-wise)."""
    return inner == outer or inner.startswith(outer + "/")


def _backend_url(value, field):
    validate.backend_url(value, field)
    return value


def _lock_defaults(value, field):
    """Each option on its own; together, under the rule of the backend, in _runner_rules."""
    validate.mapping(value, field)
    LockOptions.parse_values(value, field)
    return value


_path = validate.path
_boolean = validate.boolean
_port = validate.port
_hostname = validate.hostname


# -- the tables ---------------------------------------------------------------
TABLES = {
    "dlock_redis": {
        "dlock_redis_bind": _items(validate.address, min_items=1, max_items=16),
        "dlock_redis_port": _port,
        "dlock_redis_user": _pattern(REDIS_USER, "letters, digits and _ . -, not starting with . or -",
                                     64, "user name"),
        "dlock_redis_password": _password(16, NO_SPACE, "characters other than white space"),
        "dlock_redis_admin_user": _empty_or(_pattern(REDIS_USER, "letters, digits and _ . -, not starting with . "
                                                                 "or -", 64, "user name")),
        "dlock_redis_admin_password": _empty_or(_password(16, NO_SPACE, "characters other than white space")),
        "dlock_redis_appendfsync": _choice("always", "everysec", "no"),
        "dlock_redis_maxmemory": _empty_or(_redis_memory),
        "dlock_redis_tls": _boolean,
        "dlock_redis_tls_cert_file": _empty_or(_path),
        "dlock_redis_tls_key_file": _empty_or(_path),
        "dlock_redis_tls_ca_file": _empty_or(_path),
        "dlock_redis_tls_auth_clients": _boolean,
        "dlock_redis_url_host": _hostname,
    },
    "dlock_postgresql": {
        "dlock_postgresql_version": _integer(10, 99),
        "dlock_postgresql_cluster": _pattern(PG_CLUSTER, "letters, digits, _ and -, starting with a letter or digit",
                                             63, "cluster name"),
        "dlock_postgresql_port": _port,
        "dlock_postgresql_listen_addresses": _items(_pg_listen, min_items=1, max_items=16),
        "dlock_postgresql_database": _pattern(SQL_NAME, "lower-case letters, digits and _, not starting with a digit",
                                              63, "database name"),
        "dlock_postgresql_user": _pattern(SQL_NAME, "lower-case letters, digits and _, not starting with a digit",
                                          63, "role name"),
        "dlock_postgresql_password": _password(16, PG_PASSWORD, "printable ASCII characters without spaces"),
        "dlock_postgresql_connection_limit": _integer(1, 10000),
        "dlock_postgresql_clients": _items(_pg_client, min_items=1, max_items=1024),
        "dlock_postgresql_tcp_keepalives_idle": _integer(1, 3600),
        "dlock_postgresql_tcp_keepalives_interval": _integer(1, 600),
        "dlock_postgresql_tcp_keepalives_count": _integer(1, 100),
        "dlock_postgresql_tcp_user_timeout": _pg_time(3600),
        "dlock_postgresql_client_connection_check_interval": _pg_time(3600),
        "dlock_postgresql_tls": _boolean,
        "dlock_postgresql_tls_cert_file": _empty_or(_path),
        "dlock_postgresql_tls_key_file": _empty_or(_path),
        "dlock_postgresql_tls_ca_file": _empty_or(_path),
        "dlock_postgresql_url_scheme": _choice("postgresql", "postgresql+advisory"),
        "dlock_postgresql_url_host": _hostname,
        "dlock_postgresql_ha": _boolean,
        "dlock_postgresql_ha_group": _pattern(GROUP_NAME, "letters, digits and _, not starting with a digit", 64,
                                              "group name"),
        "dlock_postgresql_ha_name": _pattern(ETCD_NAME, "letters, digits and _ . -, not starting with . or -", 63,
                                             "member name"),
        "dlock_postgresql_ha_address": _empty_or(validate.address),
        "dlock_postgresql_ha_scope": _pattern(ETCD_NAME, "letters, digits and _ . -, not starting with . or -", 63,
                                              "cluster name"),
        "dlock_postgresql_ha_data_dir": _path,
        "dlock_postgresql_ha_etcd_endpoints": _items(_etcd_endpoint, max_items=16),
        "dlock_postgresql_ha_etcd_prefix": _etcd_prefix,
        "dlock_postgresql_ha_etcd_user": _etcd_user,
        "dlock_postgresql_ha_etcd_password": _empty_or(_etcd_password),
        "dlock_postgresql_ha_etcd_ca_file": _empty_or(_path),
        "dlock_postgresql_ha_replication_user": _pattern(SQL_NAME, "lower-case letters, digits and _, not starting "
                                                                   "with a digit", 63, "role name"),
        "dlock_postgresql_ha_replication_password": _empty_or(_password(16, PG_PASSWORD, "printable ASCII characters "
                                                                                         "without spaces")),
        "dlock_postgresql_ha_rewind_user": _pattern(SQL_NAME, "lower-case letters, digits and _, not starting with a "
                                                              "digit", 63, "role name"),
        "dlock_postgresql_ha_rewind_password": _empty_or(_password(16, PG_PASSWORD, "printable ASCII characters "
                                                                                    "without spaces")),
        "dlock_postgresql_ha_restapi_port": _port,
        # Basic auth's user:password: no colon in the user.
        "dlock_postgresql_ha_restapi_user": _pattern(ETCD_NAME, "letters, digits and _ . -, not starting with . or -",
                                                     64, "user name"),
        "dlock_postgresql_ha_restapi_password": _empty_or(_password(16, NO_SPACE, "characters other than white space")),
        "dlock_postgresql_ha_ttl": _integer(10, 3600),
        "dlock_postgresql_ha_loop_wait": _integer(1, 600),
        "dlock_postgresql_ha_retry_timeout": _integer(3, 600),
    },
    "dlock_chrony": {
        "dlock_chrony_servers": _items(_hostname),
        "dlock_chrony_pools": _items(_hostname),
        "dlock_chrony_source_options": _empty_or(_source_options),
        "dlock_chrony_makestep_threshold": _number(0.001, 86400),
        "dlock_chrony_makestep_limit": _integer(1, 1000),
        "dlock_chrony_slew_only": _boolean,
        # ppm: at most half of the runners' 2% clock margin (the other half
        # is for the rate of the runner host's own clock).
        "dlock_chrony_maxslewrate": _number(1, 10000),
        "dlock_chrony_allow": _items(validate.network, max_items=256),
        "dlock_chrony_local_stratum": _integer(0, 15),
        "dlock_chrony_container_mode": _boolean,
        "dlock_chrony_wait_sync": _boolean,
        "dlock_chrony_wait_sync_tries": _integer(1, 100000),
        "dlock_chrony_wait_sync_interval": _number(0.1, 3600),
        "dlock_chrony_wait_sync_max_correction": _number(0.000001, 3600),
        "dlock_chrony_wait_at_boot": _boolean,
        "dlock_chrony_extra_config": _items(_conf_line, max_items=256),
    },
    "dlock_metrics": {
        "dlock_metrics_textfile_dir": _path,
        "dlock_metrics_listen_address": _listen_address,
        "dlock_metrics_node_exporter_args": _items(_exporter_flag),
        "dlock_metrics_node_exporter_hardening": _boolean,
        "dlock_metrics_refresh": _boolean,
        "dlock_metrics_refresh_interval": _duration(1.0, 86400.0),
        "dlock_metrics_refresh_user": _account,
        "dlock_metrics_runner_bin": _path,
        "dlock_metrics_group": _account,
        "dlock_metrics_jobs_dir": _path,
        "dlock_metrics_password_path": _path,
        "dlock_metrics_unit_dir": _path,
        "dlock_metrics_rules_path": _empty_or(_path),
    },
    "dlock_runner": {
        "dlock_runner_backend_url": _backend_url,
        "dlock_runner_backend_password": _empty_or(_password(1, re.compile(r".+"), "one line")),
        "dlock_runner_ca_file": _empty_or(_path),
        "dlock_runner_fence_epoch": validate.fence_epoch,
        "dlock_runner_config_dir": _path,
        "dlock_runner_jobs_dir": _path,
        "dlock_runner_password_path": _path,
        "dlock_runner_install_dir": _path,
        "dlock_runner_bin": _path,
        "dlock_runner_python": _path,
        "dlock_runner_group": _account,
        "dlock_runner_metrics_dir": _empty_or(_path),
        "dlock_runner_defaults": _lock_defaults,
        "dlock_runner_install_driver": _boolean,
    },
    "dlock_etcd": {
        "dlock_etcd_group": _pattern(GROUP_NAME, "letters, digits and _, not starting with a digit", 64,
                                     "group name"),
        "dlock_etcd_name": _hostname,
        "dlock_etcd_address": validate.address,
        "dlock_etcd_client_port": _port,
        "dlock_etcd_peer_port": _port,
        "dlock_etcd_data_dir": _path,
        "dlock_etcd_initial_cluster_state": _choice("new", "existing"),
        "dlock_etcd_initial_cluster_token": _pattern(ETCD_NAME, "letters, digits and _ . -, not starting with . "
                                                                "or -", 64, "token"),
        # etcd's bounds: heartbeat and election timeout in ms, at most 50 s
        # for the election; space up to 8 GiB (etcd warns above).
        "dlock_etcd_heartbeat_interval": _integer(10, 10000),
        "dlock_etcd_election_timeout": _integer(50, 50000),
        "dlock_etcd_quota_backend_bytes": _integer(16 * 1024 ** 2, 8 * 1024 ** 3),
        # Watches (a waiting runner) need some history: at least 1000 revisions.
        "dlock_etcd_auto_compaction_retention": _integer(1000, 10 ** 9),
        "dlock_etcd_root_password": _etcd_password,
        "dlock_etcd_user": _etcd_user,
        "dlock_etcd_password": _etcd_password,
        "dlock_etcd_prefix": _etcd_prefix,
        "dlock_etcd_extra_users": _items(_etcd_account, max_items=16),
        "dlock_etcd_tls": _boolean,
        "dlock_etcd_tls_cert_file": _empty_or(_path),
        "dlock_etcd_tls_key_file": _empty_or(_path),
        "dlock_etcd_tls_ca_file": _empty_or(_path),
        "dlock_etcd_peer_tls": _boolean,
        "dlock_etcd_peer_tls_cert_file": _empty_or(_path),
        "dlock_etcd_peer_tls_key_file": _empty_or(_path),
        "dlock_etcd_peer_tls_ca_file": _empty_or(_path),
    },
    # The job list itself is checked by the dlock.fleet.dlock_jobs filter.
    "dlock_jobs": {
        "dlock_jobs_randomized_delay": _duration(),
        "dlock_jobs_accuracy": _duration(),
        "dlock_jobs_persistent": _boolean,
        "dlock_jobs_user": validate.unix_name,
        "dlock_jobs_hardening": _boolean,
        "dlock_jobs_runner_bin": _path,
        "dlock_jobs_jobs_dir": _path,
        "dlock_jobs_group": validate.unix_name,
        "dlock_jobs_password_path": _path,
        "dlock_jobs_metrics_dir": _empty_or(_path),
        "dlock_jobs_unit_dir": _path,
        "dlock_jobs_backend_url": _empty_or(_backend_url),
        "dlock_jobs_drain_timeout": _duration(positive=True),
    },
}

# Variables whose values are never shown, not even in a message about another rule.
SECRETS = ("dlock_redis_password", "dlock_redis_admin_password", "dlock_postgresql_password",
           "dlock_etcd_root_password", "dlock_etcd_password", "dlock_etcd_extra_users", "dlock_runner_backend_password",
           "dlock_postgresql_ha_etcd_password", "dlock_postgresql_ha_replication_password",
           "dlock_postgresql_ha_rewind_password", "dlock_postgresql_ha_restapi_password")


# -- rules between variables (run only on values that passed the table) ------
def _redis_rules(values):
    users = [values[name] for name in ("dlock_redis_user", "dlock_redis_admin_user") if name in values]
    if "default" in users:
        yield "dlock_redis_user and dlock_redis_admin_user must not be 'default' (nobody may log in as it)"
    if values.get("dlock_redis_admin_password") and not values.get("dlock_redis_admin_user"):
        yield "dlock_redis_admin_user: must be set when dlock_redis_admin_password is"
    if len(users) == 2 and users[0] == users[1]:
        yield "dlock_redis_user and dlock_redis_admin_user must be distinct"
    if values.get("dlock_redis_tls"):
        for name in ("dlock_redis_tls_cert_file", "dlock_redis_tls_key_file", "dlock_redis_tls_ca_file"):
            if values.get(name, "x") == "":
                yield "%s: must be set with dlock_redis_tls (a file on the backend host)" % name


def _postgresql_rules(values):
    for name in ("dlock_postgresql_database", "dlock_postgresql_user"):
        if values.get(name) in PG_HBA_NAME_KEYWORDS:
            yield ("%s: %s is a pg_hba keyword (it would match every database or user there)"
                   % (name, validate.shown(values[name])))
    user = values.get("dlock_postgresql_user")
    if user in ("postgres", "public") or (user or "").startswith("pg_"):
        yield ("dlock_postgresql_user: %s is reserved (postgres, public and pg_* are PostgreSQL's own roles)"
               % validate.shown(user))
    if values.get("dlock_postgresql_tls"):
        for name in ("dlock_postgresql_tls_cert_file", "dlock_postgresql_tls_key_file"):
            if values.get(name, "x") == "":
                yield "%s: must be set with dlock_postgresql_tls (a file on the backend host)" % name
    if values.get("dlock_postgresql_ha"):
        yield from _postgresql_ha_rules(values)


# What HA mode needs set, and the names of its PostgreSQL roles.
PG_HA_REQUIRED = ("dlock_postgresql_ha_address", "dlock_postgresql_ha_etcd_password",
                  "dlock_postgresql_ha_replication_password", "dlock_postgresql_ha_rewind_password",
                  "dlock_postgresql_ha_restapi_password")
PG_HA_ROLES = ("dlock_postgresql_user", "dlock_postgresql_ha_replication_user", "dlock_postgresql_ha_rewind_user")


def _postgresql_ha_rules(values):
    for name in PG_HA_REQUIRED:
        if values.get(name, "x") == "":
            yield "%s: must be set with dlock_postgresql_ha" % name
    if values.get("dlock_postgresql_ha_etcd_endpoints") == []:
        yield ("dlock_postgresql_ha_etcd_endpoints: must name the etcd members with dlock_postgresql_ha (run "
               "dlock_etcd first in the play: it publishes dlock_etcd_endpoints)")
    schemes = set(url.split(":", 1)[0] for url in values.get("dlock_postgresql_ha_etcd_endpoints") or [])
    if len(schemes) > 1:
        yield "dlock_postgresql_ha_etcd_endpoints: all http:// or all https:// (Patroni talks to etcd one way)"
    if schemes == {"https"} and values.get("dlock_postgresql_ha_etcd_ca_file", "x") == "":
        yield "dlock_postgresql_ha_etcd_ca_file: must be set for https:// etcd endpoints"
    roles = [values[name] for name in PG_HA_ROLES if name in values]
    if len(roles) == len(PG_HA_ROLES) and len(set(roles)) < len(roles):
        yield "%s: must be three distinct roles" % ", ".join(PG_HA_ROLES)
    for name in PG_HA_ROLES[1:]:
        role = values.get(name) or ""
        if role in ("postgres", "public") or role.startswith("pg_"):
            yield "%s: %s is reserved (postgres, public and pg_* are PostgreSQL's own roles)" % (name, validate.shown(role))
    timing = [values.get("dlock_postgresql_ha_" + name) for name in ("ttl", "loop_wait", "retry_timeout")]
    if None not in timing and int(timing[1]) + 2 * int(timing[2]) > int(timing[0]):
        yield ("dlock_postgresql_ha_ttl: %s s is less than dlock_postgresql_ha_loop_wait + 2 * "
               "dlock_postgresql_ha_retry_timeout (%s s): the leader could lose its key while it retries"
               % (timing[0], int(timing[1]) + 2 * int(timing[2])))
    listen, address = values.get("dlock_postgresql_listen_addresses"), values.get("dlock_postgresql_ha_address")
    if listen and address and address not in listen and "*" not in listen:
        yield ("dlock_postgresql_listen_addresses: must hold dlock_postgresql_ha_address (%s): the other members "
               "and the runners connect to it" % validate.shown(address))
    # Not yet: TLS between the members and to the runners of a Patroni cluster.
    if values.get("dlock_postgresql_tls"):
        yield "dlock_postgresql_tls: not available with dlock_postgresql_ha yet (the members' replication is not set up for TLS)"
    if values.get("dlock_postgresql_url_scheme") == "postgresql+advisory":
        yield ("dlock_postgresql_url_scheme: postgresql+advisory does not survive a failover (the lock lives in one "
               "server's session): use postgresql with dlock_postgresql_ha")


def _etcd_rules(values):
    if values.get("dlock_etcd_user") == "root":
        yield "dlock_etcd_user: must not be root (etcd's administrator, with every right): name the runners' own user"
    passwords = [values.get(name) for name in ("dlock_etcd_root_password", "dlock_etcd_password")]
    if passwords[0] and passwords[0] == passwords[1]:
        yield "dlock_etcd_password: must differ from dlock_etcd_root_password"
    yield from _etcd_account_rules(values)
    if "dlock_etcd_client_port" in values and values.get("dlock_etcd_client_port") == values.get("dlock_etcd_peer_port"):
        yield "dlock_etcd_client_port and dlock_etcd_peer_port must differ"
    heartbeat, election = values.get("dlock_etcd_heartbeat_interval"), values.get("dlock_etcd_election_timeout")
    if heartbeat is not None and election is not None and int(election) < 5 * int(heartbeat):
        yield ("dlock_etcd_election_timeout: %s ms is less than 5 times dlock_etcd_heartbeat_interval (%s ms): "
               "etcd refuses to start" % (election, heartbeat))
    for kind in ("tls", "peer_tls"):
        if values.get("dlock_etcd_" + kind):
            for name in ("cert_file", "key_file", "ca_file"):
                if values.get("dlock_etcd_%s_%s" % (kind, name), "x") == "":
                    yield ("dlock_etcd_%s_%s: must be set with dlock_etcd_%s (a file on every member)"
                           % (kind, name, kind))


def _etcd_account_rules(values):
    """Extra users: each its own name and a prefix apart from every other
    account's (one inside another would open its keys)."""
    if "dlock_etcd_extra_users" not in values or "dlock_etcd_user" not in values or "dlock_etcd_prefix" not in values:
        return
    accounts = [("dlock_etcd_user", values["dlock_etcd_user"], values["dlock_etcd_prefix"])]
    for index, extra in enumerate(values["dlock_etcd_extra_users"]):
        field = "dlock_etcd_extra_users[%d]" % index
        if extra["name"] == "root":
            yield "%s.name: must not be root (etcd's administrator, with every right)" % field
        if extra["password"] == values.get("dlock_etcd_root_password"):
            yield "%s.password: must differ from dlock_etcd_root_password" % field
        for other_field, name, prefix in accounts:
            if extra["name"] == name:
                yield "%s.name: %s is already the user of %s" % (field, validate.shown(name), other_field)
            if _prefix_within(extra["prefix"], prefix) or _prefix_within(prefix, extra["prefix"]):
                yield ("%s.prefix: %s overlaps %s of %s: each account's keys must be its own"
                       % (field, validate.shown(extra["prefix"]), validate.shown(prefix), other_field))
        accounts.append((field, extra["name"], extra["prefix"]))


def _chrony_rules(values):
    names = ("dlock_chrony_servers", "dlock_chrony_pools", "dlock_chrony_local_stratum")
    if all(name in values for name in names) and not (values["dlock_chrony_servers"] or values["dlock_chrony_pools"]
                                                      or int(values["dlock_chrony_local_stratum"]) > 0):
        yield ("dlock_chrony_servers, dlock_chrony_pools: no time source; set one of them (or, for a host that "
               "only serves its own clock, dlock_chrony_local_stratum)")
    if values.get("dlock_chrony_slew_only") is True:
        for line in values.get("dlock_chrony_extra_config") or ():
            if line.split()[:1] in (["makestep"], ["maxslewrate"], ["initstepslew"]):
                yield ("dlock_chrony_extra_config: %s is not for a slew-only host (dlock_chrony_slew_only: the "
                       "clock must never step while the backend serves leases)" % validate.shown(line))


def _metrics_rules(values):
    if values.get("dlock_metrics_refresh_user") == "root":
        yield ("dlock_metrics_refresh_user: must not be root (the role makes it a system user without a shell "
               "or home, and the refresh runs unprivileged)")


def _backend_scheme(url):
    """The scheme of a checked backend URL; None for '' or an unchecked one (the stricter timing rule)."""
    return validate.backend_url(url, "backend URL").scheme if url else None


def _runner_rules(values):
    if values.get("dlock_runner_group") == "root":
        yield "dlock_runner_group: must not be root (job units join this group)"
    if "dlock_runner_defaults" in values:
        try:
            LockOptions.from_mapping(values["dlock_runner_defaults"], "dlock_runner_defaults",
                                     _backend_scheme(values.get("dlock_runner_backend_url")))
        except ConfigError as exc:
            yield str(exc)


RULES = {"dlock_redis": _redis_rules, "dlock_postgresql": _postgresql_rules, "dlock_etcd": _etcd_rules,
         "dlock_chrony": _chrony_rules,
         "dlock_metrics": _metrics_rules, "dlock_runner": _runner_rules, "dlock_jobs": lambda values: ()}


# How ansible-core names an undefined variable in the error that reading it raises.
UNDEFINED = re.compile(r"'([A-Za-z_][A-Za-z0-9_]*)' is undefined")


def _unreadable(name, message):
    """A variable that cannot be read, for its template failed: 2.19+'s lazy
    mapping raises when the filter reads it, 2.18 passes an Undefined. Only
    an undefined variable's name is kept of the message: the rest may quote
    the template, braces and all, which an assert's fail_msg would template
    again, or (2.19) a password beside it in the inventory."""
    found = UNDEFINED.search(message)
    if found:
        return ("%s: refers to an undefined variable (%s is undefined): define it (vault it), or leave it out"
                % (name, found.group(1)))
    return "%s: could not be read (its template failed)" % name


def _undefined_message(value):
    """Jinja's own message of an Undefined, read without using the value."""
    try:
        return str(object.__getattribute__(value, "_undefined_message"))
    except Exception:  # pylint: disable=broad-exception-caught
        return ""


def _unexpected(name, exc):
    """A check that failed in an unforeseen way: named, and shown only when
    not a secret."""
    if name in SECRETS:
        return "%s: could not be checked (%s)" % (name, type(exc).__name__)
    return "%s: could not be checked (%s: %s)" % (name, type(exc).__name__, validate.shown(str(exc), 160))


def role_problems(variables, role):
    """The problems of a role's variables: messages naming the variable,
    never a secret; [] when all is well. Never raises."""
    table = TABLES.get(role)
    if table is None:
        return ["dlock_role_problems: unknown role %s (known: %s)" % (validate.shown(role), ", ".join(sorted(TABLES)))]
    if not isinstance(variables, dict):
        return ["%s: the role's variables must be given as a mapping" % role]
    problems = []
    missing = sorted(set(table) - set(variables))
    unknown = sorted(validate.shown(name) for name in set(variables) - set(table))
    if missing:
        problems.append("%s: the preflight does not pass %s to the check" % (role, ", ".join(missing)))
    if unknown:
        problems.append("%s: the check has no rule for %s" % (role, ", ".join(unknown)))
    passed = {}
    for name, check in table.items():
        if name not in variables:
            continue
        try:
            value = variables[name]
        except Exception as exc:  # pylint: disable=broad-exception-caught
            problems.append(_unreadable(name, str(exc)))
            continue
        if isinstance(value, Undefined):
            problems.append(_unreadable(name, _undefined_message(value)))
            continue
        try:
            check(value, name)
        except ConfigError as exc:
            problems.append(str(exc))
        except Exception as exc:  # pylint: disable=broad-exception-caught
            problems.append(_unexpected(name, exc))
        else:
            passed[name] = value
    try:
        problems.extend(RULES[role](passed))
    except Exception as exc:  # pylint: disable=broad-exception-caught
        problems.append(_unexpected(role, exc))
    return problems


# -- render filters for the role templates ------------------------------------
def dlock_pg_address(value, what="address"):
    """pg_hba's address column: the canonical CIDR of an address or network
    (a bare address becomes /32 or /128), or a host name; never a keyword."""
    try:
        return _pg_client(value, what)
    except ConfigError as exc:
        raise AnsibleFilterError(str(exc))


def dlock_conf_line(value, what="line"):
    """One whole line of a line-oriented configuration file: a string
    without any control character (so without a line break)."""
    if not isinstance(value, str):
        raise AnsibleFilterError("%s: %s must be a string" % (what, validate.shown(value)))
    try:
        return _conf_line(value, what)
    except ConfigError as exc:
        raise AnsibleFilterError(str(exc))


def dlock_role_problems(variables, role):
    return role_problems(variables, role)


def dlock_fence_switch_problems(installed, where, url, epoch):
    """The runner role's guard against fences that go back: [] or the
    message (backends/epoch.py, switch_problems). INSTALLED is the text of
    the node's dlock.json, None when it has none; URL and EPOCH were checked
    by dlock_role_problems a task earlier. Never raises."""
    try:
        return switch_problems(installed, where, url, epoch)
    except ConfigError as exc:
        return ["dlock_runner: %s" % exc]


class FilterModule(object):
    def filters(self):
        return {
            "dlock_role_problems": dlock_role_problems,
            "dlock_fence_switch_problems": dlock_fence_switch_problems,
            "dlock_pg_address": dlock_pg_address,
            "dlock_conf_line": dlock_conf_line,
        }
