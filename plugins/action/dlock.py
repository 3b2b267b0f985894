# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""Controller side of dlock.fleet.dlock.

Fills backend options from the inventory variable dlock_backend, or from the
record that playbooks/site.yml writes of the backend it provisioned
(plugins/plugin_utils/dlock_backend_options.py); gives every task of one
ansible-playbook run the same owner token (dlock_run_owner.py), runs the
lock operation in the controller's Python (or the module on the target with
run_on=target), and for hold=true starts a renewer process that keeps the
lease for the rest of the run (dlock_hold_process.py).
"""

from __future__ import annotations

from ansible import constants as C
from ansible.utils.display import Display

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.config import read_secret
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.validate import duration as parse_duration
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_args import MUTUALLY_EXCLUSIVE, REQUIRED_IF, argument_spec
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_task import check_params
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_task import run as run_lock
from ansible_collections.dlock.fleet.plugins.plugin_utils.dlock_action import BackendAction
from ansible_collections.dlock.fleet.plugins.plugin_utils.dlock_backend_options import task_parameters
from ansible_collections.dlock.fleet.plugins.plugin_utils.dlock_hold_process import run_with_hold
from ansible_collections.dlock.fleet.plugins.plugin_utils.dlock_run_owner import run_owner

display = Display()

MODULE = "dlock.fleet.dlock"


class ActionModule(BackendAction):
    def task(self, task_vars, hidden):
        args, params = self._task_params(task_vars, hidden)
        if params["run_on"] == "target":
            return self._on_target(args, params, task_vars)
        return self._on_controller(params, hidden)

    def _task_params(self, task_vars, hidden):
        """(the task's args with the backend filled in, its parameters
        validated); adds the password to HIDDEN as soon as it is known."""
        args, params = task_parameters(self, task_vars, hidden, argument_spec(),
                                       on_controller=self._task.args.get("run_on", "controller") != "target",
                                       mutually_exclusive=MUTUALLY_EXCLUSIVE, required_if=REQUIRED_IF)
        params["owner"] = params["owner"] or run_owner(C.DEFAULT_LOCAL_TMP)
        # Before any value is used, shown (-vvv) or sent to a target.
        check_params(params)
        return args, params

    def _on_target(self, args, params, task_vars):
        if params["hold"]:
            raise ConfigError("hold: runs on the controller only (the renewer lives there); not with run_on=target")
        display.vvv("dlock: %s on %s from the target as %s" % (params["key"], params["backend_url"], params["owner"]))
        return self._execute_module(module_name=MODULE, module_args=dict(args, owner=params["owner"]),
                                    task_vars=task_vars)

    def _on_controller(self, params, hidden):
        check_mode, diff = bool(self._task.check_mode), bool(self._task.diff)
        if params["backend_password_file"]:
            # Read here, so the renewer gets it on stdin and results can be scrubbed of it.
            params["backend_password"] = read_secret(params["backend_password_file"], "backend_password_file")
            params["backend_password_file"] = None
            hidden.add(params["backend_password"])
        display.vvv("dlock: %s on %s from the controller as %s"
                    % (params["key"], params["backend_url"], params["owner"]))
        if params["state"] == "query":
            return run_lock(params, check_mode, diff)
        if params["hold"] and 3 * parse_duration(params["op_timeout"], "op_timeout") > parse_duration(params["ttl"], "ttl"):
            raise ConfigError("hold: op_timeout must be at most ttl/3, the renewal interval")
        return run_with_hold(params, check_mode, diff, C.DEFAULT_LOCAL_TMP)
