#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: dlock_postgresql_access
short_description: Create or fix the dlock database, its login role, the lease tables and the grants
version_added: 0.3.0
description:
  - Creates or fixes, idempotently, what the runners need on a PostgreSQL server, as the C(dlock.fleet.dlock_postgresql)
    role sets it up, connected as a superuser.
  - The login role O(role), least privilege - C(LOGIN) and nothing else (no superuser, inherit, createrole, createdb,
    replication or bypassrls), O(connection_limit), the password O(password), no membership of any other role.
  - The database O(database), owned by C(postgres), on which only O(role) may connect (C(CONNECT), no C(TEMPORARY) or
    C(CREATE)); nothing for C(PUBLIC).
  - No C(CREATE) on schema C(public) for C(PUBLIC) or O(role); the tables of O(schema), the columns of O(upgrades) they
    lack, and on each table exactly the privileges of O(grants) for O(role).
  - The password is stored as a SCRAM-SHA-256 verifier computed by the module, so the clear text never reaches the
    server (or its logs). An existing verifier is recomputed with its own salt to tell whether the password changed.
author:
  - dlock.fleet developers (@dlock-fleet)
extends_documentation_fragment:
  - dlock.fleet.node_changes
requirements:
  - psycopg (3) on the node, Debian's C(python3-psycopg)
options:
  database:
    description:
      - The lock database.
    type: str
    required: true
  role:
    description:
      - The runners' login role.
    type: str
    required: true
  password:
    description:
      - The password of O(role).
    type: str
    required: true
  connection_limit:
    description:
      - The connection limit of O(role); V(-1) for none.
    type: int
    default: -1
  login_host:
    description:
      - The directory of the server's socket, or a host name or address.
    type: str
    default: /var/run/postgresql
  port:
    description:
      - The server's port.
    type: int
    default: 5432
  login_user:
    description:
      - The superuser to connect as. Without it, the operating system user the module runs as (O(run_as)).
    type: str
  run_as:
    description:
      - The operating system user the connection is made as, for peer authentication on the local socket (as
        C(runuser -u postgres)); the module must run as root to use it.
      - Without it, the user the module runs as.
    type: str
  schema:
    description:
      - The lease tables, each a C(CREATE TABLE IF NOT EXISTS NAME ...) statement.
    type: list
    elements: str
    required: true
  upgrades:
    description:
      - The columns added since a table was first made, each a C(ALTER TABLE NAME ADD COLUMN IF NOT EXISTS COLUMN ...)
        statement, for tables made by an earlier version.
    type: list
    elements: str
    default: []
  grants:
    description:
      - For every table of O(schema), the list of table privileges O(role) has on it (C(SELECT), C(INSERT), C(UPDATE),
        C(DELETE), C(TRUNCATE), C(REFERENCES), C(TRIGGER)); the others are revoked.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Create the database, the role, the lease tables and the grants
  dlock.fleet.dlock_postgresql_access:
    database: dlock
    role: dlock
    password: "{{ dlock_postgresql_password }}"
    connection_limit: 64
    login_host: /var/run/postgresql
    run_as: postgres
    schema:
      - CREATE TABLE IF NOT EXISTS dlock_lease (key text PRIMARY KEY, owner text NOT NULL)
    grants:
      dlock_lease: [SELECT, INSERT, UPDATE, DELETE]
"""

RETURN = r"""
actions:
  description: The changes made (in check mode, the changes it would make), in order. Never the password.
  returned: always
  type: list
  elements: str
  sample: ["create role dlock", "create database dlock", "revoke all on database dlock from PUBLIC",
           "create table dlock_lease", "grant SELECT on dlock_lease to dlock"]
"""

import base64
import hashlib
import hmac
import json
import os
import pwd
import re
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.dlock.fleet.plugins.module_utils.dlock_changes import Changes, failure_message

try:
    import psycopg
    from psycopg import sql
except ImportError:
    PSYCOPG_IMPORT_ERROR = traceback.format_exc()
else:
    PSYCOPG_IMPORT_ERROR = None

ITERATIONS = 4096  # PostgreSQL's scram_iterations default
TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
ROLE_ATTRIBUTES = {  # pg_roles column -> wanted value (least privilege)
    "rolsuper": False, "rolinherit": False, "rolcreaterole": False, "rolcreatedb": False,
    "rolcanlogin": True, "rolreplication": False, "rolbypassrls": False,
}
ROLE_OPTIONS = "LOGIN NOSUPERUSER NOINHERIT NOCREATEROLE NOCREATEDB NOREPLICATION NOBYPASSRLS"
VERIFIER = re.compile(r"^SCRAM-SHA-256\$(\d+):([^$]+)\$([^:]+):(.+)$")
FAILED = "dlock_postgresql: provisioning the database failed: "


def b64(raw):
    return base64.b64encode(raw).decode("ascii")


def scram_verifier(password, salt, iterations=ITERATIONS):
    salted = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()
    stored_key = hashlib.sha256(client_key).digest()
    return "SCRAM-SHA-256$%d:%s$%s:%s" % (iterations, b64(salt), b64(stored_key), b64(server_key))


def password_matches(stored, password):
    match = VERIFIER.match(stored or "")
    if not match:
        return False  # none, or md5: replace it with SCRAM
    iterations, salt = int(match.group(1)), base64.b64decode(match.group(2))
    return hmac.compare_digest(scram_verifier(password, salt, iterations), stored)


class Provisioner(object):
    def __init__(self, params, check):
        self.params = params
        self.changes = Changes(check)
        self.where = {"host": params["login_host"], "port": params["port"]}
        if params["login_user"]:
            self.where["user"] = params["login_user"]

    def do(self, conn, description, statement):
        self.changes.make(description, conn.execute, statement)

    def role(self, conn):
        name, limit = self.params["role"], self.params["connection_limit"]
        ident = sql.Identifier(name)
        row = conn.execute("SELECT rolpassword, rolconnlimit, %s FROM pg_authid WHERE rolname = %%s"
                           % ", ".join(ROLE_ATTRIBUTES), (name,)).fetchone()
        if row is None:
            verifier = scram_verifier(self.params["password"], os.urandom(16))
            self.do(conn, "create role %s" % name, sql.SQL("CREATE ROLE {} " + ROLE_OPTIONS + " CONNECTION LIMIT {} PASSWORD {}")
                    .format(ident, sql.Literal(limit), sql.Literal(verifier)))
            return
        stored, connlimit, attributes = row[0], row[1], dict(zip(ROLE_ATTRIBUTES, row[2:]))
        if attributes != ROLE_ATTRIBUTES or connlimit != limit:
            self.do(conn, "reset the attributes of role %s" % name,
                    sql.SQL("ALTER ROLE {} " + ROLE_OPTIONS + " CONNECTION LIMIT {}").format(ident, sql.Literal(limit)))
        if not password_matches(stored, self.params["password"]):
            verifier = scram_verifier(self.params["password"], os.urandom(16))
            self.do(conn, "set the password of role %s" % name,
                    sql.SQL("ALTER ROLE {} PASSWORD {}").format(ident, sql.Literal(verifier)))
        # No memberships: the role must not inherit anyone's rights.
        for (group,) in conn.execute("SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid "
                                     "JOIN pg_roles r ON r.oid = m.member WHERE r.rolname = %s", (name,)).fetchall():
            self.do(conn, "revoke %s from role %s" % (group, name),
                    sql.SQL("REVOKE {} FROM {}").format(sql.Identifier(group), ident))

    def database(self, conn):
        """Returns False when the database does not exist (check mode only)."""
        db, role = self.params["database"], self.params["role"]
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,)).fetchone() is None:
            self.do(conn, "create database %s" % db,
                    sql.SQL("CREATE DATABASE {} OWNER postgres ENCODING 'UTF8' TEMPLATE template0").format(sql.Identifier(db)))
            if self.changes.check:
                self.changes.note("create the lease tables and grants in %s" % db)
                return False
        # Only CONNECT, and only for the role: no TEMPORARY (temp tables) or
        # CREATE (schemas) for it, nothing for PUBLIC.
        acl = {}
        for grantee, privilege in conn.execute(
                "SELECT coalesce(r.rolname, 'PUBLIC'), a.privilege_type FROM pg_database d "
                "CROSS JOIN aclexplode(coalesce(d.datacl, acldefault('d', d.datdba))) a "
                "LEFT JOIN pg_roles r ON r.oid = a.grantee WHERE d.datname = %s", (db,)).fetchall():
            acl.setdefault(grantee, set()).add(privilege)
        ident, role_ident = sql.Identifier(db), sql.Identifier(role)
        if acl.get("PUBLIC"):
            self.do(conn, "revoke all on database %s from PUBLIC" % db,
                    sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(ident))
        if acl.get(role, set()) != {"CONNECT"}:
            self.do(conn, "grant only CONNECT on database %s to %s" % (db, role),
                    sql.SQL("REVOKE ALL ON DATABASE {0} FROM {1}; GRANT CONNECT ON DATABASE {0} TO {1}").format(ident, role_ident))
        return True

    def tables(self, conn):
        role = self.params["role"]
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
            self.changes.note("create the lease tables and grants for %s" % role)  # check mode only
            return
        if conn.execute("SELECT has_schema_privilege(%s, 'public', 'CREATE')", (role,)).fetchone()[0]:
            self.do(conn, "revoke CREATE on schema public from PUBLIC and %s" % role,
                    sql.SQL("REVOKE CREATE ON SCHEMA public FROM PUBLIC, {}").format(sql.Identifier(role)))
        for statement in self.params["schema"]:
            table = re.search(r"CREATE TABLE IF NOT EXISTS (\w+)", statement).group(1)
            exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", ("public." + table,)).fetchone()[0]
            if not exists:
                self.do(conn, "create table %s" % table, statement)
                if self.changes.check:
                    self.changes.note("grant %s on %s to %s" % (", ".join(self.params["grants"][table]), table, role))
                    continue
            self.upgrade(conn, table)
            for privilege in TABLE_PRIVILEGES:
                want = privilege in self.params["grants"][table]
                have = conn.execute("SELECT has_table_privilege(%s, %s, %s)",
                                    (role, "public." + table, privilege)).fetchone()[0]
                if have != want:
                    self.do(conn, "%s %s on %s %s %s" % ("grant" if want else "revoke", privilege, table,
                                                         "to" if want else "from", role),
                            sql.SQL("{} " + privilege + " ON TABLE public.{} {} {}").format(
                                sql.SQL("GRANT" if want else "REVOKE"), sql.Identifier(table),
                                sql.SQL("TO" if want else "FROM"), sql.Identifier(role)))

    def upgrade(self, conn, table):
        """The columns added since a table was first made (the engine's
        SCHEMA_UPGRADES: "ALTER TABLE t ADD COLUMN IF NOT EXISTS c type")."""
        for statement in self.params["upgrades"]:
            target, column = re.match(r"ALTER TABLE (\w+) ADD COLUMN IF NOT EXISTS (\w+) ", statement).groups()
            if target != table:
                continue
            exists = conn.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = 'public' "
                                  "AND table_name = %s AND column_name = %s", (table, column)).fetchone()
            if exists is None:
                self.do(conn, "add column %s to %s" % (column, table), statement)

    def run(self):
        """The actions, or raises what failed."""
        with psycopg.connect(dbname="postgres", autocommit=True, **self.where) as conn:
            self.role(conn)
            database_exists = self.database(conn)
        if database_exists:
            with psycopg.connect(dbname=self.params["database"], autocommit=True, **self.where) as conn:
                self.tables(conn)
        return self.changes.actions

    def outcome(self):
        """{"actions": [...]} or {"msg": why it failed}: what run() gives, as JSON can carry it."""
        try:
            return {"actions": self.run()}
        except (psycopg.Error, KeyError, ValueError, AttributeError) as exc:
            return {"msg": failure_message(FAILED, exc)}


class ChildFailed(Exception):
    """The process of as_user() failed: the error it raised ("Class: text")."""


def as_user(name, work):
    """work() in a child process that runs as the operating system user NAME
    (its groups, home and name, as runuser gives them): peer authentication
    on the socket maps that user to the role of its name. Returns what work()
    returns, which must be JSON; raises ChildFailed with what it raised."""
    user = pwd.getpwnam(name)
    if os.geteuid() == user.pw_uid:
        return work()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns, whatever happens
        try:
            os.close(read_end)
            with os.fdopen(write_end, "w") as pipe:
                try:
                    os.initgroups(name, user.pw_gid)
                    os.setgid(user.pw_gid)
                    os.setuid(user.pw_uid)
                    os.environ.update(HOME=user.pw_dir, USER=name, LOGNAME=name)
                    answer = {"answer": work()}
                except Exception as exc:  # pylint: disable=broad-exception-caught  # the parent reports it
                    answer = {"error": "%s: %s" % (exc.__class__.__name__, exc)}
                json.dump(answer, pipe)
        finally:
            os._exit(0)  # pylint: disable=protected-access  # no cleanup of the parent's state here
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    answer = json.loads(text) if text else {"error": "the process running as %s ended without an answer" % name}
    if "error" in answer:
        raise ChildFailed(answer["error"])
    return answer["answer"]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            database=dict(type="str", required=True),
            role=dict(type="str", required=True),
            password=dict(type="str", required=True, no_log=True),
            connection_limit=dict(type="int", default=-1),
            login_host=dict(type="str", default="/var/run/postgresql"),
            port=dict(type="int", default=5432),
            login_user=dict(type="str"),
            run_as=dict(type="str"),
            schema=dict(type="list", elements="str", required=True),
            upgrades=dict(type="list", elements="str", default=[]),
            grants=dict(type="dict", required=True),
        ),
        supports_check_mode=True,
    )
    if PSYCOPG_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("psycopg"), exception=PSYCOPG_IMPORT_ERROR)
    provisioner = Provisioner(module.params, module.check_mode)
    try:
        outcome = as_user(module.params["run_as"], provisioner.outcome) if module.params["run_as"] else provisioner.outcome()
    except ChildFailed as exc:
        module.fail_json(msg=FAILED + str(exc))
    except KeyError as exc:  # pwd: no such user
        module.fail_json(msg=failure_message(FAILED, exc))
    if "msg" in outcome:
        module.fail_json(msg=outcome["msg"])
    module.exit_json(changed=bool(outcome["actions"]), actions=outcome["actions"])


if __name__ == "__main__":
    main()
