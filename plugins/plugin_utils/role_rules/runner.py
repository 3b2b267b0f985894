# Copyright: dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The dlock_runner role's variables: their table and the rules between
them. Also the role's guard against fences that go back, which needs the
node's installed configuration and so runs a task later."""

from __future__ import annotations

import re

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.epoch import switch_problems
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.options import LockOptions
from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules.kinds import (
    account, backend_url, boolean, empty_or, kind, password, path)


def _lock_defaults(value, field):
    """Each option on its own; together, under the rule of the backend, in rules()."""
    validate.mapping(value, field)
    LockOptions.parse_values(value, field)
    return value


TABLE = {
    "dlock_runner_backend_url": backend_url,
    "dlock_runner_backend_password": empty_or(password(1, re.compile(r".+"), "one line")),
    "dlock_runner_ca_file": empty_or(path),
    "dlock_runner_fence_epoch": kind(validate.fence_epoch, "int"),
    "dlock_runner_config_dir": path,
    "dlock_runner_jobs_dir": path,
    "dlock_runner_pauses_dir": path,
    "dlock_runner_password_path": path,
    "dlock_runner_install_dir": path,
    "dlock_runner_bin": path,
    "dlock_runner_python": path,
    "dlock_runner_group": account,
    "dlock_runner_metrics_dir": empty_or(path),
    "dlock_runner_defaults": kind(_lock_defaults, "dict"),
    "dlock_runner_install_driver": boolean,
}

# Variables whose values are never shown, not even in a message about another rule.
SECRETS = ("dlock_runner_backend_password",)


def _backend_scheme(url):
    """The scheme of a checked backend URL; None for '' or an unchecked one (the stricter timing rule)."""
    return validate.backend_url(url, "backend URL").scheme if url else None


def rules(values):
    """The rules between variables (run only on values that passed the table)."""
    if values.get("dlock_runner_group") == "root":
        yield "dlock_runner_group: must not be root (job units join this group)"
    if "dlock_runner_defaults" in values:
        try:
            LockOptions.from_mapping(values["dlock_runner_defaults"], "dlock_runner_defaults",
                                     _backend_scheme(values.get("dlock_runner_backend_url")))
        except ConfigError as exc:
            yield str(exc)


def fence_switch_problems(installed, where, url, epoch):
    """The runner role's guard against fences that go back: [] or the
    message (backends/epoch.py, switch_problems). INSTALLED is the text of
    the node's dlock.json, None when it has none; URL and EPOCH were checked
    by dlock_role_problems a task earlier. Never raises."""
    try:
        return switch_problems(installed, where, url, epoch)
    except ConfigError as exc:
        return ["dlock_runner: %s" % exc]
