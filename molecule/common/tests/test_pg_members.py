"""The PostgreSQL backend hosts (molecule/postgresql: one server;
molecule/postgresql-ha: every Patroni member, where a standby reads the
replicated catalogs): the runners' role has least privilege and a SCRAM
verifier of the generated password, and a host outside pg_hba is refused
(pytest-testinfra; the PostgreSQL scenarios' shared checks, by path: their
molecule.yml lists this module in additional_files_or_dirs)."""

import base64
import hashlib
import hmac
import os
import re
import sys

import psycopg
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # fleet_checks, pg_checks

from fleet_checks import address, secret, ssh_with_stdin  # noqa: E402
from pg_checks import sql  # noqa: E402

testinfra_hosts = ["ansible://dlock_backend"]


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
    # UPDATE on dlock_slot: a release records its run's outcome in the slot's
    # marker, and a rerun of a failed slot takes it over (dlock run --rerun).
    # dlock_pause: dlock pause writes it, with the runners' role.
    # dlock_history: each run adds its entry and drops those past the newest kept.
    assert grants == ("dlock_history|DELETE,INSERT,SELECT\n"
                      "dlock_lease|INSERT,SELECT,UPDATE\ndlock_pause|DELETE,INSERT,SELECT,UPDATE\n"
                      "dlock_slot|DELETE,INSERT,SELECT,UPDATE\ndlock_wait|DELETE,INSERT,SELECT,UPDATE")
    assert sql(host, "SELECT string_agg(tableowner, ',') FROM pg_tables WHERE tablename LIKE 'dlock_%'") \
        == "postgres,postgres,postgres,postgres,postgres"


def test_the_password_is_stored_as_a_scram_verifier_of_it(host):
    stored = sql(host, "SELECT rolpassword FROM pg_authid WHERE rolname = 'dlock'", "postgres")
    match = re.match(r"^SCRAM-SHA-256\$(\d+):([^$]+)\$([^:]+):(.+)$", stored)
    assert match, "not a SCRAM verifier"
    salted = hashlib.pbkdf2_hmac("sha256", secret("backend.password").encode(), base64.b64decode(match.group(2)),
                                 int(match.group(1)))
    stored_key = hashlib.sha256(hmac.new(salted, b"Client Key", "sha256").digest()).digest()
    assert base64.b64encode(stored_key).decode() == match.group(3)


def test_a_host_outside_pg_hba_is_refused(host):
    # From the controller (the lab host, x.x.x.1), with the right password, to
    # a database no rule lets it reach (molecule/postgresql adds the
    # controller to the lock database's clients: its test_backend.py, and
    # molecule/postgresql-ha's, pin who is in pg_hba).
    with pytest.raises(psycopg.OperationalError, match="no pg_hba.conf entry"):
        psycopg.connect(host=address(host), user="dlock", dbname="postgres", password=secret("backend.password"),
                        connect_timeout=5, sslmode="disable")
    # From the backend itself over TCP.
    done = ssh_with_stdin(host, 'PGPASSWORD="$(cat)" psql -h %s -U dlock -d dlock -c "SELECT 1"' % address(host),
                          secret("backend.password"))
    assert done.returncode != 0 and "no pg_hba.conf entry" in done.stderr, done.stderr
