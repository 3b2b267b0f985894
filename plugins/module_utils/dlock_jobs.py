# Copyright: dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The dlock_jobs role's job list, validated: the engine's validation core
(one source of truth for names, paths, durations, options and the timing
rule) applied to every entry, which comes back with only checked values, in
canonical form. The filter dlock.fleet.dlock_jobs runs it on the controller,
the module dlock.fleet.dlock_job_units again on the node (a module does not
trust its input): nothing of an entry reaches a unit or a job file without
having passed a validator. Beside the engine, not in module_utils/dlock/,
whose every file the runner role installs on the nodes."""

from __future__ import annotations

import datetime
import math
import re

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import oncalendar, validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.options import OPTION_NAMES, LockOptions
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.slots import COARSE_CLOCK_SCHEMES, edge_uncertainty, slot_lead

UNIT_KEYS = (
    "name", "command", "shell", "schedule", "randomized_delay", "accuracy", "persistent", "user", "group",
    "environment", "working_directory", "description", "state", "hardening", "read_write_paths",
    "unit_settings", "key", "groups",
)
# systemd calendar expressions ("Mon..Fri *-*-* 02:00:00 Europe/Berlin",
# "*:0/5", "hourly") never need %, \, quotes or other punctuation.
SCHEDULE = re.compile(r"[A-Za-z0-9 _*:,./~+-]+")
# What an operator coming from cron writes, and what OnCalendar says instead.
CRON_SHORTHANDS = {"@hourly": "hourly", "@daily": "daily", "@midnight": "daily", "@weekly": "weekly",
                   "@monthly": "monthly", "@yearly": "yearly", "@annually": "yearly"}
CRON_LINE = re.compile(r"[0-9*/,-]+(?: +[0-9*/,-]+){4}")  # five fields; an OnCalendar time has a ':'
DIRECTIVE = re.compile(r"[A-Z][A-Za-z0-9]{1,63}")
# Directives the role writes itself and that decide what runs, as whom and
# how a run is judged: unit_settings may not replace or add to them.
RESERVED_DIRECTIVES = ("Type", "User", "Group", "DynamicUser", "SupplementaryGroups", "SuccessExitStatus",
                       "KillMode", "SyslogIdentifier", "PermissionsStartOnly", "RemainAfterExit",
                       "RootDirectory", "RootImage", "LoadCredential", "LoadCredentialEncrypted",
                       "SetCredential", "SetCredentialEncrypted", "ImportCredential", "Environment",
                       "EnvironmentFile", "PassEnvironment", "UnsetEnvironment")


def _command(job, where):
    command = job.get("command")
    if isinstance(command, str):
        if not validate.boolean(job.get("shell", False), "%s: shell" % where):
            raise ConfigError("%s: command is a string; give an argv list, or set shell: true to run it with "
                              "/bin/sh -c (the string is then shell code)" % where)
        command = ["/bin/sh", "-c", command]
    return validate.argv(command, "%s: command" % where)


def _environment(values, where):
    field = "%s: environment" % where
    validate.mapping(values, field)
    # Numbers are common in YAML (PORT: 8080); they become their decimal text.
    as_text = {}
    for name, value in values.items():
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        as_text[name] = value
    return validate.environment(as_text, field)


def _unit_settings(values, where):
    field = "%s: unit_settings" % where
    validate.mapping(values, field)
    result = {}
    for name, value in values.items():
        validate.text(name, "%s: name" % field, 64, DIRECTIVE, "a systemd directive name such as MemoryMax")
        if name in RESERVED_DIRECTIVES or name.startswith("Exec"):
            raise ConfigError("%s.%s: is set by the role and cannot be overridden (it decides what runs, "
                              "as whom, or how a run is judged)" % (field, name))
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        result[name] = validate.unit_value(value, "%s.%s" % (field, name), 1024)
    return result


def _job_file(job, where, defaults, scheme):
    """The content of /etc/dlock/jobs/NAME.json for one job entry, and its
    lock options as the runner will see them (the runner's defaults, then the
    job's) under the rule of its backend (scheme None: the stricter rule)."""
    content = {"command": _command(job, where),
               "environment": _environment(job.get("environment") or {}, where)}
    options = dict((k, job[k]) for k in OPTION_NAMES if job.get(k) is not None)
    effective = dict((k, v) for k, v in defaults.items() if k in OPTION_NAMES)
    effective.update(options)
    lock_options = LockOptions.from_mapping(effective, where, scheme)  # raises with the field's name
    if job.get("key") is not None:
        content["key"] = validate.lock_key(job["key"], "%s: key" % where)
    if job.get("groups") is not None:
        content["groups"] = validate.groups(job["groups"], "%s: groups" % where)
    if job.get("working_directory") is not None:
        content["working_directory"] = validate.path(job["working_directory"], "%s: working_directory" % where)
    if job.get("description"):
        content["description"] = validate.unit_value(job["description"], "%s: description" % where)
    content.update(options)
    return content, lock_options


def _check_slot_window(job, where, lock_options, defaults, schedule, scheme):
    """Every node that fires for one slot must claim it (slots.py): on the
    backend's clock a node is at most max_clock_skew early, which the slot's
    lead covers, and late by the skew, the timer's randomized delay and
    accuracy, and the backend's own uncertainty at a window's edge
    (slots.edge_uncertainty); all of that after the firing's place in its
    slot, in any time zone the node may be in (_latest_phase), must end
    before the next slot's window opens, the lead before its boundary. The
    job's once_per, else the runner's default one (lock_options has merged
    them, as the runner does)."""
    once_per = lock_options.once_per
    if once_per is None:
        return
    field = "once_per" if job.get("once_per") is not None else "once_per of dlock_runner_defaults"
    timer = {}
    for name, default_name in (("randomized_delay", "dlock_jobs_randomized_delay"), ("accuracy", "dlock_jobs_accuracy")):
        if job.get(name) is not None:
            timer[name] = validate.duration(job[name], "%s: %s" % (where, name))
        else:  # the role's default, which the timer uses too
            timer[name] = validate.duration(defaults[name], default_name)
    skew = lock_options.max_clock_skew  # the job's, else the runner's default, else the engine's
    phase, zone_bound = _latest_phase(schedule, once_per, "%s: schedule" % where)
    edge = edge_uncertainty(scheme)
    late = timer["randomized_delay"] + timer["accuracy"] + skew + edge
    if phase + late + slot_lead(once_per, skew) < once_per:
        return
    fired = ""
    if phase:
        fired = "the schedule can fire %s after a slot's boundary%s, and that + " % (
            _span(phase),
            " in some time zone (a zone's offset is a multiple of 15 minutes: name UTC in the schedule to fix it)"
            if zone_bound else "")
    backend = ""
    if edge:
        backend = " + the backend's clock resolution (%s: %s, or the backend is not known)" % (
            validate.format_duration(edge), "/".join(COARSE_CLOCK_SCHEMES))
    raise ConfigError("%s: %srandomized_delay (%s) + accuracy (%s) + 2 x max_clock_skew (%s)%s must stay below %s (%s), "
                      "or nodes that fire for one slot could claim two and run twice; lower the delay or the accuracy, "
                      "or make once_per longer"
                      % (where, fired, validate.format_duration(timer["randomized_delay"]),
                         validate.format_duration(timer["accuracy"]), validate.format_duration(skew), backend, field,
                         validate.format_duration(once_per)))


def _span(seconds):
    """Whole seconds as days, hours, minutes and seconds: 6d23h45m, 59m59s."""
    seconds, parts = int(seconds), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append("%d%s" % (seconds // size, unit))
            seconds %= size
    return "".join(parts) or "0s"


# Every time zone's offset from UTC is a multiple of 15 minutes.
ZONE_STEP = 900
ANY_ZONE = tuple(range(0, 86400, ZONE_STEP))
UTC_ZONES = ("utc", "gmt", "uct", "universal", "zulu", "etc/utc", "etc/gmt", "etc/uct", "etc/universal", "etc/zulu")


def _latest_phase(schedule, width, field):
    """(the latest a firing of the schedule can fall after a slot's
    boundary, seconds; whether that is so only in some time zone). A firing
    at second s of a local day is at UTC day x 86400 + s - offset: over all
    days its place in a slot of W seconds is (s - offset) mod g, g =
    gcd(W, 1 day), plus any multiple of g below W (exactly (s - offset) mod
    W where W divides a day). The days the date words allow are not used:
    they only make the latest place less likely, never later. The offsets
    are the zone's when the schedule names UTC, every multiple of 15 minutes
    otherwise (the node's zone, or a zone this check does not look up)."""
    firings = schedule_times(schedule)
    if firings is None:
        raise ConfigError("%s: %s: its firing times cannot be read here (hours, minutes and whole seconds as N, "
                          "N..M, N/R or lists of them), so whether every node that fires for a once_per slot claims "
                          "that slot cannot be checked; write the times so" % (field, validate.shown(schedule)))
    seconds, zone = firings
    width = int(width)
    step = math.gcd(width, 86400)
    offsets = (0,) if zone in UTC_ZONES else ANY_ZONE
    here = width - step + max(second % step for second in seconds)
    anywhere = width - step + max((second - offset) % step for second in seconds for offset in offsets)
    return float(anywhere), anywhere > here


def _firing_days(weekdays, month_day):
    """The days (ordinals) a schedule fires on, over enough days to hold its
    smallest gap between two of them."""
    if month_day is None:  # every day of every month: any 15 days hold each gap of the week
        months, days = set(range(1, 13)), set(range(1, 32))
        first, last = datetime.date(2000, 1, 3), datetime.date(2000, 1, 18)
    else:
        # Month lengths, leap years and weekdays repeat every 28 years from
        # 1901 to 2099: 29 years hold every gap of a month or less.
        months, days = set(month_day[0]), set(month_day[1])
        first, last = datetime.date(2000, 1, 1), datetime.date(2029, 1, 1)
    found = []
    for ordinal in range(first.toordinal(), last.toordinal()):
        day = datetime.date.fromordinal(ordinal)
        if day.weekday() in weekdays and day.month in months and day.day in days:
            found.append(ordinal)
    return found


def schedule_times(expression):
    """(the seconds of the day at which an OnCalendar expression fires, its
    time zone in lower case or None: the node's own), or None where the time
    words cannot be read (schedule_period's grammar for them). The date
    words (weekdays, days of the month, a year, ~) are not read."""
    words = oncalendar.words_of(expression)
    zone = None
    if words and words[-1][:1].isalpha() and (len(words) > 1 or oncalendar.weekdays(words[-1]) is None):
        zone = words.pop().lower()
    clock = [word for word in words if ":" in word]
    if len(clock) > 1:
        return None
    times = oncalendar.firing_times(clock)
    return None if times is None else (times, zone)


def schedule_period(expression):
    """The smallest gap, in seconds, between two firings of an OnCalendar
    expression, or None where it cannot be told from the expression alone.

    Known: the shorthands (hourly, daily...), and [WEEKDAYS] [[*-]MONTH-DAY]
    [HOUR:MINUTE[:SECOND]] [TIME ZONE] with whole seconds and any year (*).
    Not known, and so not checked here: a year named (a schedule that ends),
    the last days of a month (~), fractions of a second. The gap is nominal,
    in the expression's own time: a daylight saving change that makes one
    local day 23 hours long does not make 'daily' a 23-hour period."""
    words = oncalendar.words_of(expression)
    if not words:
        return None
    dates = oncalendar.firing_dates(words)
    times = None if dates is None else oncalendar.firing_times(words)
    if times is None:
        return None
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    days = _firing_days(*dates)
    if len(days) > 1:  # from the last firing of one day to the first of the next
        gaps.append(min(later - earlier for earlier, later in zip(days, days[1:])) * 86400 - (times[-1] - times[0]))
    return float(min(gaps)) if gaps else None


def schedule_every(expression):
    """The gap, in seconds, of an OnCalendar expression that fires at equal
    gaps (every day at the same times, or on every Nth day once), or None:
    a schedule with unequal gaps (weekdays only, the days of a month), or one
    that cannot be told from the expression (schedule_period's grammar). A
    job whose once_per is this gap expects a run in every slot: the runner
    counts a slot with none as missed (the job file's every_slot)."""
    words = oncalendar.words_of(expression)
    if not words:
        return None
    dates = oncalendar.firing_dates(words)
    times = None if dates is None else oncalendar.firing_times(words)
    if times is None or dates[1] is not None:
        return None
    days = _firing_days(*dates)
    day_gaps = set(later - earlier for earlier, later in zip(days, days[1:]))
    if len(day_gaps) != 1:
        return None
    (every_days,) = day_gaps
    if len(times) == 1:
        return float(every_days * 86400)
    gaps = set(later - earlier for earlier, later in zip(times, times[1:]))
    gaps.add(86400 - (times[-1] - times[0]))  # from the day's last firing to the next day's first
    return float(gaps.pop()) if every_days == 1 and len(gaps) == 1 else None


def _check_period(job, where, lock_options, schedule):
    """A slot longer than the schedule's period swallows firings silently:
    hourly with once_per 1d runs once a day. Checked where the period is
    known from the expression (schedule_period); elsewhere not."""
    if lock_options.once_per is None:
        return
    period = schedule_period(schedule)
    if period is None or lock_options.once_per <= period:
        return
    field = "once_per" if job.get("once_per") is not None else "once_per of dlock_runner_defaults"
    raise ConfigError("%s: %s (%s) is longer than the period of its schedule %s (%s, the shortest time between "
                      "two firings): it would run once per %s and skip the other firings; make once_per %s or "
                      "less, or the schedule sparser"
                      % (where, field, validate.format_duration(lock_options.once_per), validate.shown(schedule),
                         validate.format_duration(period), validate.format_duration(lock_options.once_per),
                         validate.format_duration(period)))


def _schedule(value, where):
    """The job's OnCalendar expression (systemd-analyze checks it on the node,
    in the role's preflight); cron's forms are refused with what to write."""
    field = "%s: schedule" % where
    if isinstance(value, str) and value.strip() in CRON_SHORTHANDS:
        raise ConfigError("%s: %s is cron's shorthand; a systemd OnCalendar expression writes it %s"
                          % (field, validate.shown(value), CRON_SHORTHANDS[value.strip()]))
    if isinstance(value, str) and CRON_LINE.fullmatch(value.strip()):
        raise ConfigError("%s: %s is a cron line; write a systemd OnCalendar expression instead (cron's "
                          "'0 3 * * *' is '*-*-* 03:00:00'; see systemd.time(7))" % (field, validate.shown(value)))
    return validate.text(value, field, 256, SCHEDULE, "a systemd OnCalendar expression")


def _present(job, where, defaults, timer_defaults, scheme):
    """The checked fields of a present job, for its unit files."""
    if job.get("schedule") is None:
        raise ConfigError("%s: schedule (a systemd OnCalendar expression) is required" % where)
    content, lock_options = _job_file(job, where, defaults, scheme)
    entry = {
        "name": job["name"], "state": "present",
        "schedule": _schedule(job["schedule"], where),
        "file": content,
    }
    _check_slot_window(job, where, lock_options, timer_defaults, entry["schedule"], scheme)
    _check_period(job, where, lock_options, entry["schedule"])
    if lock_options.once_per is not None and schedule_every(entry["schedule"]) == lock_options.once_per:
        content["every_slot"] = True  # a slot with no run is a missed one (the runner counts it: history.py)
    if lock_options.catches_up and not content.get("every_slot"):
        raise ConfigError("%s: catch_up: policy %s needs a schedule that fires in every once_per slot (%s does not "
                          "with once_per %s, or cannot be told from the expression): it would run slots that were "
                          "never due" % (where, lock_options.catch_up["policy"], validate.shown(entry["schedule"]),
                                         validate.format_duration(lock_options.once_per)))
    for name in ("randomized_delay", "accuracy"):
        if job.get(name) is not None:
            entry[name + "_sec"] = "%gs" % validate.duration(job[name], "%s: %s" % (where, name))
    for name in ("persistent", "hardening"):
        if job.get(name) is not None:
            entry[name] = validate.boolean(job[name], "%s: %s" % (where, name))
    for name in ("user", "group"):
        if job.get(name) is not None:
            entry[name] = validate.unix_name(job[name], "%s: %s" % (where, name))
    if job.get("description"):
        entry["description"] = entry["file"]["description"]
    entry["read_write_paths"] = validate.items(job.get("read_write_paths") or [], "%s: read_write_paths" % where,
                                               validate.path)
    entry["unit_settings"] = _unit_settings(job.get("unit_settings") or {}, where)
    return entry


def _entry(job, index, seen, defaults, timer_defaults, scheme):
    where = "dlock_jobs_list[%d]" % index
    validate.mapping(job, where)
    name = validate.job_name(job.get("name"), "%s: name" % where)
    where = "dlock_jobs_list[%d] (%s)" % (index, name)
    if name in seen:
        raise ConfigError("%s: duplicate job name; each job needs its own name" % where)
    seen.add(name)
    unknown = sorted(set(job) - set(UNIT_KEYS) - set(OPTION_NAMES))
    if unknown:
        raise ConfigError("%s: unknown field %s" % (where, ", ".join(validate.shown(k) for k in unknown)))
    state = job.get("state", "present")
    if state not in ("present", "absent"):
        raise ConfigError("%s: state must be present or absent" % where)
    if state == "absent":
        return {"name": name, "state": "absent"}
    return _present(job, where, defaults, timer_defaults, scheme)


def validate_jobs(jobs, defaults=None, randomized_delay=0, backend_url="", accuracy="1s"):
    """Validated jobs: only checked values, each present job with `file` (the
    job file's content). `randomized_delay` and `accuracy` are the role's
    defaults for the timers;
    `backend_url` the runners' backend, whose scheme decides the timing rule
    ('' when not known: the stricter rule of a backend on a wall clock).
    ConfigError names the entry and its field."""
    validate.items(jobs, "dlock_jobs_list", lambda job, field: job, max_items=1000)
    defaults = validate.mapping(defaults or {}, "dlock_runner_defaults")
    scheme = validate.backend_url(backend_url, "dlock_jobs_backend_url").scheme if backend_url else None
    LockOptions.from_mapping(dict((k, v) for k, v in defaults.items() if k in OPTION_NAMES),
                             "dlock_runner_defaults", scheme)
    seen = set()
    timer_defaults = {"randomized_delay": randomized_delay, "accuracy": accuracy}
    return [_entry(job, index, seen, defaults, timer_defaults, scheme) for index, job in enumerate(jobs)]
