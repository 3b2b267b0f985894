# Copyright: dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kinds of value a role variable can be, built on the engine's
validation core (plugins/module_utils/dlock/validate.py). Each kind is a
check(value, field) that raises ConfigError, and carries `.spec`: the
argument_specs entry that describes the same value (its type, and its
choices, elements or options), so the roles' argument_specs can be held
to the tables (tests/unit/plugins/plugin_utils/role_rules)."""

from __future__ import annotations

import re

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError

# Names the roles create (users, groups) must be names, never numeric ids.
ACCOUNT = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
# Plain lower-case SQL identifiers: no quoting is ever needed.
SQL_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
# Non-blank characters without control characters (passwords).
NO_SPACE = re.compile(r"\S+")
# An Ansible inventory group name.
GROUP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# etcd user and role names (the URL's user too) and the bootstrap token.
ETCD_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
# A value that is a number or a text: Ansible's str turns a number into its
# text, which the check reads alike; raw passes either as it is.
NUMBER_OR_TEXT = ("str", "raw")


def kind(check, spec_type, **spec):
    """`check` as a kind, described in argument_specs by `spec_type` (one
    type, or a tuple of types that each describe it) and `spec`."""
    def run(value, field):
        return check(value, field)
    run.spec = dict(spec, type=spec_type)
    return run


def empty_or(check):
    """'' (the role's 'none') or a value passing `check`: a text in the
    spec, whatever `check` takes ('' is no path, no port)."""
    def run(value, field):
        if isinstance(value, str) and value == "":
            return value
        return check(value, field)
    return kind(run, "str")


def items(check, min_items=0, max_items=64):
    """A list of values each passing the kind `check`."""
    def run(value, field):
        return validate.items(value, field, check, max_items=max_items, min_items=min_items)
    spec = {"elements": check.spec["type"]}
    if "options" in check.spec:  # a list of mappings: their keys
        spec["options"] = check.spec["options"]
    return kind(run, "list", **spec)


def integer(minimum, maximum):
    return kind(lambda value, field: validate.integer(value, field, minimum, maximum), "int")


def number(minimum, maximum):
    return kind(lambda value, field: validate.number(value, field, minimum, maximum), "float")


def duration(minimum=0.0, maximum=validate.MAX_DURATION, positive=False):
    return kind(lambda value, field: validate.duration(value, field, minimum, maximum, positive), NUMBER_OR_TEXT)


def choice(*choices):
    return kind(lambda value, field: validate.choice(value, field, choices), "str", choices=list(choices))


def pattern(regex, hint, max_len=validate.MAX_TEXT, what="value"):
    return kind(lambda value, field: validate.text(value, field, max_len, regex, hint, kind=what), "str")


def password(min_len, regex, hint):
    """A password: at least `min_len` characters, all matching `regex`;
    never shown in a message."""
    def run(value, field):
        validate.text(value, field, 1024, allow_empty=True, secret=True)
        if len(value) < min_len:
            raise ConfigError("%s: must be set, %d+ characters" % (field, min_len))
        if not regex.fullmatch(value):
            raise ConfigError("%s: may hold only %s" % (field, hint))
        return value
    return kind(run, "str")


def _account(value, field):
    """A user or group name the role creates: a name, not a numeric id."""
    return validate.text(value, field, 32, ACCOUNT,
                         "letters, digits and _ . -, starting with a letter or _, at most 32 characters",
                         kind="user or group name")


def _backend_url(value, field):
    validate.backend_url(value, field)
    return value


account = kind(_account, "str")
backend_url = kind(_backend_url, "str")
path = kind(validate.path, "path")
boolean = kind(validate.boolean, "bool")
port = kind(validate.port, "int")
hostname = kind(validate.hostname, "str")
address = kind(validate.address, "str")
network = kind(validate.network, "str")
unix_name = kind(validate.unix_name, "str")
no_space_password = password(16, NO_SPACE, "characters other than white space")
