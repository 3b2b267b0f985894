"""The runner and jobs roles on the job nodes: files and modes, units clean
under systemd-analyze verify, timers enabled, a removed job leaves nothing,
a job runs under its unit (pytest-testinfra)."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))

from fleet_checks import JOB, address, backend_name, secret  # noqa: E402

testinfra_hosts = ["ansible://dlock_nodes"]

TIMERS = ("dlock-%s.timer" % JOB, "dlock-shell-line.timer")
UNITS = ("dlock-%s.service" % JOB, "dlock-shell-line.service") + TIMERS


def test_runner_installed(host):
    wrapper = host.file("/usr/local/bin/dlock")
    assert wrapper.mode == 0o755 and wrapper.user == "root"
    assert host.file("/usr/local/lib/dlock/dlock/cli.py").exists
    out = host.run("/usr/local/bin/dlock --version")
    assert out.rc == 0 and out.stdout.startswith("dlock ")


def test_config_files_and_modes(host):
    config = host.file("/etc/dlock/dlock.json")
    assert (config.mode, config.user, config.group) == (0o640, "root", "dlock")
    settings = json.loads(config.content_string)
    backend = host.get_host("ansible://%s" % backend_name(host), ansible_inventory=os.environ["MOLECULE_INVENTORY_FILE"])
    assert settings["backend"] == "redis://dlock@%s:6379/0" % address(backend)
    assert secret("backend.password") not in config.content_string
    assert settings["password_file"] == "/etc/dlock/backend.password"
    password = host.file("/etc/dlock/backend.password")
    assert (password.mode, password.user) == (0o600, "root")
    job = host.file("/etc/dlock/jobs/%s.json" % JOB)
    assert (job.mode, job.group) == (0o640, "dlock")
    assert json.loads(job.content_string)["command"] == ["/bin/sleep", "1"]
    shell = json.loads(host.file("/etc/dlock/jobs/shell-line.json").content_string)
    # The line as written: molecule.yml's $$ reached the job as a $.
    assert shell["command"] == ["/bin/sh", "-c", "echo $DLOCK_RUN_ID >/dev/null"], shell["command"]


@pytest.mark.parametrize("unit", UNITS)
def test_units_verify_clean(host, unit):
    path = "/etc/systemd/system/" + unit
    assert host.file(path).content_string.startswith("# Ansible managed")
    out = host.run("systemd-analyze verify %s", path)
    assert out.rc == 0 and out.stderr.strip() == "", out.stderr


def test_service_unit_runs_the_job_file_not_a_shell(host):
    unit = host.file("/etc/systemd/system/dlock-%s.service" % JOB).content_string
    assert "ExecStart=/usr/local/bin/dlock run --job %s\n" % JOB in unit
    assert "SuccessExitStatus=72 73 74" in unit
    assert "ProtectSystem=strict" in unit and "NoNewPrivileges=yes" in unit
    assert "LoadCredential=dlock-backend:/etc/dlock/backend.password" in unit
    assert "ProtectSystem" not in host.file("/etc/systemd/system/dlock-shell-line.service").content_string


@pytest.mark.parametrize("timer", TIMERS)
def test_timers_enabled_and_listed(host, timer):
    assert host.service(timer).is_enabled
    assert host.service(timer).is_running
    assert timer in host.check_output("systemctl list-timers --all --no-pager")


def test_removed_job_leaves_nothing(host):
    for path in ("/etc/dlock/jobs/retired.json", "/etc/systemd/system/dlock-retired.timer",
                 "/etc/systemd/system/dlock-retired.service"):
        assert not host.file(path).exists


def test_job_runs_under_its_unit(host):
    out = host.run("systemctl start dlock-%s.service" % JOB)
    assert out.rc == 0, out.stderr
    log = host.check_output("journalctl -u dlock-%s.service -o cat --no-pager | grep '^{' | tail -1" % JOB)
    record = json.loads(log)
    assert record["result"] in ("success", "skipped_duplicate", "skipped_locked")
