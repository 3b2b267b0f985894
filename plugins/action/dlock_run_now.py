# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""Controller side of dlock.fleet.dlock_run_now: checks the task's values
with the validation core before anything reaches a node, refuses a job that
is not in the host's dlock_jobs_list (a typo), gives every host of one run
of the task the same id (the task's uuid: one run on one of them), finds
the node's dlock command (dlock_runner_bin), then runs the module there."""

from __future__ import annotations

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.plugin_utils.dlock_action import BackendAction
from ansible_collections.dlock.fleet.plugins.plugin_utils.dlock_jobs_list import JOBS_VAR, present_jobs

BIN_VAR = "dlock_runner_bin"


class ActionModule(BackendAction):
    _supports_async = True

    def task(self, task_vars, hidden):
        args = self._module_args(dict(self._task.args), task_vars)
        if self._task.check_mode:
            return dict(skipped=True, changed=False, id=args["id"],
                        msg="check mode: %s not run (a run cannot be foretold)" % args["job"])
        return self._execute_module(module_name="dlock.fleet.dlock_run_now", module_args=args, task_vars=task_vars,
                                    wrap_async=self._task.async_val)

    def _module_args(self, args, task_vars):
        unknown = sorted(set(args) - {"job", "id", "reason", "force", "dlock_bin"})
        if unknown:
            raise ConfigError("unknown option(s) %s (allowed: job, id, reason, force, dlock_bin)"
                              % ", ".join(validate.shown(name) for name in unknown))
        job = validate.job_name(args.get("job"), "job")
        jobs = self._templar.template(task_vars[JOBS_VAR]) if JOBS_VAR in task_vars else None
        if jobs is not None and job not in present_jobs(jobs):
            raise ConfigError("job: %s is not a job of %s on this host" % (job, JOBS_VAR))
        args["job"] = job
        # One id for every host of this run of the task: the task's uuid.
        args["id"] = validate.manual_id(args["id"] if args.get("id") is not None else "task-" + self._task._uuid,
                                        "id")
        if args.get("reason") is not None:
            args["reason"] = validate.reason(args["reason"], "reason")
        args["force"] = validate.boolean(args.get("force", False), "force")
        if args["force"] and args.get("reason") is None:
            raise ConfigError("force: needs reason (a run that overrides a pause says why)")
        bin_path = args.get("dlock_bin") or self._templar.template(task_vars.get(BIN_VAR, "/usr/local/bin/dlock"))
        args["dlock_bin"] = validate.path(bin_path, "dlock_bin (or %s)" % BIN_VAR)
        return args
