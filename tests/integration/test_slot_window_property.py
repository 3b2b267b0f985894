"""Property: a job the dlock_jobs filter accepts never has two nodes that
fire for one slot claim two slots (slots.py's window, the filter's check in
module_utils/dlock_jobs.py). Hypothesis picks the slot width, where the
schedule fires in it, the timer's randomized delay and accuracy, the clock
skew allowed and the node's time zone; each node is early by up to the skew
or late by up to the skew, the delay and the accuracy, on the backend's
clock. Whatever the filter accepts lands every such node in one slot."""

from __future__ import annotations

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
