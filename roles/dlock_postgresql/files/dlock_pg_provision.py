"""Create or fix the dlock database, its login role, the lease tables and the
grants, idempotently. Run as the postgres superuser (peer authentication on
the local socket); the spec comes as JSON on stdin, so the password is never
on a command line or in the environment.

Spec: {"database", "role", "password", "connection_limit", "host" (socket
dir), "port", "schema": [CREATE TABLE statements], "upgrades": [ALTER
TABLE ... ADD COLUMN IF NOT EXISTS statements, for tables made by an earlier
version], "grants": {table: [privileges]}, "check": bool}.
Prints {"changed": bool, "actions": [...]} (never the password) and exits 0,
or prints {"failed": true, "msg": ...} and exits 1.

The password is stored as a SCRAM-SHA-256 verifier computed here, so the
clear text never reaches the server (or its logs). An existing verifier is
recomputed with its own salt to tell whether the password changed.
"""

import base64
import hashlib
import hmac
import json
import os
import re
import sys

import psycopg
from psycopg import sql

ITERATIONS = 4096  # PostgreSQL's scram_iterations default
TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
ROLE_ATTRIBUTES = {  # pg_roles column -> wanted value (least privilege)
    "rolsuper": False, "rolinherit": False, "rolcreaterole": False, "rolcreatedb": False,
    "rolcanlogin": True, "rolreplication": False, "rolbypassrls": False,
}
ROLE_OPTIONS = "LOGIN NOSUPERUSER NOINHERIT NOCREATEROLE NOCREATEDB NOREPLICATION NOBYPASSRLS"
VERIFIER = re.compile(r"^SCRAM-SHA-256\$(\d+):([^$]+)\$([^:]+):(.+)$")


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
    def __init__(self, spec):
        self.spec = spec
        self.check = bool(spec.get("check"))
        self.actions = []
        self.where = {"host": spec.get("host") or "/var/run/postgresql", "port": int(spec.get("port") or 5432)}

    def do(self, conn, description, statement):
        """Record an action; run it unless in check mode."""
        self.actions.append(description)
        if not self.check:
            conn.execute(statement)

    def role(self, conn):
        name, limit = self.spec["role"], int(self.spec.get("connection_limit", -1))
        ident = sql.Identifier(name)
        row = conn.execute("SELECT rolpassword, rolconnlimit, %s FROM pg_authid WHERE rolname = %%s"
                           % ", ".join(ROLE_ATTRIBUTES), (name,)).fetchone()
        if row is None:
            verifier = scram_verifier(self.spec["password"], os.urandom(16))
            self.do(conn, "create role %s" % name, sql.SQL("CREATE ROLE {} " + ROLE_OPTIONS + " CONNECTION LIMIT {} PASSWORD {}")
                    .format(ident, sql.Literal(limit), sql.Literal(verifier)))
            return
        stored, connlimit, attributes = row[0], row[1], dict(zip(ROLE_ATTRIBUTES, row[2:]))
        if attributes != ROLE_ATTRIBUTES or connlimit != limit:
            self.do(conn, "reset the attributes of role %s" % name,
                    sql.SQL("ALTER ROLE {} " + ROLE_OPTIONS + " CONNECTION LIMIT {}").format(ident, sql.Literal(limit)))
        if not password_matches(stored, self.spec["password"]):
            verifier = scram_verifier(self.spec["password"], os.urandom(16))
            self.do(conn, "set the password of role %s" % name,
                    sql.SQL("ALTER ROLE {} PASSWORD {}").format(ident, sql.Literal(verifier)))
        # No memberships: the role must not inherit anyone's rights.
        for (group,) in conn.execute("SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid "
                                     "JOIN pg_roles r ON r.oid = m.member WHERE r.rolname = %s", (name,)).fetchall():
            self.do(conn, "revoke %s from role %s" % (group, name),
                    sql.SQL("REVOKE {} FROM {}").format(sql.Identifier(group), ident))

    def database(self, conn):
        """Returns False when the database does not exist (check mode only)."""
        db, role = self.spec["database"], self.spec["role"]
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,)).fetchone() is None:
            self.do(conn, "create database %s" % db,
                    sql.SQL("CREATE DATABASE {} OWNER postgres ENCODING 'UTF8' TEMPLATE template0").format(sql.Identifier(db)))
            if self.check:
                self.actions.append("create the lease tables and grants in %s" % db)
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
        role = self.spec["role"]
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
            self.actions.append("create the lease tables and grants for %s" % role)  # check mode only
            return
        if conn.execute("SELECT has_schema_privilege(%s, 'public', 'CREATE')", (role,)).fetchone()[0]:
            self.do(conn, "revoke CREATE on schema public from PUBLIC and %s" % role,
                    sql.SQL("REVOKE CREATE ON SCHEMA public FROM PUBLIC, {}").format(sql.Identifier(role)))
        for statement in self.spec["schema"]:
            table = re.search(r"CREATE TABLE IF NOT EXISTS (\w+)", statement).group(1)
            exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", ("public." + table,)).fetchone()[0]
            if not exists:
                self.do(conn, "create table %s" % table, statement)
                if self.check:
                    self.actions.append("grant %s on %s to %s" % (", ".join(self.spec["grants"][table]), table, role))
                    continue
            self.upgrade(conn, table)
            for privilege in TABLE_PRIVILEGES:
                want = privilege in self.spec["grants"][table]
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
        for statement in self.spec.get("upgrades", ()):
            target, column = re.match(r"ALTER TABLE (\w+) ADD COLUMN IF NOT EXISTS (\w+) ", statement).groups()
            if target != table:
                continue
            exists = conn.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = 'public' "
                                  "AND table_name = %s AND column_name = %s", (table, column)).fetchone()
            if exists is None:
                self.do(conn, "add column %s to %s" % (column, table), statement)

    def run(self):
        with psycopg.connect(dbname="postgres", autocommit=True, **self.where) as conn:
            self.role(conn)
            database_exists = self.database(conn)
        if database_exists:
            with psycopg.connect(dbname=self.spec["database"], autocommit=True, **self.where) as conn:
                self.tables(conn)
        return {"changed": bool(self.actions), "actions": self.actions}


def main():
    try:
        result = Provisioner(json.load(sys.stdin)).run()
    except (psycopg.Error, KeyError, ValueError, AttributeError) as exc:
        sys.stdout.write(json.dumps({"failed": True, "msg": "%s: %s" % (exc.__class__.__name__, exc)}) + "\n")
        return 1
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
