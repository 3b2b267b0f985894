"""The job nodes of the PostgreSQL scenario: the runner with the
least-privilege role, what that role cannot do, metrics, unit hardening,
the password in use."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared"))

# The shared tests, imported to be collected here.
from fleet_checks import (  # noqa: E402,F401  pylint: disable=unused-import
    backend_name,
    test_force_release_ends_the_holders_run,
    test_job_unit_exposure,
    test_password_is_in_use,
    test_runner_commands_work_with_the_backend,
    test_textfile_metrics_served_over_http_and_clean,
    wait_for,
)
from pg_checks import (  # noqa: E402,F401  pylint: disable=unused-import
    test_fleet_connections_carry_the_keepalive_settings,
    test_the_role_cannot_do_anything_else,
    test_the_role_cannot_reach_other_databases,
    test_the_role_uses_the_lease_tables,
)

testinfra_hosts = ["ansible://dlock_nodes"]


def test_advisory_force_release_by_the_same_role(host):
    """dlock release --force of an advisory lock ends the holder's session
    (pg_terminate_backend): allowed because every runner logs in as the same role."""
    url = "postgresql+advisory://dlock@%s:5432/dlock" % backend_name(host)
    host.run("systemd-run --unit dlock-advisory-hold --collect dlock run --job advisory-hold "
             "--backend %s --ttl 30s -- sleep 60", url)
    wait_for(lambda: '"held": true' in host.run("dlock status --key advisory-hold --backend %s --json", url).stdout,
             attempts=40)
    out = host.run("dlock release --key advisory-hold --backend %s --force --reason 'molecule verify'", url)
    host.run("systemctl stop dlock-advisory-hold.service")
    assert out.rc == 0 and "was held by %s" % host.backend.get_hostname() in out.stdout, out.stdout + out.stderr
