"""The line of waiters on etcd: etcd's own lock recipe (its concurrency
package), tickets P/KEY/queue/OWNER in the order of their create_revision.
The grant's transaction compares, besides the lock key, the whole
P/KEY/queue/ range (EtcdLine.compare): every live ticket there must be ours
or younger than ours (none at all for a caller without a ticket). A waiter
keeps its ticket's lease alive while it waits; a dead waiter's ticket goes
with its lease.

A waiter also holds a spare lease of the lock's ttl (EtcdLine.keep_spare),
granted while it waits and kept alive with its ticket. Its grant after a
wake-up puts the lock key on that lease with no request before the
transaction, where it granted a lease first (a Raft write, and a disk sync
on a quorum, between the holder's release and its own job). The lease then
counts from the spare's last keep-alive, not from the grant: the grant says
how long before it that was (Grant.lease_age), and the job's deadline is
that much earlier (waiting.acquire)."""

import time

from ..boottime import now
from ..errors import BackendError
from .base import Grant, LockView
from .etcd_gateway import b64, first_kv, json_lines, lease_seconds, prefix_end, unb64
from .etcd_http import Unavailable


class EtcdLine(object):
    """Our places in the keys' lines, and what wait_change watches."""

    def __init__(self, gateway, names):
        self.gateway = gateway
        self.names = names
        self._seen = {}  # key -> revision at which we last saw it held, for wait_change
        self._tickets = {}  # (key, owner) -> (lease id or None, create_revision) of our place in line
        self._watched = {}  # key -> the one name whose deletion moves us up the line (wait_change)
        self._woken = set()  # keys whose last wait_change saw the lock deleted (first_try_after_wake)
        # (key, owner) -> [lease id, its TTL, boottime.now() when its grant or last keep-alive was sent]
        self._spares = {}

    def _range(self, key):
        queue = self.names.queue(key)
        return {"key": b64(queue), "range_end": b64(prefix_end(queue))}

    def waits(self, key, owner):
        """Whether owner has a place in key's line."""
        return (key, owner) in self._tickets

    def first_try_after_wake(self, key):
        """Whether the last wait_change on key ended with the deletion of the
        lock, which only the first in line watches (once: the next call says
        False). The lock is then most likely free and ours: the grant's own
        transaction is its check, without the read of refused() before it.
        A waiter woken by the deletion of the ticket before its own reads
        first: that deletion is most often the grant of the one before it,
        and a refused grant costs a write (the transaction) where the read
        costs none."""
        if key in self._woken:
            self._woken.discard(key)
            return True
        return False

    def granted(self, key, owner, grant_ops):
        """Our ticket goes with the grant: its deletion, one of the grant's
        writes (GRANT_OPS, the transaction's success list), wakes the next in
        line without a round trip of its own. Its lease, with nothing left on
        it, ends by itself within TICKET_TTL: leave() does not revoke it (a
        round trip between the grant and the job's start). A ticket of
        another process of the same run (no lease of ours) is left to it."""
        ticket = self._tickets.get((key, owner))
        if ticket is not None and ticket[0] is not None:
            grant_ops.append({"request_delete_range": {"key": b64(self.names.queue(key) + owner)}})

    def forget(self, key, owner):
        """The grant deleted our ticket (granted): leave() has nothing to do."""
        self._tickets.pop((key, owner), None)

    def saw_refused(self, key, revision):
        """A grant of key was refused at revision: wait_change watches from just after it."""
        self._seen[key] = revision

    def compare(self, key, owner):
        """The grant's condition on the line: no live ticket older than ours
        (a range compare holds for every key in the range; an empty range
        compares as create_revision 0)."""
        ticket = self._tickets.get((key, owner))
        compare = dict(self._range(key), target="CREATE")
        if ticket is None:
            compare.update(result="EQUAL", create_revision=0)
        else:
            compare.update(result="GREATER", create_revision=ticket[1] - 1)
        return compare

    def refused(self, key, owner):
        """A "locked" Grant when the lock is held or another ticket comes
        first, from one read-only transaction; None when a grant may succeed."""
        lock, queue_range = self.names.lock(key), self._range(key)
        # The ticket just before ours, the one whose deletion lets us move up.
        before = dict(queue_range, max_create_revision=self._tickets[(key, owner)][1] - 1, sort_order="DESCEND",
                      sort_target="CREATE", limit=1, keys_only=True)
        answer = self.gateway.txn([{"key": b64(lock), "target": "CREATE", "result": "EQUAL", "create_revision": 0},
                                   self.compare(key, owner)], [],
                                  [{"request_range": {"key": b64(lock)}},
                                   {"request_range": dict(queue_range, count_only=True)},
                                   {"request_range": before}])
        if answer.get("succeeded"):
            return None
        self._seen[key] = int(answer["header"]["revision"])
        ahead = (answer["responses"][2].get("response_range", {}).get("kvs") or [None])[0]
        # Like etcd's recipe, each waiter watches only the one before it (the
        # first in line watches the lock): a release wakes one waiter, not all.
        self._watched[key] = unb64(ahead["key"]) if ahead else lock
        held = first_kv(answer["responses"][0])
        if held is None:
            waiters = int(answer["responses"][1].get("response_range", {}).get("count", 0))
            return Grant("locked", holder=LockView(key, queued=waiters, server_time=time.time()))
        # No ttl_remaining (one more round trip): the watch tells of the lease's end.
        record = held.record()
        return Grant("locked", holder=LockView(key, owner=record.get("owner"), fence=held.create_revision,
                                               acquired_at=record.get("acquired_at"), server_time=time.time()))

    def waiters(self, key):
        answer = self.gateway.post("/kv/range", dict(self._range(key), count_only=True))
        return int(answer.get("count", 0))

    def keep_spare(self, key, owner, seconds):
        """While we wait in line: a spare lease of SECONDS (the lock's ttl, as
        the grant would ask for), for our grant after a wake-up (take_spare);
        granted once, kept alive by join() with the ticket."""
        if self.waits(key, owner) and (key, owner) not in self._spares:
            sent = now()
            self._spares[(key, owner)] = [self.gateway.grant_lease(seconds), seconds, sent]

    def take_spare(self, key, owner, seconds):
        """(the spare lease, boottime.now() when the request that last set
        its expiry was sent: it lasts at least SECONDS from then, as etcd
        counts from when it got that request), for a grant's transaction; or
        None when there is none, or it is shorter than SECONDS, or a quarter
        of it is spent: kept alive every TICKET_REFRESH, it is not, unless its
        waiter was stopped (it may have expired), and a job must not lose
        much of its lease to it; the grant then asks for a lease of its own."""
        spare = self._spares.pop((key, owner), None)
        if spare is None:
            return None
        lease, length, kept_at = spare
        if length >= seconds and now() - kept_at < seconds / 4.0:
            return lease, kept_at
        self.gateway.revoke(lease)
        return None

    def return_spare(self, key, owner, lease, seconds, kept_at):
        """A refused grant's lock lease (the spare it took, or a new one): kept
        as the spare while we wait in line, else revoked."""
        if self.waits(key, owner) and (key, owner) not in self._spares:
            self._spares[(key, owner)] = [lease, seconds, kept_at]
        else:
            self.gateway.revoke(lease)

    def _keep_spare_alive(self, key, owner):
        spare = self._spares.get((key, owner))
        if spare is None:
            return
        sent = now()
        if self.gateway.keepalive(spare[0]) >= spare[1]:
            spare[2] = sent
        else:  # it ran out (etcd revoked it): the next refused read takes another
            del self._spares[(key, owner)]

    def join(self, key, owner, ttl, min_ttl):
        """A ticket P/KEY/queue/OWNER on a lease of its own, created once and
        kept alive (and our spare lease with it); one whose lease ran out is
        taken anew, at the end of the line."""
        self._keep_spare_alive(key, owner)
        ticket = self._tickets.get((key, owner))
        if ticket is not None:
            lease = ticket[0]
            if lease is None or self.gateway.keepalive(lease) > 0:
                return  # ours and alive (or another process's, with the same owner, which keeps it)
            del self._tickets[(key, owner)]
        name = b64(self.names.queue(key) + owner)
        lease = self.gateway.grant_lease(lease_seconds(ttl, "ticket ttl", min_ttl))
        try:
            answer = self.gateway.txn([{"key": name, "target": "CREATE", "result": "EQUAL", "create_revision": 0}],
                                      [{"request_put": {"key": name, "value": "", "lease": lease}}],
                                      [{"request_range": {"key": name}}])
        except BackendError:
            self.gateway.revoke(lease)
            raise
        if answer.get("succeeded"):
            self._tickets[(key, owner)] = (lease, int(answer["header"]["revision"]))
            return
        self.gateway.revoke(lease)
        existing = first_kv(answer["responses"][0])
        if existing is not None:  # a task of the same run (same owner) on another host waits too
            self._tickets[(key, owner)] = (None, existing.create_revision)

    def leave(self, key, owner):
        spare = self._spares.pop((key, owner), None)
        if spare is not None:
            self.gateway.revoke(spare[0])
        ticket = self._tickets.pop((key, owner), None)
        if ticket is not None and ticket[0] is not None:
            self.gateway.revoke(ticket[0])  # deletes the ticket; its deletion wakes the others

    def wait_change(self, key, timeout):
        """Watch for a deletion (release, force_release, a lease's expiry, a
        ticket leaving the line) of the one name the last refusal named, or
        else of any of the key's names, from just after the
        revision at which we saw it refused, so one in between is not
        missed; at most `timeout`. Any trouble with the watch ends in a plain
        sleep: the caller asks again, and a backend that is down then says so."""
        request = self._watch_request(key)
        watches_lock = request["key"] == b64(self.names.lock(key))
        deadline = time.monotonic() + timeout
        try:
            response = self.gateway.post("/watch", {"create_request": request}, stream=True, read_timeout=timeout)
        except BackendError:
            time.sleep(max(0.0, deadline - time.monotonic()))
            return
        try:
            for message in json_lines(response):
                result = message.get("result", {})
                if result.get("events"):
                    if watches_lock:
                        self._woken.add(key)
                    return  # deleted: ask again
                if result.get("canceled") or "error" in message:
                    return  # compacted past `since`: ask again
                if time.monotonic() >= deadline:
                    return
        except (Unavailable, ValueError):
            return  # the read timed out (no release within timeout) or the stream broke
        finally:
            response.close()

    def _watch_request(self, key):
        """The watch of wait_change: deletions of the watched name, else of the key's names."""
        since = self._seen.get(key)
        watched = self._watched.pop(key, None)
        if watched is not None:
            request = {"key": b64(watched), "filters": ["NOPUT"]}
        else:
            base = self.names.base(key)
            request = {"key": b64(base), "range_end": b64(prefix_end(base)), "filters": ["NOPUT"]}
        if since is not None:
            request["start_revision"] = since + 1
        return request
