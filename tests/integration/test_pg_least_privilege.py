"""The dlock_postgresql role's provisioning helper, and the engine under the
least-privilege role it creates, on a real PostgreSQL on loopback.

The helper runs as the role runs it (the spec as JSON on stdin), with the
role's own grants (roles/dlock_postgresql/vars/main.yml) and the engine's own
schema: a statement the engine starts to send that the grants do not allow
fails here before it fails on a fleet.
"""

import json
import os
import subprocess
import sys
import time
import uuid

import psycopg
import pytest
import yaml

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import Slot, open_backend
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.pg_common import SCHEMA

ROLE_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "dlock_postgresql")
HELPER = os.path.join(ROLE_DIR, "files", "dlock_pg_provision.py")
PASSWORD = "pg-least-privilege-0123"


def provision(server, name, password=PASSWORD, check=False):
    with open(os.path.join(ROLE_DIR, "vars", "main.yml")) as handle:
        grants = yaml.safe_load(handle)["__dlock_postgresql_grants"]
    spec = {"database": name, "role": name, "password": password, "connection_limit": 16,
            "host": "127.0.0.1", "port": server.port, "schema": list(SCHEMA), "grants": grants, "check": check}
    done = subprocess.run([sys.executable, HELPER], input=json.dumps(spec), capture_output=True, text=True,
                          env=dict(os.environ, PGUSER="postgres"), timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert password not in done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def provisioned(pg_server):
    name = "dlock_lp_" + uuid.uuid4().hex[:8]
    first = provision(pg_server, name)
    yield name, first
    pg_server.sql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % name)
    pg_server.sql("DROP ROLE IF EXISTS %s" % name)


def connect(server, name, password=PASSWORD, db=None):
    return psycopg.connect(host="127.0.0.1", port=server.port, user=name, password=password,
                           dbname=db or name, autocommit=True, connect_timeout=5)


def test_provisioning_is_idempotent_and_check_mode_changes_nothing(pg_server, provisioned):
    name, first = provisioned
    assert first["changed"] and "create role %s" % name in first["actions"]
    assert provision(pg_server, name) == {"changed": False, "actions": []}
    changed = provision(pg_server, name, password="another-password-0123", check=True)
    assert changed["actions"] == ["set the password of role %s" % name]
    with connect(pg_server, name) as conn:  # check mode kept the old password
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_the_engine_works_under_the_role(pg_server, provisioned, unique_key):
    name, _first = provisioned
    for scheme in ("postgresql", "postgresql+advisory"):
        url = "%s://%s@127.0.0.1:%d/%s" % (scheme, name, pg_server.port, name)
        a, b = open_backend(url, password=PASSWORD), open_backend(url, password=PASSWORD)  # two runners
        key = "%s-%s" % (unique_key, scheme.replace("+", "-"))
        try:
            assert a.acquire(key, "owner-a", 5).granted
            assert b.acquire(key, "owner-b", 5).status == "locked"
            assert a.renew(key, "owner-a", 5)
            assert b.query(key).owner == "owner-a"
            assert a.release(key, "owner-a", last={"result": "success"})
            slot = Slot(int(time.time()) // 60, marker_ttl=120)
            assert b.acquire(key, "owner-b", 5, slot).granted
            assert b.release(key, "owner-b")
            assert a.acquire(key, "owner-a", 5, slot).status == "duplicate"
            assert a.acquire(key, "owner-a", 5).granted
            assert b.force_release(key).owner == "owner-a"  # an operator breaking a runner's lock
            assert b.server_time() > 0
            # Waiting in line: ticket, LISTEN, the wake-up on release, leaving
            # (a fresh runner: the force release ended a's session, advisory).
            a.close()
            a = open_backend(url, password=PASSWORD)
            assert a.acquire(key, "owner-a", 5).granted
            b.join_queue(key, "owner-b", 3)
            assert b.acquire(key, "owner-b", 5).status == "locked"
            assert a.release(key, "owner-a")
            b.wait_change(key, 5)
            assert b.acquire(key, "owner-b", 5).granted
            b.leave_queue(key, "owner-b")
            assert b.release(key, "owner-b")
        finally:
            a.close()
            b.close()


def test_the_role_cannot_create_or_delete_leases(pg_server, provisioned):
    """(Other databases are closed to it by the role's pg_hba: molecule/postgresql.)"""
    name, _first = provisioned
    with connect(pg_server, name) as conn:
        for statement in ("CREATE TABLE intruder (x int)", "CREATE TEMP TABLE intruder (x int)",
                          "DELETE FROM dlock_lease", "TRUNCATE dlock_slot", "DROP TABLE dlock_lease"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
