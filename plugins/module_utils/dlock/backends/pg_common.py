"""PostgreSQL plumbing shared by the lease-table and advisory-lock backends.

Connections are autocommit, never use server-side prepared statements (so they
work through PgBouncer in transaction mode) and carry TCP keepalives and a TCP
user timeout, so a dead peer is noticed in seconds rather than hours.

High availability (Patroni, synchronous replication): the URL may list several
hosts; they are tried in order and only a read-write server is accepted
(target_session_attrs=read-write, always), so a failover is a reconnect. A
write counts only when its commit is known to be synchronously replicated
(see CommitUnknown).
"""

import json
import math
import os
import select
import socket  # psycopg imports it anyway: no cost at start
import threading
import time

from ..errors import AuthError, BackendError, MissingDriver
from ..slots import marker_owner, outcome_marker
from ..validate import MAX_DURATION, backend_url
from ..watchdog import Watchdog
from .base import Backend, Grant, LockView, endpoint, grant_not_counted, lease_ms, rerun_refusal

try:
    import psycopg
except ImportError:
    psycopg = None

# Created on first use when missing. A least-privilege role gets them from the
# dlock_postgresql role instead (it then needs no CREATE right).
SCHEMA = (
    """CREATE TABLE IF NOT EXISTS dlock_lease (
        key text PRIMARY KEY,
        owner text,
        fence bigint NOT NULL DEFAULT 0,
        acquired_at timestamptz,
        expires_at timestamptz,
        last_run jsonb,
        line_until timestamptz
    )""",
    """CREATE TABLE IF NOT EXISTS dlock_slot (
        key text NOT NULL,
        slot bigint NOT NULL,
        owner text NOT NULL,
        expires_at timestamptz NOT NULL,
        PRIMARY KEY (key, slot)
    )""",
    """CREATE TABLE IF NOT EXISTS dlock_wait (
        key text NOT NULL,
        owner text NOT NULL,
        arrived timestamptz NOT NULL,
        expires_at timestamptz NOT NULL,
        PRIMARY KEY (key, owner)
    )""",
)

# The line of waiters: a live ticket (expires_at in the future) of another
# owner that arrived before ours, or before now when we have none.
WAITER_AHEAD = """
SELECT 1 FROM dlock_wait w
 WHERE w.key = %(key)s AND w.owner <> %(owner)s AND w.expires_at > clock_timestamp()
   AND w.arrived < COALESCE((SELECT m.arrived FROM dlock_wait m
                              WHERE m.key = %(key)s AND m.owner = %(owner)s AND m.expires_at > clock_timestamp()),
                            'infinity')
"""

# Take the last place (a new ticket, or ours after it expired) or keep ours;
# drop the key's expired tickets. The key's lease row (made here if the key
# was never granted: no owner, fence 0) gets the ticket's expiry as its
# line_until if that is later, in the same statement, from the same value.
# Leaving the line never lowers line_until: only time does (lowered from a
# snapshot, it could miss a ticket that joined meanwhile). The answer says
# whether this session still listens (LISTEN was sent before, in a
# transaction of its own). Through PgBouncer in transaction mode a LISTEN
# stays on a pooled server session and its notifications do not reach us;
# when this shows it (another session ran this statement) we stop sending
# LISTENs. Waiting never depends on them: the waiter looks again at least
# every waiting.TICKET_REFRESH.
JOIN_QUEUE = """
WITH purged AS (DELETE FROM dlock_wait WHERE key = %(key)s AND expires_at <= clock_timestamp() AND owner <> %(owner)s),
     ticket AS (INSERT INTO dlock_wait AS w (key, owner, arrived, expires_at)
                VALUES (%(key)s, %(owner)s, clock_timestamp(), clock_timestamp() + %(ttl_ms)s * interval '1 millisecond')
                ON CONFLICT (key, owner) DO UPDATE
                   SET expires_at = excluded.expires_at,
                       arrived = CASE WHEN w.expires_at > clock_timestamp() THEN w.arrived ELSE excluded.arrived END
                RETURNING expires_at),
     line AS (INSERT INTO dlock_lease AS l (key, line_until) SELECT %(key)s, expires_at FROM ticket
              ON CONFLICT (key) DO UPDATE SET line_until = GREATEST(l.line_until, excluded.line_until))
SELECT 'dlock' = ANY(ARRAY(SELECT pg_listening_channels())) FROM ticket
"""

# Wake the first live waiter in line (channel 'dlock', payload "KEY OWNER":
# keys hold no spaces), if there is one; the others stay asleep. A scalar
# subquery: it fits in a RETURNING or a select list.
NOTIFY_FIRST = """(SELECT pg_notify('dlock', w.key || ' ' || w.owner) FROM dlock_wait w
 WHERE w.key = %(key)s AND w.expires_at > clock_timestamp() ORDER BY w.arrived LIMIT 1)"""

WAITERS = "SELECT count(*) FROM dlock_wait WHERE key = %s AND expires_at > clock_timestamp()"

# Leaving may put someone else first while the lock is free: tell them.
LEAVE_QUEUE = """
WITH gone AS (DELETE FROM dlock_wait WHERE key = %(key)s AND owner = %(owner)s RETURNING 1)
SELECT """ + NOTIFY_FIRST + """
 WHERE EXISTS (SELECT 1 FROM gone)
   AND NOT EXISTS (SELECT 1 FROM dlock_lease WHERE key = %(key)s AND owner IS NOT NULL
                                               AND (expires_at IS NULL OR expires_at > clock_timestamp()))
"""

TABLES = ("dlock_lease", "dlock_slot", "dlock_wait")

# Columns added since the tables were first released: brought to tables made
# by an earlier version, by the dlock_postgresql role (which owns them) or,
# where the runners' role owns the tables, by the engine when a statement
# finds the column missing. Each is "ALTER TABLE t ADD COLUMN IF NOT EXISTS c type".
#   line_until: until when a ticket in the key's line may still be live (the
#   latest expiry a join gave one); a grant reads the line from its own row.
SCHEMA_UPGRADES = (
    """ALTER TABLE dlock_lease ADD COLUMN IF NOT EXISTS line_until timestamptz""",
)

# "Now" is clock_timestamp(), never now(): now() is the transaction's start,
# which lags real time by every wait inside the transaction (a row lock, a
# slot claim queued behind another). Expiry checks and new expiries use the
# moment the statement really runs; the holder's own deadline counts from
# when it sent the request, which is earlier still, so it stays on the safe side.
#
# Grant when the key is free or its lease has expired; the fence grows by one
# per grant and lives in the row, which is never deleted. expires_at NULL means
# "held by a session" (advisory backend, which passes ttl_ms NULL, session true).
# While waiters are in line (dlock_wait), only the first live one is granted:
# nothing is inserted or updated when a live ticket is ahead of ours (or when
# there is any and we have none).
UPSERT_LEASE = """
INSERT INTO dlock_lease AS l (key, owner, fence, acquired_at, expires_at)
SELECT %(key)s, %(owner)s, 1, clock_timestamp(),
       CASE WHEN %(ttl_ms)s::bigint IS NULL THEN NULL
            ELSE clock_timestamp() + %(ttl_ms)s::bigint * interval '1 millisecond' END
 WHERE NOT EXISTS (""" + WAITER_AHEAD + """)
ON CONFLICT (key) DO UPDATE
   SET owner = excluded.owner, fence = l.fence + 1,
       acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
 WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp()
    -- a session holder's row (expires_at NULL) is stale once we hold its advisory lock
    OR (l.expires_at IS NULL AND %(session)s)
RETURNING fence
"""

# The same grant for a key that has nobody in line (the common case), the
# one statement a runner that finds the lock free sends. It reads the line
# from the lease row itself (line_until: no ticket can be live after it),
# with no subquery on dlock_wait: PostgreSQL parses and plans it in half the
# time of UPSERT_LEASE. It grants only where UPSERT_LEASE would, and refuses
# while a ticket may be live: then PgLeaseBackend asks again with
# UPSERT_LEASE. A key without a row has no line (a join makes the row). A join
# and this grant serialise on the row's lock, and the grant's WHERE is judged
# on the row as the join left it. A lease row (ttl, no session holder) only:
# the advisory backend uses UPSERT_LEASE.
UPSERT_LEASE_NO_LINE = """
INSERT INTO dlock_lease AS l (key, owner, fence, acquired_at, expires_at)
VALUES (%(key)s, %(owner)s, 1, clock_timestamp(), clock_timestamp() + %(ttl_ms)s * interval '1 millisecond')
ON CONFLICT (key) DO UPDATE
   SET owner = excluded.owner, fence = l.fence + 1,
       acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
 WHERE (l.owner IS NULL OR l.expires_at <= clock_timestamp())
   AND (l.line_until IS NULL OR l.line_until <= clock_timestamp())
RETURNING fence
"""

# The slot claimed is decided here, on the server's clock (slots.py's
# slot_number of clock_timestamp()), when a width is given: (slot, claimed).
CLAIM_SLOT = """
WITH s AS (SELECT COALESCE(floor(extract(epoch FROM clock_timestamp()) * 1000 / %(width_ms)s::bigint + 0.5)::bigint,
                           %(slot)s::bigint) AS slot),
     claim AS (INSERT INTO dlock_slot (key, slot, owner, expires_at)
               SELECT %(key)s, slot, %(owner)s, clock_timestamp() + %(marker_ms)s * interval '1 millisecond' FROM s
               ON CONFLICT DO NOTHING RETURNING 1)
SELECT slot, EXISTS (SELECT 1 FROM claim) FROM s
"""

# A rerun of a slot (base.Slot.rerun): the server's slot now and the slot's
# live marker, its row locked until the grant's transaction ends, so two
# reruns of one slot serialise on it (the second then finds the lease taken).
RERUN_SLOT = """
SELECT floor(extract(epoch FROM clock_timestamp()) * 1000 / %(width_ms)s::bigint + 0.5)::bigint,
       (SELECT owner FROM dlock_slot
         WHERE key = %(key)s AND slot = %(slot)s AND expires_at > clock_timestamp() FOR UPDATE)
"""
# The marker, ours now (a rerun's grant) or recording our run's outcome (a
# release): only while it names `expected`; its expiry is kept.
SET_SLOT_OWNER = """
UPDATE dlock_slot SET owner = %(marker)s
 WHERE key = %(key)s AND slot = %(slot)s AND owner = %(expected)s AND expires_at > clock_timestamp()
"""

# An expired marker is no marker (it is pruned at the next claim).
SLOT_OWNER = "SELECT owner FROM dlock_slot WHERE key = %s AND slot = %s AND expires_at > clock_timestamp()"
PRUNE_SLOTS = "DELETE FROM dlock_slot WHERE key = %s AND expires_at < clock_timestamp()"

QUERY = """
SELECT owner, fence, extract(epoch FROM acquired_at)::float8,
       extract(epoch FROM expires_at - clock_timestamp())::float8, last_run,
       extract(epoch FROM clock_timestamp())::float8, expires_at IS NULL OR expires_at > clock_timestamp()
  FROM dlock_lease WHERE key = %s
"""

# Each release answers whether it freed the lock while someone may be in
# line (line_until, as the grant reads it). Only then is WAKE_FIRST sent, in
# the same transaction (a notification goes out at commit); a release with
# nobody in line costs one statement. A wake-up is never a grant: if the lock
# is taken between the two statements, the woken waiter is refused and waits on.
#
# Keep the lease until acquired_at + min_hold but never extend it; record the run.
RELEASE = """
UPDATE dlock_lease
   SET expires_at = LEAST(COALESCE(expires_at, 'infinity'),
                          GREATEST(clock_timestamp(), acquired_at + %(min_hold_ms)s * interval '1 millisecond')),
       owner = CASE WHEN acquired_at + %(min_hold_ms)s * interval '1 millisecond' > clock_timestamp()
                         AND (expires_at IS NULL OR expires_at > clock_timestamp()) THEN owner END,
       last_run = COALESCE(%(last)s::jsonb, last_run)
 WHERE key = %(key)s AND owner = %(owner)s
RETURNING owner IS NULL AND line_until > clock_timestamp()
"""

# RELEASE without a min_hold (the common case): free at once, with less to
# parse. The same answer: RELEASE would keep the owner only if the server's
# clock had stepped back since the grant, to before acquired_at. The row's
# expires_at becomes the release's time even if the lease had expired before
# (no grant or answer reads expires_at of a row without an owner).
RELEASE_AT_ONCE = """
UPDATE dlock_lease SET expires_at = clock_timestamp(), owner = NULL
 WHERE key = %(key)s AND owner = %(owner)s
RETURNING line_until > clock_timestamp()
"""
# The same, recording the run.
RELEASE_AT_ONCE_LAST = """
UPDATE dlock_lease SET expires_at = clock_timestamp(), owner = NULL, last_run = %(last)s::jsonb
 WHERE key = %(key)s AND owner = %(owner)s
RETURNING line_until > clock_timestamp()
"""

WAKE_FIRST = "SELECT " + NOTIFY_FIRST

# The primary's synchronous replication, as far as the runners' role may see
# it. pg_stat_replication shows any role one row per standby connection, but
# its state and sync_state only to roles with the rights of pg_read_all_stats
# (pg_monitor has them); the dlock_postgresql role grants its role no
# membership, so a least-privilege runner sees how many standbys are
# connected and whether synchronous_standby_names asks for one, not whether
# a connected standby is synchronous yet.
REPLICATION = """
SELECT current_setting('synchronous_standby_names'), count(*),
       count(*) FILTER (WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')),
       pg_has_role('pg_read_all_stats', 'USAGE'), pg_is_in_recovery()
  FROM pg_stat_replication
"""

UNDO_SLOT = "DELETE FROM dlock_slot WHERE key = %s AND slot = %s AND owner = %s"

FORCE_RELEASE = """
UPDATE dlock_lease SET owner = NULL, expires_at = clock_timestamp()
 WHERE key = %(key)s AND owner IS NOT NULL
RETURNING """ + NOTIFY_FIRST


class CommitUnknown(BackendError):
    """A write may be committed on the primary without being synchronously
    replicated, or may not be committed at all: it cannot be counted."""


def _commit_warning(notices):
    """The server's words when a write's commit was acknowledged without the
    synchronous standby's confirmation, else None.

    When the wait for the standby is cancelled (our op_timeout cancel request,
    or pg_terminate_backend), PostgreSQL acknowledges the commit with a WARNING
    "canceling wait for synchronous replication due to user request" / "The
    transaction has already committed locally, but might not have been
    replicated to the standby." (src/backend/replication/syncrep.c). It has no
    SQLSTATE of its own (the generic 01000; 57P01 when terminated) and its text
    follows lc_messages, which only a superuser may set. So the text is never
    matched: any WARNING during a write means the write is not vouched for.
    The writes (lease upsert, slot claim, renew, release) raise no other
    warning, so this only ever fails closed."""
    for severity, message, detail in notices:
        if severity == "WARNING":
            return "%s (%s)" % (message, detail) if detail else message
    return None


class Refused(Exception):
    """Rolls back a grant transaction; carries the answer ('locked' or 'duplicate')."""

    def __init__(self, status):
        Exception.__init__(self, status)
        self.status = status


def _ms(seconds):
    return int(math.ceil(seconds * 1000))


def shutdown_grace(op_timeout):
    """How long past op_timeout a call may go on before its socket is shut
    down: the time the cancel request gets to end it (a statement, a commit's
    wait for the standby, which then answers with the warning that says the
    commit is not replicated). Half the op_timeout, at most a second."""
    return min(op_timeout / 2.0, 1.0)


class PgBackend(Backend):
    """Connection handling, schema and the queries both PostgreSQL backends share."""

    # Look for the lease tables before the first operation (True), or create
    # them only when an operation finds one missing, and then do it again.
    # Doing it again is safe only where an operation leaves nothing behind
    # when it fails: not the advisory lock, taken outside any transaction.
    schema_first = False

    def __init__(self, url, password=None, op_timeout=2.0, ca_file=None):
        if psycopg is None:
            raise MissingDriver("psycopg", "python3-psycopg", "postgresql://")
        self.url = url
        # [(host, port or None)] in the URL's order; the one that gave the
        # last read-write session is tried first.
        self.hosts = backend_url(url).hosts
        self._current = 0
        self.password = password
        self.op_timeout = op_timeout
        self.ca_file = ca_file
        self._conn = None
        self._schema_ready = self._upgraded = False
        # (severity, message, detail) of the notices of the current operation
        self._notices = []
        self._watchdog = Watchdog("dlock-pg-cancel")
        self._grace = shutdown_grace(op_timeout)
        # Held to shut a socket down and to close a connection: a socket is
        # never shut down after its descriptor was closed, and maybe reused.
        self._closing = threading.Lock()
        self._shut = None  # the connection whose socket the last resort shut down
        self._listening = None  # the connection whose session LISTENs, while we wait
        self._pooled = False  # a LISTEN did not stick to our session (PgBouncer, transaction mode)
        self._woken = set()  # notifications ("KEY OWNER") not yet looked at
        self._waiting_as = {}  # key -> the owner that waits in line

    # -- connection -------------------------------------------------------
    def _connect(self):
        """A read-write session on the first host that gives one, within
        op_timeout for all the hosts tried. With several hosts we try them
        one by one, each with an equal share of what is left (as etcd's
        members): handed the whole list, libpq (waited on by psycopg) can
        spend the whole op_timeout on a host that never answers, such as a
        partitioned former primary, and never ask the new primary behind
        it. A wrong password is the same on every host: it ends the try."""
        deadline = time.monotonic() + self.op_timeout
        count = len(self.hosts)
        errors = []
        for number in range(count):
            index = (self._current + number) % count
            left = deadline - time.monotonic()
            if left <= 0:
                break
            host, port = self.hosts[index]
            try:
                conn = self._connect_to(host, port, left / (count - number))
            except AuthError:
                raise
            except BackendError as exc:
                errors.append(("%s: %s" % (endpoint(host, port or 5432), exc)) if count > 1 else str(exc))
                continue
            self._current = index
            return conn
        raise BackendError("postgresql: cannot connect (%s)" % ("; ".join(errors) or "no time left"))

    def _connect_to(self, host, port, timeout):
        kwargs = dict(
            # This host only (the URL's list is tried by _connect); an empty
            # port is libpq's default.
            host=host, port=str(port or ""),
            autocommit=True,
            prepare_threshold=None,
            application_name="dlock",
            # libpq counts connect_timeout in whole seconds and treats < 2 as 2.
            connect_timeout=max(2, int(math.ceil(timeout))),
            keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3,
            tcp_user_timeout=_ms(self.op_timeout),
            # A lock is only ever taken on a server that takes writes: with
            # several hosts (h1,h2,h3) a standby is passed over (_connect
            # goes on to the next); with one, a standby is an error, not a lock.
            # This overrides the URL, which validate.py limits to read-write.
            target_session_attrs="read-write",
        )
        if self.password is not None:
            kwargs["password"] = self.password
        if self.ca_file:
            kwargs["sslrootcert"] = self.ca_file
        try:
            conn = psycopg.connect(self.url, **kwargs)
        except psycopg.OperationalError as exc:
            text = str(exc).strip()
            if "password authentication failed" in text or "no password supplied" in text:
                raise AuthError("postgresql: authentication failed (%s)" % text.splitlines()[0])
            raise BackendError(text.splitlines()[0] if text else str(exc))
        except psycopg.Error as exc:
            raise BackendError(str(exc).strip() or exc.__class__.__name__)
        conn.add_notice_handler(self._on_notice)
        conn.add_notify_handler(self._on_notify)
        try:
            # A client_min_messages set for the role or the database above
            # WARNING would hide an unreplicated commit from us.
            conn.execute("SET client_min_messages = warning")
        except psycopg.Error as exc:
            conn.close()
            raise BackendError(str(exc).strip() or exc.__class__.__name__)
        return conn

    @property
    def conn(self):
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        return self._conn

    def _ensure_schema(self, conn, upgrade=False):
        """Create the lease tables where one is missing; upgrade: bring the
        existing ones up to date (SCHEMA_UPGRADES), a statement having found a
        column missing. Both need the tables' owner rights; a least-privilege
        role gets a message naming the role that does it."""
        try:
            with conn.cursor() as cur:
                if upgrade:
                    statements = SCHEMA_UPGRADES
                else:
                    cur.execute("SELECT bool_and(to_regclass(t) IS NOT NULL) FROM unnest(%s::text[]) AS t",
                                (list(TABLES),))
                    statements = () if cur.fetchone()[0] else SCHEMA + SCHEMA_UPGRADES
                for statement in statements:
                    try:
                        cur.execute(statement)
                    except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateObject,
                            psycopg.errors.DuplicateColumn):
                        pass  # created concurrently by another runner
        except psycopg.Error as exc:
            raise BackendError("postgresql: cannot %s the lease tables (%s); %s them with the dlock_postgresql role"
                               % ("bring up to date" if upgrade else "create", str(exc).strip(),
                                  "upgrade" if upgrade else "create"))
        self._schema_ready = True

    def _on_notice(self, diag):
        # Copied out: the Diagnostic is only valid during the callback.
        self._notices.append((diag.severity_nonlocalized, diag.message_primary, diag.message_detail))

    def _on_notify(self, notify):
        # Notifications that arrive with a statement's answer (psycopg hands
        # them here); wait_change reads the ones that arrive while it waits.
        self._woken.add(notify.payload)

    def _cancel(self, conn):
        """Ask the server to cancel what conn is running (the op_timeout)."""
        try:
            if hasattr(conn, "cancel_safe"):  # psycopg >= 3.2: bounded, non-blocking with libpq >= 17
                conn.cancel_safe(timeout=self.op_timeout)
            else:
                conn.cancel()
        except Exception:  # a closed connection, an unreachable server
            pass  # nothing more to do here: TCP timeouts and the caller's deadline remain

    def _shut_down(self, conn):
        """The last resort of op_timeout: shut the connection's socket down, so
        the call waiting on it fails at once. A cancel request is acted on by
        the server process; one that does not run (stopped, stuck in the
        kernel on a hung disk) never acts on it, while its kernel still
        acknowledges our packets (so neither the TCP user timeout nor the
        keepalives end the wait). Shut down on a duplicate of libpq's
        descriptor: the socket is shared, libpq's descriptor stays its own.
        The connection is never used again (_bounded resets it)."""
        with self._closing:
            if conn.closed:
                return
            try:
                sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
            except (psycopg.Error, OSError, ValueError):
                return  # no socket left to shut down
            try:
                self._shut = conn
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already disconnected
            finally:
                sock.close()

    def _bounded(self, conn, fn):
        """fn(conn), with a cancel request sent if it runs past op_timeout,
        and its socket shut down if it still runs a grace later (_shut_down).

        op_timeout is enforced by a cancel request from the client, not by
        statement_timeout: the server stops counting statement_timeout before
        the commit, so it never ends a commit's wait for the synchronous
        standby, which with a strict synchronous setup and no standby lasts
        for ever. A cancel does end it: the commit is then acknowledged with
        a warning (see _commit_warning)."""
        self._shut = None
        self._watchdog.arm(self.op_timeout, lambda: self._cancel(conn),
                           then=(self._grace, lambda: self._shut_down(conn)))
        del self._notices[:]
        try:
            if self.schema_first and not self._schema_ready:
                self._ensure_schema(conn)
            try:
                return fn(conn)
            except psycopg.errors.UndefinedTable:
                # A database the lease tables were never created in: create
                # them (a CREATE TABLE commits: under the op_timeout too) and
                # do it again. Nothing was written: the statement that named
                # a missing table was refused whole, and a transaction
                # around it rolled back. Asked only then, not on every
                # connection: a round trip less for each start of a runner.
                if self._schema_ready:
                    raise
                self._ensure_schema(conn)
                return fn(conn)
            except psycopg.errors.UndefinedColumn:
                # Tables made by an earlier version: the same, once per backend.
                if self._upgraded:
                    raise
                self._upgraded = True
                self._ensure_schema(conn, upgrade=True)
                return fn(conn)
        finally:
            fired = self._watchdog.disarm()
            if fired:
                self.reset()  # the cancel request may land on our next statement: start afresh

    def _run(self, fn, write=False):
        """Run fn(conn) within op_timeout and turn driver errors into
        BackendError; a broken connection is dropped so the next call reconnects.
        write=True: fn commits something that counts only once it is known to
        be synchronously replicated; otherwise CommitUnknown is raised."""
        try:
            result = self._bounded(self.conn, fn)
        except psycopg.errors.QueryCanceled:
            # An ERROR, not the commit's warning: the statement and its transaction were rolled back.
            self.reset()
            raise BackendError("postgresql: no answer within op_timeout (%gs); cancelled" % self.op_timeout)
        except psycopg.OperationalError as exc:
            self.reset()
            text = str(exc).strip() or exc.__class__.__name__
            if self._shut is not None:
                text = ("no answer within op_timeout (%gs), nor to the cancel request within %gs more; "
                        "the connection was shut down (%s)" % (self.op_timeout, self._grace, text))
            if write:  # the connection was lost before or after the commit: nobody can tell
                raise CommitUnknown("postgresql: the outcome of the write is unknown: %s" % text)
            raise BackendError("postgresql: %s" % text)
        except psycopg.Error as exc:
            raise BackendError("postgresql: %s" % str(exc).strip())
        warning = _commit_warning(self._notices) if write else None
        if warning:
            self.reset()
            raise CommitUnknown("postgresql: the commit is not known to be replicated to a synchronous standby: %s"
                                % warning)
        return result

    def describe(self, cluster=False):
        """The server this session is on (with a multi-host URL, the one
        libpq found read-write) and, with cluster=True, its synchronous
        standbys as far as the role may see them (REPLICATION)."""
        info = {"backend": self.name, "member": None, "cluster": None}
        if cluster:
            names, connected, sync, visible, standby = self._run(lambda conn: conn.execute(REPLICATION).fetchone())
            info["cluster"] = {"primary": not standby, "synchronous_standby_names": names,
                               "sync_replication": bool(names.strip()), "standbys_connected": connected,
                               "sync_standbys": sync if visible else None}
        conn = self._conn
        if conn is not None and not conn.closed:
            # Every session is read-write (target_session_attrs): on the primary.
            info["member"] = {"endpoint": endpoint(conn.info.host, conn.info.port), "role": "primary"}
        return info

    def reset(self):
        self._listening = None
        conn, self._conn = self._conn, None
        if conn is not None:
            with self._closing:
                try:
                    conn.close()
                except Exception:  # a stuck or broken connection: nothing left to save
                    pass

    def close(self):
        self.reset()

    # -- grants ---------------------------------------------------------------
    def _grant(self, grant, key, owner, slot):
        """Run grant(conn), the transaction that takes the lease. A grant whose
        commit cannot be counted (CommitUnknown) is no grant (base.grant_not_counted):
        it is undone as far as possible and raised as a BackendError; a
        refusal would pass for "another owner holds the lock"."""
        try:
            return self._run(grant, write=True)
        except CommitUnknown as exc:
            raise grant_not_counted(exc, lambda: self._undo_grant(key, owner, slot))

    def _undo_grant(self, key, owner, slot):
        """Release a grant we do not count; True when something of it was ours.

        Safe because it is owner-checked: it frees only a lease row and a slot
        marker that carry our own random owner token, under which no job runs.
        It commits with synchronous_commit = local (this transaction only) so
        it does not wait in turn for the missing standby: freeing needs no
        replication to be safe, since whoever takes the lease next must get
        its own grant replicated. If a failover loses it, the lease still
        ends at its TTL."""
        def undo(conn):
            with conn.transaction():
                conn.execute("SET LOCAL synchronous_commit = local")
                released = self._release_row(conn, key, owner, 0.0, None)
                if slot is not None and not slot.rerun:  # a rerun's marker stays, rerunnable (redis_lease)
                    released = conn.execute(UNDO_SLOT, (key, slot.number, owner)).rowcount > 0 or released
            return released
        return self._run(undo)

    # -- shared queries -----------------------------------------------------
    def server_time(self):
        def query(conn):
            return conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]
        return self._run(query)

    def _query(self, conn, key):
        row = conn.execute(QUERY, (key,)).fetchone()
        if row is None:
            now = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]
            return LockView(key, server_time=now)
        owner, fence, acquired_at, ttl_left, last, now, live = row
        # fence 0: a row a waiter's ticket made before any grant (no fence was ever given).
        return LockView(key, owner=owner if live else None, fence=fence or None, acquired_at=acquired_at,
                      ttl_remaining=max(0.0, ttl_left) if (ttl_left is not None and live and owner) else None,
                      last=last, server_time=now)

    def query(self, key):
        return self._run(lambda conn: self._query(conn, key))

    def _refusal(self, conn, key, slot, status):
        if status in ("future", "unknown"):  # a rerun refused
            return Grant(status)
        holder = self._query(conn, key)
        if status == "duplicate":
            marker = self._slot_owner(conn, key, slot)
            holder.owner = marker_owner(marker) if marker else None
        elif holder.owner is None:  # free, but others came first
            holder.queued = conn.execute(WAITERS, (key,)).fetchone()[0]
        return Grant(status, holder=holder)

    @staticmethod
    def _slot_owner(conn, key, slot):
        row = conn.execute(SLOT_OWNER, (key, slot.number)).fetchone()
        return row[0] if row else None

    @staticmethod
    def _claim_slot(conn, key, owner, slot):
        """True when the slot is ours; a Refused with rerun_refusal's answer
        for a rerun that may not be granted. Inside the grant's transaction."""
        if slot.rerun:
            params = {"key": key, "slot": slot.number, "width_ms": lease_ms(slot.width, "once_per")}
            current, marker = conn.execute(RERUN_SLOT, params).fetchone()
            refusal = rerun_refusal(slot.number, current, marker)
            if refusal is not None:
                raise Refused(refusal)
            params.update(marker=owner, expected=marker)
            return conn.execute(SET_SLOT_OWNER, params).rowcount == 1
        conn.execute(PRUNE_SLOTS, (key,))
        params = {"key": key, "owner": owner, "slot": slot.number,
                  "marker_ms": lease_ms(slot.marker_ttl, "once_per marker", 1.0, 1.5 * MAX_DURATION),
                  "width_ms": None if slot.width is None else lease_ms(slot.width, "once_per")}
        slot.number, claimed = conn.execute(CLAIM_SLOT, params).fetchone()
        return claimed

    @staticmethod
    def _upsert(conn, key, owner, ttl_ms, statement=UPSERT_LEASE):
        params = {"key": key, "owner": owner, "ttl_ms": ttl_ms, "session": ttl_ms is None}
        row = conn.execute(statement, params).fetchone()
        return row[0] if row else None

    @staticmethod
    def _release_row(conn, key, owner, min_hold, last, notify=True, slot=None):
        """Owner-checked release of the row; notify: wake the first waiter if
        it freed the lock. With last and slot, in one transaction, the
        slot's marker records the outcome (Backend.release). True when the
        row was ours."""
        min_hold_ms = lease_ms(min_hold, "min_hold", 0.0)
        params = {"key": key, "owner": owner, "min_hold_ms": min_hold_ms,
                  "last": json.dumps(last, sort_keys=True) if last else None}
        statement = RELEASE if min_hold_ms else RELEASE_AT_ONCE_LAST if last else RELEASE_AT_ONCE
        if slot is not None and last:
            params.update(slot=slot.number, expected=owner, marker=outcome_marker(owner, last.get("result")))
            with conn.transaction():
                row = conn.execute(statement, params).fetchone()
                if row is not None:
                    conn.execute(SET_SLOT_OWNER, params)
        else:
            row = conn.execute(statement, params).fetchone()
        if row is not None and notify and row[0]:
            conn.execute(WAKE_FIRST, params)
        return row is not None

    # -- waiting --------------------------------------------------------------
    def join_queue(self, key, owner, ttl):
        def join(conn):
            if self._listening is not conn and not self._pooled:
                # Its own transaction: a LISTEN takes effect at commit.
                conn.execute("LISTEN dlock")
                self._listening = conn
            self._waiting_as[key] = owner
            params = {"key": key, "owner": owner, "ttl_ms": lease_ms(ttl, "ticket ttl")}
            if not conn.execute(JOIN_QUEUE, params).fetchone()[0] and self._listening is conn:
                # A pooler in transaction mode ran the LISTEN on another server
                # session: nobody tells us of releases; we wake by time, and
                # send no more LISTENs into its pool.
                self._listening, self._pooled = None, True
        self._run(join)

    def leave_queue(self, key, owner):
        def leave(conn):
            conn.execute(LEAVE_QUEUE, {"key": key, "owner": owner})
            if self._listening is conn:
                conn.execute("UNLISTEN dlock")
            self._listening = None
        self._run(leave)
        self._woken.discard("%s %s" % (key, self._waiting_as.pop(key, owner)))

    def wait_change(self, key, timeout):
        """Wait for a notification naming us first in the key's line, on the
        session that LISTENs; without one (not listening, a pooler), sleep."""
        deadline = time.monotonic() + timeout
        conn = self._listening if self._listening is self._conn else None
        wake = "%s %s" % (key, self._waiting_as.get(key))
        while wake not in self._woken:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if conn is None or conn.closed:
                time.sleep(left)
                return
            try:
                if select.select([conn.fileno()], [], [], left)[0]:
                    conn.pgconn.consume_input()
                while True:
                    notify = conn.pgconn.notifies()
                    if notify is None:
                        break
                    self._woken.add(notify.extra.decode("utf-8", "replace"))
            except (psycopg.Error, OSError, ValueError):
                self.reset()  # a broken session: the next request reconnects, or says the server is down
                conn = None
        self._woken.clear()  # ours is handled; the others name other waiters
