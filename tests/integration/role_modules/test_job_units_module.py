"""The dlock_job_units module (the dlock_jobs role's write) run by real
`ansible` on a local connection, into a temporary directory, with no systemd
(this machine has none running: no systemctl is called): check mode with
--diff changes nothing and shows each file, a run writes them, a second run
changes nothing, a hostile entry fails with its field named and no
traceback. The module's logic, with a fake systemctl:
tests/unit/plugins/modules/test_dlock_job_units.py."""

import grp
import os

import pytest
from ansible_cli import run_module

JOBS = [{"name": "report", "command": ["/usr/bin/report"], "schedule": "hourly", "once_per": "1h",
         "environment": {"REPORT_TO": "ops"}},
        {"name": "old", "state": "absent"}]

pytestmark = pytest.mark.skipif(os.path.isdir("/run/systemd/system"), reason="would call this machine's systemctl")


def arguments(tmp_path, **changed):
    args = {"jobs": JOBS, "jobs_dir": str(tmp_path / "jobs"), "unit_dir": str(tmp_path / "units"),
            "group": grp.getgrgid(os.getgid()).gr_name, "password_path": str(tmp_path / "backend.password"),
            "runner_bin": str(tmp_path / "bin" / "dlock")}
    args.update(changed)
    return args


def files(tmp_path):
    """The files the module wrote (not the runner the fixture put there)."""
    return sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*")
                  if path.is_file() and path.parent.name != "bin")


@pytest.fixture
def node(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "units").mkdir()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "dlock").write_text("#!/bin/sh\n")  # what the runner role installs
    return tmp_path


def test_check_mode_then_a_run_then_a_run_that_changes_nothing(node):
    rc, result, output = run_module("dlock_job_units", arguments(node), "--check", "--diff")
    assert rc == 0 and result["changed"], output
    assert files(node) == []
    assert "+++ after: %s/units/dlock-report.timer" % node in output and "+OnCalendar=hourly" in output
    rc, result, output = run_module("dlock_job_units", arguments(node))
    assert rc == 0 and result["changed"] and not result["daemon_reload"], output
    assert result["jobs"]["report"]["files"] == [str(node / "jobs/report.json"), str(node / "units/dlock-report.service"),
                                                 str(node / "units/dlock-report.timer")]
    assert files(node) == ["jobs/report.json", "units/dlock-report.service", "units/dlock-report.timer"]
    assert (node / "units/dlock-report.service").read_text().startswith("# Ansible managed\n")
    rc, result, output = run_module("dlock_job_units", arguments(node))
    assert rc == 0 and not result["changed"], output
    rc, result, output = run_module("dlock_job_units", arguments(node, timers="started", write=False))
    assert rc == 0 and not result["changed"], output  # no systemd: no timer to start


@pytest.mark.parametrize("jobs, field", [
    ([dict(JOBS[0], schedule="hourly\nExecStartPre=/bin/id")], "dlock_jobs_list[0] (report): schedule"),
    ([dict(JOBS[0], randomized_delay="NaN")], "dlock_jobs_list[0] (report): randomized_delay"),
    ("report", "dlock_jobs_list"),
])
def test_a_hostile_entry_fails_with_its_field_named(node, jobs, field):
    rc, result, output = run_module("dlock_job_units", arguments(node, jobs=jobs))
    assert rc != 0, output
    assert result["msg"].startswith("dlock_job_units: ConfigError: ") and field in result["msg"], result["msg"]
    assert "Traceback" not in output and "exception" not in result
    assert files(node) == []
