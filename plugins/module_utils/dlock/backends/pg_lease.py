"""PostgreSQL lease table: the lease is a row whose expiry comes from the
server's clock (clock_timestamp()); it survives reconnects, server restarts and PgBouncer."""

from .base import Grant, lease_ms
from .pg_common import FORCE_RELEASE, UPSERT_LEASE_NO_LINE, PgBackend, Refused

# expires_at > clock_timestamp(): an expired lease is never brought back to life.
RENEW = ("UPDATE dlock_lease SET expires_at = clock_timestamp() + %s * interval '1 millisecond' "
         "WHERE key = %s AND owner = %s AND expires_at > clock_timestamp() RETURNING 1")
LOCK_ROW = "SELECT 1 FROM dlock_lease WHERE key = %s FOR UPDATE"


class PgLeaseBackend(PgBackend):
    name = "postgresql"

    def acquire(self, key, owner, ttl, slot=None, pauses=()):
        ttl_ms = lease_ms(ttl)  # checked once, before anything is sent

        def grant(conn):
            try:
                if slot is None:  # one atomic statement: no transaction round trips
                    fence = self._upsert(conn, key, owner, ttl_ms, pauses, UPSERT_LEASE_NO_LINE)
                    if fence is None:
                        holder = self._query(conn, key)
                        if holder.owner is not None:
                            return Grant("locked", holder=holder)
                        # Free, yet refused: someone is in line (or the lock was
                        # freed meanwhile); the grant that follows the line decides.
                        fence = self._upsert(conn, key, owner, ttl_ms, pauses)
                    if fence is None:
                        raise Refused("locked")
                else:
                    # One transaction: the slot claim is undone when the lease is busy.
                    # Concurrent claims of one slot serialise on its primary key
                    # (reruns, on its row lock).
                    with conn.transaction():
                        self._refuse_if_paused(conn, pauses)  # before the slot is touched
                        if not self._claim_slot(conn, key, owner, slot):
                            raise Refused("duplicate")
                        # The lean grant first (nobody in line), then the line's.
                        fence = (self._upsert(conn, key, owner, ttl_ms, pauses, UPSERT_LEASE_NO_LINE)
                                 or self._upsert(conn, key, owner, ttl_ms, pauses))
                        if fence is None:
                            raise Refused("locked")  # in the transaction: the claim is rolled back
            except Refused as refused:
                return self._refusal(conn, key, slot, refused.status, refused.pause)
            return Grant("granted", fence=fence)
        return self._grant(grant, key, owner, slot)

    def renew(self, key, owner, ttl):
        def renew(conn):
            return conn.execute(RENEW, (lease_ms(ttl), key, owner)).fetchone() is not None
        # A renewal not known to be replicated fails (CommitUnknown, a
        # BackendError): the heartbeat retries until its deadline, then fences.
        return self.session.run(renew, write=True)

    def release(self, key, owner, min_hold=0.0, last=None, slot=None):
        return self.session.run(lambda conn: self._release_row(conn, key, owner, min_hold, last, slot=slot), write=True)

    def force_release(self, key):
        def force(conn):
            with conn.transaction():
                conn.execute(LOCK_ROW, (key,))
                holder = self._query(conn, key)
                conn.execute(FORCE_RELEASE, {"key": key})
            return holder
        return self.session.run(force, write=True)
