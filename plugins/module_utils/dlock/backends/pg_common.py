"""What the lease-table and advisory-lock backends share: the lease tables
(SCHEMA: the dlock_postgresql role reads its tables from here), the SQL, and
PgBackend, their grants, queries and line of waiters. Their session (hosts,
op_timeout, synchronous replication) is pg_session.py's.
"""

import json
import select
import time

from ..errors import BackendError, MissingDriver
from ..slots import SLOT_TRIES, marker_owner, outcome_marker
from ..validate import MAX_DURATION
from .base import (Backend, Grant, LockView, Pause, endpoint, grant_not_counted, history_entry, history_keep,
                   history_record, lease_ms, pause_ms, rerun_refusal, scope_parts)
from .pg_session import CommitUnknown, PgSession

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
    """CREATE TABLE IF NOT EXISTS dlock_pause (
        scope text PRIMARY KEY,
        record text NOT NULL,
        until timestamptz NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS dlock_history (
        key text NOT NULL,
        id bigint GENERATED ALWAYS AS IDENTITY,
        once text,
        entry text NOT NULL,
        PRIMARY KEY (key, id),
        UNIQUE (key, once)
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

# The tables a grant needs: a runner fails closed until they are all there.
TABLES = ("dlock_lease", "dlock_slot", "dlock_wait", "dlock_pause")
# A table only the history needs: made where it is missing if this role may,
# else its writes fail (counted, the runs unchanged) until the
# dlock_postgresql role makes it. Never a reason to refuse a grant.
HISTORY_TABLE = "dlock_history"

# Columns added since the tables were first released: brought to tables made
# by an earlier version, by the dlock_postgresql role (which owns them) or,
# where the runners' role owns the tables, by the engine when a statement
# finds the column missing. Each is "ALTER TABLE t ADD COLUMN IF NOT EXISTS c type".
#   line_until: until when a ticket in the key's line may still be live (the
#   latest expiry a join gave one); a grant reads the line from its own row.
SCHEMA_UPGRADES = (
    """ALTER TABLE dlock_lease ADD COLUMN IF NOT EXISTS line_until timestamptz""",
)

# A key's history (base.history_record): one row per entry, in the order of
# their ids (an identity: an INSERT needs no right on its sequence). One
# statement adds the entry, unless an entry of its once id is there (NULL:
# none, and NULLs never conflict), and drops what is older than the newest
# `keep` counting it.
ADD_HISTORY = """
WITH added AS (INSERT INTO dlock_history (key, once, entry) VALUES (%(key)s, %(once)s, %(entry)s)
               ON CONFLICT (key, once) DO NOTHING RETURNING id),
     trimmed AS (DELETE FROM dlock_history
                  WHERE key = %(key)s AND EXISTS (SELECT 1 FROM added)
                    AND id <= (SELECT id FROM dlock_history WHERE key = %(key)s
                                ORDER BY id DESC OFFSET %(older)s LIMIT 1))
SELECT count(*) FROM added"""
READ_HISTORY = "SELECT entry FROM dlock_history WHERE key = %(key)s ORDER BY id DESC LIMIT %(limit)s"
SLOT_CLAIMED = """SELECT count(*) FROM dlock_slot
 WHERE key = %(key)s AND slot = %(slot)s AND expires_at > clock_timestamp()"""

# A pause (base.Pause) is its scope's row: the record the other backends
# store too, and `until`, its end on the server's clock. A row whose until
# has passed is no pause (every statement says so); the scope's next pause
# takes the row over. The live pauses of a list of scopes (text[]), in its order:
LIVE_PAUSES = """SELECT scope, record FROM dlock_pause
 WHERE scope = ANY(%(scopes)s::text[]) AND until > clock_timestamp()
 ORDER BY array_position(%(scopes)s::text[], scope)"""
FIRST_PAUSE = LIVE_PAUSES + " LIMIT 1"

# Pauses and grants are ordered by dlock_pause's table lock: every grant
# reads the table (ACCESS SHARE, taken before its statement's snapshot and
# kept to its commit), a pause takes ACCESS EXCLUSIVE first in its own
# transaction. So a grant waits for a pause being written and then sees it
# (READ COMMITTED: the snapshot is taken once the lock is held), and a
# pause waits for the grants in flight: none is made after pause() returns.
LOCK_PAUSES = "LOCK TABLE dlock_pause IN ACCESS EXCLUSIVE MODE"

# The record gets `at` and `until` from one reading of the server's clock.
PAUSE = """
INSERT INTO dlock_pause AS p (scope, record, until)
SELECT %(scope)s, json_build_object('reason', %(reason)s::text, 'by', %(by)s::text,
                                    'at', extract(epoch FROM at)::float8, 'until', extract(epoch FROM until)::float8)::text,
       until
  FROM (SELECT at, at + %(ms)s::bigint * interval '1 millisecond' AS until
          FROM (SELECT clock_timestamp() AS at) AS n) AS t
ON CONFLICT (scope) DO UPDATE SET record = excluded.record, until = excluded.until
RETURNING record
"""

RESUME = "DELETE FROM dlock_pause WHERE scope = %(scope)s RETURNING record, until > clock_timestamp()"


def _unless_paused(upsert):
    """A grant statement (an INSERT INTO dlock_lease ... RETURNING fence
    whose SELECT has NOT EXISTS (SELECT 1 FROM pause) in its WHERE) made one
    statement with the pause that refuses it: it answers the fence or NULL,
    and the scope and record of that pause or NULLs."""
    return ("WITH pause AS (" + FIRST_PAUSE + "),\n     granted AS (" + upsert + ")\n"
            "SELECT (SELECT fence FROM granted), (SELECT scope FROM pause), (SELECT record FROM pause)")


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
# there is any and we have none), nor while a pause of the grant's scopes is
# live (_unless_paused).
UPSERT_LEASE = _unless_paused("""
INSERT INTO dlock_lease AS l (key, owner, fence, acquired_at, expires_at)
SELECT %(key)s, %(owner)s, 1, clock_timestamp(),
       CASE WHEN %(ttl_ms)s::bigint IS NULL THEN NULL
            ELSE clock_timestamp() + %(ttl_ms)s::bigint * interval '1 millisecond' END
 WHERE NOT EXISTS (""" + WAITER_AHEAD + """) AND NOT EXISTS (SELECT 1 FROM pause)
ON CONFLICT (key) DO UPDATE
   SET owner = excluded.owner, fence = l.fence + 1,
       acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
 WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp()
    -- a session holder's row (expires_at NULL) is stale once we hold its advisory lock
    OR (l.expires_at IS NULL AND %(session)s)
RETURNING fence""")

# The same grant for a key that has nobody in line (the common case), the
# one statement a runner that finds the lock free sends. It reads the line
# from the lease row itself (line_until: no ticket can be live after it),
# with no subquery on dlock_wait: PostgreSQL parses and plans it in half the
# time of UPSERT_LEASE. It grants only where UPSERT_LEASE would, and refuses
# while a ticket may be live: then PgLeaseBackend asks again with
# UPSERT_LEASE. A key without a row has no line (a join makes the row). A join
# and this grant serialise on the row's lock, and the grant's WHERE is judged
# on the row as the join left it. A lease row (ttl, no session holder) only:
# the advisory backend uses UPSERT_LEASE. Pauses: as UPSERT_LEASE.
UPSERT_LEASE_NO_LINE = _unless_paused("""
INSERT INTO dlock_lease AS l (key, owner, fence, acquired_at, expires_at)
SELECT %(key)s, %(owner)s, 1, clock_timestamp(), clock_timestamp() + %(ttl_ms)s * interval '1 millisecond'
 WHERE NOT EXISTS (SELECT 1 FROM pause)
ON CONFLICT (key) DO UPDATE
   SET owner = excluded.owner, fence = l.fence + 1,
       acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
 WHERE (l.owner IS NULL OR l.expires_at <= clock_timestamp())
   AND (l.line_until IS NULL OR l.line_until <= clock_timestamp())
RETURNING fence""")

# slots.py's slot_number on the server's clock (the statements' parameters
# width_ms and lead_ms): the one place the rule is written in SQL.
SLOT_NOW = ("floor((extract(epoch FROM clock_timestamp()) * 1000 + %(lead_ms)s::bigint) "
            "/ %(width_ms)s::bigint)::bigint")

# The slot claimed is decided here, on the server's clock, when a width is
# given (else the slot given is claimed): (slot, claimed). With %(exact)s (a
# job with blackout windows) only the slot asked for, %(slot)s, is claimed,
# and not while %(blackout)s says it is blacked out (base.Slot.blackout):
# the caller asks again for the server's slot when it is another.
CLAIM_SLOT = """
WITH s AS (SELECT COALESCE(""" + SLOT_NOW + """, %(slot)s::bigint) AS slot),
     claim AS (INSERT INTO dlock_slot (key, slot, owner, expires_at)
               SELECT %(key)s, slot, %(owner)s, clock_timestamp() + %(marker_ms)s * interval '1 millisecond' FROM s
                WHERE NOT %(exact)s OR (slot = %(slot)s::bigint AND NOT %(blackout)s)
               ON CONFLICT DO NOTHING RETURNING 1)
SELECT slot, EXISTS (SELECT 1 FROM claim) FROM s
"""

# The server's slot now (as CLAIM_SLOT decides it) and its live marker's owner:
# a grant that finds it taken is a duplicate before it takes any lock.
CURRENT_SLOT_OWNER = """
WITH s AS (SELECT COALESCE(""" + SLOT_NOW + """, %(slot)s::bigint) AS slot)
SELECT slot, (SELECT owner FROM dlock_slot
               WHERE key = %(key)s AND dlock_slot.slot = s.slot AND expires_at > clock_timestamp()) FROM s
"""

# A rerun of a slot (base.Slot.rerun): the server's slot now and the slot's
# live marker, its row locked until the grant's transaction ends, so two
# reruns of one slot serialise on it (the second then finds the lease taken).
RERUN_SLOT = """
SELECT """ + SLOT_NOW + """,
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

# The locks of a list of keys (text[]): a row for each, in the list's order,
# the lease columns NULL for a key that has no row (never granted, nobody in
# line), the server's clock in every row. One statement for one key or many.
QUERY = """
SELECT l.key IS NOT NULL, l.owner, l.fence, extract(epoch FROM l.acquired_at)::float8,
       extract(epoch FROM l.expires_at - clock_timestamp())::float8, l.last_run,
       extract(epoch FROM clock_timestamp())::float8, l.expires_at IS NULL OR l.expires_at > clock_timestamp()
  FROM unnest(%s::text[]) WITH ORDINALITY AS k(key, n) LEFT JOIN dlock_lease l ON l.key = k.key
 ORDER BY k.n
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


def _lock_view(key, row):
    """The LockView of key's row of QUERY."""
    found, owner, fence, acquired_at, ttl_left, last, now, live = row
    if not found:
        return LockView(key, server_time=now)
    # fence 0: a row a waiter's ticket made before any grant (no fence was ever given).
    return LockView(key, owner=owner if live else None, fence=fence or None, acquired_at=acquired_at,
                    ttl_remaining=max(0.0, ttl_left) if (ttl_left is not None and live and owner) else None,
                    last=last, server_time=now)


def _slot_params(key, slot):
    """The parameters of the slot statements: the slot's width and lead in ms
    (a width of None: the slot's number is taken as given)."""
    width_ms = None if slot.width is None else lease_ms(slot.width, "once_per")
    return {"key": key, "slot": slot.number, "width_ms": width_ms, "lead_ms": int(round(slot.lead * 1000))}


class Refused(Exception):
    """Rolls back a grant transaction; carries the answer ('locked',
    'duplicate', a rerun's, or 'paused' with the Pause)."""

    def __init__(self, status, pause=None):
        Exception.__init__(self, status)
        self.status = status
        self.pause = pause


def ensure_schema(conn, upgrade=False):
    """Create the lease tables where one is missing; upgrade: bring the
    existing ones up to date (SCHEMA_UPGRADES), a statement having found a
    column missing. Both need the tables' owner rights; a least-privilege
    role gets a message naming the role that does it."""
    try:
        with conn.cursor() as cur:
            if upgrade:
                statements = SCHEMA_UPGRADES
            else:
                cur.execute("SELECT bool_and(to_regclass(t) IS NOT NULL), to_regclass(%s) IS NOT NULL "
                            "FROM unnest(%s::text[]) AS t", (HISTORY_TABLE, list(TABLES)))
                ready, history_ready = cur.fetchone()
                if ready:
                    if not history_ready:
                        _make_history_table(conn)
                    return
                statements = SCHEMA + SCHEMA_UPGRADES
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


def _make_history_table(conn):
    """The history's table, where this role may make it (in a savepoint: a
    refusal leaves the transaction around it usable)."""
    statement = next(statement for statement in SCHEMA if HISTORY_TABLE + " (" in statement)
    try:
        with conn.transaction():
            conn.execute(statement)
    except psycopg.Error:
        pass  # no right to: the history's writes say the table is missing (PgBackend.add_history)


class PgBackend(Backend):
    """The grants, queries and line of waiters both PostgreSQL backends
    share; their session (connection, op_timeout, replication) is
    pg_session.PgSession."""

    # Look for the lease tables before the first call (PgSession.schema_first).
    schema_first = False

    def __init__(self, url, password=None, op_timeout=2.0, ca_file=None):
        if psycopg is None:
            raise MissingDriver("psycopg", "python3-psycopg", "postgresql://")
        self.session = PgSession(url, password, op_timeout, ca_file, ensure_schema, self._woken_by,
                                 schema_first=self.schema_first)
        self._pooled = False  # a LISTEN did not stick to our session (PgBouncer, transaction mode)
        self._woken = set()  # notifications ("KEY OWNER") not yet looked at
        self._waiting_as = {}  # key -> the owner that waits in line

    def _woken_by(self, payload):
        self._woken.add(payload)

    @property
    def conn(self):
        """The session's connection, opened when there is none (tests, benchmarks)."""
        return self.session.conn

    def describe(self, cluster=False):
        """The server this session is on (with a multi-host URL, the one
        libpq found read-write) and, with cluster=True, its synchronous
        standbys as far as the role may see them (REPLICATION)."""
        info = {"backend": self.name, "member": None, "cluster": None}
        if cluster:
            names, connected, sync, visible, standby = self.session.run(
                lambda conn: conn.execute(REPLICATION).fetchone())
            info["cluster"] = {"primary": not standby, "synchronous_standby_names": names,
                               "sync_replication": bool(names.strip()), "standbys_connected": connected,
                               "sync_standbys": sync if visible else None}
        conn = self.session.current
        if conn is not None and not conn.closed:
            # Every session is read-write (target_session_attrs): on the primary.
            info["member"] = {"endpoint": endpoint(conn.info.host, conn.info.port), "role": "primary"}
        return info

    def reset(self):
        self.session.reset()

    def close(self):
        self.reset()

    # -- grants ---------------------------------------------------------------
    def _grant(self, grant, key, owner, slot):
        """Run grant(conn), the transaction that takes the lease. A grant whose
        commit cannot be counted (CommitUnknown) is no grant (base.grant_not_counted):
        it is undone as far as possible and raised as a BackendError; a
        refusal would pass for "another owner holds the lock"."""
        for _try in range(SLOT_TRIES):
            try:
                answer = self.session.run(grant, write=True)
            except CommitUnknown as exc:
                raise grant_not_counted(exc, lambda: self._undo_grant(key, owner, slot))
            if answer.status != "moved":
                return answer
        raise BackendError("postgresql: the slot kept moving during the grant of %s (once_per too short?)" % key)

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
        return self.session.run(undo)

    # -- shared queries -----------------------------------------------------
    def server_time(self):
        def query(conn):
            return conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]
        return self.session.run(query)

    def _query(self, conn, key):
        return self._query_many(conn, [key])[0]

    def _query_many(self, conn, keys):
        return [_lock_view(key, row) for key, row in zip(keys, conn.execute(QUERY, (keys,)).fetchall())]

    def query(self, key):
        return self.session.run(lambda conn: self._query(conn, key))

    def query_many(self, keys):
        """One statement for all keys (QUERY): one round trip."""
        return self.session.run(lambda conn: self._query_many(conn, keys))

    def _refusal(self, conn, key, slot, status, pause=None):
        if status == "paused":
            return Grant(status, pause=pause)
        if status in ("future", "unknown", "moved"):  # a rerun refused; the slot to judge again (_grant)
            return Grant(status)
        if status == "blackout":
            return Grant(status, window=slot.blackout)
        holder = self._query(conn, key)
        if status == "duplicate":
            marker = self._slot_owner(conn, key, slot)
            holder.owner = marker_owner(marker) if marker else None
        elif holder.owner is None:  # free, but others came first
            holder.queued = conn.execute(WAITERS, (key,)).fetchone()[0]
        return Grant(status, holder=holder)

    @staticmethod
    def _current_slot_owner(conn, key, slot):
        """The owner of the live marker of the slot a grant would claim now,
        or None; slot.number becomes that slot (a duplicate names it)."""
        slot.number, owner = conn.execute(CURRENT_SLOT_OWNER, _slot_params(key, slot)).fetchone()
        return owner

    @staticmethod
    def _slot_owner(conn, key, slot):
        row = conn.execute(SLOT_OWNER, (key, slot.number)).fetchone()
        return row[0] if row else None

    @staticmethod
    def _claim_slot(conn, key, owner, slot):
        """True when the slot is ours; a Refused with rerun_refusal's answer
        for a rerun that may not be granted. Inside the grant's transaction."""
        params = _slot_params(key, slot)
        if slot.rerun:
            current, marker = conn.execute(RERUN_SLOT, params).fetchone()
            refusal = rerun_refusal(slot.number, current, marker)
            if refusal is not None:
                raise Refused(refusal)
            if slot.blackout is not None:
                raise Refused("blackout")
            params.update(marker=owner, expected=marker)
            return conn.execute(SET_SLOT_OWNER, params).rowcount == 1
        conn.execute(PRUNE_SLOTS, (key,))
        blacked_out = slot.blackout is not None
        params.update(owner=owner, marker_ms=lease_ms(slot.marker_ttl, "once_per marker", 1.0, 1.5 * MAX_DURATION),
                      exact=slot.blackout_of is not None, blackout=blacked_out)
        asked = slot.number
        slot.number, claimed = conn.execute(CLAIM_SLOT, params).fetchone()
        if slot.blackout_of is not None and slot.number != asked:
            raise Refused("moved")  # judge the server's slot, and ask again
        if blacked_out:
            raise Refused("blackout")
        return claimed

    @staticmethod
    def _upsert(conn, key, owner, ttl_ms, pauses, statement=UPSERT_LEASE):
        """The fence granted, or None; Refused('paused') while a pause of
        `pauses` is live (_unless_paused)."""
        params = {"key": key, "owner": owner, "ttl_ms": ttl_ms, "session": ttl_ms is None, "scopes": list(pauses)}
        fence, scope, record = conn.execute(statement, params).fetchone()
        if scope is not None:
            raise Refused("paused", Pause.from_record(scope, record))
        return fence

    @staticmethod
    def _refuse_if_paused(conn, pauses):
        """Refused('paused') while a pause of `pauses` is live: the first
        statement of a grant transaction that claims a slot before its upsert."""
        row = conn.execute(FIRST_PAUSE, {"scopes": list(pauses)}).fetchone()
        if row is not None:
            raise Refused("paused", Pause.from_record(*row))

    # -- pauses ---------------------------------------------------------------
    def pause(self, scope, reason, seconds, by):
        scope_parts(scope)  # checked: only a pause a grant can name is stored
        params = {"scope": scope, "reason": reason, "by": by, "ms": pause_ms(seconds)}

        def write(conn):
            with conn.transaction():
                conn.execute(LOCK_PAUSES)
                return conn.execute(PAUSE, params).fetchone()[0]
        # Written as a grant is: a commit not known to be replicated raises CommitUnknown.
        return Pause.from_record(scope, self.session.run(write, write=True))

    def resume(self, scope):
        row = self.session.run(lambda conn: conn.execute(RESUME, {"scope": scope}).fetchone(), write=True)
        return Pause.from_record(scope, row[0]) if row is not None and row[1] else None

    def read_pauses(self, scopes):
        rows = self.session.run(lambda conn: conn.execute(LIVE_PAUSES, {"scopes": list(scopes)}).fetchall())
        return [Pause.from_record(scope, record) for scope, record in rows]

    def add_history(self, key, entry, keep, once=None, once_ttl=None):
        params = {"key": key, "once": once, "entry": history_record(entry, once), "older": history_keep(keep) - 1}
        # Not write=True: a commit not known to be replicated costs an entry, never a grant.
        try:
            return self.session.run(lambda conn: conn.execute(ADD_HISTORY, params).fetchone()[0]) == 1
        except BackendError as exc:
            if '"%s" does not exist' % HISTORY_TABLE in str(exc):
                raise BackendError("postgresql: the table %s does not exist; the dlock_postgresql role makes it "
                                   "(the runs go on without a history until then)" % HISTORY_TABLE)
            raise

    def slot_claimed(self, key, number):
        params = {"key": key, "slot": number}
        return self.session.run(lambda conn: conn.execute(SLOT_CLAIMED, params).fetchone()[0]) == 1

    def read_history(self, key, limit):
        rows = self.session.run(lambda conn: conn.execute(READ_HISTORY, {"key": key, "limit": limit}).fetchall())
        return [history_entry(text) for text, in rows]

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
            if self.session.listening is not conn and not self._pooled:
                # Its own transaction: a LISTEN takes effect at commit.
                conn.execute("LISTEN dlock")
                self.session.listening = conn
            self._waiting_as[key] = owner
            params = {"key": key, "owner": owner, "ttl_ms": lease_ms(ttl, "ticket ttl")}
            if not conn.execute(JOIN_QUEUE, params).fetchone()[0] and self.session.listening is conn:
                # A pooler in transaction mode ran the LISTEN on another server
                # session: nobody tells us of releases; we wake by time, and
                # send no more LISTENs into its pool.
                self.session.listening, self._pooled = None, True
        self.session.run(join)

    def leave_queue(self, key, owner):
        def leave(conn):
            conn.execute(LEAVE_QUEUE, {"key": key, "owner": owner})
            if self.session.listening is conn:
                conn.execute("UNLISTEN dlock")
            self.session.listening = None
        self.session.run(leave)
        self._woken.discard("%s %s" % (key, self._waiting_as.pop(key, owner)))

    def wait_change(self, key, timeout):
        """Wait for a notification naming us first in the key's line, on the
        session that LISTENs; without one (not listening, a pooler), sleep."""
        deadline = time.monotonic() + timeout
        conn = self.session.listening if self.session.listening is self.session.current else None
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
