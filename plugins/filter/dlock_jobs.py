# Copyright: dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter `dlock.fleet.dlock_jobs`: validates the dlock_jobs role's job list
with the engine's validation core (one source of truth for names, paths,
durations, options and the timing rule) and returns only checked values, in
canonical form, for the templates: nothing of an entry reaches a unit or a
job file without having passed a validator."""

from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.options import OPTION_NAMES, LockOptions

UNIT_KEYS = (
    "name", "command", "shell", "schedule", "randomized_delay", "accuracy", "persistent", "user", "group",
    "environment", "working_directory", "description", "state", "hardening", "read_write_paths",
    "unit_settings", "key",
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
    if job.get("working_directory") is not None:
        content["working_directory"] = validate.path(job["working_directory"], "%s: working_directory" % where)
    if job.get("description"):
        content["description"] = validate.unit_value(job["description"], "%s: description" % where)
    content.update(options)
    return content, lock_options


def _check_slot_window(job, where, lock_options, default_delay):
    """Timers fire at a boundary plus randomized delay (plus skew): all of that
    must fit in half a slot, or nodes could land in different slots."""
    if not job.get("once_per"):
        return
    once_per = validate.duration(job["once_per"], "%s: once_per" % where)
    if job.get("randomized_delay") is not None:
        delay = validate.duration(job["randomized_delay"], "%s: randomized_delay" % where)
    else:  # the role's default, which the timer uses too
        delay = validate.duration(default_delay, "dlock_jobs_randomized_delay")
    skew = lock_options.max_clock_skew  # the job's, else the runner's default, else the engine's
    if delay + skew >= once_per / 2:
        raise ConfigError("%s: randomized_delay (%s) + max_clock_skew (%s) must stay below half of once_per "
                          "(%s), or nodes that fire in the same slot could see different slots"
                          % (where, validate.format_duration(delay), validate.format_duration(skew),
                             validate.format_duration(once_per)))


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


def _present(job, where, defaults, default_delay, scheme):
    """The checked fields of a present job, for the templates."""
    if job.get("schedule") is None:
        raise ConfigError("%s: schedule (a systemd OnCalendar expression) is required" % where)
    content, lock_options = _job_file(job, where, defaults, scheme)
    entry = {
        "name": job["name"], "state": "present",
        "schedule": _schedule(job["schedule"], where),
        "file": content,
    }
    _check_slot_window(job, where, lock_options, default_delay)
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


def _entry(job, index, seen, defaults, default_delay, scheme):
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
    return _present(job, where, defaults, default_delay, scheme)


def dlock_jobs(jobs, defaults=None, randomized_delay=0, backend_url=""):
    """Validated jobs: only checked values, each present job with `file` (the
    job file's content). `randomized_delay` is the role's default delay;
    `backend_url` the runners' backend, whose scheme decides the timing rule
    ('' when not known: the stricter rule of a backend on a wall clock)."""
    try:
        validate.items(jobs, "dlock_jobs_list", lambda job, field: job, max_items=1000)
        defaults = validate.mapping(defaults or {}, "dlock_runner_defaults")
        scheme = validate.backend_url(backend_url, "dlock_jobs_backend_url").scheme if backend_url else None
        LockOptions.from_mapping(dict((k, v) for k, v in defaults.items() if k in OPTION_NAMES),
                                 "dlock_runner_defaults", scheme)
        seen = set()
        return [_entry(job, index, seen, defaults, randomized_delay, scheme) for index, job in enumerate(jobs)]
    except ConfigError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule(object):
    def filters(self):
        return {"dlock_jobs": dlock_jobs}
