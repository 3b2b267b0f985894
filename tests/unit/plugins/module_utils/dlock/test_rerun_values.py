"""The values of `dlock run --rerun SLOT --reason TEXT`, through the one
validation core, and the slot markers that record a run's outcome."""

import calendar

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.base import Slot, rerun_refusal
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.slots import (
    DONE, FAILED, marker_owner, marker_succeeded, outcome_marker, run_id)

HOUR = 3600.0
AT_FIVE = calendar.timegm((2026, 11, 27, 5, 0, 0))


@pytest.mark.parametrize("value", ["2026-11-27T05:00:00Z", "billing@2026-11-27T05:00:00Z"])
def test_a_slot_is_named_by_its_boundary_or_its_run_id(value):
    number = validate.rerun_slot(value, "--rerun", "billing", HOUR)
    assert number * HOUR == AT_FIVE
    # The run id a run of that slot gets is the one named: the job's idempotency key matches.
    assert run_id("billing", number, HOUR, 7) == "billing@2026-11-27T05:00:00Z"


def test_a_boundary_of_a_width_that_is_no_whole_hour():
    assert validate.rerun_slot("2026-11-27T05:07:30Z", "--rerun", "j", 90.0) * 90 == AT_FIVE + 450


@pytest.mark.parametrize("value,fragment", [
    ("2026-11-27T05:00:00Z\n", "holds a control character"),
    ("2026-11-27T05:00:00Z\x00", "holds a control character"),
    ("\u20282026-11-27T05:00:00Z", "holds a control character"),
    ("NaN", "is not a slot boundary"),
    ("inf", "is not a slot boundary"),
    ("1e308", "is not a slot boundary"),
    ("1795755600", "is not a slot boundary"),
    ("yesterday", "is not a slot boundary"),
    ("", "must not be empty"),
    ("2026-11-27 05:00:00", "is not a slot boundary"),
    ("2026-11-27T05:00:00", "is not a slot boundary"),
    ("2026-11-27T05:00:00+00:00", "is not a slot boundary"),
    ("2026-11-27T05:00:00.000Z", "is not a slot boundary"),
    ("2026-11-27t05:00:00z", "is not a slot boundary"),
    ("\uff12026-11-27T05:00:00Z", "is not a slot boundary"),
    ("2026-02-30T05:00:00Z", "is not a valid date and time"),
    ("2026-11-27T25:00:00Z", "is not a valid date and time"),
    ("0000-01-01T00:00:00Z", "is not a valid date and time"),
    ("2026-11-27T05:30:00Z", "is not a boundary of the job's once_per (1h)"),
    ("2026-11-27T05:00:01Z", "is not a boundary of the job's once_per (1h)"),
    ("other@2026-11-27T05:00:00Z", "is a run id of another job (this is billing)"),
    ("@2026-11-27T05:00:00Z", "is a run id of another job"),
    ("billing@billing@2026-11-27T05:00:00Z", "is a run id of another job"),
    ("billing#12", "is not a slot boundary"),
    ("x" * 300, "is longer than"),
])
def test_a_bad_slot_is_refused_naming_the_flag(value, fragment):
    with pytest.raises(ConfigError) as err:
        validate.rerun_slot(value, "--rerun", "billing", HOUR)
    message = str(err.value)
    assert message.startswith("--rerun: ") and fragment in message
    assert "\n" not in message and "\x00" not in message


@pytest.mark.parametrize("value", [None, 1795755600, 1.5e308, float("nan"), ["2026-11-27T05:00:00Z"], True])
def test_a_slot_that_is_no_string_is_refused(value):
    with pytest.raises(ConfigError, match="must be a string"):
        validate.rerun_slot(value, "--rerun", "billing", HOUR)


def test_a_job_without_once_per_has_no_slots_to_rerun():
    with pytest.raises(ConfigError, match="job billing has no once_per"):
        validate.rerun_slot("2026-11-27T05:00:00Z", "--rerun", "billing", None)


@pytest.mark.parametrize("value,fragment", [
    ("outage\n{\"result\": \"success\"}", "holds a control character"),
    ("outage\x00", "holds a control character"),
    ("outage\r", "holds a control character"),
    ("out\x1bage", "holds a control character"),
    ("out\u2029age", "holds a control character"),
    ("", "must not be empty"),
    ("   ", "must say why"),
    ("x" * 501, "is longer than 500"),
    (None, "must be a string"),
    (["outage"], "must be a string"),
    (12, "must be a string"),
])
def test_a_bad_reason_is_refused(value, fragment):
    with pytest.raises(ConfigError) as err:
        validate.reason(value)
    assert str(err.value).startswith("--reason: ") and fragment in str(err.value)


def test_a_reason_is_kept_as_given():
    assert validate.reason("provider outage, ticket #4711 (é)") == "provider outage, ticket #4711 (é)"


@pytest.mark.parametrize("owner", ["n1:12:abc", "done:1:ab", "failed:1:ab", "done", ""])
def test_a_marker_names_its_owner_whatever_outcome_it_records(owner):
    assert marker_owner(owner) == owner and not marker_succeeded(owner)
    assert marker_owner(outcome_marker(owner, "success")) == owner
    assert marker_succeeded(outcome_marker(owner, "success"))
    for result in ("failed", "lock_lost", None):
        marker = outcome_marker(owner, result)
        assert marker == FAILED + owner and marker_owner(marker) == owner and not marker_succeeded(marker)
    assert DONE.endswith(" ") and FAILED.endswith(" ")  # no owner token starts with a space


@pytest.mark.parametrize("number,current,marker,refusal", [
    (10, 10, "n1:1:ab", None),
    (9, 10, FAILED + "n1:1:ab", None),
    (10, 10, DONE + "n1:1:ab", "duplicate"),
    (10, 10, None, "unknown"),
    (11, 10, "n1:1:ab", "future"),
    (11, 10, None, "future"),
])
def test_the_rerun_rule(number, current, marker, refusal):
    assert rerun_refusal(number, current, marker) == refusal


def test_a_rerun_slot_needs_its_width():
    with pytest.raises(ValueError, match="needs its width"):
        Slot(10, 90.0, rerun=True)
    assert Slot(10, 90.0, 60.0, rerun=True).rerun
