"""Verify the runner and jobs roles on the lab nodes (pytest-testinfra)."""

import json

import pytest

testinfra_hosts = ["ansible://dlock_nodes"]

UNITS = ("dlock-sample-report.service", "dlock-sample-report.timer",
         "dlock-shell-line.service", "dlock-shell-line.timer")


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
    assert settings["backend"] == "redis://dlock@10.77.2.10:6379/0"
    assert "molecule-lab-password" not in config.content_string
    assert settings["password_file"] == "/etc/dlock/backend.password"
    secret = host.file("/etc/dlock/backend.password")
    assert (secret.mode, secret.user) == (0o600, "root")
    job = host.file("/etc/dlock/jobs/sample-report.json")
    assert (job.mode, job.group) == (0o640, "dlock")
    assert json.loads(job.content_string)["command"] == ["/bin/echo", "report"]
    shell = json.loads(host.file("/etc/dlock/jobs/shell-line.json").content_string)
    assert shell["command"][:2] == ["/bin/sh", "-c"]


@pytest.mark.parametrize("unit", UNITS)
def test_units_verify_clean(host, unit):
    path = "/etc/systemd/system/" + unit
    assert host.file(path).content_string.startswith("# Ansible managed")
    out = host.run("systemd-analyze verify %s", path)
    assert out.rc == 0 and out.stderr.strip() == "", out.stderr


def test_service_unit_runs_the_job_file_not_a_shell(host):
    unit = host.file("/etc/systemd/system/dlock-sample-report.service").content_string
    assert "ExecStart=/usr/local/bin/dlock run --job sample-report\n" in unit
    assert "SuccessExitStatus=73 74" in unit
    assert "ProtectSystem=strict" in unit and "NoNewPrivileges=yes" in unit
    assert "LoadCredential=dlock-backend:/etc/dlock/backend.password" in unit
    assert "ProtectSystem" not in host.file("/etc/systemd/system/dlock-shell-line.service").content_string


@pytest.mark.parametrize("timer", ["dlock-sample-report.timer", "dlock-shell-line.timer"])
def test_timers_enabled_and_listed(host, timer):
    assert host.service(timer).is_enabled
    assert host.service(timer).is_running
    assert timer in host.check_output("systemctl list-timers --all --no-pager")


def test_removed_job_leaves_nothing(host):
    for path in ("/etc/dlock/jobs/retired.json", "/etc/systemd/system/dlock-retired.timer",
                 "/etc/systemd/system/dlock-retired.service"):
        assert not host.file(path).exists


def test_job_runs_under_its_unit(host):
    out = host.run("systemctl start dlock-sample-report.service")
    assert out.rc == 0, out.stderr
    log = host.check_output("journalctl -u dlock-sample-report.service -o cat --no-pager | grep '^{' | tail -1")
    record = json.loads(log)
    assert record["result"] in ("success", "skipped_duplicate", "skipped_locked")
