"""Property: a job the dlock_jobs filter accepts never has two nodes that
fire for one slot claim two slots (slots.py's window, the filter's check in
module_utils/dlock_jobs.py). Hypothesis picks the slot width, where the
schedule fires in it, the timer's randomized delay and accuracy, the clock
skew allowed and the node's time zone; each node is early by up to the skew
or late by up to the skew, the delay and the accuracy, on the backend's
clock. Whatever the filter accepts lands every such node in one slot."""

from __future__ import annotations

import datetime
import os
import re
import subprocess

import pytest
from ansible.errors import AnsibleFilterError
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.dlock.fleet.plugins.filter.dlock_jobs import dlock_jobs
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.slots import slot_lead, slot_number


def _schedule(width, phase):
    """An expression that fires every `width` seconds, `phase` seconds after
    each multiple of it in the node's day (width divides a day)."""
    if width == 86400:
        return "*-*-* %02d:%02d:%02d" % (phase // 3600, phase // 60 % 60, phase % 60)
    if width == 3600:
        return "*:%02d:%02d" % (phase // 60, phase % 60)
    if width == 300:
        return "*:%d/5:%02d" % (phase // 60, phase % 60)
    if width == 60:
        return "*:*:%02d" % phase
    return "*:*:%d/%d" % (phase, width)


@st.composite
def cases(draw):
    width = draw(st.sampled_from([5, 10, 60, 300, 3600, 86400]))
    phase = draw(st.integers(0, width - 1) | st.sampled_from([0, width - 1, width // 2]))
    utc = draw(st.booleans())
    offset = 0 if utc else draw(st.integers(-48, 56)) * 900  # UTC-12:00 to UTC+14:00, in quarter hours
    return {
        "width": width, "phase": phase, "utc": utc, "offset": offset,
        "delay": draw(st.sampled_from([0, 0.5, 1, 2, 30, 600, 900, 3600])),
        "accuracy": draw(st.sampled_from([0.1, 1, 60])),
        "skew": draw(st.sampled_from([0, 0.25, 0.5, 2])),
        "day": draw(st.integers(19000, 25000)),
    }


@settings(max_examples=500, deadline=None)
@given(cases())
def test_every_node_firing_for_a_slot_claims_that_slot(case):
    width = case["width"]
    job = {"name": "report", "command": ["/usr/bin/report"], "ttl": "10m", "once_per": "%ds" % width,
           "schedule": _schedule(width, case["phase"]) + (" UTC" if case["utc"] else ""),
           "randomized_delay": "%gs" % case["delay"], "accuracy": "%gs" % case["accuracy"],
           "max_clock_skew": "%gs" % case["skew"]}
    try:
        dlock_jobs([job])
    except AnsibleFilterError as exc:
        assert "must stay below once_per" in str(exc)
        return
    # Local time is UTC + offset: the node's firing, in backend (UTC) seconds.
    fired = case["day"] * 86400 + case["phase"] - case["offset"]
    lead = slot_lead(width, case["skew"])
    earliest = fired - case["skew"]
    latest = fired + case["skew"] + case["delay"] + case["accuracy"]
    assert slot_number(earliest, width, lead) == slot_number(latest, width, lead), (job, case)


@pytest.mark.parametrize("width", [5.0, 60.0, 3600.0, 86400.0])
@settings(max_examples=200, deadline=None)
@given(boundary=st.integers(0, 10 ** 6), skew=st.floats(0.0, 5.0), early=st.floats(0.0, 1.0),
       late=st.floats(0.0, 0.999))
def test_a_slot_holds_its_lead_before_and_the_rest_after_its_boundary(width, boundary, skew, early, late):
    """slots.py's window: from the lead before the boundary to the lead
    before the next one."""
    lead = slot_lead(width, skew)
    at = boundary * width
    assert slot_number(at - early * lead, width, lead) == boundary
    assert slot_number(at + late * (width - lead), width, lead) == boundary
    assert slot_number(at + width - lead, width, lead) == boundary + 1


# -- the filter against systemd's own firings ------------------------------------
# Zones whose offsets are not whole hours, and one with daylight saving time.
ZONES = ["UTC", "Europe/Berlin", "Asia/Kathmandu", "Asia/Tehran", "America/St_Johns", "Australia/Eucla"]
EXPRESSIONS = ["hourly", "daily", "weekly", "monthly", "*:0/5", "*:0/10", "*:*:0/5", "*:*:0/10", "Mon 00:30",
               "Thu *-*-* 00:30", "*-*~01 23:30", "*:59:59", "*:30", "Sat,Sun 23:50", "*-*-* 12:00"]
WIDTHS = [5, 10, 60, 300, 420, 3600, 86400, 7 * 86400, 28 * 86400]
BACKENDS = {"redis://127.0.0.1:6379/0": 0.0, "etcd://127.0.0.1:2379": 1.0, "": 1.0}


def _firings_in_utc(expression, zone, iterations=150):
    """The UTC epoch seconds of the firings systemd-analyze lists on a node in `zone`."""
    done = subprocess.run(["systemd-analyze", "calendar", "--iterations=%d" % iterations,
                           "--base-time=2026-03-20 00:00:00", "--", expression],
                          env=dict(os.environ, TZ=zone), capture_output=True, text=True, timeout=60, check=True)
    stamps = re.findall(r"\(in UTC\): \w{3} (\S+ \S+) UTC", done.stdout)
    if not stamps:  # the node is in UTC, or the expression names it: no second line
        stamps = re.findall(r"(?:Next elapse|Iter\. #\d+): \w{3} (\S+ \S+) UTC", done.stdout)
    assert stamps, done.stdout
    return [datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=datetime.timezone.utc).timestamp()
            for stamp in stamps]


@settings(max_examples=200, deadline=None)
@given(expression=st.sampled_from(EXPRESSIONS), utc=st.booleans(), zone=st.sampled_from(ZONES),
       width=st.sampled_from(WIDTHS), delay=st.sampled_from([0, 1, 2, 30, 300, 900, 3600]),
       accuracy=st.sampled_from([0.1, 1, 60]), skew=st.sampled_from([0, 0.25, 0.5, 2]),
       backend=st.sampled_from(sorted(BACKENDS)))
def test_systemds_firings_of_an_accepted_job_each_land_in_one_slot(
        expression, utc, zone, width, delay, accuracy, skew, backend):
    """Whatever the filter accepts, each firing systemd computes for a node
    in any of these zones, early by the skew or late by the skew, delay,
    accuracy and the backend's edge uncertainty, is in one slot."""
    schedule = expression + (" UTC" if utc else "")
    job = {"name": "report", "command": ["/usr/bin/report"], "ttl": "10m", "once_per": "%ds" % width,
           "schedule": schedule, "randomized_delay": "%gs" % delay, "accuracy": "%gs" % accuracy,
           "max_clock_skew": "%gs" % skew}
    try:
        dlock_jobs([job], backend_url=backend)
    except AnsibleFilterError as exc:
        assert "must stay below" in str(exc) or "longer than the period" in str(exc), str(exc)
        return
    lead = slot_lead(width, skew)
    for fired in _firings_in_utc(schedule, zone):
        earliest, latest = fired - skew, fired + skew + delay + accuracy + BACKENDS[backend]
        assert slot_number(earliest, width, lead) == slot_number(latest, width, lead), (job, zone, fired)


def test_what_the_zone_rule_refuses_does_split_in_a_real_zone():
    """`*:30` hourly with a 15-minute delay: on a node in Kathmandu (+5:45)
    systemd fires it at :45 UTC, and a node late by the delay claims the next
    slot while a prompt one claims this one. The filter refuses it unless
    the schedule names UTC."""
    job = {"name": "report", "command": ["/usr/bin/report"], "ttl": "10m", "once_per": "1h", "schedule": "*:30",
           "randomized_delay": "15m", "max_clock_skew": "500ms"}
    with pytest.raises(AnsibleFilterError, match="45m after a slot's boundary in some time zone"):
        dlock_jobs([job], backend_url="redis://127.0.0.1:6379/0")
    lead = slot_lead(3600, 0.5)
    split = [fired for fired in _firings_in_utc("*:30", "Asia/Kathmandu", 24)
             if slot_number(fired, 3600, lead) != slot_number(fired + 15 * 60 + 1.5, 3600, lead)]
    assert len(split) == 24
    assert dlock_jobs([dict(job, schedule="*:30 UTC")], backend_url="redis://127.0.0.1:6379/0")
