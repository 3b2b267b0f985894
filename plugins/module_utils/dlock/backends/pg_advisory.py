"""PostgreSQL session advisory lock, held on one connection for the run.

The lock dies with the session: there is no server-side TTL, so a lost
connection means a lost lock (renew() then says False and the runner fences
at once). PgBouncer in transaction pooling breaks it: connect directly. The
lease table still carries the fence, the holder and the last run.

The session ends when the server sees its connection close, and the kernel
closes a TCP connection with the last descriptor of its socket: the job's
guard holds a copy of it (guard_fds), so a runner's death (SIGKILL, OOM kill)
ends the session only once nothing of its job is left. That copy cannot stop
the runner itself from ending the session (libpq's close sends Terminate on
the shared socket, a shutdown sends FIN on it), so the runner never closes,
terminates or shuts down the connection that holds the lock while its job
may still run: a renewal that fails, or gets no answer within op_timeout,
makes the lock lost (the runner fences its job) and leaves the socket as it
is (reset() stops using that connection, it does not close it); the
connection is closed at release(), which the runner calls once the guard
has reported that nothing of the job is left. A hung renewal is abandoned,
never cut: its statement runs outside the watchdog (no cancel request, no
shutdown), and the heartbeat stops waiting for it after op_timeout. So a
renewal that fails while the session lives on (a server process stopped
for a while) keeps the lock taken through kill_grace: no waiter is granted
beside the job being stopped. A session that did end (a server restart,
force-release's pg_terminate_backend) is gone whatever the runner does.

It does not survive a failover. An advisory lock lives in one server's memory
and is never replicated: a standby promoted in place of the primary knows
nothing of it, so a runner connecting there takes the same key at once, while
the old holder only notices its lost session at its next heartbeat (up to
renew_every + op_timeout, then kill_grace): two jobs can overlap. On a
replicated cluster (Patroni) use postgresql://, the lease table, whose grants
count only once a synchronous standby has them.
"""

import hashlib

from ..errors import BackendError
from .base import Grant, grant_not_counted
from .pg_common import FORCE_RELEASE, NOTIFY_FIRST, PgBackend, Refused

# The advisory locks of this database that sessions hold, as pg_locks shows
# a lock_id: split in classid (high 32 bits) and objid (low 32 bits).
HELD_LOCKS = """
  FROM pg_locks
 WHERE locktype = 'advisory' AND granted AND objsubid = 1
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
HOLDER_PIDS = "SELECT pid" + HELD_LOCKS + "   AND classid = %s::bigint::oid AND objid = %s::bigint::oid"
# Which of a list of lock ids are held (query_many: one round trip for all).
HELD_IDS = ("SELECT DISTINCT (classid::bigint << 32) | objid::bigint" + HELD_LOCKS
            + "   AND (classid::bigint << 32) | objid::bigint = ANY(%s::bigint[])")


# Unlock, and wake the waiters: only now can one of them take the lock.
UNLOCK = "SELECT pg_advisory_unlock(%(id)s), " + NOTIFY_FIRST


def lock_id(key):
    """A stable positive bigint for the key; pg_locks shows it split in classid/objid."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") & (2 ** 63 - 1)


def _holder_pids(conn, key):
    ident = lock_id(key)
    return [row[0] for row in conn.execute(HOLDER_PIDS, (ident >> 32, ident & 0xFFFFFFFF)).fetchall()]


class PgAdvisoryBackend(PgBackend):
    name = "postgresql+advisory"
    lease_survives_reconnect = False
    schema_first = True  # a grant that failed on a missing table would leave its advisory lock taken

    def acquire(self, key, owner, ttl, slot=None, pauses=()):
        # Only a counted grant's session is the lock's: one not counted
        # (CommitUnknown) has dropped its connection, and the lock with it. A
        # counted one's connection is the one the session kept (none when the
        # call ran past op_timeout: it was dropped, and the first renewal
        # finds the lock lost). It is pinned: the session's reset() then only
        # stops using it (the lock counts as lost), never closes it, which
        # would end the session and free the lock while the runner may still
        # be stopping the job. release() closes it.
        granted = self._grant(lambda conn: self._take(conn, key, owner, slot, pauses), key, owner, slot)
        if granted.granted:
            if self.session.current is None:
                # The answer came as op_timeout ran out: the cancel request
                # went out, so the session dropped the connection, and the lock
                # with its session. A grant whose lock is gone is no grant:
                # counted, its job would run unlocked until the first renewal.
                raise grant_not_counted(
                    BackendError("postgresql: the grant answered only as op_timeout (%gs) ran out, and its session, "
                                 "which held the lock, was dropped" % self.session.op_timeout),
                    lambda: self._undo_grant(key, owner, slot))
            self.session.pinned = self.session.current
        return granted

    def _take(self, conn, key, owner, slot, pauses):
        """The grant's statements: the advisory lock, then the lease row (its
        statement refuses while a pause of `pauses` is live) and the slot
        claim in one transaction."""
        # A rerun is judged under the lock, in the transaction (_claim_slot).
        if slot is not None and not slot.rerun:
            done = self._current_slot_owner(conn, key, slot)  # slot.number: the server's slot now
            if slot.blackout is not None:
                return self._refusal_unless_paused(conn, key, slot, "blackout", pauses)
            if done:
                return self._refusal_unless_paused(conn, key, slot, "duplicate", pauses)
        if not conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_id(key),)).fetchone()[0]:
            return self._refusal_unless_paused(conn, key, slot, "locked", pauses)
        try:
            with conn.transaction():
                # A previous holder's min_hold keeps the row busy past its unlock.
                fence = self._upsert(conn, key, owner, None, pauses)
                if fence is None:
                    raise Refused("locked")
                if slot is not None and not self._claim_slot(conn, key, owner, slot):
                    raise Refused("duplicate")
        except Refused as refused:
            conn.execute(UNLOCK, {"id": lock_id(key), "key": key})
            return self._refusal(conn, key, slot, refused.status, refused.pause)
        return Grant("granted", fence=fence)

    def _refusal_unless_paused(self, conn, key, slot, status, pauses):
        """A refusal before the lease row's statement, which is where a pause
        is judged: a live pause of `pauses` is the answer instead, as every
        backend gives it (the lock held or the slot done or not)."""
        try:
            self._refuse_if_paused(conn, pauses)
        except Refused as paused:
            return self._refusal(conn, key, slot, paused.status, paused.pause)
        return self._refusal(conn, key, slot, status)

    def _holding(self):
        """The connection that holds our lock, or None once it is gone."""
        conn = self.session.pinned
        if conn is None or conn.closed or conn is not self.session.current:
            return None
        return conn

    def renew(self, key, owner, ttl):
        """Whether our session still holds the lock. Not through session.run: the
        watchdog's last resort would shut the socket down, ending the session
        while the job may still run. A renewal that hangs is abandoned by the
        heartbeat instead (it stops waiting after op_timeout and reset()s,
        which only stops using the connection); its thread may stay blocked
        until the server answers or release() closes the connection."""
        conn = self._holding()
        if conn is None:
            return False
        try:
            return conn.execute("SELECT pg_backend_pid() = ANY(%s)", (_holder_pids(conn, key),)).fetchone()[0]
        except Exception:  # any failure of the session is the loss of the lock
            if self.session.current is conn:  # not a connection made since (a late answer of an abandoned renewal)
                self.reset()
            return False

    def guard_fds(self, key):
        """The socket of the session that holds the lock. The guard only keeps
        its copy, never reads or writes it (the protocol stream stays the
        runner's alone); it closes it once the job is dead and before its
        report, so the release, after that report, is the session's last
        word. () when no session holds it (lost: the heartbeat fences)."""
        conn = self._holding()
        if conn is None:
            return ()
        try:
            return (conn.fileno(),)
        except Exception:  # no socket left: the session, and the lock with it, is gone
            return ()

    def release(self, key, owner, min_hold=0.0, last=None, slot=None):
        """Called once nothing of the job is left (after the guard's report):
        from here on the connection may be shut down or closed."""
        conn = self._holding()
        if conn is None:
            self.session.close_pinned()  # one kept open by reset() after the lock was lost
            return False
        self.session.pinned = None

        def release(conn):
            released = self._release_row(conn, key, owner, min_hold, last, notify=False, slot=slot)
            conn.execute(UNLOCK, {"id": lock_id(key), "key": key})
            return released
        return self.session.run(release, write=True)

    def close(self):
        self.reset()
        self.session.close_pinned()  # the run is over: still set only when no release() came

    def force_release(self, key):
        def force(conn):
            holder = self._query(conn, key)
            for pid in _holder_pids(conn, key):
                # Only ending the session frees a session lock; needs pg_signal_backend
                # or the same role as the holder.
                if not conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]:
                    raise BackendError("postgresql: could not end session %d holding %s" % (pid, key))
            conn.execute(FORCE_RELEASE, {"key": key})
            return holder
        return self.session.run(force, write=True)

    def _query_many(self, conn, keys):
        views = PgBackend._query_many(self, conn, keys)
        by_session = [view for view in views if view.owner is not None and view.ttl_remaining is None]
        if by_session:
            ids = [lock_id(view.key) for view in by_session]
            held = set(row[0] for row in conn.execute(HELD_IDS, (ids,)).fetchall())
            for view, ident in zip(by_session, ids):
                if ident not in held:
                    view.owner = None  # row says held by a session, but no session holds the lock
        return views
