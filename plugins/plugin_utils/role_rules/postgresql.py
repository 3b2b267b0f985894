# Copyright: dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The dlock_postgresql role's variables, Patroni's (dlock_postgresql_ha_*)
among them: their table and the rules between them. Also pg_client, which
the dlock_pg_address filter applies again where pg_hba is rendered."""

from __future__ import annotations

import re

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules.etcd import etcd_password, etcd_prefix, etcd_user
from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules.kinds import (
    ETCD_NAME, GROUP_NAME, NO_SPACE, NUMBER_OR_TEXT, SQL_NAME, address, boolean, choice, empty_or, hostname, integer,
    items, kind, password, path, pattern, port)

PG_CLUSTER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
# Printable ASCII without space: the role computes the SCRAM verifier itself,
# and PostgreSQL would SASLprep-normalise anything else.
PG_PASSWORD = re.compile(r"[!-~]+")
# PostgreSQL time units (its 'm' is not minutes: it is refused).
PG_TIME = re.compile(r"([0-9]{1,10})(ms|s|min|h|d)?")
PG_TIME_UNITS = {"ms": 0.001, None: 0.001, "s": 1, "min": 60, "h": 3600, "d": 86400}
# pg_hba keywords that would widen an entry: in the address column to more
# than one host or network, in the database and user columns to every one.
PG_HBA_KEYWORDS = ("all", "samehost", "samenet")
PG_HBA_NAME_KEYWORDS = ("all", "sameuser", "samerole", "samegroup", "replication")
ETCD_ENDPOINT = re.compile(r"(https?)://(\[[0-9A-Fa-f:.]+\]|[^/:\[\]]+):([0-9]{1,5})")


def pg_time(maximum):
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
    return kind(run, NUMBER_OR_TEXT)


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


pg_client = kind(_pg_client, "str")
_sql_role = pattern(SQL_NAME, "lower-case letters, digits and _, not starting with a digit", 63, "role name")
_pg_password = password(16, PG_PASSWORD, "printable ASCII characters without spaces")
_etcd_style_name = "letters, digits and _ . -, not starting with . or -"

TABLE = {
    # A major version, 10 to 99, that the spec calls text: it names the
    # package and the paths (postgresql-15, /etc/postgresql/15/main).
    "dlock_postgresql_version": kind(integer(10, 99), "str"),
    "dlock_postgresql_cluster": pattern(PG_CLUSTER, "letters, digits, _ and -, starting with a letter or digit", 63,
                                        "cluster name"),
    "dlock_postgresql_port": port,
    "dlock_postgresql_listen_addresses": items(kind(_pg_listen, "str"), min_items=1, max_items=16),
    "dlock_postgresql_database": pattern(SQL_NAME, "lower-case letters, digits and _, not starting with a digit", 63,
                                         "database name"),
    "dlock_postgresql_user": _sql_role,
    "dlock_postgresql_password": _pg_password,
    "dlock_postgresql_connection_limit": integer(1, 10000),
    "dlock_postgresql_clients": items(pg_client, min_items=1, max_items=1024),
    "dlock_postgresql_tcp_keepalives_idle": integer(1, 3600),
    "dlock_postgresql_tcp_keepalives_interval": integer(1, 600),
    "dlock_postgresql_tcp_keepalives_count": integer(1, 100),
    "dlock_postgresql_tcp_user_timeout": pg_time(3600),
    "dlock_postgresql_client_connection_check_interval": pg_time(3600),
    "dlock_postgresql_tls": boolean,
    "dlock_postgresql_tls_cert_file": empty_or(path),
    "dlock_postgresql_tls_key_file": empty_or(path),
    "dlock_postgresql_tls_ca_file": empty_or(path),
    "dlock_postgresql_url_scheme": choice("postgresql", "postgresql+advisory"),
    "dlock_postgresql_url_host": hostname,
    "dlock_postgresql_ha": boolean,
    "dlock_postgresql_ha_group": pattern(GROUP_NAME, "letters, digits and _, not starting with a digit", 64,
                                         "group name"),
    "dlock_postgresql_ha_name": pattern(ETCD_NAME, _etcd_style_name, 63, "member name"),
    "dlock_postgresql_ha_address": empty_or(address),
    "dlock_postgresql_ha_scope": pattern(ETCD_NAME, _etcd_style_name, 63, "cluster name"),
    "dlock_postgresql_ha_data_dir": path,
    "dlock_postgresql_ha_etcd_endpoints": items(kind(_etcd_endpoint, "str"), max_items=16),
    "dlock_postgresql_ha_etcd_prefix": etcd_prefix,
    "dlock_postgresql_ha_etcd_user": etcd_user,
    "dlock_postgresql_ha_etcd_password": empty_or(etcd_password),
    "dlock_postgresql_ha_etcd_ca_file": empty_or(path),
    "dlock_postgresql_ha_replication_user": _sql_role,
    "dlock_postgresql_ha_replication_password": empty_or(_pg_password),
    "dlock_postgresql_ha_rewind_user": _sql_role,
    "dlock_postgresql_ha_rewind_password": empty_or(_pg_password),
    "dlock_postgresql_ha_restapi_port": port,
    # Basic auth's user:password: no colon in the user.
    "dlock_postgresql_ha_restapi_user": pattern(ETCD_NAME, _etcd_style_name, 64, "user name"),
    "dlock_postgresql_ha_restapi_password": empty_or(password(16, NO_SPACE, "characters other than white space")),
    "dlock_postgresql_ha_ttl": integer(10, 3600),
    "dlock_postgresql_ha_loop_wait": integer(1, 600),
    "dlock_postgresql_ha_retry_timeout": integer(3, 600),
}

# Variables whose values are never shown, not even in a message about another rule.
SECRETS = ("dlock_postgresql_password", "dlock_postgresql_ha_etcd_password", "dlock_postgresql_ha_replication_password",
           "dlock_postgresql_ha_rewind_password", "dlock_postgresql_ha_restapi_password")

# What HA mode needs set, and the names of its PostgreSQL roles.
PG_HA_REQUIRED = ("dlock_postgresql_ha_address", "dlock_postgresql_ha_etcd_password",
                  "dlock_postgresql_ha_replication_password", "dlock_postgresql_ha_rewind_password",
                  "dlock_postgresql_ha_restapi_password")
PG_HA_ROLES = ("dlock_postgresql_user", "dlock_postgresql_ha_replication_user", "dlock_postgresql_ha_rewind_user")


def rules(values):
    """The rules between variables (run only on values that passed the table)."""
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
        yield from _ha_rules(values)


def _ha_rules(values):
    for name in PG_HA_REQUIRED:
        if values.get(name, "x") == "":
            yield "%s: must be set with dlock_postgresql_ha" % name
    yield from _ha_etcd_rules(values)
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
    listen, ha_address = values.get("dlock_postgresql_listen_addresses"), values.get("dlock_postgresql_ha_address")
    if listen and ha_address and ha_address not in listen and "*" not in listen:
        yield ("dlock_postgresql_listen_addresses: must hold dlock_postgresql_ha_address (%s): the other members "
               "and the runners connect to it" % validate.shown(ha_address))
    # Not yet: TLS between the members and to the runners of a Patroni cluster.
    if values.get("dlock_postgresql_tls"):
        yield "dlock_postgresql_tls: not available with dlock_postgresql_ha yet (the members' replication is not set up for TLS)"
    if values.get("dlock_postgresql_url_scheme") == "postgresql+advisory":
        yield ("dlock_postgresql_url_scheme: postgresql+advisory does not survive a failover (the lock lives in one "
               "server's session): use postgresql with dlock_postgresql_ha")


def _ha_etcd_rules(values):
    """Patroni's etcd: its members named, reached one way (and https:// with a CA)."""
    if values.get("dlock_postgresql_ha_etcd_endpoints") == []:
        yield ("dlock_postgresql_ha_etcd_endpoints: must name the etcd members with dlock_postgresql_ha (run "
               "dlock_etcd first in the play: it publishes dlock_etcd_endpoints)")
    schemes = set(url.split(":", 1)[0] for url in values.get("dlock_postgresql_ha_etcd_endpoints") or [])
    if len(schemes) > 1:
        yield "dlock_postgresql_ha_etcd_endpoints: all http:// or all https:// (Patroni talks to etcd one way)"
    if schemes == {"https"} and values.get("dlock_postgresql_ha_etcd_ca_file", "x") == "":
        yield "dlock_postgresql_ha_etcd_ca_file: must be set for https:// etcd endpoints"
