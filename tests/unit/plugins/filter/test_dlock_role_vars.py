"""The roles' check (filter dlock.fleet.dlock_role_problems): each preflight
hands it exactly its table (the tables against the roles' argument_specs:
tests/unit/plugins/plugin_utils/role_rules); problems name the variable and
never a password; the render filters for pg_hba and verbatim lines. The real
runs are in tests/integration/roles/test_role_hostile.py."""

from __future__ import annotations

import os
import re

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from jinja2 import StrictUndefined

from ansible_collections.dlock.fleet.plugins.filter.dlock_render import dlock_conf_line, dlock_pg_address
from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules.check import TABLES, role_problems
from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))


def _load(role, *path):
    with open(os.path.join(ROOT, "roles", role, *path)) as handle:
        return yaml.safe_load(handle)


@pytest.mark.parametrize("role", sorted(TABLES))
def test_the_preflight_hands_over_exactly_the_table(role):
    def flat(tasks):  # blocks opened, imported task files read in
        for task in tasks:
            if "ansible.builtin.import_tasks" in task:
                yield from flat(_load(role, "tasks", task["ansible.builtin.import_tasks"]))
            else:
                yield from (flat(task["block"]) if "block" in task else [task])
    # The role hands its variables to dlock_common's settings check.
    [check] = [task for task in flat(_load(role, "tasks", "preflight.yml"))
               if task.get("ansible.builtin.import_role", {}).get("tasks_from") in ("preflight.yml", "settings.yml")]
    assert check["ansible.builtin.import_role"]["name"] == "dlock.fleet.dlock_common"
    assert check["vars"]["dlock_common_role"] == role
    expression = check["vars"]["dlock_common_problems"]
    pairs = re.findall(r"'(\w+)': (\w+)", expression)
    assert all(key == value for key, value in pairs)
    assert sorted(key for key, _value in pairs) == sorted(TABLES[role])
    assert expression.rstrip().endswith("| dlock.fleet.dlock_role_problems('%s') }}" % role)
    # There it is templated under no_log.
    [judge] = [task for task in _load("dlock_common", "tasks", "settings.yml")
               if task.get("name") == "Preflight | Judge the settings"]
    assert judge["no_log"] is True
    assert judge["ansible.builtin.set_fact"] == {"__dlock_common_problems": "{{ dlock_common_problems }}"}


GOOD_REDIS = {"dlock_redis_bind": ["127.0.0.1", "::1"], "dlock_redis_port": "6379", "dlock_redis_user": "dlock",
              "dlock_redis_password": "x" * 16, "dlock_redis_admin_user": "dlock-admin",
              "dlock_redis_admin_password": "", "dlock_redis_appendfsync": "always", "dlock_redis_maxmemory": "",
              "dlock_redis_tls": False, "dlock_redis_tls_cert_file": "", "dlock_redis_tls_key_file": "",
              "dlock_redis_tls_ca_file": "", "dlock_redis_tls_auth_clients": False, "dlock_redis_url_host": "db1"}


def test_good_settings_have_no_problem():
    assert role_problems(GOOD_REDIS, "dlock_redis") == []


def test_a_forgotten_or_unknown_variable_is_a_problem():
    values = dict(GOOD_REDIS)
    del values["dlock_redis_port"]
    values["dlock_redis_colour"] = "blue"
    assert role_problems(values, "dlock_redis") == [
        "dlock_redis: the preflight does not pass dlock_redis_port to the check",
        "dlock_redis: the check has no rule for 'dlock_redis_colour'"]


@pytest.mark.parametrize("variables, role, problem", [
    ({}, "dlock_nosuch", "unknown role"),
    ("dlock_redis_port=1", "dlock_redis", "must be given as a mapping"),
])
def test_the_check_itself_is_misused(variables, role, problem):
    [message] = role_problems(variables, role)
    assert problem in message


class Unreadable(str):
    """A value that raises when used (as a lazy variable whose template fails)."""

    def __len__(self):
        raise RuntimeError("cannot be read: Pw-5ecret")

    __bool__ = __len__


def test_it_never_raises_and_names_what_it_could_not_check():
    problems = role_problems(dict(GOOD_REDIS, dlock_redis_user=Unreadable(), dlock_redis_password=Unreadable()),
                             "dlock_redis")
    assert "dlock_redis_user: could not be checked (RuntimeError: 'cannot be read: Pw-5ecret')" in problems
    assert "dlock_redis_password: could not be checked (RuntimeError)" in problems


class RaisingOnRead(dict):
    """What ansible-core 2.19+ passes: a lazy mapping that raises when the
    filter reads a value whose template refers to an undefined variable."""

    def __getitem__(self, name):
        value = dict.__getitem__(self, name)
        if isinstance(value, StrictUndefined):
            raise RuntimeError("'vault_pw' is undefined")
        return value


@pytest.mark.parametrize("core", ["2.18", "2.19"])
@pytest.mark.parametrize("secret", [False, True], ids=["setting", "password"])
def test_a_variable_that_refers_to_an_undefined_one_is_named_without_its_template(secret, core):
    """`"{{ vault_pw }}"` with vault_pw undefined: 2.18 passes an Undefined,
    2.19+ raises when the value is read. Either way the message names the
    undefined variable and nothing of the template, whose braces an assert's
    fail_msg would template again; and the filter itself does not fail (a
    2.19 task that fails shows the inventory lines around the variable)."""
    undefined = StrictUndefined(hint="{{ vault_pw }} 'vault_pw' is undefined", name="vault_pw")
    name = "dlock_redis_password" if secret else "dlock_redis_user"
    variables = dict(GOOD_REDIS, **{name: undefined})
    problems = role_problems(RaisingOnRead(variables) if core == "2.19" else variables, "dlock_redis")
    assert problems == ["%s: refers to an undefined variable (vault_pw is undefined): define it (vault it), "
                        "or leave it out" % name]


@pytest.mark.parametrize("password", ["short-Pw-5ecret", "Pw-5ecret with spaces", "Pw-5ecret-long\nloadmodule /x",
                                      "Pw-5ecret-with-nul\x00-in", "\u2028Pw-5ecret-separator"])
def test_a_password_is_never_shown(password):
    for role, name, extra in (("dlock_redis", "dlock_redis_password", GOOD_REDIS),
                              ("dlock_redis", "dlock_redis_admin_password", GOOD_REDIS)):
        problems = role_problems(dict(extra, **{name: password}), role)
        assert [p for p in problems if p.startswith(name)], problems
        assert not any("Pw-5ecret" in p for p in problems)


@pytest.mark.parametrize("name, value, message", [
    ("dlock_redis_bind", "127.0.0.1", "dlock_redis_bind: '127.0.0.1' must be a list"),
    ("dlock_redis_port", "80 x", "dlock_redis_port: '80 x' must be a whole number"),
    ("dlock_redis_port", 0, "dlock_redis_port: 0 is out of range (1-65535)"),
    ("dlock_redis_user", "default", "must not be 'default'"),
    ("dlock_redis_maxmemory", "999999999999gb", "dlock_redis_maxmemory: '999999999999gb' is more than 1 PiB"),
    ("dlock_redis_tls", "yes", "dlock_redis_tls: 'yes' must be true or false"),
])
def test_messages_name_the_variable(name, value, message):
    assert message in "; ".join(role_problems(dict(GOOD_REDIS, **{name: value}), "dlock_redis"))


@pytest.mark.parametrize("value, canonical", [
    ("10.0.0.5", "10.0.0.5/32"), ("10.0.0.0/8", "10.0.0.0/8"), ("::1", "::1/128"),
    ("FD00:0::/64", "fd00::/64"), ("node1.example.com", "node1.example.com"),
])
def test_pg_address_is_canonical(value, canonical):
    assert dlock_pg_address(value) == canonical


@pytest.mark.parametrize("value", ["all", "SameNet", "samehost", "10.0.0.0/8 trust", "0.0.0.0/0\nhost all all x trust",
                                   "10.0.0.1/8", ".example.com", "fe80::1%eth0", "", 10, None])
def test_pg_address_refuses_what_is_not_one_address_network_or_host(value):
    with pytest.raises(AnsibleFilterError):
        dlock_pg_address(value, "dlock_postgresql_clients")


@pytest.mark.parametrize("value", ["a\nb", "a\x00", "tab\there", "", ["x"], 5])
def test_conf_line_is_one_line(value):
    with pytest.raises(AnsibleFilterError):
        dlock_conf_line(value, "dlock_chrony_extra_config")
    assert dlock_conf_line("hwtimestamp *") == "hwtimestamp *"


@pytest.mark.parametrize("check", [validate.address, validate.network, validate.hostname, validate.host_or_network])
def test_ipv6_zones_are_refused(check):
    with pytest.raises(ConfigError, match="IPv6 zone"):
        check("fe80::1%eth0", "f")
    with pytest.raises(ConfigError):
        check("fe80::1%25eth0", "f")


GOOD_RUNNER = {"dlock_runner_backend_url": "redis://dlock@127.0.0.1:6379/0", "dlock_runner_backend_password": "x",
               "dlock_runner_ca_file": "", "dlock_runner_config_dir": "/etc/dlock",
               "dlock_runner_jobs_dir": "/etc/dlock/jobs", "dlock_runner_password_path": "/etc/dlock/pw",
               "dlock_runner_install_dir": "/opt/dlock", "dlock_runner_bin": "/usr/local/bin/dlock",
               "dlock_runner_python": "/usr/bin/python3", "dlock_runner_group": "dlock",
               "dlock_runner_metrics_dir": "", "dlock_runner_install_driver": False,
               "dlock_runner_defaults": {"ttl": "5s", "renew_every": "4s", "op_timeout": "400ms",
                                         "kill_grace": "300ms", "max_clock_skew": "1s"}}


@pytest.mark.parametrize("url, refused", [
    ("redis://dlock@127.0.0.1:6379/0", True), ("postgresql://dlock@db1/dlock", True),
    ("etcd://127.0.0.1:2379/dlock", False), ("file:///var/lib/dlock", False), ("", True), ("bogus://x", True),
])
def test_runner_defaults_pass_the_timing_rule_of_the_backend(url, refused):
    """Issue 25: on Redis and PostgreSQL (and when the backend is not known) the
    rule counts 2 x max_clock_skew; the reproduction's options no longer fit there."""
    problems = role_problems(dict(GOOD_RUNNER, dlock_runner_backend_url=url), "dlock_runner")
    rule = [p for p in problems if p.startswith("dlock_runner_defaults: ")]
    assert bool(rule) == refused, problems
    if refused:
        assert "+ 2 x max_clock_skew (2s) = 6.8s must be below ttl (5s)" in rule[0]
