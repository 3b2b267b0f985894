"""The dlock_postgresql_access module (dlock_postgresql's provisioning), and
the engine under the least-privilege role it creates, on a real PostgreSQL
on loopback.

The module runs by real `ansible`, with the role's own grants
(roles/dlock_postgresql/vars/main.yml) and the engine's own schema: a
statement the engine starts to send that the grants do not allow fails here
before it fails on a fleet.
"""

import json
import os
import re
import subprocess
import sys
import time
import uuid

import psycopg
import pytest
from ansible_cli import BIN, ansible_env, run_module
from pg_access import PASSWORD, arguments, provision

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import Slot, open_backend, pause_scopes
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.pg_common import SCHEMA, SCHEMA_UPGRADES
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import BackendError

# dlock_lease as the first release made it: no line_until.
EARLIER_LEASE_TABLE = SCHEMA[0].replace(",\n        line_until timestamptz", "")


def test_the_role_reads_the_engines_schema_whole(pg_role_spec):
    assert pg_role_spec["schema"] == list(SCHEMA) and pg_role_spec["upgrades"] == list(SCHEMA_UPGRADES)
    assert "line_until" in SCHEMA[0] and "line_until" not in EARLIER_LEASE_TABLE


@pytest.fixture
def provisioned(pg_server, pg_role_spec):
    name = "dlock_lp_" + uuid.uuid4().hex[:8]
    first = provision(pg_server, name, pg_role_spec)
    yield name, first
    pg_server.sql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % name)
    pg_server.sql("DROP ROLE IF EXISTS %s" % name)


def connect(server, name, password=PASSWORD, db=None):
    return psycopg.connect(host="127.0.0.1", port=server.port, user=name, password=password,
                           dbname=db or name, autocommit=True, connect_timeout=5)


def test_provisioning_is_idempotent_and_check_mode_changes_nothing(pg_server, provisioned, pg_role_spec):
    name, first = provisioned
    assert first["changed"] and "create role %s" % name in first["actions"]
    assert provision(pg_server, name, pg_role_spec) == {"changed": False, "actions": []}
    changed = provision(pg_server, name, pg_role_spec, password="another-password-0123", check=True)
    assert changed["actions"] == ["set the password of role %s" % name]
    with connect(pg_server, name) as conn:  # check mode kept the old password
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_password_postgresql_stored_itself_is_recognised(pg_server, provisioned, pg_role_spec):
    """The module's SCRAM verifier follows PostgreSQL's: one the server
    computed (its own salt) for the same password is kept, not rewritten."""
    name, _first = provisioned
    pg_server.sql("SET password_encryption = 'scram-sha-256'; ALTER ROLE %s PASSWORD '%s'" % (name, PASSWORD))
    assert provision(pg_server, name, pg_role_spec) == {"changed": False, "actions": []}


def test_check_mode_on_a_new_server_says_all_and_changes_nothing(pg_server, pg_role_spec):
    name = "dlock_new_" + uuid.uuid4().hex[:8]
    would = provision(pg_server, name, pg_role_spec, check=True)
    want = ["create role %s" % name, "create database %s" % name, "create the lease tables and grants in %s" % name]
    assert would == {"changed": True, "actions": want}
    assert pg_server.sql("SELECT count(*) FROM pg_roles WHERE rolname = '%s'" % name) == [(0,)]
    assert pg_server.sql("SELECT count(*) FROM pg_database WHERE datname = '%s'" % name) == [(0,)]


def test_as_the_role_runs_it_as_postgres_on_the_socket(pg_server, provisioned, pg_role_spec):
    """The role's way: the connection made as the operating system user
    postgres, on the socket (the test server trusts postgres there, as peer
    authentication does on a node); without run_as, root is refused."""
    name, _first = provisioned
    args = dict(arguments(pg_server, name, pg_role_spec), login_host=pg_server.dir, login_user=None)
    rc, result, output = run_module("dlock_postgresql_access", dict(args, run_as="postgres"))
    assert rc == 0 and result["changed"] is False and result["actions"] == [], output
    rc, result, output = run_module("dlock_postgresql_access", args)
    assert rc != 0, output
    assert result["msg"].startswith("dlock_postgresql: provisioning the database failed: OperationalError: "), output
    assert 'user "root"' in result["msg"], output  # pg_hba.conf lets only postgres in on the socket
    rc, result, output = run_module("dlock_postgresql_access", dict(args, run_as="nobody"))
    # The socket's directory is postgres's alone: only a process that is not root is kept out.
    assert rc != 0 and "Permission denied" in result["msg"], output
    assert result["msg"].startswith("dlock_postgresql: provisioning the database failed: OperationalError: "), output
    rc, result, output = run_module("dlock_postgresql_access", dict(args, run_as="no-such-user-0"))
    assert rc != 0 and result["msg"] == ("dlock_postgresql: provisioning the database failed: KeyError: "
                                         "\"getpwnam(): name not found: 'no-such-user-0'\""), output
    assert PASSWORD not in output, output


ROLE_PROVISION = """
- hosts: localhost
  gather_facts: true
  gather_subset: [min]
  tasks:
    - ansible.builtin.import_role:
        name: dlock.fleet.dlock_postgresql
        tasks_from: provision.yml
"""


def role_provision(tmp_path, variables, *options):
    """The role's own provisioning tasks, on this host as on a node: the module
    with the role's Python (/usr/bin/python3, python3-psycopg) as postgres on
    the socket. Returns (rc, output, changed count of the recap)."""
    (tmp_path / "play.yml").write_text(ROLE_PROVISION)
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    # The controller's Python for the facts; the role's task names its own.
    (tmp_path / "inventory").write_text("localhost ansible_connection=local ansible_python_interpreter=%s\n"
                                        % sys.executable)
    done = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(tmp_path / "inventory"), "-vvv",
                           "-e", "@" + str(tmp_path / "vars.json"), str(tmp_path / "play.yml")] + list(options),
                          env=ansible_env(), capture_output=True, text=True, timeout=180, check=False)
    output = done.stdout + done.stderr
    recap = re.search(r"localhost\s+: ok=\d+\s+changed=(\d+)", output)
    return done.returncode, output, int(recap.group(1)) if recap else None


def test_the_roles_tasks_provision_as_postgres_on_the_socket(pg_server, tmp_path):
    """The role's tasks: the earlier releases' helpers removed, the module run
    as the role runs it; a second run and a check run with the same password
    change nothing, a check run with another reports it and keeps the old."""
    name = "dlock_role_" + uuid.uuid4().hex[:8]
    old_helpers = tmp_path / "dlock-postgresql"
    old_helpers.mkdir()
    (old_helpers / "dlock_pg_provision.py").write_text("# an earlier release's helper\n")
    variables = {"dlock_postgresql_database": name, "dlock_postgresql_user": name, "dlock_postgresql_password": PASSWORD,
                 "dlock_postgresql_port": pg_server.port, "__dlock_postgresql_platform": {"socket_dir": pg_server.dir},
                 "__dlock_postgresql_helper_dir": str(old_helpers), "__dlock_systemd_running": True,
                 "__dlock_postgresql_installed": True, "__dlock_postgresql_provision_here": True}
    try:
        rc, output, changed = role_provision(tmp_path, variables)
        assert rc == 0 and changed == 2 and not old_helpers.exists(), output  # removed, provisioned
        assert "create role %s" % name in output and PASSWORD not in output, output
        assert re.search(r"'/usr/bin/python3 \S+/AnsiballZ_dlock_postgresql_access\.py", output), output
        with connect(pg_server, name) as conn:
            assert conn.execute("SELECT count(*) FROM dlock_lease").fetchone() == (0,)
        for options in ((), ("--check",)):
            rc, output, changed = role_provision(tmp_path, variables, *options)
            assert rc == 0 and changed == 0 and PASSWORD not in output, output
        other = "another-password-0123"
        rc, output, changed = role_provision(tmp_path, dict(variables, dlock_postgresql_password=other), "--check")
        assert rc == 0 and changed == 1 and "set the password of role %s" % name in output, output
        assert other not in output, output
        with connect(pg_server, name) as conn:  # check mode kept the old password
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        pg_server.sql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % name)
        pg_server.sql("DROP ROLE IF EXISTS %s" % name)


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
            assert b.release(key, "owner-b", last={"result": "failed"}, slot=slot)  # the marker records it
            assert a.acquire(key, "owner-a", 5, slot).status == "duplicate"
            rerun = Slot(slot.number, 120, 60.0, rerun=True)  # the slot's row locked, its marker ours
            assert a.acquire(key, "owner-a", 5, rerun).granted
            assert a.release(key, "owner-a", last={"result": "success"}, slot=rerun)
            assert b.acquire(key, "owner-b", 5, rerun).status == "duplicate"
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
            # Pausing (dlock pause and resume, with the runners' role) and a grant a pause refuses.
            scopes = pause_scopes(key)
            assert [b.pause(scope, "maintenance", 60, "ops").scope for scope in scopes] == list(scopes)
            assert [pause.scope for pause in a.read_pauses(scopes)] == list(scopes)
            assert a.acquire(key, "owner-a", 5, None, scopes).status == "paused"
            assert [b.resume(scope).scope for scope in scopes] == list(scopes)
            assert a.acquire(key, "owner-a", 5, None, scopes).granted
            # The history: entries, one once per slot, the trim, reading it.
            for entry in ({"result": "success"}, {"result": "failed"}, {"result": "lock_lost"}):
                assert b.add_history(key, entry, 2)
            assert a.add_history(key, {"result": "skipped_paused"}, 2, "skipped_paused@1", 60)
            assert not b.add_history(key, {"result": "skipped_paused"}, 2, "skipped_paused@1", 60)
            assert [entry["result"] for entry in b.read_history(key, 5)] == ["skipped_paused", "lock_lost"]
            assert a.slot_claimed(key, slot.number) and not a.slot_claimed(key, slot.number + 1)
        finally:
            a.close()
            b.close()


@pytest.mark.parametrize("scheme", ["postgresql", "postgresql+advisory"])
def test_a_database_provisioned_before_the_history_still_grants(pg_server, provisioned, pg_role_spec, unique_key,
                                                                scheme):
    """Provisioned before the history table: grants go on (the history is no
    reason to refuse one), its writes fail naming the role that makes the
    table, and the role makes it, with its grants, from then on kept."""
    name, _first = provisioned
    pg_server.sql("DROP TABLE IF EXISTS dlock_history", db=name)
    url = "%s://%s@127.0.0.1:%d/%s" % (scheme, name, pg_server.port, name)
    runner = open_backend(url, password=PASSWORD)
    try:
        assert runner.acquire(unique_key, "owner-a", 5, None, pause_scopes(unique_key)).granted
        assert runner.release(unique_key, "owner-a", last={"result": "success"})
        with pytest.raises(BackendError, match="the table dlock_history does not exist; the dlock_postgresql role makes it"):
            runner.add_history(unique_key, {"result": "success"}, 5)
        assert provision(pg_server, name, pg_role_spec)["changed"]
        runner.close()
        runner = open_backend(url, password=PASSWORD)
        assert runner.add_history(unique_key, {"result": "success"}, 5)
        assert runner.read_history(unique_key, 5) == [{"result": "success"}]
    finally:
        runner.close()


PAUSE_GRANTS = ("SELECT", "INSERT", "UPDATE", "DELETE")


@pytest.mark.parametrize("earlier, refusal, checked, made", [
    ("ALTER TABLE dlock_lease DROP COLUMN line_until",
     r"cannot bring up to date the lease tables \(must be owner of table dlock_lease\); upgrade them with the "
     r"dlock_postgresql role",
     ["add column line_until to dlock_lease"], ["add column line_until to dlock_lease"]),
    # Provisioned before pauses: a runner cannot tell whether its job is paused.
    ("DROP TABLE dlock_pause",
     r"(?s)cannot create the lease tables .*; create them with the dlock_postgresql role",
     ["create table dlock_pause", "grant %s on dlock_pause to {role}" % ", ".join(PAUSE_GRANTS)],
     ["create table dlock_pause"] + ["grant %s on dlock_pause to {role}" % grant for grant in PAUSE_GRANTS]),
])
def test_tables_of_an_earlier_version_are_brought_up_to_date(
        pg_server, provisioned, pg_role_spec, unique_key, earlier, refusal, checked, made):
    """The role adds the columns and tables added since (check mode only says
    so); then the engine under the role grants and waits in line."""
    name, _first = provisioned
    pg_server.sql(earlier, db=name)
    url = "postgresql://%s@127.0.0.1:%d/%s" % (name, pg_server.port, name)
    runner = open_backend(url, password=PASSWORD)
    try:
        # Before the role ran: the runner fails closed and names what to run.
        with pytest.raises(BackendError, match=refusal):
            runner.acquire(unique_key, "owner-a", 5, None, pause_scopes(unique_key))
        assert provision(pg_server, name, pg_role_spec, check=True) == {
            "changed": True, "actions": [action.format(role=name) for action in checked]}
        assert provision(pg_server, name, pg_role_spec) == {
            "changed": True, "actions": [action.format(role=name) for action in made]}
        assert provision(pg_server, name, pg_role_spec) == {"changed": False, "actions": []}
        runner.close()
        runner = open_backend(url, password=PASSWORD)
        runner.join_queue(unique_key, "owner-a", 3)
        assert runner.acquire(unique_key, "owner-a", 5, None, pause_scopes(unique_key)).granted
        runner.leave_queue(unique_key, "owner-a")
        assert runner.release(unique_key, "owner-a")
    finally:
        runner.close()


def test_the_engine_brings_tables_it_owns_up_to_date(pg_server, unique_key):
    """Where the runners' role owns the tables (it made them itself, with an
    earlier version), the engine adds the missing column on first use."""
    name = "dlock_own_" + uuid.uuid4().hex[:8]
    pg_server.sql("CREATE DATABASE %s" % name)
    try:
        with pg_server.connect(name) as conn:
            for statement in (EARLIER_LEASE_TABLE,) + SCHEMA[1:]:
                conn.execute(statement)
        engine = open_backend(pg_server.url().rsplit("/", 1)[0] + "/" + name)
        try:
            assert engine.acquire(unique_key, "owner-a", 5).granted
            assert engine.release(unique_key, "owner-a", last={"result": "success"})
        finally:
            engine.close()
        assert pg_server.sql("SELECT count(*) FROM information_schema.columns WHERE table_name = 'dlock_lease' "
                             "AND column_name = 'line_until'", db=name) == [(1,)]
    finally:
        pg_server.sql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % name)


def test_the_role_cannot_create_or_delete_leases(pg_server, provisioned):
    """(Other databases are closed to it by the role's pg_hba: molecule/postgresql.)"""
    name, _first = provisioned
    with connect(pg_server, name) as conn:
        for statement in ("CREATE TABLE intruder (x int)", "CREATE TEMP TABLE intruder (x int)",
                          "DELETE FROM dlock_lease", "TRUNCATE dlock_slot", "DROP TABLE dlock_lease"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
