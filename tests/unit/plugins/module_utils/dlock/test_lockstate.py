"""The schedule periods of `dlock metrics`: one systemd-analyze run for all
the distinct calendars of a node's timers (the refresh runs every 30 s by
default, on nodes with hundreds of jobs), each calendar on its own only when
that run refused one of them. Uses this machine's systemd-analyze, which
reads calendars without a running systemd."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import lockstate

pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")


@pytest.fixture
def analyze_runs(monkeypatch):
    """The argv of every systemd-analyze run the code under test makes."""
    runs = []
    real = subprocess.run

    def counted(argv, **kwargs):
        runs.append(argv)
        return real(argv, check=kwargs.pop("check"), **kwargs)

    monkeypatch.setattr(lockstate.subprocess, "run", counted)
    return runs


def timers(tmp_path, calendars):
    for job, calendar in calendars.items():
        (tmp_path / ("dlock-%s.timer" % job)).write_text("[Timer]\nOnCalendar=%s\nAccuracySec=1s\n" % calendar)
    return str(tmp_path)


def test_all_the_jobs_cost_one_systemd_analyze_run(tmp_path, analyze_runs):
    unit_dir = timers(tmp_path, dict([("job-%02d" % n, "*:0/5" if n % 2 else "hourly") for n in range(40)]
                                     + [("daily", "*-*-* 02:00:00"), ("weekly", "Mon *-*-* 00:00")]))
    periods = lockstate.schedule_periods(unit_dir, ["job-%02d" % n for n in range(40)] + ["daily", "weekly", "gone"])
    assert len(analyze_runs) == 1
    assert analyze_runs[0][4:] == sorted(["*:0/5", "hourly", "*-*-* 02:00:00", "Mon *-*-* 00:00"])  # each once
    assert periods["job-01"] == 300 and periods["job-00"] == 3600
    assert periods["daily"] == 86400 and periods["weekly"] == 7 * 86400
    assert "gone" not in periods  # no timer file


def test_a_calendar_systemd_refuses_leaves_the_others_told(tmp_path, analyze_runs):
    unit_dir = timers(tmp_path, {"good": "*:0/5", "bad": "every full moon", "other": "hourly"})
    periods = lockstate.schedule_periods(unit_dir, ["good", "bad", "other"])
    assert periods == {"good": 300, "other": 3600}
    assert len(analyze_runs) == 1 + 3  # the run for all of them, then one a calendar


def test_a_timer_with_two_calendars_or_none_has_no_period(tmp_path, analyze_runs):
    (tmp_path / "dlock-two.timer").write_text("[Timer]\nOnCalendar=hourly\nOnCalendar=daily\n")
    (tmp_path / "dlock-none.timer").write_text("[Timer]\nOnBootSec=5m\n")
    assert lockstate.schedule_periods(str(tmp_path), ["two", "none"]) == {}
    assert analyze_runs == []


def test_a_paused_job_exports_its_pause_and_an_active_one_a_zero():
    paused = {"job": "report", "key": "report", "held": False, "fence": 3, "last": None,
              "paused": {"scope": "all", "reason": "drill", "until": 1800.0, "by": "ops@n1", "at": 600.0}}
    active = {"job": "sync", "key": "sync", "held": False, "fence": 1, "last": None, "paused": None}
    samples = dict((name, values) for name, _kind, _help, values
                   in lockstate.families([paused, active], {}, None, 1000.0))
    assert samples["dlock_paused"] == [({"job": "report", "key": "report"}, 1), ({"job": "sync", "key": "sync"}, 0)]
    assert samples["dlock_pause_until_timestamp_seconds"] == [({"job": "report", "key": "report"}, 1800.0)]
    assert samples["dlock_pause_start_timestamp_seconds"] == [({"job": "report", "key": "report"}, 600.0)]
