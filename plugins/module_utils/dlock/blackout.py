"""Blackout windows: when a job's slots do not run (the job option `blackout`,
docs/runner.md "Blackout windows").

A window is either a calendar opening and a duration,
    {"calendar": "Sat,Sun 22:00", "duration": "8h"}   (every weekend night)
or one range,
    {"from": "2026-12-24T00:00:00Z", "to": "2026-12-27T00:00:00Z"},
all in UTC: the backend's clock has no time zone, and a window must mean the
same moment on every node. The calendar is the part of systemd's OnCalendar
grammar that oncalendar.py reads (weekdays, days of the month, times).

A once_per slot is blacked out when its boundary (N x once_per, the moment
its run id names) is in a window: [opening, opening + duration), [from, to).
That is a function of the slot's number alone, so the runner tells the
grant whether the slot it asks for is blacked out (base.Slot.blackout), and
the backend, inside the grant's atomic step, refuses it only once its own
clock says that slot is the one open; otherwise it answers with its slot,
which the runner judges in turn. A window is so judged on the backend's
clock, as a pause is, and never by a node's clock alone. A job without
once_per has no slot and cannot have a blackout (options.LockOptions).
"""

import datetime

from . import oncalendar, validate
from .errors import ConfigError

MAX_WINDOWS = 16
# A calendar window is at most a week long: a longer one is a range, or a pause.
MAX_CALENDAR_WINDOW = 7 * 86400.0
DAY = 86400
WINDOW_KEYS = (("calendar", "duration"), ("from", "to"))
UTC_NAMES = ("utc", "gmt", "z", "zulu", "etc/utc")


def check_blackout(raw, field):
    """The job option `blackout`: a list of at most MAX_WINDOWS windows,
    normalised ({calendar, duration in seconds} or {from, to} as written)."""
    return validate.items(raw, field, _window, max_items=MAX_WINDOWS, min_items=1)


def _window(raw, field):
    validate.mapping(raw, field)
    keys = tuple(sorted(raw))
    if keys == ("calendar", "duration"):
        duration = validate.duration(raw["duration"], "%s.duration" % field, 1.0, MAX_CALENDAR_WINDOW, positive=True)
        calendar = validate.text(raw["calendar"], "%s.calendar" % field, 100)
        _parse_calendar(calendar, "%s.calendar" % field)
        return {"calendar": calendar, "duration": duration}
    if keys == ("from", "to"):
        opens = validate.moment(raw["from"], "%s.from" % field)
        closes = validate.moment(raw["to"], "%s.to" % field)
        if closes <= opens:
            raise ConfigError("%s: to (%s) is not after from (%s)" % (field, raw["to"], raw["from"]))
        return {"from": raw["from"], "to": raw["to"]}
    raise ConfigError("%s: a window is {calendar, duration} or {from, to} (UTC); found the keys %s"
                      % (field, ", ".join(validate.shown(key) for key in keys) or "none"))


def _parse_calendar(expression, field):
    """(weekdays, (months, days) or None, the opening seconds of a day) of a
    window's calendar expression, in UTC; a ConfigError names what cannot be read."""
    words = oncalendar.words_of(expression)
    if words and words[-1][:1].isalpha() and (len(words) > 1 or oncalendar.weekdays(words[-1]) is None):
        zone = words.pop()
        if zone.lower() not in UTC_NAMES:
            raise ConfigError("%s: %s names the time zone %s; blackout windows are in UTC (the backend's clock "
                              "has no zone, and a window must mean one moment on every node): write its times "
                              "in UTC" % (field, validate.shown(expression), validate.shown(zone)))
    dates = oncalendar.firing_dates(words) if words else None
    opens = None if dates is None else oncalendar.firing_times(words)
    if opens is None:
        raise ConfigError("%s: %s is not a calendar this can read: [WEEKDAYS] [*-MONTH-DAY] HH:MM[:SS] with "
                          "whole seconds, any year (Sat,Sun 22:00; *-12-24 00:00; Mon..Fri 09:00), or a shorthand "
                          "(daily, weekly...)" % (field, validate.shown(expression)))
    return dates[0], dates[1], opens


class Blackout(object):
    """A job's windows, checked (check_blackout); `covering(moment)` judges one."""

    def __init__(self, windows):
        self.windows = []
        for index, window in enumerate(windows):
            if "calendar" in window:
                days_of_week, month_day, opens = _parse_calendar(window["calendar"], "blackout[%d]" % index)
                self.windows.append((_shown(window), window["duration"], (days_of_week, month_day, opens)))
            else:
                opens = validate.moment(window["from"], "blackout[%d].from" % index)
                closes = validate.moment(window["to"], "blackout[%d].to" % index)
                self.windows.append((_shown(window), closes - opens, opens))

    def covering(self, moment):
        """The first window that `moment` (epoch seconds, UTC) is in, as
        shown to operators, or None."""
        for shown, length, opening in self.windows:
            start = opening if not isinstance(opening, tuple) else _latest_opening(opening, moment, length)
            if start is not None and start <= moment < start + length:
                return shown
        return None

    def of_slot(self, number, width):
        """The window slot `number` of width `width` is blacked out by (its boundary is in it), or None."""
        return self.covering(number * width)


def _latest_opening(calendar, moment, length):
    """The latest opening of a calendar window at or before `moment` that may
    still cover it (no earlier than `length` before it), or None."""
    days_of_week, month_day, opens = calendar
    day = int(moment // DAY)
    for ordinal_day in range(day, int((moment - length) // DAY) - 1, -1):
        date = datetime.date(1970, 1, 1) + datetime.timedelta(days=ordinal_day)
        if date.weekday() not in days_of_week:
            continue
        if month_day is not None and (date.month not in month_day[0] or date.day not in month_day[1]):
            continue
        earlier = [second for second in opens if ordinal_day * DAY + second <= moment]
        if earlier:
            return ordinal_day * DAY + earlier[-1]
    return None


def _shown(window):
    if "calendar" in window:
        return "%s for %s" % (window["calendar"], validate.format_duration(window["duration"]))
    return "%s to %s" % (window["from"], window["to"])
