"""The part of systemd's OnCalendar grammar that can be read without
systemd (systemd.time(7)): [WEEKDAYS] [[*-]MONTH-DAY] [HOUR:MINUTE[:SECOND]]
[TIME ZONE] with whole seconds and any year, and the shorthands (hourly,
daily...). The dlock_jobs role reads its schedules with it (their period,
and whether they fire in every once_per slot), the runner its blackout
windows (blackout.py). What is outside it reads as None: systemd-analyze
checks a schedule on the node, a blackout window refuses it.
"""

import re

# systemd's calendar shorthands, as the expressions they stand for (systemd.time(7));
# the names are case-insensitive, as systemd reads them.
CALENDAR_SHORTHANDS = {"minutely": "*-*-* *:*:00", "hourly": "*-*-* *:00:00", "daily": "*-*-* 00:00:00",
                       "weekly": "Mon *-*-* 00:00:00", "monthly": "*-*-01 00:00:00",
                       "quarterly": "*-01,04,07,10-01 00:00:00", "semiannually": "*-01,07-01 00:00:00",
                       "yearly": "*-01-01 00:00:00", "annually": "*-01-01 00:00:00"}
WEEKDAYS = (("mon", "monday"), ("tue", "tuesday"), ("wed", "wednesday"), ("thu", "thursday"), ("fri", "friday"),
            ("sat", "saturday"), ("sun", "sunday"))


# One calendar component item: N, N..M, N/R or N..M/R (a list of them is comma-separated).
CALENDAR_ITEM = re.compile(r"([0-9]{1,4})(?:\.\.([0-9]{1,4}))?(?:/([0-9]{1,4}))?")


def component_values(text, low, high):
    """The sorted values of one component of an OnCalendar expression (*, or a
    comma list of N, N..M, N/R, N..M/R), or None for anything else (fractions
    of a second, the last days of a month ~, values out of range)."""
    if text == "*":
        return list(range(low, high + 1))
    values = set()
    for item in text.split(","):
        match = CALENDAR_ITEM.fullmatch(item)
        if not match:
            return None
        first = int(match.group(1))
        step = int(match.group(3) or 1)
        last = int(match.group(2)) if match.group(2) else (high if match.group(3) else first)
        # What systemd refuses (a repetition wider than the component's range,
        # N/R repeated past its end: *:50/20) is left to systemd-analyze on the node.
        if not low <= first <= last <= high or not 1 <= step <= high - low:
            return None
        if match.group(3) and not match.group(2) and first + step > high:
            return None
        values.update(range(first, last + 1, step))
    return sorted(values)


def weekdays(text):
    """The weekday numbers (0 = Monday) of a weekday list (Mon..Fri,Sun), or None."""
    names = dict((name, number) for number, pair in enumerate(WEEKDAYS) for name in pair)
    days = set()
    for item in text.lower().split(","):
        first, _sep, last = item.partition("..")
        if first not in names or (last or first) not in names or names[first] > names[last or first]:
            return None
        days.update(range(names[first], names[last or first] + 1))
    return days


def words_of(expression):
    """The expression's words, a shorthand (hourly, daily...) spelt out."""
    words = expression.split()
    if words and words[0].lower() in CALENDAR_SHORTHANDS:
        words = CALENDAR_SHORTHANDS[words[0].lower()].split() + words[1:]
    return words


def firing_dates(words):
    """The weekdays and the (months, days) that the date words of an
    expression allow, taken off the front of `words`: (weekdays, None) when
    every day of every month is; None where it cannot be told."""
    days_of_week = set(range(7))
    if words and words[0][:1].isalpha():
        days_of_week = weekdays(words.pop(0))
        if days_of_week is None:
            return None
    month_day = None
    if words and "-" in words[0] and ":" not in words[0] and not words[0][:1].isalpha():
        parts = words.pop(0).split("-")
        if len(parts) == 3 and parts[0] != "*" or len(parts) not in (2, 3):
            return None  # a year named: the schedule ends
        months, days = component_values(parts[-2], 1, 12), component_values(parts[-1], 1, 31)
        if months is None or days is None:
            return None
        if (months, days) != (list(range(1, 13)), list(range(1, 32))):
            month_day = (months, days)
    return days_of_week, month_day


def firing_times(words):
    """The sorted seconds of the day at which an expression fires, from the
    time words left in `words` (a time zone last is dropped: the gaps stay
    what the expression says); None where it cannot be told, or when other
    words are left."""
    clock = ["00", "00", "00"]
    if words and ":" in words[0]:
        clock = words.pop(0).split(":") + ["00"]
        if len(clock) not in (3, 4):
            return None
    if words and words[-1][:1].isalpha():
        words.pop()
    if words:
        return None
    hours, minutes, seconds = (component_values(clock[0], 0, 23), component_values(clock[1], 0, 59),
                               component_values(clock[2], 0, 59))
    if hours is None or minutes is None or seconds is None:
        return None
    return sorted(h * 3600 + m * 60 + s for h in hours for m in minutes for s in seconds)
