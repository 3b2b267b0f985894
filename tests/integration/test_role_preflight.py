"""Every role documents its variables in meta/argument_specs.yml, and the
backend roles' preflight passes good input (bad input: test_role_hostile.py).
Only the preflight tasks run (on localhost; they assert and ask
`systemctl is-system-running`, nothing else)."""

import os
import subprocess
import sys

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible_cli import BIN, ROOT, ansible_env

SECRET = "Sekr3t-but-short"  # 16 characters

PLAY = """
- hosts: localhost
  gather_facts: true
  tasks:
    - ansible.builtin.include_role:
        name: dlock.fleet.{role}
        tasks_from: preflight.yml
"""


def run_preflight(tmp_path, role, variables):
    playbook = tmp_path / "preflight.yml"
    playbook.write_text(PLAY.format(role=role))
    extra = tmp_path / "vars.yml"
    extra.write_text(yaml.safe_dump(variables))
    argv = [os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local",
            "-e", "ansible_python_interpreter=" + sys.executable, "-e", "@" + str(extra), "-vvv", str(playbook)]
    return subprocess.run(argv, env=ansible_env(), capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("role, variables", [
    ("dlock_redis", {"dlock_redis_password": SECRET}),
    ("dlock_postgresql", {"dlock_postgresql_password": SECRET, "dlock_postgresql_clients": ["10.0.0.0/24"]}),
    # localhost alone (group ungrouped) is a one-member cluster.
    ("dlock_etcd", {"dlock_etcd_root_password": SECRET, "dlock_etcd_password": SECRET[::-1],
                    "dlock_etcd_group": "ungrouped", "dlock_etcd_address": "127.0.0.1"}),
])
def test_good_input_passes_preflight(tmp_path, role, variables):
    proc = run_preflight(tmp_path, role, variables)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert SECRET not in out


ROLES = sorted(os.listdir(os.path.join(ROOT, "roles")))


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_cover_the_defaults_and_validate(role):
    """Every default is documented in meta/argument_specs.yml (and nothing
    else is), and the spec's own defaults pass ansible-core's validator."""
    with open(os.path.join(ROOT, "roles", role, "defaults", "main.yml")) as handle:
        defaults = yaml.safe_load(handle) or {}
    with open(os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml")) as handle:
        options = yaml.safe_load(handle)["argument_specs"]["main"]["options"]
    assert sorted(defaults) == sorted(options)
    assert all(name.startswith(role + "_") for name in options)
    assert [name for name, spec in options.items() if "password" in name and spec["type"] == "str"
            and not spec.get("no_log")] == []
    result = ArgumentSpecValidator(options).validate({}, validate_role_argument_spec=True)
    assert result.error_messages == []
