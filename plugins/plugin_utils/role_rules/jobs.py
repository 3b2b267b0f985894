# Copyright: dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The dlock_jobs role's scalar settings: their table. The job list itself
(dlock_jobs_list) is checked by the dlock.fleet.dlock_jobs filter."""

from __future__ import annotations

from ansible_collections.dlock.fleet.plugins.plugin_utils.role_rules.kinds import (
    backend_url, boolean, duration, empty_or, path, unix_name)

TABLE = {
    "dlock_jobs_randomized_delay": duration(),
    "dlock_jobs_accuracy": duration(),
    "dlock_jobs_persistent": boolean,
    "dlock_jobs_user": unix_name,
    "dlock_jobs_hardening": boolean,
    "dlock_jobs_runner_bin": path,
    "dlock_jobs_jobs_dir": path,
    "dlock_jobs_group": unix_name,
    "dlock_jobs_password_path": path,
    "dlock_jobs_metrics_dir": empty_or(path),
    "dlock_jobs_unit_dir": path,
    "dlock_jobs_backend_url": empty_or(backend_url),
    "dlock_jobs_drain_timeout": duration(positive=True),
}

SECRETS = ()


def rules(_values):
    """No rule between the settings."""
    return ()
