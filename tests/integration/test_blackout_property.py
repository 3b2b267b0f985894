"""Blackout windows (blackout.py) against rules written apart from the code:
which moments a daily, a weekday and a range window covers, for moments
from 1970 to 2100 (Hypothesis)."""

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.blackout import Blackout, check_blackout

DAY = 86400


def windows(*raw):
    return Blackout(check_blackout(list(raw), "blackout"))


def stamp(seconds):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


MOMENTS = st.integers(min_value=0, max_value=4102444800)  # 1970 to 2100


@settings(max_examples=300, deadline=None)
@given(hour=st.integers(0, 23), minute=st.integers(0, 59), length=st.integers(1, 7 * DAY), moment=MOMENTS)
def test_a_daily_window_covers_exactly_the_moments_within_its_length_of_an_opening(hour, minute, length, moment):
    daily = windows({"calendar": "%02d:%02d" % (hour, minute), "duration": length})
    opening = hour * 3600 + minute * 60
    # The latest opening at or before the moment, by arithmetic alone.
    latest = moment - (moment - opening) % DAY
    assert (daily.covering(moment) is not None) == (moment - latest < length)


@settings(max_examples=300, deadline=None)
@given(days=st.sets(st.integers(0, 6), min_size=1), length=st.integers(1, 3 * DAY), moment=MOMENTS)
def test_a_weekday_window_covers_a_moment_when_an_allowed_day_opened_within_its_length(days, length, moment):
    names = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
    weekly = windows({"calendar": "%s 00:00" % ",".join(names[day] for day in sorted(days)), "duration": length})
    # 1970-01-01 was a Thursday (3): the day `n` days after it is weekday (n + 3) % 7.
    openings = [n * DAY for n in range(moment // DAY - 8, moment // DAY + 1) if (n + 3) % 7 in days]
    expected = any(start <= moment < start + length for start in openings)
    assert (weekly.covering(moment) is not None) == expected


@settings(max_examples=200, deadline=None)
@given(start=MOMENTS, length=st.integers(1, 400 * DAY), moment=MOMENTS)
def test_a_range_covers_from_its_start_up_to_its_end(start, length, moment):
    ranged = windows({"from": stamp(start), "to": stamp(start + length)})
    assert (ranged.covering(moment) is not None) == (start <= moment < start + length)
