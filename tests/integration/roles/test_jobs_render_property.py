"""Property tests of the job list: Hypothesis generates job entries, hostile
ones included; the dlock_jobs filter either refuses an entry with the field
named, or the role's renderer (module_utils/dlock_job_files.py, which the
dlock_job_units module writes with) renders units that systemd-analyze verify
accepts without a single warning and that hold exactly the intended settings.
The period the filter holds once_per to is the smallest gap between two
firings that systemd-analyze calendar lists for the same expression.

Rendering uses the role's defaults for its settings."""

from __future__ import annotations

import datetime
import os
import re
import subprocess

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_cli import ROOT
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ansible_collections.dlock.fleet.plugins.filter.dlock_jobs import dlock_jobs
from ansible_collections.dlock.fleet.plugins.module_utils import dlock_job_files as job_files
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.oncalendar import CALENDAR_SHORTHANDS
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_jobs import SCHEDULE, schedule_period
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.validate import CONTROL

ROLE = os.path.join(ROOT, "roles", "dlock_jobs")
CONTROL_CHARS = st.sampled_from(["\n", "\r", "\x00", "\t", "\x1b", "\x7f", "\x85", "\u2028", "\u2029"])
# Any text, with a control character thrown in often.
TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["100%", "%h on %H", "50%% done", "a\\", "ends\\ "]),
                 st.builds(lambda a, c, b: a + c + b, st.text(max_size=10), CONTROL_CHARS, st.text(max_size=10)))
NAMES = st.from_regex(r"\A[a-z][a-z0-9_.-]{0,20}\Z")
PATHS = st.from_regex(r"\A(/[a-z0-9_-][a-z0-9_.-]{0,7}){1,4}\Z")
VALID_FOR = {"MemoryMax": "100M", "Nice": "5", "CPUQuota": "50%", "TimeoutStartSec": "1h", "IOSchedulingClass": "idle"}
# Directives with values systemd takes, and settings that must be refused.
UNIT_SETTINGS = st.lists(st.one_of(
    st.sampled_from(sorted(VALID_FOR.items())),
    st.sampled_from([("ExecStartPre", "/bin/id"), ("User", "root"), ("Foo\nBar", "1"),
                     ("MemoryMax", "1G\nExecStartPre=/bin/id"), ("LoadCredential", "x:/etc/shadow")])),
    max_size=3).map(dict)
VALID_SETTINGS = st.lists(st.sampled_from(sorted(VALID_FOR.items())), max_size=3).map(dict)
SCHEDULES = st.one_of(st.sampled_from(["hourly", "*:0/5", "Mon..Fri *-*-* 02:00:00", "*-*-* 03:30:00 UTC"]), TEXT)


def mostly(valid, hostile, hostile_too=True):
    """Three draws in four from the valid strategy (or all, for rendering)."""
    return st.one_of(valid, valid, valid, hostile) if hostile_too else valid


# Printable ASCII without { and }: Ansible templates inventory values itself
# (a literal {{ needs !unsafe), which is not the filter's business.
DESCRIPTIONS = st.one_of(st.from_regex(r"\A[ -z|~]{1,30}\Z"), st.sampled_from(["100%", "%h on %H", "50%% done"]))


@st.composite
def job_entries(draw, hostile=True):
    entry = {"name": draw(mostly(NAMES, TEXT, hostile)), "command": ["/usr/bin/env", draw(st.text(max_size=20))],
             "schedule": draw(mostly(st.sampled_from(["hourly", "*:0/5", "Mon..Fri *-*-* 02:00:00",
                                                     "*-*-* 03:30:00 UTC"]), TEXT, hostile))}
    for field, strategy in (("description", mostly(DESCRIPTIONS, TEXT, hostile)), ("user", mostly(NAMES, TEXT, hostile)),
                            ("group", mostly(NAMES, TEXT, hostile)),
                            ("read_write_paths", st.lists(mostly(PATHS, TEXT, hostile), max_size=3)),
                            ("unit_settings", UNIT_SETTINGS if hostile else VALID_SETTINGS), ("working_directory", mostly(PATHS, TEXT, hostile)),
                            ("randomized_delay", mostly(st.sampled_from(["1s", "500ms", "0"]),
                                                        st.sampled_from(["NaN", "1e308", "2m\n", "-1s"]), hostile))):
        if draw(st.booleans()):
            entry[field] = draw(strategy)
    return entry


def _accepted(entry):
    """The filter's verdict: the normalised entry, or None (refused, named)."""
    try:
        return dlock_jobs([entry])[0]
    except AnsibleFilterError as exc:
        assert "dlock_jobs_list[0]" in str(exc)
        return None


def _render(tmp_path, jobs):
    """The two units of each job, rendered as the dlock_job_units module
    renders them, with the role's defaults (and no password file)."""
    out = tmp_path / "units"
    out.mkdir()
    with open(os.path.join(ROLE, "defaults", "main.yml")) as handle:
        defaults = yaml.safe_load(handle)
    settings = job_files.Settings(
        managed="managed by a test", runner_bin="/bin/true", jobs_dir="/etc/dlock/jobs", group="dlock",
        user=defaults["dlock_jobs_user"], hardening=defaults["dlock_jobs_hardening"],
        randomized_delay=defaults["dlock_jobs_randomized_delay"], accuracy=defaults["dlock_jobs_accuracy"],
        persistent=defaults["dlock_jobs_persistent"], password_path="/etc/dlock/backend.password",
        metrics_dir="/var/lib/prometheus/node-exporter", credential=False)
    for job in dlock_jobs(jobs):
        (out / job_files.service_name(job["name"])).write_text(job_files.service_unit(job, settings))
        (out / job_files.timer_name(job["name"])).write_text(job_files.timer_unit(job, settings))
    return out


def _settings(path):
    """{section: [(key, value)]} of a unit file, with %% read back as %."""
    sections, current = {}, None
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
            continue
        key, _sep, value = line.partition("=")
        current.append((key, value))
    return sections


def _expected(entry, job):
    """What the [Service] and [Unit] sections must say for this entry."""
    description = "dlock job %s" % job["name"] + (": %s" % entry["description"] if entry.get("description") else "")
    return {"Description": description.replace("%", "%%"), "User": entry.get("user", "root"),
            "Group": entry.get("group"), "OnCalendar": job["schedule"]}


@settings(max_examples=300, deadline=None)
@given(job_entries())
def test_an_entry_with_a_control_character_anywhere_is_refused(entry):
    strings = [v for v in entry.values() if isinstance(v, str)] + list(entry.get("read_write_paths", [])) \
        + [k + "=" + v for k, v in entry.get("unit_settings", {}).items()]
    if any(CONTROL.search(s) for s in strings):
        assert _accepted(entry) is None, entry


# No shrinking: each example renders 24 units; a failure is reported as found.
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck),
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(st.lists(job_entries(hostile=False), min_size=12, max_size=12))
def test_every_accepted_entry_renders_exactly_what_was_meant(tmp_path_factory, entries):
    accepted = []
    for index, entry in enumerate(entries):
        entry["name"] += "-%d" % index  # unique, so each entry renders its own units
        job = _accepted(entry)
        if job is not None:
            accepted.append((entry, job))
    if not accepted:
        return
    tmp_path = tmp_path_factory.mktemp("units")
    out = _render(tmp_path, [entry for entry, _job in accepted])
    files = sorted(str(p) for p in out.iterdir())
    assert len(files) == 2 * len(accepted)
    verify = subprocess.run(["systemd-analyze", "verify"] + files, capture_output=True, text=True, timeout=60,
                            check=False)
    # Any warning about a unit (unknown key, bad value, ignored line) is a failure.
    warnings = [line for line in (verify.stdout + verify.stderr).splitlines() if str(out) in line]
    assert verify.returncode == 0 and not warnings, verify.stdout + verify.stderr
    for entry, job in accepted:
        service = _settings(out / ("dlock-%s.service" % job["name"]))
        timer = _settings(out / ("dlock-%s.timer" % job["name"]))
        expected = _expected(entry, job)
        unit, svc = dict(service["Unit"]), service["Service"]
        assert unit["Description"] == expected["Description"]
        assert dict(svc)["User"] == expected["User"]
        assert dict(svc).get("Group") == expected["Group"]
        assert [v for k, v in svc if k == "ExecStart"] == ["/bin/true run --job %s" % job["name"]]
        # The unit's cgroup is the job's outer containment: stopping the unit kills every process of it.
        assert [v for k, v in svc if k == "KillMode"] == ["control-group"]
        assert dict(timer["Timer"])["OnCalendar"] == expected["OnCalendar"]
        for key, value in entry.get("unit_settings", {}).items():
            assert (key, value) in svc
        rw = dict(svc).get("ReadWritePaths", "").split()
        assert set(entry.get("read_write_paths", [])) <= set(rw)
        # Nothing but the intended settings: every [Service] key is one the role writes or the entry asked for.
        allowed = {"Type", "ExecStart", "SuccessExitStatus", "KillMode", "User", "Group", "SupplementaryGroups",
                   "SyslogIdentifier", "ReadWritePaths"} | set(job_files.HARDENING) | set(entry.get("unit_settings", {}))
        assert {k for k, _v in svc} <= allowed


@pytest.mark.parametrize("settings_, message", [
    ({"ExecStartPre": "/bin/id"}, "is set by the role and cannot be overridden"),
    ({"User": "root"}, "is set by the role and cannot be overridden"),
    ({"KillMode": "process"}, "is set by the role and cannot be overridden"),
    ({"Foo\nBar": "1"}, "holds a control character"),
    ({"MemoryMax": "1G\nExecStartPre=/bin/id"}, "holds a control character"),
])
def test_unit_settings_cannot_add_or_replace_what_runs(settings_, message):
    with pytest.raises(AnsibleFilterError, match=re.escape(message)):
        dlock_jobs([{"name": "x", "command": ["/bin/true"], "schedule": "hourly", "unit_settings": settings_}])


# -- the schedule's period ----------------------------------------------------
WEEKDAY_NAMES = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]


@st.composite
def calendar_component(draw, low, high, max_items=2, wildcard=True):
    """(text, values) of one OnCalendar component: * or a comma list of N,
    N..M, N/R (R at least a quarter of the range) and N..M/R; each item has
    at most 4 values, so that systemd-analyze lists enough days of them."""
    if wildcard and draw(st.integers(0, 4)) == 0:
        return "*", set(range(low, high + 1))
    items, values = [], set()
    for _index in range(draw(st.integers(1, max_items))):
        first = draw(st.integers(low, high))
        kind = draw(st.sampled_from(["value", "range", "repeat", "range-repeat"]))
        if kind == "value":
            items.append("%d" % first)
            values.add(first)
        elif kind == "range":
            last = draw(st.integers(first, min(high, first + 3)))
            items.append("%d..%d" % (first, last))
            values.update(range(first, last + 1))
        else:
            span = high - low
            step = draw(st.integers(max(1, span // 4), span))
            last = high if kind == "repeat" else draw(st.integers(first, high))
            if kind == "repeat" and first + step > high:  # systemd refuses N/R repeated past the end
                first = max(low, high - step)
            items.append("%d/%d" % (first, step) if kind == "repeat" else "%d..%d/%d" % (first, last, step))
            values.update(range(first, last + 1, step))
    return ",".join(items), values


@st.composite
def calendar_expressions(draw):
    """(expression, firings a day at most, whether the date is restricted)."""
    if draw(st.integers(0, 9)) == 0:  # a shorthand, any case
        name = draw(st.sampled_from(sorted(CALENDAR_SHORTHANDS)))
        every_day = {"minutely": 1440, "hourly": 24, "daily": 1, "weekly": 1}
        return (name.capitalize() if draw(st.booleans()) else name), every_day.get(name, 1), name not in every_day
    words = []
    if draw(st.booleans()):
        first = draw(st.integers(0, 6))
        last = draw(st.integers(first, 6))
        words.append(WEEKDAY_NAMES[first] if first == last else "%s..%s" % (WEEKDAY_NAMES[first], WEEKDAY_NAMES[last]))
    restricted = draw(st.booleans())
    if restricted:  # days of the month: one time a day, so 3000 firings cover 29 years
        months, _values = draw(calendar_component(1, 12, wildcard=True))
        days, _values = draw(calendar_component(1, 31, wildcard=False))
        words.append("*-%s-%s" % (months, days))
        words.append("%02d:%02d" % (draw(st.integers(0, 23)), draw(st.integers(0, 59))))
        per_day = 1
    else:
        if draw(st.booleans()):
            words.append("*-*-*")
        hours, hour_values = draw(calendar_component(0, 23))
        minutes, minute_values = draw(calendar_component(0, 59, wildcard=False))
        clock = "%s:%s" % (hours, minutes)
        per_day = len(hour_values) * len(minute_values)
        if draw(st.booleans()):
            seconds, second_values = draw(calendar_component(0, 59, max_items=1, wildcard=False))
            clock += ":" + seconds
            per_day *= len(second_values)
        words.append(clock)
    if draw(st.booleans()):
        words.append("UTC")
    return " ".join(words), per_day, restricted


def _firings(expression, iterations):
    """The times systemd-analyze calendar lists for the expression from 2000
    on, in UTC (its calendar ends in 2199); None if it refuses the expression."""
    done = subprocess.run(["systemd-analyze", "calendar", "--iterations=%d" % iterations,
                           "--base-time=2000-01-01 00:00:00", "--", expression],
                          env=dict(os.environ, TZ="UTC"), capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:  # systemd's own quirks (*:0:5..5 is refused, *:5..5 is not)
        assert "Failed to parse calendar specification" in done.stderr, done.stderr
        return None
    return [datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S")
            for stamp in re.findall(r"(?:Next elapse|Iter\. #\d+): \w{3} (\S+ \S+) UTC", done.stdout)]


YEAR = 366 * 86400.0


@settings(max_examples=150, deadline=None)
@given(calendar_expressions())
def test_the_period_is_the_smallest_gap_systemd_lists(case):
    """The filter's period is the smallest gap between consecutive firings
    that systemd lists: over 15 days for an every-day date (each gap of the
    week); over 2000-2098 for days of the month (the 28-year cycle of month
    lengths, leap years and weekdays, three times over; 2100 is no leap year).
    Where the smallest gap is over a year, the period is not below it, or not
    known: a once_per is at most 30 days."""
    expression, per_day, restricted = case
    firings = _firings(expression, 10000 if restricted else 15 * per_day + 1)
    if firings is None:
        return  # the node's preflight refuses it: no period to compare
    if restricted:  # at most 8 days a month, one time each: 10000 firings reach past 2099
        assert firings[-1].year >= 2099, (expression, firings[-1])
        firings = [firing for firing in firings if firing.year < 2099]
    else:
        assert firings[-1] - firings[0] >= datetime.timedelta(days=14), expression
    period = schedule_period(expression)
    gaps = [(later - earlier).total_seconds() for earlier, later in zip(firings, firings[1:])]
    if not gaps or min(gaps) > YEAR:
        assert period is None or period >= min(gaps), (expression, period)
    else:
        assert period == min(gaps), (expression, period, min(gaps))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.from_regex(SCHEDULE, fullmatch=True), calendar_expressions().map(lambda case: case[0]),
                 st.sampled_from(["*:0/0", "*:*:0/0.5", "*-02~03", "0..23/25:00", "9999:99", "*:0/9999",
                                  "Mon..Sun,Fri..Mon", "1/1:1/1:1/1", "*-*-* *:*:* *"])))
def test_any_schedule_text_gets_a_period_or_none(expression):
    """Whatever passes the schedule's pattern, the period is a positive number
    of seconds or None (not known): never an exception."""
    period = schedule_period(expression)
    assert period is None or period >= 1
