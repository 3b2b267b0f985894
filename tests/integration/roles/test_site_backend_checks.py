"""site.yml's checks of the provisioned backend on the nodes, before anything
is changed on any host: the backend's checks must have run (its URL known), and a
PostgreSQL URL with sslmode=verify-full needs dlock_backend_ca_file. The
backend host is left out with --limit and its URL given in the inventory, so
only the controller-side assertions of the node play are judged here.

This host is n1: every run is --check and carries a job the jobs preflight
refuses, so the rollout stops in the first play, which checks every host
before any changes, whatever the backend checks decide."""

import os
import re
import subprocess
import sys

import pytest
import yaml
from ansible_cli import BIN, ROOT, ansible_env

PASSWORD = "x" * 32
# Refused by the jobs preflight, which follows the backend checks in the same play.
STOP = {"dlock_jobs_list": [{"name": "stop-here", "schedule": "not a calendar", "command": ["/bin/true"]}]}
STOPPED = "stop-here: schedule \"not a calendar\" is not a valid systemd OnCalendar expression"


def run_site(tmp_path, backend_hostvars, extra, backends=("b1",), limit="n1"):
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {
        "dlock_backend": {"hosts": dict((name, dict(local, **backend_hostvars)) for name in backends)},
        "dlock_nodes": {"hosts": {"n1": dict(local)}}}}}))
    variables = tmp_path / "vars.yml"
    variables.write_text(yaml.safe_dump(dict(STOP, dlock_backend_password=PASSWORD, **extra)))
    argv = [os.path.join(BIN, "ansible-playbook"), "-i", str(inventory), "--limit", limit, "--check",
            "-e", "@" + str(variables), os.path.join(ROOT, "playbooks", "site.yml")]
    proc = subprocess.run(argv, env=ansible_env(), capture_output=True, text=True, timeout=180, check=False)
    out = proc.stdout + proc.stderr
    assert "PLAY [Keep the clocks in sync]" not in out, out  # nothing past the checks ran here
    return proc, out


def task_result(out, name):
    """The first result line (ok / skipping / fatal) of task NAME for n1."""
    match = re.search(r"TASK \[%s\].*?\n(ok|skipping|fatal|changed): \[n1\]" % re.escape(name), out, re.S)
    assert match, out
    return match.group(1)


def test_nodes_without_the_backend_play_are_stopped_with_its_host_named(tmp_path):
    proc, out = run_site(tmp_path, {}, {"dlock_backend_type": "redis"})
    assert proc.returncode == 2, out
    assert "its backend host b1 is not in this run" in out, out
    assert PASSWORD not in out


VERIFY_FULL = "postgresql://dlock@10.0.0.5:5432/dlock?sslmode=verify-full"


def test_postgresql_over_tls_without_a_ca_file_is_stopped(tmp_path):
    proc, out = run_site(tmp_path, {"dlock_postgresql_url": VERIFY_FULL}, {"dlock_backend_type": "postgresql"})
    assert proc.returncode == 2, out
    assert task_result(out, "Require the CA of a PostgreSQL backend with TLS") == "fatal"
    assert "set dlock_backend_ca_file" in out, out
    assert PASSWORD not in out


@pytest.mark.parametrize("url, extra, result", [
    (VERIFY_FULL, {"dlock_backend_ca_file": "/etc/dlock/ca.pem"}, "ok"),
    ("postgresql://dlock@10.0.0.5:5432/dlock", {}, "skipping"),
], ids=["verify-full with a CA file", "plain"])
def test_the_ca_check_passes_with_a_ca_file_or_without_tls(tmp_path, url, extra, result):
    proc, out = run_site(tmp_path, {"dlock_postgresql_url": url}, dict(extra, dlock_backend_type="postgresql"))
    assert task_result(out, "Require the backend's URL") == "ok"
    assert task_result(out, "Require the CA of a PostgreSQL backend with TLS") == result
    assert "set dlock_backend_ca_file" not in out, out
    assert proc.returncode == 2 and STOPPED in out, out  # the checks went on to the jobs


def test_redis_with_a_second_backend_host_is_refused(tmp_path):
    """Redis replication is asynchronous: site.yml does not pretend a second
    Redis host makes the lock highly available."""
    proc, out = run_site(tmp_path, {}, {"dlock_backend_type": "redis"}, backends=("b1", "b2"), limit="all")
    assert proc.returncode == 2, out
    assert "dlock_backend_type redis takes exactly one host in dlock_backend (it has 2)" in out, out
    assert "TASK [Apply the backend role]" not in out, out
    assert PASSWORD not in out


PATRONI_FILES = ["dlock-backend-admin.password"] + [
    "dlock-patroni-%s.password" % name for name in ("etcd", "replication", "restapi", "rewind")]


@pytest.mark.parametrize("ha, generated", [(False, []), (True, PATRONI_FILES)], ids=["one server", "Patroni"])
def test_patronis_passwords_are_generated_only_for_a_patroni_cluster(tmp_path, ha, generated):
    """With dlock_postgresql_ha, etcd's root password and Patroni's four are
    generated beside the inventory (the role then stops here: one backend
    host is no cluster); for one server, none is."""
    proc, out = run_site(tmp_path, {}, {"dlock_backend_type": "postgresql", "dlock_postgresql_ha": ha}, limit="b1")
    assert proc.returncode == 2, out
    files = sorted(p.name for p in (tmp_path / "credentials").glob("*")) if (tmp_path / "credentials").exists() else []
    assert files == generated, (files, out)
    assert PASSWORD not in out and not any((tmp_path / "credentials" / f).read_text().strip() in out for f in files)
