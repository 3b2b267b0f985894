# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""What the collection's controller-side action plugins share: a task that
talks to a lock backend, whose errors become a failed result with their
message, and whose result never shows the backend's password."""

from __future__ import annotations

from ansible.module_utils.common.parameters import remove_values
from ansible.plugins.action import ActionBase

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_task import LockFailed


class BackendAction(ActionBase):
    """An action plugin whose task is `task(task_vars, hidden)`: it returns
    the task's result and adds every secret it learns to `hidden`."""

    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(BackendAction, self).run(tmp, task_vars)
        del tmp
        hidden = set()
        try:
            result.update(self.task(task_vars, hidden))
        except LockFailed as exc:
            result.update(exc.result, failed=True, msg=exc.msg)
        except ConfigError as exc:
            result.update(failed=True, msg=str(exc))
        return remove_values(result, hidden)

    def task(self, task_vars, hidden):
        raise NotImplementedError
