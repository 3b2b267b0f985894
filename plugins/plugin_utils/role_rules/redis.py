# Copyright: dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The dlock_redis role's variables: their table and the rules between them."""

from __future__ import annotations

import re

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules.kinds import (
    address, boolean, choice, empty_or, hostname, items, no_space_password, path, pattern, port)

REDIS_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
REDIS_MEMORY = re.compile(r"(?i)([0-9]{1,16})(b|k|kb|m|mb|g|gb)?")
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


_redis_user = pattern(REDIS_USER, "letters, digits and _ . -, not starting with . or -", 64, "user name")

TABLE = {
    "dlock_redis_bind": items(address, min_items=1, max_items=16),
    "dlock_redis_port": port,
    "dlock_redis_user": _redis_user,
    "dlock_redis_password": no_space_password,
    "dlock_redis_admin_user": empty_or(_redis_user),
    "dlock_redis_admin_password": empty_or(no_space_password),
    "dlock_redis_appendfsync": choice("always", "everysec", "no"),
    "dlock_redis_maxmemory": empty_or(_redis_memory),
    "dlock_redis_tls": boolean,
    "dlock_redis_tls_cert_file": empty_or(path),
    "dlock_redis_tls_key_file": empty_or(path),
    "dlock_redis_tls_ca_file": empty_or(path),
    "dlock_redis_tls_auth_clients": boolean,
    "dlock_redis_url_host": hostname,
}

# Variables whose values are never shown, not even in a message about another rule.
SECRETS = ("dlock_redis_password", "dlock_redis_admin_password")


def rules(values):
    """The rules between variables (run only on values that passed the table)."""
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
