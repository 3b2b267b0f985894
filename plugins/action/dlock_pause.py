# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""Controller side of dlock.fleet.dlock_pause.

Fills the backend options as dlock.fleet.dlock's action plugin does (the
inventory variable dlock_backend, else site.yml's record), looks the job or
group up in the host's dlock_jobs_list (a typo is refused; drain=kill gets
the lock keys of the jobs in the scope), and runs the pause in the
controller's Python: once per run of the task, for the first of its hosts
(dlock_once.py); the others are given its result. Then, on each host, it
writes the host's mirror of the pause (pause_files.py) with
dlock.fleet.dlock_files, or removes it.
"""

from __future__ import annotations

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_args import MUTUALLY_EXCLUSIVE
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.pause_files import DEFAULT_PAUSES_DIR
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_pause_task import (
    argument_spec, check_params, mirror_entry, run)
from ansible_collections.dlock.fleet.plugins.plugin_utils.dlock_action import BackendAction
from ansible_collections.dlock.fleet.plugins.plugin_utils.dlock_backend_options import task_parameters
from ansible_collections.dlock.fleet.plugins.plugin_utils.dlock_jobs_list import JOBS_VAR, present_jobs
from ansible_collections.dlock.fleet.plugins.plugin_utils.dlock_once import once_per_task

PAUSES_DIR_VAR = "dlock_runner_pauses_dir"  # the dlock_runner role's, where the host's runner reads the mirror
# What makes two hosts' tasks one pause (their drain_keys may differ: the first host's are drained).
IDENTITY = ("key", "group", "all", "state", "reason", "until", "drain")


class ActionModule(BackendAction):
    def task(self, task_vars, hidden):
        args, params = task_parameters(self, task_vars, hidden, argument_spec(), mutually_exclusive=MUTUALLY_EXCLUSIVE)
        check_params(params)  # before any value is used or shown
        jobs = self._templar.template(task_vars[JOBS_VAR]) if JOBS_VAR in task_vars else None
        resolved = resolve_scope(params, jobs)
        pauses_dir = None
        if params["mirror"]:
            # The task's own value, as given: type=path would make a list its
            # repr, and an empty one is not the variable's default.
            pauses_dir = args["pauses_dir"] if args.get("pauses_dir") is not None else self._templar.template(
                task_vars.get(PAUSES_DIR_VAR, DEFAULT_PAUSES_DIR))
            validate.path(pauses_dir, "pauses_dir (or %s)" % PAUSES_DIR_VAR)
            self._check_mirror_dir(task_vars, pauses_dir)  # before the backend is asked
        check_mode, diff = bool(self._task.check_mode), bool(self._task.diff)
        result, made_here = once_per_task(self._task, dict((name, resolved.get(name)) for name in IDENTITY),
                                          lambda: run(resolved, check_mode, diff))
        result = dict(result, made_here=made_here)
        if not made_here:
            # Its change and its diff are the host's that made it.
            result.update(changed=False, drained=[], msg="%s (by this task on another host)" % result["msg"])
            result.pop("diff", None)
        if pauses_dir is not None:
            self._mirror(task_vars, mirror_entry(pauses_dir, result["scope"], result["paused"]), result)
        return result

    def _check_mirror_dir(self, task_vars, pauses_dir):
        """The host's mirror directory is one, or not there yet (the mirror
        makes it): a FIFO or a file there would fail the mirror only once the
        pause is made in the backend. stat opens nothing."""
        field = "pauses_dir (or %s)" % PAUSES_DIR_VAR
        found = self._execute_module(module_name="ansible.legacy.stat", task_vars=task_vars, module_args={
            "path": pauses_dir, "follow": True, "get_checksum": False, "get_mime": False, "get_attributes": False})
        if found.get("failed"):
            raise ConfigError("%s: %s cannot be looked at on this host: %s"
                              % (field, validate.shown(pauses_dir), found.get("msg")))
        if found.get("stat", {}).get("exists") and not found["stat"].get("isdir"):
            raise ConfigError("%s: %s is not a directory on this host" % (field, validate.shown(pauses_dir)))

    def _mirror(self, task_vars, entry, result):
        """Make this host's mirror match the backend's pause (`entry`, a
        dlock_files entry); its change and diff join the result's."""
        done = self._execute_module(module_name="dlock.fleet.dlock_files", module_args={"files": [entry]},
                                    task_vars=task_vars)
        if done.get("failed"):
            raise ConfigError("%s; not mirrored on this host: %s" % (result["msg"], done.get("msg")))
        changed = bool(done.get("changed"))
        result["mirror"] = {"path": entry["path"], "changed": changed}
        result["changed"] = result["changed"] or changed
        diffs = _diff_list(result.pop("diff", None)) + _diff_list(done.get("diff"))
        if diffs:
            result["diff"] = diffs  # Ansible shows each of a list of diffs


def _diff_list(diff):
    return [] if not diff else list(diff) if isinstance(diff, list) else [diff]


def resolve_scope(params, jobs):
    """PARAMS with the job given as its lock key, and with drain=kill the
    lock keys to drain, from the host's job list JOBS (None: not defined).
    A job not in the list, or a group no job of it is in, is refused: a
    typo would pause nothing."""
    params = dict(params)
    entries = present_jobs(jobs)
    if params.get("job") is not None:
        name = validate.job_name(params["job"], "job")
        if entries is None or name not in entries:
            raise ConfigError("job: %s is not a job of %s on this host%s; to pause a lock by its key, give key"
                              % (name, JOBS_VAR, "" if entries is not None else " (not defined)"))
        params["job"], params["key"] = None, entries[name][0]
    if params.get("group") is not None and params.get("state") == "paused":
        group = validate.group_name(params["group"], "group")
        if entries is None or not any(group in groups for _key, groups in entries.values()):
            raise ConfigError("group: no job of %s on this host is in group %s (a job's groups list)"
                              % (JOBS_VAR, group))
    if params.get("drain") == "kill" and params.get("key") is None:
        if entries is None:
            raise ConfigError("drain=kill: needs %s on this host, to find the locks of the jobs to drain" % JOBS_VAR)
        group = params.get("group")
        params["drain_keys"] = sorted(set(key for key, groups in entries.values() if group is None or group in groups))
    return params
