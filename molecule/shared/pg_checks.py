"""Checks the PostgreSQL scenarios (molecule/postgresql: one server;
molecule/postgresql-ha: a Patroni cluster) share, imported by name into
their test modules like fleet_checks.py's.

On the backend hosts (test_backend.py): the runners' role has least
privilege and a SCRAM verifier of the generated password, and a host
outside pg_hba is refused. On a Patroni standby these read the replicated
catalogs, so every member is checked. On the job nodes (test_nodes.py): as
the runners' role, through the URL the runner itself uses (one server, or
every member with target_session_attrs=read-write: the primary), the lease
tables work and nothing else does.
"""

import base64
import hashlib
import hmac
import json
import re

import psycopg
import pytest

from fleet_checks import address, secret, ssh_with_stdin

# As the runners' role, through the node's own backend URL: the password from
# the node's file, through the environment (never on the command line).
AS_RUNNER = 'PGPASSWORD="$(cat /etc/dlock/backend.password)" psql -XAtq %s -c %s'
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


def sql(host, query, database="dlock"):
    """A query as the postgres superuser (peer authentication on the socket)."""
    return host.check_output("runuser -u postgres -- psql -XAtq -d %s -c %s", database, query)


def runner_url(host, database="dlock"):
    """The node's backend URL (dlock.json), for this database."""
    url = json.loads(host.file("/etc/dlock/dlock.json").content_string)["backend"]
    return re.sub(r"/dlock(\?|$)", "/%s\\1" % database, url)


def as_runner(host, statement, database="dlock"):
    return host.run(AS_RUNNER, runner_url(host, database), statement)


# ----------------------------------------------------------------- backend hosts (test_backend.py)


def test_the_role_has_least_privilege(host):
    attributes = sql(host, "SELECT rolsuper, rolinherit, rolcreaterole, rolcreatedb, rolcanlogin, rolreplication, "
                           "rolbypassrls FROM pg_roles WHERE rolname = 'dlock'")
    assert attributes == "f|f|f|f|t|f|f"
    assert sql(host, "SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member "
                     "WHERE r.rolname = 'dlock'") == "0"
    assert sql(host, "SELECT has_database_privilege('dlock', 'dlock', 'CONNECT'), "
                     "has_database_privilege('dlock', 'dlock', 'CREATE'), "
                     "has_database_privilege('dlock', 'dlock', 'TEMPORARY'), "
                     "has_schema_privilege('dlock', 'public', 'CREATE')") == "t|f|f|f"
    grants = sql(host, "SELECT table_name, string_agg(privilege_type, ',' ORDER BY privilege_type) "
                       "FROM information_schema.role_table_grants WHERE grantee = 'dlock' GROUP BY 1 ORDER BY 1")
    assert grants == ("dlock_lease|INSERT,SELECT,UPDATE\ndlock_slot|DELETE,INSERT,SELECT\n"
                      "dlock_wait|DELETE,INSERT,SELECT,UPDATE")
    assert sql(host, "SELECT string_agg(tableowner, ',') FROM pg_tables WHERE tablename LIKE 'dlock_%'") == "postgres,postgres,postgres"


def test_the_password_is_stored_as_a_scram_verifier_of_it(host):
    stored = sql(host, "SELECT rolpassword FROM pg_authid WHERE rolname = 'dlock'", "postgres")
    match = re.match(r"^SCRAM-SHA-256\$(\d+):([^$]+)\$([^:]+):(.+)$", stored)
    assert match, "not a SCRAM verifier"
    salted = hashlib.pbkdf2_hmac("sha256", secret("backend.password").encode(), base64.b64decode(match.group(2)),
                                 int(match.group(1)))
    stored_key = hashlib.sha256(hmac.new(salted, b"Client Key", "sha256").digest()).digest()
    assert base64.b64encode(stored_key).decode() == match.group(3)


def test_a_host_outside_pg_hba_is_refused(host):
    # From the controller (the lab host, x.x.x.1), with the right password.
    with pytest.raises(psycopg.OperationalError, match="no pg_hba.conf entry"):
        psycopg.connect(host=address(host), user="dlock", dbname="dlock", password=secret("backend.password"),
                        connect_timeout=5, sslmode="disable")
    # From the backend itself over TCP.
    done = ssh_with_stdin(host, 'PGPASSWORD="$(cat)" psql -h %s -U dlock -d dlock -c "SELECT 1"' % address(host),
                          secret("backend.password"))
    assert done.returncode != 0 and "no pg_hba.conf entry" in done.stderr, done.stderr


# ----------------------------------------------------------------- job nodes (test_nodes.py)


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
