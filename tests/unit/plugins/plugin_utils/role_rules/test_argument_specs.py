"""Each role's meta/argument_specs.yml says what its rule table
(plugins/plugin_utils/role_rules/) enforces: the same variables, and for
each the type, choices, elements, sub-options and required that the rule's
kind carries (kinds.py, `.spec`). The table is the one source; this keeps
the documentation and validate_argument_spec from drifting away from it."""

from __future__ import annotations

import os

import pytest
import yaml

from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules.check import TABLES

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", ".."))
# The job list is checked by the dlock.fleet.dlock_jobs filter, not by a table.
JOB_LIST = "dlock_jobs_list"


def _load(role, *path):
    with open(os.path.join(ROOT, "roles", role, *path)) as handle:
        return yaml.safe_load(handle)


def _options(role):
    return _load(role, "meta", "argument_specs.yml")["argument_specs"]["main"]["options"]


def _disagreements(field, rule, option, templated=False):
    """How argument_specs' `option` differs from the kind's `rule` spec."""
    types = rule["type"] if isinstance(rule["type"], tuple) else (rule["type"],)
    if templated:  # a default that is a template must be raw for the argument spec validator
        types += ("raw",)
    if option.get("type", "str") not in types:
        yield "%s: type %s, the rule's is %s" % (field, option.get("type", "str"), " or ".join(types))
    for key in ("choices", "elements"):
        if rule.get(key) != option.get(key):
            yield "%s: %s %s, the rule's %s" % (field, key, option.get(key), rule.get(key))
    if bool(rule.get("required")) != bool(option.get("required")):
        yield "%s: required %s, the rule's %s" % (field, bool(option.get("required")), bool(rule.get("required")))
    rule_options, spec_options = rule.get("options", {}), option.get("options", {})
    if sorted(rule_options) != sorted(spec_options):
        yield "%s: options %s, the rule's %s" % (field, sorted(spec_options), sorted(rule_options))
    for key in sorted(set(rule_options) & set(spec_options)):
        yield from _disagreements("%s.%s" % (field, key), rule_options[key], spec_options[key])


@pytest.mark.parametrize("role", sorted(TABLES))
def test_the_table_covers_every_variable_of_the_role(role):
    defaults = set(_load(role, "defaults", "main.yml")) - {JOB_LIST}
    assert set(TABLES[role]) == defaults == set(_options(role)) - {JOB_LIST}


@pytest.mark.parametrize("role", sorted(TABLES))
def test_argument_specs_say_what_the_table_enforces(role):
    options, defaults = _options(role), _load(role, "defaults", "main.yml")
    found = [problem for name, check in sorted(TABLES[role].items())
             for problem in _disagreements(name, check.spec, options[name], "{{" in str(defaults[name]))]
    assert found == []


def test_a_disagreement_is_found():
    """The comparison itself: each attribute, and a sub-option, counts."""
    rule = {"type": "list", "elements": "dict", "options": {"name": {"type": "str", "required": True}}}
    assert list(_disagreements("v", rule, dict(rule))) == []
    assert list(_disagreements("v", rule, dict(rule, type="str"))) == ["v: type str, the rule's is list"]
    assert list(_disagreements("v", rule, dict(rule, elements="str"))) == ["v: elements str, the rule's dict"]
    assert list(_disagreements("v", rule, dict(rule, options={"name": {"type": "str"}}))) == [
        "v.name: required False, the rule's True"]
    assert list(_disagreements("v", {"type": "str", "choices": ["a", "b"]}, {"type": "str"})) == [
        "v: choices None, the rule's ['a', 'b']"]
    assert list(_disagreements("v", {"type": "int"}, {"type": "raw"}, templated=True)) == []
