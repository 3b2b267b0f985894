"""The job nodes of the PostgreSQL scenarios: as the runners' role, through
the URL the runner itself uses (one server, or every member with
target_session_attrs=read-write: the primary), the lease tables work, the
keepalive settings hold and nothing else is allowed (pytest-testinfra; the
PostgreSQL scenarios' shared checks, by path, as test_pg_members.py says)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # fleet_checks, pg_checks

from pg_checks import as_runner  # noqa: E402

testinfra_hosts = ["ansible://dlock_nodes"]

# What the runners' role must not do, and the error PostgreSQL gives.
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
    out = as_runner(host, "SELECT count(*) FROM dlock_lease")
    assert out.rc == 0 and out.stdout.strip().isdigit(), out.stderr


def test_fleet_connections_carry_the_keepalive_settings(host):
    """As a runner's connection sees them (they apply to TCP connections only)."""
    # Read from the socket: seconds, and milliseconds for tcp_user_timeout.
    want = {"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3",
            "tcp_user_timeout": "10000"}
    for name, value in want.items():
        out = as_runner(host, "SHOW %s" % name)
        assert out.rc == 0 and out.stdout.strip() == value, (name, out.stdout, out.stderr)


@pytest.mark.parametrize("statement,error", REFUSED)
def test_the_role_cannot_do_anything_else(host, statement, error):
    out = as_runner(host, statement)
    assert out.rc != 0 and error in out.stderr, (statement, out.stderr)


@pytest.mark.parametrize("database", ["postgres", "template1"])
def test_the_role_cannot_reach_other_databases(host, database):
    out = as_runner(host, "SELECT 1", database)
    assert out.rc != 0 and "no pg_hba.conf entry" in out.stderr, out.stderr
