# Copyright: dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The dlock_etcd role's variables: their table and the rules between them.
Also the etcd account's kinds, which the dlock_postgresql role's Patroni
account shares."""

from __future__ import annotations

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules.kinds import (
    ETCD_NAME, GROUP_NAME, address, boolean, choice, empty_or, hostname, integer, items, kind, no_space_password,
    path, pattern, port)

etcd_user = pattern(ETCD_NAME, "letters, digits and _ . -, not starting with . or -", 64, "user name")
# The engine's rule for the path of an etcd URL.
etcd_prefix = pattern(validate.ETCD_PREFIX, "a path such as /dlock: segments of letters, digits and _ . -, no "
                                            "trailing /", 200, "key prefix")
etcd_password = no_space_password
ETCD_ACCOUNT = {"name": etcd_user, "password": etcd_password, "prefix": etcd_prefix}


def _etcd_account(value, field):
    """One of dlock_etcd_extra_users: exactly name, password and prefix (the
    value is never shown: it holds a password)."""
    if not isinstance(value, dict) or sorted(value) != sorted(ETCD_ACCOUNT):
        raise ConfigError("%s: must be a mapping of exactly %s" % (field, ", ".join(sorted(ETCD_ACCOUNT))))
    for key, check in ETCD_ACCOUNT.items():
        check(value[key], "%s.%s" % (field, key))
    return value


etcd_account = kind(_etcd_account, "dict", options=dict((key, dict(check.spec, required=True))
                                                        for key, check in ETCD_ACCOUNT.items()))

TABLE = {
    "dlock_etcd_group": pattern(GROUP_NAME, "letters, digits and _, not starting with a digit", 64, "group name"),
    "dlock_etcd_name": hostname,
    "dlock_etcd_address": address,
    "dlock_etcd_client_port": port,
    "dlock_etcd_peer_port": port,
    # 0: no metrics listener.
    "dlock_etcd_metrics_port": integer(0, 65535),
    "dlock_etcd_data_dir": path,
    "dlock_etcd_initial_cluster_state": choice("new", "existing"),
    "dlock_etcd_initial_cluster_token": pattern(ETCD_NAME, "letters, digits and _ . -, not starting with . or -", 64,
                                                "token"),
    # etcd's bounds: heartbeat and election timeout in ms, at most 50 s
    # for the election; space up to 8 GiB (etcd warns above).
    "dlock_etcd_heartbeat_interval": integer(10, 10000),
    "dlock_etcd_election_timeout": integer(50, 50000),
    "dlock_etcd_quota_backend_bytes": integer(16 * 1024 ** 2, 8 * 1024 ** 3),
    # Watches (a waiting runner) need some history: at least 1000 revisions.
    "dlock_etcd_auto_compaction_retention": integer(1000, 10 ** 9),
    "dlock_etcd_root_password": etcd_password,
    "dlock_etcd_user": etcd_user,
    "dlock_etcd_password": etcd_password,
    "dlock_etcd_prefix": etcd_prefix,
    "dlock_etcd_extra_users": items(etcd_account, max_items=16),
    "dlock_etcd_tls": boolean,
    "dlock_etcd_tls_cert_file": empty_or(path),
    "dlock_etcd_tls_key_file": empty_or(path),
    "dlock_etcd_tls_ca_file": empty_or(path),
    "dlock_etcd_peer_tls": boolean,
    "dlock_etcd_peer_tls_cert_file": empty_or(path),
    "dlock_etcd_peer_tls_key_file": empty_or(path),
    "dlock_etcd_peer_tls_ca_file": empty_or(path),
}

# Variables whose values are never shown, not even in a message about another rule.
SECRETS = ("dlock_etcd_root_password", "dlock_etcd_password", "dlock_etcd_extra_users")


def rules(values):
    """The rules between variables (run only on values that passed the table)."""
    if values.get("dlock_etcd_user") == "root":
        yield "dlock_etcd_user: must not be root (etcd's administrator, with every right): name the runners' own user"
    passwords = [values.get(name) for name in ("dlock_etcd_root_password", "dlock_etcd_password")]
    if passwords[0] and passwords[0] == passwords[1]:
        yield "dlock_etcd_password: must differ from dlock_etcd_root_password"
    yield from _account_rules(values)
    ports = [(name, values[name]) for name in ("dlock_etcd_client_port", "dlock_etcd_peer_port",
                                               "dlock_etcd_metrics_port") if values.get(name)]
    for index, (name, number) in enumerate(ports):
        for other, other_number in ports[index + 1:]:
            if int(number) == int(other_number):
                yield "%s and %s must differ (both %s)" % (name, other, number)
    heartbeat, election = values.get("dlock_etcd_heartbeat_interval"), values.get("dlock_etcd_election_timeout")
    if heartbeat is not None and election is not None and int(election) < 5 * int(heartbeat):
        yield ("dlock_etcd_election_timeout: %s ms is less than 5 times dlock_etcd_heartbeat_interval (%s ms): "
               "etcd refuses to start" % (election, heartbeat))
    for tls in ("tls", "peer_tls"):
        if values.get("dlock_etcd_" + tls):
            for name in ("cert_file", "key_file", "ca_file"):
                if values.get("dlock_etcd_%s_%s" % (tls, name), "x") == "":
                    yield ("dlock_etcd_%s_%s: must be set with dlock_etcd_%s (a file on every member)"
                           % (tls, name, tls))


def _prefix_within(inner, outer):
    """Whether etcd prefix `inner` is `outer` or under it (segment-wise)."""
    return inner == outer or inner.startswith(outer + "/")


def _account_rules(values):
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
