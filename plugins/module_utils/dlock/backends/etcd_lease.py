"""etcd v3 lease: the lock is a key attached to an etcd lease (a server-side
TTL), created by one transaction that compares its create_revision with 0.

The parts: etcd_keys.py (the names of a lock's keys), etcd_gateway.py (the
HTTP client of etcd's gRPC gateway, its failover between members, leases),
etcd_grant.py (the grant's transaction, the once-per slot's marker and the
rerun rules), etcd_line.py (the line of waiters). EtcdBackend puts them
together, and renews, releases and reads the lock.
"""

import binascii
import json
import math
import os
import time

from ..errors import BackendError, ConfigError, OutcomeUnknown
from ..options import BACKEND_MIN_TTL
from ..safefile import require_regular
from ..slots import outcome_marker
from ..validate import backend_url
from .base import Backend, Pause, Slot, history_entry, history_keep, history_record, lease_ms, pause_ms
from .epoch import DEFAULT_PORTS
from .etcd_gateway import KV, EtcdGateway, answer_date, b64, first_kv, prefix_end
from .etcd_grant import EtcdGrant, lock_view, overdue
from .etcd_keys import KeyNames
from .etcd_line import EtcdLine

# etcd refuses a transaction of more operations than its --max-txn-ops,
# 128 unless the cluster sets it otherwise: query_many reads three keys a
# lock, so at most 42 locks a transaction.
MAX_TXN_OPS = 128
KEYS_PER_TXN = MAX_TXN_OPS // 3


class EtcdBackend(Backend):
    name = "etcd"

    def __init__(self, url, password=None, op_timeout=2.0, ca_file=None):
        parts = backend_url(url)
        if password is not None and not parts.user:
            raise ConfigError("backend: etcd has no default user: name the user in the URL "
                              "(etcd://USER@host:2379,...) to log in with a password")
        # Files ssl opens itself must be regular files (a FIFO would
        # block it beyond any timeout of ours).
        cert, key_file = parts.query.get("cert"), parts.query.get("key")
        if cert:
            require_regular(cert, "TLS client certificate")
            require_regular(key_file, "TLS client key")
        self.min_ttl = BACKEND_MIN_TTL[parts.scheme]
        self.gateway = EtcdGateway([(host, port or DEFAULT_PORTS[parts.scheme]) for host, port in parts.hosts],
                                   "https" if parts.scheme == "etcd+https" else "http", op_timeout,
                                   user=parts.user, password=password, ca_file=ca_file, cert=cert, key_file=key_file)
        self.names = KeyNames(parts.path)
        self.line = EtcdLine(self.gateway, self.names)
        self._leases = {}  # (key, owner) -> the lease id of our grant, for renew
        self._grant = EtcdGrant(self.gateway, self.names, self.line, self.min_ttl, self._leases)

    def server_time(self):
        """The member's wall clock, from the HTTP Date header of an answer:
        etcd's API has no clock (its response header holds none), and the
        Date header has whole seconds, so this is the middle of that second
        and clock_resolution tells the check it is 1s coarse."""
        return answer_date(self.gateway.post("/maintenance/status", {}, dated=True)) + 0.5

    clock_resolution = 1.0

    def acquire(self, key, owner, ttl, slot=None, pauses=()):
        return self._grant.acquire(key, owner, ttl, slot, pauses)

    # -- pauses: keys on leases of their own (etcd_keys.py) -----------------------
    def pause(self, scope, reason, seconds, by):
        """The pause's key, put on a new lease of its length (whole seconds,
        rounded up; etcd may grant more): etcd ends it. at: the member's
        clock, the middle of the second the lease grant's Date header names
        (as server_time); until: at + the TTL granted. A pause it replaces
        loses its key to the new lease: its own lease is revoked."""
        lease, ttl, date = self.gateway.grant_dated_lease(int(math.ceil(pause_ms(seconds) / 1000.0)))
        at = date + 0.5
        pause = Pause(scope, reason, at + ttl, by, at)
        # A put that fails keeps its lease: revoked, it would take with it the
        # pause this one may have replaced, and the pause asked for may be there.
        put = self.gateway.post("/kv/put", {"key": b64(self.names.pause(scope)), "value": b64(pause.as_record()),
                                            "lease": lease, "prev_kv": True})
        replaced = put.get("prev_kv")
        if replaced and int(replaced.get("lease", 0)):
            self.gateway.revoke(int(replaced["lease"]))
        return pause

    def resume(self, scope):
        answer = self.gateway.post("/kv/deleterange", {"key": b64(self.names.pause(scope)), "prev_kv": True})
        ended = KV(answer["prev_kvs"][0]) if answer.get("prev_kvs") else None
        if ended is None:
            return None
        if ended.lease:
            self.gateway.revoke(ended.lease)
        return Pause.from_record(scope, ended.value)

    def read_pauses(self, scopes):
        """One read-only transaction: the pauses as they were at one
        revision, less those whose end has passed on the member's clock
        (a lease can outlive its TTL: the grant ends them, etcd_grant.overdue)."""
        names = [b64(self.names.pause(scope)) for scope in scopes]
        response = self.gateway.post("/kv/txn", {"compare": [], "success": [{"request_range": {"key": name}}
                                                                            for name in names], "failure": []},
                                     dated=True)
        try:
            answer, answered = response.json(), answer_date(response)
        except ValueError as exc:
            raise BackendError("etcd: unreadable answer to the read of the pauses: %s" % exc)
        kvs = [first_kv(item) for item in answer.get("responses", [])]  # none: left out of the JSON
        pauses = [Pause.from_record(scope, kv.value) for scope, kv in zip(scopes, kvs) if kv is not None]
        return [pause for pause in pauses if not overdue(pause, answered)]

    # -- the history: one key an entry (etcd_keys.py) ---------------------------
    def add_history(self, key, entry, keep, once=None, once_ttl=None):
        """A put (with once, only if no key of that id was ever made: a
        transaction on its create_revision), then the oldest entries past
        `keep` deleted: at most three requests, the last only when it is over."""
        keep = history_keep(keep)
        prefix = self.names.history(key)
        # A run's entry is named by its owner token (one run, one entry); an
        # entry of no run (the pause log's) by 64 random bits, or each would
        # replace the one before.
        name = prefix + ("once/%s" % once if once is not None else
                         "run/%s" % (entry.get("owner") or "entry-" + binascii.hexlify(os.urandom(8)).decode()))
        put = {"request_put": {"key": b64(name), "value": b64(history_record(entry, once))}}
        compare = [] if once is None else [{"key": b64(name), "target": "CREATE", "create_revision": "0"}]
        if not self.gateway.txn(compare, [put], []).get("succeeded", False):
            return False
        span = {"key": b64(prefix), "range_end": b64(prefix_end(prefix))}
        count = int(self.gateway.post("/kv/range", dict(span, count_only=True)).get("count", 0))
        if count > keep:
            oldest = self.gateway.post("/kv/range", dict(span, keys_only=True, sort_target="CREATE",
                                                         sort_order="ASCEND", limit=count - keep)).get("kvs") or []
            deletes = [{"request_delete_range": {"key": kv["key"]}} for kv in oldest]
            for start in range(0, len(deletes), MAX_TXN_OPS):
                self.gateway.txn([], deletes[start:start + MAX_TXN_OPS], [])
        return True

    def slot_claimed(self, key, number):
        # A marker is on a lease of its own: etcd deletes it when that expires.
        return self.gateway.get(self.names.marker(key, Slot(number, None))) is not None

    def read_history(self, key, limit):
        prefix = self.names.history(key)
        kvs = self.gateway.post("/kv/range", {"key": b64(prefix), "range_end": b64(prefix_end(prefix)),
                                              "sort_target": "CREATE", "sort_order": "DESCEND",
                                              "limit": limit}).get("kvs") or []
        return [history_entry(KV(item).value) for item in kvs]

    def renew(self, key, owner, ttl):
        """Keep our lease alive, then check the key is still ours and on that
        lease (after the keep-alive: a key seen ours afterwards cannot go
        before the renewed lease). etcd cannot change a lease's TTL: it must
        already be at least ttl.

        What keeps the lock is the keep-alive, which the leader serves. The
        check after it only looks for a key deleted under a live lease (an
        operator's force_release, which then revokes the lease), so it is
        first a serializable read, which the member answers from its own
        state with no round trip to the leader: on a slow leader a renewal
        is then one trip through it, where a linearizable read added a
        second and a ReadIndex round (test_leader_slowed). A member behind
        its leader (restarted, catching up) may not show our key yet, so a
        read that does not show it ours is asked again, linearizable, and
        that one decides; a member a moment behind a force_release may show
        the key once more, and the revoked lease fails the next keep-alive."""
        lock = self.names.lock(key)
        lease = self._leases.get((key, owner))
        if lease is None:  # another process took it (the module's later task, the hold renewer)
            held = self.gateway.get(lock)
            if held is None or held.record().get("owner") != owner:
                return False
            lease = held.lease
        left = self.gateway.keepalive(lease)
        if left <= 0:
            return False  # the lease expired or was revoked

        def ours(held):
            return held is not None and held.lease == lease and held.record().get("owner") == owner
        if not ours(self.gateway.get(lock, serializable=True)) and not ours(self.gateway.get(lock)):
            return False
        if left < ttl:
            raise BackendError("etcd: the lease of %s lasts %ds, less than ttl %gs (etcd cannot lengthen it)"
                               % (key, left, ttl))
        return True

    def release(self, key, owner, min_hold=0.0, last=None, slot=None):
        """Owner-checked delete; record the last run; revoke our lease.

        min_hold (lockAtLeastFor) keeps the key until acquired_at + min_hold,
        never longer than its lease would have: the key is moved to a new
        lease of the remaining seconds (rounded up) when that ends sooner
        than its lease. Leaving the old lease to expire would hold the lock
        up to a whole ttl after the job, not min_hold. acquired_at is the
        acquiring node's clock (etcd has none), so min_hold is as exact as
        the nodes' time sync: it is a schedule guarantee, not the exclusion."""
        hold_ms = lease_ms(min_hold, "min_hold", 0.0)
        lease = self._leases.get((key, owner))
        if lease is not None and hold_ms == 0:
            # Granted by this process: the lock key is ours while it is on our
            # lease (no one else puts a key on it), so the transaction checks
            # that, without a read first: one round trip fewer between the
            # job's end and the next holder's wake-up.
            compare = [{"key": b64(self.names.lock(key)), "target": "LEASE", "result": "EQUAL", "lease": lease}]
            keep = 0.0
            success, short = self._release_writes(key, None, keep, last)
        else:
            held = self.gateway.get(self.names.lock(key))
            if held is None or held.record().get("owner") != owner:
                return False
            lease = held.lease
            keep = (held.record().get("acquired_at") or 0) + hold_ms / 1000.0 - time.time()
            success, short = self._release_writes(key, held, keep, last)
            # mod_revision: the key is still the one we read (owner and lease).
            compare = [{"key": b64(self.names.lock(key)), "target": "MOD", "result": "EQUAL",
                        "mod_revision": held.mod_revision}]
        answer = self._release_with_outcome(key, owner, last, slot, compare, success)
        lost_try = answer is not None and self.gateway.answered_after_a_lost_try
        if answer is None or not answer.get("succeeded"):
            answer = self.gateway.txn(compare, success, [])
            lost_try = lost_try or self.gateway.answered_after_a_lost_try
        self._leases.pop((key, owner), None)
        if not answer.get("succeeded"):
            if lost_try:
                # A member that gave no answer may have applied one of these
                # transactions: then the lock changed by our own release.
                raise OutcomeUnknown("etcd: the release got no answer from a member, and the next one found the "
                                     "lock changed: the first may have applied it")
            if short:
                self.gateway.revoke(short)
            return False
        if keep <= 0 or short:
            self.gateway.revoke(lease)
        return True

    def _release_writes(self, key, held, keep, last):
        """The release transaction's writes (the last run; the lock key
        deleted, or moved to a short lease of `keep` seconds more), and that
        short lease (None when there is none)."""
        lock = b64(self.names.lock(key))
        success, short = [], None
        if last:
            success.append({"request_put": {"key": b64(self.names.last(key)),
                                            "value": b64(json.dumps(last, sort_keys=True))}})
        if keep <= 0:
            success.append({"request_delete_range": {"key": lock}})
        else:
            left = self.gateway.lease_ttl(held.lease)
            if left is not None and math.ceil(keep) < left:
                short = self.gateway.grant_lease(int(math.ceil(keep)))
                success.append({"request_put": {"key": lock, "ignore_value": True, "lease": short}})
        return success, short

    def _release_with_outcome(self, key, owner, last, slot, compare, success):
        """The release, with the slot's marker recording the outcome on its
        own lease (its expiry kept), if the marker still names owner; the
        transaction's answer, or None when there is no such marker (the
        caller then releases without it, as it does when the marker changed
        before this transaction)."""
        marker = self.gateway.get(self.names.marker(key, slot)) if slot is not None and last else None
        if marker is None or marker.value != owner:
            return None
        name = b64(self.names.marker(key, slot))
        return self.gateway.txn(
            compare + [{"key": name, "target": "MOD", "result": "EQUAL", "mod_revision": marker.mod_revision}],
            success + [{"request_put": {"key": name, "value": b64(outcome_marker(owner, last.get("result"))),
                                        "lease": marker.lease}}], [])

    def force_release(self, key):
        """Delete the lock key and revoke its lease, so the holder's next
        renew says False (the key gone, or else its lease: renew)."""
        lock = self.names.lock(key)
        before = self.query(key)
        held = self.gateway.get(lock)
        if held is None:
            before.owner = None
            return before
        compare = [{"key": b64(lock), "target": "MOD", "result": "EQUAL", "mod_revision": held.mod_revision}]
        answer = self.gateway.txn(compare, [{"request_delete_range": {"key": b64(lock)}}], [])
        if not answer.get("succeeded"):
            raise BackendError("etcd: %s changed while it was being broken; try again" % key)
        self.gateway.revoke(held.lease)
        # Report the holder we actually removed (it may have changed since the query).
        before.owner = held.record().get("owner")
        before.fence = held.create_revision
        return before

    def query(self, key):
        return self.query_many([key])[0]

    def query_many(self, keys):
        """A read-only transaction for each KEYS_PER_TXN keys: their lock,
        fence and last keys at one revision. A held lock's lease is then
        asked for its time left (lock_view): a request for each held lock."""
        views = []
        for start in range(0, len(keys), KEYS_PER_TXN):
            chunk = keys[start:start + KEYS_PER_TXN]
            names = [name for key in chunk
                     for name in (self.names.lock(key), self.names.fence(key), self.names.last(key))]
            answer = self.gateway.txn([], [{"request_range": {"key": b64(name)}} for name in names], [])
            kvs = [first_kv(response) for response in answer["responses"]]
            for index, key in enumerate(chunk):
                held, fence_kv, last_kv = kvs[3 * index:3 * index + 3]
                last = (last_kv.record() or None) if last_kv is not None else None
                views.append(lock_view(self.gateway, key, held, last,
                                       fence_kv.mod_revision if fence_kv is not None else 0))
        return views

    # -- waiting: etcd_line.py ---------------------------------------------------
    def join_queue(self, key, owner, ttl):
        self.line.join(key, owner, ttl, self.min_ttl)

    def leave_queue(self, key, owner):
        self.line.leave(key, owner)

    def wait_change(self, key, timeout):
        self.line.wait_change(key, timeout)

    def describe(self, cluster=False):
        """The member that answered last: its endpoint in the URL and the
        member id of its answers' header (its name once the member list
        was read). With cluster=True, every member of the URL is asked for
        its status (maintenance/status: its leader, its errors such as "no
        leader" or an alarm) within one op_timeout, and any member for the
        member list; etcd 3.4 lets any authenticated user call both."""
        info = {"backend": self.name, "member": None, "cluster": None}
        if cluster:
            info["cluster"] = self.gateway.cluster()
        info["member"] = self.gateway.answered(info["cluster"])
        return info

    def reset(self):
        self.gateway.close()

    def close(self):
        self.reset()
