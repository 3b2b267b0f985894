# Copyright: dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter `dlock.fleet.dlock_jobs`: validates the dlock_jobs role's job list
with the engine's own rules (one source of truth for names, options and the
timing rule) and normalises it for the templates."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import validate_key
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.config import ENV_NAME, validate_job_name
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.durations import format_duration, parse_duration
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.options import OPTION_NAMES, LockOptions

UNIT_KEYS = (
    "name", "command", "shell", "schedule", "randomized_delay", "accuracy", "persistent", "user", "group",
    "environment", "working_directory", "description", "state", "hardening", "read_write_paths",
    "unit_settings", "key",
)


def _job_file(job, where):
    """The content of /etc/dlock/jobs/NAME.json for one job entry."""
    command = job.get("command")
    if isinstance(command, str):
        if not job.get("shell"):
            raise ConfigError("%s: command is a string; give an argv list, or set shell: true to run it with "
                              "/bin/sh -c (the string is then shell code)" % where)
        command = ["/bin/sh", "-c", command]
    elif not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise ConfigError("%s: command must be a non-empty list of strings (argv, no shell)" % where)
    environment = job.get("environment") or {}
    if not isinstance(environment, dict) or not all(ENV_NAME.match(str(k)) for k in environment):
        raise ConfigError("%s: environment must map variable names to values" % where)
    options = dict((k, job[k]) for k in OPTION_NAMES if job.get(k) is not None)
    LockOptions.from_mapping(options, where)  # raises with the field's name
    content = {"command": command, "environment": dict((k, str(v)) for k, v in environment.items())}
    if job.get("key"):
        content["key"] = validate_key(job["key"])
    for name in ("working_directory", "description"):
        if job.get(name):
            content[name] = str(job[name])
    content.update(options)
    return content


def _check_slot_window(job, where, defaults):
    """Timers fire at a boundary plus randomized delay (plus skew): all of that
    must fit in half a slot, or nodes could land in different slots."""
    if not job.get("once_per"):
        return
    once_per = parse_duration(job["once_per"], "%s: once_per" % where)
    delay = parse_duration(job.get("randomized_delay") or 0, "%s: randomized_delay" % where)
    skew = parse_duration(job.get("max_clock_skew") or defaults.get("max_clock_skew") or 2, "%s: max_clock_skew" % where)
    if delay + skew >= once_per / 2:
        raise ConfigError("%s: randomized_delay (%s) + max_clock_skew (%s) must stay below half of once_per "
                          "(%s), or nodes that fire in the same slot could see different slots"
                          % (where, format_duration(delay), format_duration(skew), format_duration(once_per)))


def dlock_jobs(jobs, defaults=None):
    """Validated jobs, each with `file` (the job file's content) added."""
    if not isinstance(jobs, list):
        raise AnsibleFilterError("dlock_jobs_list must be a list of job entries")
    seen = set()
    result = []
    for index, job in enumerate(jobs):
        where = "dlock_jobs_list[%d]" % index
        try:
            if not isinstance(job, dict):
                raise ConfigError("%s: must be a mapping" % where)
            name = validate_job_name(job.get("name"))
            where = "dlock_jobs_list[%d] (%s)" % (index, name)
            if name in seen:
                raise ConfigError("%s: duplicate job name; each job needs its own name" % where)
            seen.add(name)
            unknown = sorted(set(job) - set(UNIT_KEYS) - set(OPTION_NAMES))
            if unknown:
                raise ConfigError("%s: unknown field %s" % (where, ", ".join(unknown)))
            state = job.get("state", "present")
            if state not in ("present", "absent"):
                raise ConfigError("%s: state must be present or absent" % where)
            entry = dict(job, state=state)
            if state == "present":
                if not job.get("schedule"):
                    raise ConfigError("%s: schedule (a systemd OnCalendar expression) is required" % where)
                entry["file"] = _job_file(job, where)
                _check_slot_window(job, where, defaults or {})
                for name_ in ("randomized_delay", "accuracy"):
                    if job.get(name_) is not None:
                        entry[name_ + "_sec"] = "%gs" % parse_duration(job[name_], "%s: %s" % (where, name_))
            result.append(entry)
        except ConfigError as exc:
            raise AnsibleFilterError(str(exc))
    return result


class FilterModule(object):
    def filters(self):
        return {"dlock_jobs": dlock_jobs}
