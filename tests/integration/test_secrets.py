"""Secrets fail loudly, on every supported ansible-core.

A user who copies "Using the roles in an existing playbook" (examples/
roles_in_playbook.yml) and whose vault variable is undefined or empty gets a
failed rollout that names the variable, and the node's backend password file
is left as it was: no role deletes a secret because a variable was undefined
or empty. The dlock_runner role runs for real on this machine (-c local),
its paths in a temporary directory; the same with site.yml's
dlock_backend_password.

Runs once per ansible-core that scripts/setup.sh installs: .venv (2.19, the
main test venv), .venv-2.18 (the oldest supported) and, where a Python 3.12+
is found, .venv-2.21 (the newest that installs here).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from ansible_cli import ROOT, ansible_env

EXAMPLE = os.path.join(ROOT, "examples", "roles_in_playbook.yml")
OLD_SECRET = "old-secret-kept-on-the-node\n"
CORES = {"2.19": os.path.join(ROOT, ".venv", "bin"), "2.18": os.path.join(ROOT, ".venv-2.18", "bin"),
         "2.21": os.path.join(ROOT, ".venv-2.21", "bin")}


@pytest.fixture(params=sorted(CORES))
def core(request):
    """The bin directory of one supported ansible-core."""
    bin_dir = CORES[request.param]
    if not os.path.exists(os.path.join(bin_dir, "ansible-playbook")):
        if request.param == "2.21":  # needs Python 3.12+, which Debian 12 lacks (scripts/setup.sh)
            pytest.skip("no .venv-2.21 on this machine (no Python 3.12+)")
        pytest.fail("missing %s: run scripts/setup.sh" % bin_dir)
    return bin_dir


def core_version(bin_dir):
    out = subprocess.run([os.path.join(bin_dir, "python"), "-c", "import ansible; print(ansible.__version__)"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


class Node(object):
    """The runner role's paths, in a temporary directory; a password file already there."""

    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.password = tmp_path / "etc" / "backend.password"
        self.password.parent.mkdir()
        self.password.write_text(OLD_SECRET)
        os.chmod(str(self.password), 0o600)
        self.stat = os.stat(str(self.password))
        self.inventory = tmp_path / "inventory.yml"
        self.inventory.write_text(yaml.safe_dump({"workers": {"hosts": {"node1": {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))

    def paths(self):
        return {
            "ansible_become": False,
            "dlock_runner_config_dir": str(self.dir / "etc"),
            "dlock_runner_jobs_dir": str(self.dir / "etc" / "jobs"),
            "dlock_runner_password_path": str(self.password),
            "dlock_runner_install_dir": str(self.dir / "lib"),
            "dlock_runner_bin": str(self.dir / "bin" / "dlock"),
            "dlock_runner_metrics_dir": "",
            "dlock_runner_group": "daemon",  # exists on Debian; the role refuses root
            "dlock_runner_install_driver": False,
            "dlock_jobs_list": [],
            "dlock_jobs_unit_dir": str(self.dir / "units"),
        }

    def play(self, core, playbook, extra, *options):
        argv = [os.path.join(core, "ansible-playbook"), "-i", str(self.inventory), playbook,
                "-e", json.dumps(dict(self.paths(), **extra))] + list(options)
        env = ansible_env({"PATH": core + os.pathsep + os.environ.get("PATH", "")})
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180, check=False)

    def password_unchanged(self):
        now = os.stat(str(self.password))
        return self.password.read_text() == OLD_SECRET and (now.st_ino, now.st_mtime_ns) == (
            self.stat.st_ino, self.stat.st_mtime_ns)

    def written(self):
        """Everything the role wrote besides the password file that was there."""
        return sorted(str(p.relative_to(self.dir)) for p in self.dir.rglob("*")
                      if p != self.password and p.name != "inventory.yml" and p != self.password.parent)


# The success cases start at the configure phase (its directories, the
# password, dlock.json): the engine's install is not their subject.
FROM_CONFIGURE = ("--start-at-task", "Make the configuration directories")


def roles_play(tmp_path, backend):
    """The example's play with the backend of the case, the runner role only."""
    with open(EXAMPLE) as handle:
        plays = yaml.safe_load(handle)
    plays[0]["vars"]["dlock_backend"] = backend
    plays[0]["roles"] = ["dlock.fleet.dlock_runner"]
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(plays))
    return str(path)


def test_undefined_vault_variable_stops_the_rollout_and_keeps_the_password(core, tmp_path):
    node = Node(tmp_path)
    run = node.play(core, EXAMPLE, {})  # the example as shipped: vault_dlock_redis_password is not defined
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    # Named by ansible-core's check of the role's arguments (their defaults
    # read dlock_backend.password), before any task of the role.
    assert re.search(r"\bvault_dlock_redis_password'? is undefined", out), out
    assert "no backend" not in out  # not blamed on the URL
    assert node.password_unchanged()
    assert node.written() == [], node.written()


def test_empty_password_stops_the_rollout_and_keeps_the_password(core, tmp_path):
    node = Node(tmp_path)
    run = node.play(core, EXAMPLE, {"vault_dlock_redis_password": ""})
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert "the backend password is required" in out and "it is empty" in out, out
    assert node.password_unchanged() and node.written() == []


def test_a_bad_job_entry_stops_the_example_before_the_runner_changes_anything(tmp_path):
    """The example's pre_tasks run both roles' checks first: a bad job entry
    is named (its index and its name) before the runner role writes a file."""
    node = Node(tmp_path)
    jobs = [{"name": "fine", "command": ["true"], "schedule": "hourly"},
            {"name": "typo", "command": ["true"], "schedule": "hourly", "ttl": "10s", "renew_every": "9s"}]
    run = node.play(CORES["2.19"], EXAMPLE, {"vault_dlock_redis_password": "new-secret-0123456789",
                                             "dlock_jobs_list": jobs})
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert "dlock_jobs_list[1] (typo): renew_every (9s)" in out, out
    assert "TASK [dlock.fleet.dlock_runner : Install" not in out, out
    assert re.search(r"node1\s+: ok=\d+\s+changed=0\s", out), out
    assert node.password_unchanged() and node.written() == [], node.written()


# The role's deletion logic is the same on every core; the slow successful
# runs are made on 2.19 (the main test venv) only.
def test_no_password_key_keeps_the_existing_file(tmp_path):
    """A backend without a password: the role runs, the file stays (no task deletes it)."""
    core = CORES["2.19"]
    node = Node(tmp_path)
    play = roles_play(tmp_path, {"url": "redis://127.0.0.1:6379/0"})
    run = node.play(core, play, {}, *FROM_CONFIGURE)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "TASK [dlock.fleet.dlock_runner : Write the backend password]" in run.stdout
    assert node.password_unchanged()
    with open(str(tmp_path / "etc" / "dlock.json")) as handle:
        config = json.load(handle)
    assert config["backend"] == "redis://127.0.0.1:6379/0" and "password_file" not in config


# On every core: each renders dlock.json's text its own way (2.18 would turn
# a variable's text that starts with "{" back into a mapping).
def test_defined_password_is_written(core, tmp_path):
    node = Node(tmp_path)
    play = roles_play(tmp_path, {"url": "redis://dlock@127.0.0.1:6379/0", "password": "{{ vault_dlock_redis_password }}"})
    run = node.play(core, play, {"vault_dlock_redis_password": "new-secret-0123456789"}, *FROM_CONFIGURE)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert node.password.read_text() == "new-secret-0123456789\n"
    assert "new-secret-0123456789" not in out
    with open(str(tmp_path / "etc" / "dlock.json")) as handle:
        assert json.load(handle)["password_file"] == str(node.password)


def test_site_backend_password_undefined_is_named(core, tmp_path):
    """site.yml: dlock_backend_password given but undefined must not fall back to a generated password."""
    node = Node(tmp_path)
    node.inventory.write_text(yaml.safe_dump({"all": {"children": {
        "dlock_backend": {"hosts": {"lock1": {"ansible_connection": "local",
                                              "ansible_python_interpreter": sys.executable}}},
        "dlock_nodes": {"hosts": {"node1": {"ansible_connection": "local",
                                            "ansible_python_interpreter": sys.executable}}}},
        "vars": {"dlock_backend_type": "redis",
                 "dlock_backend_password": "{{ vault_dlock_backend_password }}",
                 "dlock_backend_password_file": str(tmp_path / "generated.password")}}}))
    run = node.play(core, "dlock.fleet.site", {})
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert re.search(r"\bvault_dlock_backend_password'? is undefined", out), out
    assert not (tmp_path / "generated.password").exists()
    assert node.password_unchanged()


def test_site_own_backend_password_undefined_is_named(core, tmp_path):
    """site.yml with a backend of your own: the check play stops every node before any change."""
    node = Node(tmp_path)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    node.inventory.write_text(yaml.safe_dump({"all": {"children": {
        "dlock_nodes": {"hosts": {"node1": dict(local), "node2": dict(local)}}},
        "vars": {"dlock_backend": {"url": "redis://dlock@127.0.0.1:6379/0",
                                   "password": "{{ vault_dlock_redis_password }}"}}}}))
    run = node.play(core, "dlock.fleet.site", {})
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert re.search(r"\bvault_dlock_redis_password'? is undefined", out), out
    assert "no backend" not in out
    assert "dlock_backend refers to an undefined variable" in out and "Nothing was changed" in out, out
    assert "TASK [dlock.fleet.dlock_runner : Install" not in out
    assert node.password_unchanged() and node.written() == []
