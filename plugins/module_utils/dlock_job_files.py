# Copyright: dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The three files of a job, rendered from a validated entry (dlock_jobs.py's
validate_jobs): its job file (the command and its lock options, as JSON),
its service unit and its timer unit. Every value in a unit line passes
rendering.unit_value (one line, % escaped), every directive name
rendering.conf_token. Beside the engine, not in module_utils/dlock/, whose
every file the runner role installs on the nodes."""

from __future__ import annotations

import json
import os
from collections import namedtuple

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_rendering import conf_token, unit_value

# Sandboxing of the job units (hardening: true). Per job, unit_settings
# overrides any of these, and hardening: false drops them all.
HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "read-only",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "ProtectClock": "yes",
    "ProtectHostname": "yes",
    "RestrictSUIDSGID": "yes",
    "RestrictRealtime": "yes",
    "RestrictNamespaces": "yes",
    "LockPersonality": "yes",
    "SystemCallArchitectures": "native",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    "CapabilityBoundingSet": "",
    "UMask": "0027",
}

# The role's settings that shape every job's files (the dlock_jobs_* variables):
# a job's own field, where it has one, wins over them. `credential`: whether the
# runner's password file exists, so that LoadCredential= can name it.
Settings = namedtuple("Settings", [
    "managed", "runner_bin", "jobs_dir", "group", "user", "hardening", "randomized_delay", "accuracy",
    "persistent", "password_path", "metrics_dir", "credential"])


def make_settings(managed, runner_bin, jobs_dir, group, user, hardening, randomized_delay, accuracy, persistent,
                  password_path, metrics_dir):
    """The role's settings, each checked by the rule of its dlock_jobs_*
    variable; the delays stay as given (the timers say them as given). The
    credential is loaded only if the password file exists on this node."""
    validate.text(managed, "managed", 200)
    validate.path(runner_bin, "dlock_jobs_runner_bin")
    validate.path(jobs_dir, "dlock_jobs_jobs_dir")
    validate.unix_name(group, "dlock_jobs_group")
    validate.unix_name(user, "dlock_jobs_user")
    validate.boolean(hardening, "dlock_jobs_hardening")
    validate.duration(randomized_delay, "dlock_jobs_randomized_delay")
    validate.duration(accuracy, "dlock_jobs_accuracy")
    validate.boolean(persistent, "dlock_jobs_persistent")
    validate.path(password_path, "dlock_jobs_password_path")
    if metrics_dir != "":
        validate.path(metrics_dir, "dlock_jobs_metrics_dir")
    return Settings(managed, runner_bin, jobs_dir, group, user, hardening, randomized_delay, accuracy, persistent,
                    password_path, metrics_dir, os.path.exists(password_path))


def job_file_name(name):
    return "%s.json" % name


def service_name(name):
    return "dlock-%s.service" % name


def timer_name(name):
    return "dlock-%s.timer" % name


def job_file(job):
    """The job file: its content as JSON (what Ansible's to_nice_json writes), and a newline."""
    return json.dumps(job["file"], indent=4, sort_keys=True, separators=(",", ": ")) + "\n"


def _read_write_paths(job, settings):
    """The metrics directory (the runner writes its metrics there), then the
    job's own paths, each once, in that order."""
    paths = [settings.metrics_dir] if settings.metrics_dir else []
    for path in job.get("read_write_paths", []):
        if path not in paths:
            paths.append(path)
    return paths


def _unit_settings(job, hardening):
    """The hardening defaults (if on) overridden by the job's unit_settings,
    sorted by name without regard to case (as the templates' dictsort did)."""
    settings = dict(HARDENING) if hardening else {}
    settings.update(job.get("unit_settings", {}))
    return sorted(settings.items(), key=lambda item: item[0].lower())


def service_unit(job, settings):
    """The job's service unit: the runner runs the job file's command under its lock."""
    name = job["name"]
    hardening = job.get("hardening", settings.hardening)
    description = "dlock job %s" % name + (": %s" % job["description"] if job.get("description") else "")
    lines = [
        "# %s" % settings.managed,
        "# dlock job %s: the command lives in %s/%s," % (name, settings.jobs_dir, job_file_name(name)),
        "# so no job text is parsed by systemd or a shell. Every value below passed the",
        "# dlock_jobs filter and passes dlock_unit_value here (one line, % escaped).",
        "[Unit]",
        "Description=%s" % unit_value(description, "description"),
        "Wants=network-online.target",
        "After=network-online.target time-sync.target",
        "",
        "[Service]",
        "Type=oneshot",
        "ExecStart=%s run --job %s" % (unit_value(settings.runner_bin, "dlock_jobs_runner_bin"), name),
        "# 72: paused; 73: another node holds the lock; 74: the slot already ran elsewhere.",
        "SuccessExitStatus=72 73 74",
        "# The runner's process tree (and the job's) ends with the unit.",
        "KillMode=control-group",
        "User=%s" % unit_value(job.get("user", settings.user), "user"),
    ]
    if job.get("group"):
        lines.append("Group=%s" % unit_value(job["group"], "group"))
    lines.append("SupplementaryGroups=%s" % unit_value(settings.group, "dlock_jobs_group"))
    if settings.credential:
        lines.append("LoadCredential=dlock-backend:%s" % unit_value(settings.password_path, "dlock_jobs_password_path"))
    lines.append("SyslogIdentifier=dlock-%s" % name)
    read_write = _read_write_paths(job, settings)
    if hardening and read_write:
        lines.append("ReadWritePaths=%s" % " ".join(unit_value(path, "read_write_paths") for path in read_write))
    for key, value in _unit_settings(job, hardening):
        lines.append("%s=%s" % (conf_token(key, "unit_settings name"), unit_value(value, key, specifiers=True)))
    return "\n".join(lines) + "\n"


def timer_unit(job, settings):
    """The job's timer: its schedule, and how far each firing may be moved."""
    persistent = job.get("persistent", settings.persistent)
    lines = [
        "# %s" % settings.managed,
        "[Unit]",
        "Description=Timer of dlock job %s" % job["name"],
        "",
        "[Timer]",
        "OnCalendar=%s" % unit_value(job["schedule"], "schedule"),
        "RandomizedDelaySec=%s" % unit_value(job.get("randomized_delay_sec", settings.randomized_delay),
                                             "randomized_delay"),
        "AccuracySec=%s" % unit_value(job.get("accuracy_sec", settings.accuracy), "accuracy"),
        "Persistent=%s" % ("true" if persistent else "false"),
        "",
        "[Install]",
        "WantedBy=timers.target",
    ]
    return "\n".join(lines) + "\n"
