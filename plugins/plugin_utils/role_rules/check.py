# Copyright: dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The roles' variables, checked once (filter dlock.fleet.dlock_role_problems).

Each role's module here holds its table, which says for every public
variable which kind of value (kinds.py) it must be, with its bounds, and the
rules that relate its variables to each other. role_problems runs a role's
table, then its rules on the values that passed, and returns the problems:
each names its variable, none shows a secret."""

from __future__ import annotations

import re

from jinja2 import Undefined

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules import (
    chrony, etcd, jobs, metrics, postgresql, redis, runner)

ROLES = {"dlock_redis": redis, "dlock_postgresql": postgresql, "dlock_etcd": etcd, "dlock_chrony": chrony,
         "dlock_metrics": metrics, "dlock_runner": runner, "dlock_jobs": jobs}
TABLES = dict((role, module.TABLE) for role, module in ROLES.items())
# Variables whose values are never shown, not even in a message about another rule.
SECRETS = tuple(name for module in ROLES.values() for name in module.SECRETS)

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


def _coverage_problems(variables, role, table):
    """A variable the preflight forgot to pass, or one the table does not know."""
    missing = sorted(set(table) - set(variables))
    unknown = sorted(validate.shown(name) for name in set(variables) - set(table))
    if missing:
        yield "%s: the preflight does not pass %s to the check" % (role, ", ".join(missing))
    if unknown:
        yield "%s: the check has no rule for %s" % (role, ", ".join(unknown))


def _value_problem(variables, name, check):
    """(problem, None) or (None, the value that passed `check`)."""
    try:
        value = variables[name]
    except Exception as exc:  # pylint: disable=broad-exception-caught
        return _unreadable(name, str(exc)), None
    if isinstance(value, Undefined):
        return _unreadable(name, _undefined_message(value)), None
    try:
        check(value, name)
    except ConfigError as exc:
        return str(exc), None
    except Exception as exc:  # pylint: disable=broad-exception-caught
        return _unexpected(name, exc), None
    return None, value


def role_problems(variables, role):
    """The problems of a role's variables: messages naming the variable,
    never a secret; [] when all is well. Never raises."""
    table = TABLES.get(role)
    if table is None:
        return ["dlock_role_problems: unknown role %s (known: %s)" % (validate.shown(role), ", ".join(sorted(TABLES)))]
    if not isinstance(variables, dict):
        return ["%s: the role's variables must be given as a mapping" % role]
    problems = list(_coverage_problems(variables, role, table))
    passed = {}
    for name, check in table.items():
        if name not in variables:
            continue
        problem, value = _value_problem(variables, name, check)
        if problem is None:
            passed[name] = value
        else:
            problems.append(problem)
    try:
        problems.extend(ROLES[role].rules(passed))
    except Exception as exc:  # pylint: disable=broad-exception-caught
        problems.append(_unexpected(role, exc))
    return problems
