"""The job nodes of the PostgreSQL scenario: the runner with the
least-privilege role, what that role cannot do, metrics, unit hardening,
the password in use."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared"))

import time  # noqa: E402

import pytest  # noqa: E402

# The shared tests, imported to be collected here.
from fleet_checks import (  # noqa: E402,F401  pylint: disable=unused-import
    backend_name,
    test_force_release_works,
    test_job_unit_exposure,
    test_password_is_in_use,
    test_runner_commands_work_with_the_backend,
    test_textfile_metrics_served_over_http_and_clean,
)

testinfra_hosts = ["ansible://dlock_nodes"]

# As the runners' role: the password from the node's file, through the
# environment (never on the command line).
AS_RUNNER = 'PGPASSWORD="$(cat /etc/dlock/backend.password)" psql -XAtq -h %s -U dlock -d %s -c %s'
REFUSED = [
    ("CREATE TABLE mine (i int)", "permission denied for schema public"),
    ("CREATE TEMP TABLE mine (i int)", "permission denied to create temporary tables"),
    ("CREATE SCHEMA mine", "permission denied for database"),
    ("DROP TABLE dlock_lease", "must be owner"),
    ("TRUNCATE dlock_lease", "permission denied"),
    ("DELETE FROM dlock_lease", "permission denied"),
    ("ALTER TABLE dlock_slot ADD COLUMN x int", "must be owner"),
    ("SELECT rolpassword FROM pg_authid", "permission denied"),
    ("CREATE ROLE other", "permission denied"),
]


def test_the_role_uses_the_lease_tables(host):
    out = host.run(AS_RUNNER, backend_name(host), "dlock", "SELECT count(*) FROM dlock_lease")
    assert out.rc == 0 and out.stdout.strip().isdigit(), out.stderr


def test_fleet_connections_carry_the_keepalive_settings(host):
    """As a runner's connection sees them (they apply to TCP connections only)."""
    # Read from the socket: seconds, and milliseconds for tcp_user_timeout.
    want = {"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3",
            "tcp_user_timeout": "10000"}
    for name, value in want.items():
        out = host.run(AS_RUNNER, backend_name(host), "dlock", "SHOW %s" % name)
        assert out.rc == 0 and out.stdout.strip() == value, (name, out.stdout, out.stderr)


@pytest.mark.parametrize("statement,error", REFUSED)
def test_the_role_cannot_do_anything_else(host, statement, error):
    out = host.run(AS_RUNNER, backend_name(host), "dlock", statement)
    assert out.rc != 0 and error in out.stderr, (statement, out.stderr)


@pytest.mark.parametrize("database", ["postgres", "template1"])
def test_the_role_cannot_reach_other_databases(host, database):
    out = host.run(AS_RUNNER, backend_name(host), database, "SELECT 1")
    assert out.rc != 0 and "no pg_hba.conf entry" in out.stderr, out.stderr


def test_advisory_force_release_by_the_same_role(host):
    """dlock release --force of an advisory lock ends the holder's session
    (pg_terminate_backend): allowed because every runner logs in as the same role."""
    url = "postgresql+advisory://dlock@%s:5432/dlock" % backend_name(host)
    host.run("systemd-run --unit dlock-advisory-hold --collect dlock run --job advisory-hold "
             "--backend %s --ttl 30s -- sleep 60", url)
    for _attempt in range(40):
        if '"held": true' in host.run("dlock status --key advisory-hold --backend %s --json", url).stdout:
            break
        time.sleep(0.5)
    out = host.run("dlock release --key advisory-hold --backend %s --force --reason 'molecule verify'", url)
    host.run("systemctl stop dlock-advisory-hold.service")
    assert out.rc == 0 and "was held by %s" % host.backend.get_hostname() in out.stdout, out.stdout + out.stderr
