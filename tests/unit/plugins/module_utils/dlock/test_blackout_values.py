"""The job option `blackout` (blackout.py): its values through the one
validation core, hostile ones included, and which slots its windows black
out (tests/integration/test_blackout_property.py checks the rule against
arithmetic written apart from the code, with Hypothesis)."""

import calendar
import os

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.blackout import (
    MAX_WINDOWS, Blackout, check_blackout)
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.options import LockOptions

DAY = 86400
# Saturday 2026-11-28, 00:00 UTC.
SATURDAY = calendar.timegm((2026, 11, 28, 0, 0, 0))


def windows(*raw):
    return Blackout(check_blackout(list(raw), "blackout"))


def test_a_weekend_night_window_blacks_out_the_slots_whose_boundary_is_in_it():
    night = windows({"calendar": "Sat,Sun 22:00", "duration": "8h"})
    assert night.covering(SATURDAY + 22 * 3600) == "Sat,Sun 22:00 for 8h"
    assert night.covering(SATURDAY + 22 * 3600 - 1) is None
    assert night.covering(SATURDAY + DAY + 6 * 3600 - 1) == "Sat,Sun 22:00 for 8h"  # Sunday 05:59:59
    assert night.covering(SATURDAY + DAY + 6 * 3600) is None
    # Sunday night's opening runs into Monday morning; Monday night is not in it.
    assert night.covering(SATURDAY + 2 * DAY + 3600) == "Sat,Sun 22:00 for 8h"
    assert night.covering(SATURDAY + 2 * DAY + 22 * 3600) is None
    # A slot is judged by its boundary: hourly slots 22:00 to 05:00 Saturday night.
    hour = 3600
    first = (SATURDAY + 21 * hour) // hour
    assert [number - first for number in range(first, first + 10) if night.of_slot(number, hour)] == list(range(1, 9))


def test_a_range_and_the_first_window_that_covers_is_named():
    both = windows({"from": "2026-12-24T00:00:00Z", "to": "2026-12-27T00:00:00Z"},
                   {"calendar": "daily", "duration": "1h"})
    christmas = calendar.timegm((2026, 12, 25, 0, 30, 0))
    assert both.covering(christmas) == "2026-12-24T00:00:00Z to 2026-12-27T00:00:00Z"
    assert both.covering(calendar.timegm((2026, 12, 28, 0, 30, 0))) == "daily for 1h"
    assert both.covering(calendar.timegm((2026, 12, 28, 1, 0, 0))) is None


def test_days_of_the_month_and_a_window_of_a_week():
    month_end = windows({"calendar": "*-*-28 00:00 UTC", "duration": "7d"})
    assert month_end.covering(calendar.timegm((2026, 2, 28, 0, 0, 0))) is not None
    assert month_end.covering(calendar.timegm((2026, 3, 6, 23, 59, 59))) is not None  # 28 Feb + 7 days
    assert month_end.covering(calendar.timegm((2026, 3, 7, 0, 0, 0))) is None
    assert month_end.covering(calendar.timegm((2026, 3, 27, 0, 0, 0))) is None


def test_values_are_normalised_as_the_job_file_keeps_them():
    assert check_blackout([{"calendar": "Sat 01:00", "duration": "90m"}, {"from": "2026-12-24T00:00:00Z",
                                                                          "to": "2026-12-25T00:00:00Z"}], "b") == [
        {"calendar": "Sat 01:00", "duration": 5400.0},
        {"from": "2026-12-24T00:00:00Z", "to": "2026-12-25T00:00:00Z"}]
    # What the job file holds reads back the same (the runner parses it again).
    kept = check_blackout([{"calendar": "Sat 01:00", "duration": 5400.0}], "b")
    assert check_blackout(kept, "b") == kept


@pytest.mark.parametrize("raw,fragment", [
    ("Sat 22:00", "must be a list"),
    ({"calendar": "Sat 22:00", "duration": "1h"}, "must be a list"),
    ([], "needs at least 1 item"),
    ([{"calendar": "Sat 22:00", "duration": "1h"}] * (MAX_WINDOWS + 1), "has more than %d items" % MAX_WINDOWS),
    (["Sat 22:00"], "must be a mapping"),
    ([{"calendar": "Sat 22:00"}], "is {calendar, duration} or {from, to}"),
    ([{"calendar": "Sat 22:00", "duration": "1h", "to": "2026-12-24T00:00:00Z"}], "found the keys"),
    ([{"calendar": "Sat 22:00\n", "duration": "1h"}], "control character"),
    ([{"calendar": "Sat\x0022:00", "duration": "1h"}], "control character"),
    ([{"calendar": "", "duration": "1h"}], "must not be empty"),
    ([{"calendar": ["Sat 22:00"], "duration": "1h"}], "must be a string"),
    ([{"calendar": "Sat 22:00 Europe/Berlin", "duration": "1h"}], "blackout windows are in UTC"),
    ([{"calendar": "Sat 22:00:00.5", "duration": "1h"}], "is not a calendar this can read"),
    ([{"calendar": "*-*~01 00:00", "duration": "1h"}], "is not a calendar this can read"),
    ([{"calendar": "2027-01-01 00:00", "duration": "1h"}], "is not a calendar this can read"),
    ([{"calendar": "Caturday 22:00", "duration": "1h"}], "is not a calendar this can read"),
    ([{"calendar": "Sat 22:00", "duration": "NaN"}], "blackout[0].duration"),
    ([{"calendar": "Sat 22:00", "duration": float("nan")}], "blackout[0].duration"),
    ([{"calendar": "Sat 22:00", "duration": 1e308}], "above the maximum"),
    ([{"calendar": "Sat 22:00", "duration": "-1h"}], "blackout[0].duration"),
    ([{"calendar": "Sat 22:00", "duration": "8d"}], "above the maximum of 7d"),
    ([{"calendar": "Sat 22:00", "duration": 0}], "blackout[0].duration"),
    ([{"from": "2026-12-27T00:00:00Z", "to": "2026-12-24T00:00:00Z"}], "is not after from"),
    ([{"from": "2026-12-24T00:00:00Z", "to": "2026-12-24T00:00:00Z"}], "is not after from"),
    ([{"from": "2026-02-30T00:00:00Z", "to": "2026-03-24T00:00:00Z"}], "is not a valid date"),
    ([{"from": "NaN", "to": "2026-12-24T00:00:00Z"}], "is not a moment"),
    ([{"from": 1e308, "to": "2026-12-24T00:00:00Z"}], "is not a moment"),
    ([{"from": "2026-12-24T00:00:00+01:00", "to": "2026-12-25T00:00:00Z"}], "is not a moment"),
])
def test_hostile_values_are_refused_naming_the_field(raw, fragment):
    with pytest.raises(ConfigError) as failed:
        check_blackout(raw, "blackout")
    assert fragment in str(failed.value) and "blackout" in str(failed.value)


def test_a_fifo_where_a_window_belongs_is_no_window(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(str(fifo))
    with pytest.raises(ConfigError, match="is not a calendar this can read"):
        check_blackout([{"calendar": str(fifo), "duration": "1h"}], "blackout")


def test_a_blackout_needs_once_per_its_slots():
    with pytest.raises(ConfigError, match="give the job once_per"):
        LockOptions(blackout=[{"calendar": "daily", "duration": "1h"}])
    assert LockOptions(once_per="1h", blackout=[{"calendar": "daily", "duration": "1h"}]).blackout == [
        {"calendar": "daily", "duration": 3600.0}]
