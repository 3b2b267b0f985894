# Copyright: dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The roles' variables, checked once: filter `dlock.fleet.dlock_role_problems`.

For each role a table says, for every public variable, which validator of
the engine's validation core (plugins/module_utils/dlock/validate.py) it
must pass, with its bounds; a few rules then relate variables to each other.
Each role's preflight hands the filter all its variables (under no_log: the
passwords are among them) and reports the problems it returns. No rule is
restated in Jinja, and no variable is left out: the filter refuses a set of
variables that is not exactly its table.

The tables and rules live in plugins/plugin_utils/role_rules/, one module
per role. Also `dlock.fleet.dlock_fence_switch_problems`, the runner role's
guard against fences that go back.
"""

from __future__ import annotations

from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules.check import role_problems
from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules.runner import fence_switch_problems


class FilterModule(object):
    def filters(self):
        return {
            "dlock_role_problems": role_problems,
            "dlock_fence_switch_problems": fence_switch_problems,
        }
