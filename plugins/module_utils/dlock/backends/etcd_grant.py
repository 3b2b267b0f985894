"""The etcd grant: a lease grant (a waiter's spare lease instead, granted
while it waited: etcd_line.py), then one transaction that compares the lock
key's create_revision with 0, the line (etcd_line.py), with once_per the
slot's marker, and the version of each pause key of the grant's scopes with
0 (none is there: a pause's key goes with its lease at its end), and puts the
lock key on the lease, the fence key and the marker on a lease of its own.

Fencing token: the lock key's create_revision, the store's revision of the
grant. etcd's revision only grows (across grants, leader changes and
restarts: it is in the data directory), so each grant's is greater than
every earlier one's.
"""

import json
import time

from ..boottime import now
from ..errors import BackendError
from ..slots import SLOT_TRIES, marker_owner
from .base import Grant, LockView, Pause, rerun_refusal
from .etcd_gateway import KV, answer_date, b64, first_kv, lease_seconds


def lock_view(gateway, key, held, last=None, fence=0):
    """The LockView of a lock key as read (None: free, `fence` the last one)."""
    if held is None:
        return LockView(key, fence=fence, last=last, server_time=time.time())
    record = held.record()
    return LockView(key, owner=record.get("owner"), fence=held.create_revision,
                    acquired_at=record.get("acquired_at"), ttl_remaining=gateway.lease_ttl(held.lease),
                    last=last, server_time=time.time())


def _in_window(slot, answered):
    """Whether the slot's window was open at `answered`, the Date header of
    the grant's answer: whole seconds, the start of the second it names
    (slots.py: the window is [N*W - lead, (N+1)*W - lead))."""
    opens = slot.number * slot.width - slot.lead
    return opens < answered + 1 and answered < opens + slot.width


def overdue(pause, answered):
    """Whether the pause had certainly ended at `answered`, a Date header
    (the start of its second): a lease can outlive its TTL (etcd_lease.pause)."""
    return pause.until is not None and pause.until <= answered


def end_overdue(gateway, name, paused):
    """Delete an overdue pause's key `name`, unless it changed since it was read (paused, its KV)."""
    gateway.txn([{"key": b64(name), "target": "MOD", "result": "EQUAL", "mod_revision": paused.mod_revision}],
                [{"request_delete_range": {"key": b64(name)}}], [])


class _Transaction(object):
    """The grant's transaction, and the leases granted for it."""

    def __init__(self, lease, seconds, kept_at, compare, success, failure):
        self.lease = lease
        self.seconds = seconds  # the lease's TTL
        self.kept_at = kept_at  # boottime.now() when the request that set its expiry was sent
        self.compare = compare
        self.success = success
        self.failure = failure
        self.marker_lease = None  # the new slot marker's own lease (once_per, not a rerun)
        self.rerun_marker = None  # the marker a rerun replaces, as read before (a KV)
        self.scopes = ()  # the pauses compared, whose keys the failure reads last

    def pause(self, answer):
        """(the pause that failed the transaction, the first of its scopes',
        its key's KV); or (None, None)."""
        responses = answer["responses"][len(self.failure) - len(self.scopes):]
        for scope, response in zip(self.scopes, responses):
            paused = first_kv(response)
            if paused is not None:
                return Pause.from_record(scope, paused.value), paused
        return None, None

    def payload(self):
        return {"compare": self.compare, "success": self.success, "failure": self.failure}

    def revoke(self, gateway, spare_to=None):
        """Revoke what was granted for a transaction that took nothing (its
        keys go with them); the lock's lease goes to SPARE_TO instead (a
        refused waiter's line keeps it: EtcdLine.return_spare)."""
        if self.lease and spare_to is not None:
            spare_to(self.lease, self.seconds, self.kept_at)
        elif self.lease:
            gateway.revoke(self.lease)
        if self.marker_lease:
            gateway.revoke(self.marker_lease)


class EtcdGrant(object):
    """Backend.acquire on etcd. `leases` is the backend's (key, owner) ->
    lease id of our grants, for renew and release."""

    def __init__(self, gateway, names, line, min_ttl, leases):
        self.gateway = gateway
        self.names = names
        self.line = line
        self.min_ttl = min_ttl
        self.leases = leases
        # boottime.now() (CLOCK_BOOTTIME, as the lease deadlines) at the start of the try in progress (_try)
        self._try_started = None

    def acquire(self, key, owner, ttl, slot=None, pauses=()):
        """The grant, with the once-per slot checked on the member's clock:
        an etcd transaction has no clock to compare with, so the slot comes
        from the runner's clock (checked against the member's by the clock
        check) and the grant stands only if the Date header of the
        transaction's own answer (whole seconds) says that slot's window was
        open then; otherwise it is revoked and asked again for the member's slot."""
        for _try in range(SLOT_TRIES):
            grant = self._try(key, owner, ttl, slot, pauses)
            if grant is not None:
                return grant
        raise BackendError("etcd: the slot kept moving during the grant of %s (once_per too short?)" % key)

    def _try(self, key, owner, ttl, slot, pauses):
        """A Grant, or None to try again (the slot moved, or a rerun's marker changed)."""
        self._try_started = now()
        seen = None
        if slot is not None and not slot.rerun and slot.blackout is not None:
            return self._blacked_out(key, owner, ttl, slot, pauses)
        waiter = self.line.waits(key, owner)
        if waiter and not self.line.first_try_after_wake(key):
            # A waiter: most of its tries are refused; its read says so and
            # names the ticket to watch. Woken by the lock's deletion, it is
            # most likely next: the read would be a round trip between the
            # release and the job.
            refusal = self.line.refused(key, owner)
            if refusal is not None:
                # While it waits: the lease its grant will take when woken.
                self.line.keep_spare(key, owner, lease_seconds(ttl, "ttl", self.min_ttl))
                return refusal
        if slot is not None and slot.rerun:
            seen = self._rerun_marker(key, slot)
            if isinstance(seen, Grant):
                return seen
            if slot.blackout is not None:
                return self._blacked_out(key, owner, ttl, slot, pauses)
        elif not waiter:
            # The grant's compares, read-only: when they fail (the lock is
            # held, the slot done, a pause on: what most tries of a fleet
            # find, all nodes but one), the answer is the refusal, without
            # the writes through Raft of a full try (a lease grant, the
            # transaction, the revoke; with once_per, a second lease and its
            # revoke). When they hold, the full try decides.
            check = self._transaction(key, owner, ttl, slot, None, pauses, check_only=True)
            answer, answered = self._send(check)
            if not answer.get("succeeded"):
                return self._refused(key, owner, slot, check, answer, int(answer["header"]["revision"]), answered)
        txn = self._transaction(key, owner, ttl, slot, seen, pauses)
        answer, answered = self._send(txn)
        revision = int(answer["header"]["revision"])
        if answer.get("succeeded") and txn.marker_lease and slot.width is not None and not _in_window(slot, answered):
            # Granted outside the slot's window on the member's clock (a delayed
            # grant): undo it (revoking the leases deletes both keys), ask again.
            txn.revoke(self.gateway)
            self._slot_at_next_answer(slot, answered)
            return None
        if answer.get("succeeded"):
            self.leases[(key, owner)] = txn.lease
            self.line.forget(key, owner)  # the transaction deleted our ticket (EtcdLine.granted)
            return Grant("granted", fence=revision, lease_age=self._lease_age(txn))  # the lock key's create_revision
        return self._refused(key, owner, slot, txn, answer, revision, answered)

    def _lease_age(self, txn):
        """How long the lock's lease had been counting when this try began:
        a spare's, since its last keep-alive; a lease granted by the try, none."""
        return max(0.0, self._try_started - txn.kept_at)

    def _slot_at_next_answer(self, slot, answered):
        """Ask again for the slot open on the member's clock when the next
        try's answer comes: the Date header's second (its middle) plus as
        long as this try took. A slow leader makes every try long (each is
        several round trips), and the next takes as long: asking for the
        slot open at `answered` would find it over again."""
        slot.number = slot.number_at(answered + 0.5 + (now() - self._try_started))

    def _blacked_out(self, key, owner, ttl, slot, pauses):
        """The answer for a blacked-out slot (base.Slot.blackout), which
        writes nothing: the grant's compares, read-only, whose pauses are the
        answer first, as on every backend; else 'blackout' once the Date
        header of that read says the slot is the one open on the member's
        clock (None to ask again for the member's slot when it is another)."""
        check = self._transaction(key, owner, ttl, slot, None, pauses, check_only=True)
        answer, answered = self._send(check)
        if not answer.get("succeeded"):
            refusal = self._pause_refusal(check, answer, answered)
            if refusal is not True:
                return refusal
        if slot.width is not None and not slot.rerun and not _in_window(slot, answered):
            self._slot_at_next_answer(slot, answered)
            return None
        return Grant("blackout", window=slot.blackout)

    def _pause_refusal(self, txn, answer, answered):
        """For a transaction that failed its compares: the 'paused' Grant of
        the pause that failed it, None to try again (the pause had ended: its
        key is deleted), or True when no pause did."""
        pause, paused = txn.pause(answer)
        if pause is None:
            return True
        if overdue(pause, answered):
            # Its lease outlived its end: a new leader starts every lease
            # again at its full TTL. The record's end is the pause's end.
            end_overdue(self.gateway, self.names.pause(pause.scope), paused)
            return None
        return Grant("paused", pause=pause)

    def _rerun_marker(self, key, slot):
        """The marker a rerun of slot may replace, or the refusal (a Grant):
        base.rerun_refusal, on the member's clock (the Date header of the
        read's answer, the start of its second: a slot that began within
        that second may be refused, never one in the future granted). The
        grant's transaction then compares the marker's mod_revision with
        this read's, so the rule holds at the grant: a marker changed
        meanwhile (a rerun, a release, its expiry) fails the compare."""
        response = self.gateway.post("/kv/range", {"key": b64(self.names.marker(key, slot))}, dated=True)
        try:
            kvs, answered = response.json().get("kvs") or [], answer_date(response)
        except ValueError as exc:
            raise BackendError("etcd: unreadable answer to the read of a slot marker: %s" % exc)
        marker = KV(kvs[0]) if kvs else None
        refusal = rerun_refusal(slot.number, slot.number_at(answered), marker and marker.value)
        if refusal == "duplicate":
            return Grant(refusal, holder=LockView(key, owner=marker_owner(marker.value)))
        return Grant(refusal) if refusal else marker

    def _transaction(self, key, owner, ttl, slot, rerun_marker, pauses, check_only=False):
        """The lease, and the transaction that puts the lock key on it; with
        check_only, its compares and reads alone (no lease, no write: etcd
        serves it as a read)."""
        lock = b64(self.names.lock(key))
        seconds = lease = kept_at = None
        if not check_only:
            seconds = lease_seconds(ttl, "ttl", self.min_ttl)
            # A waiter's spare lease, or a new one.
            lease, kept_at = self.line.take_spare(key, owner, seconds) or (None, now())
            lease = lease or self.gateway.grant_lease(seconds)
        value = json.dumps({"owner": owner, "acquired_at": time.time()}, sort_keys=True)
        txn = _Transaction(lease, seconds, kept_at,
                           [{"key": lock, "target": "CREATE", "result": "EQUAL", "create_revision": 0},
                            self.line.compare(key, owner)],
                           [{"request_put": {"key": lock, "value": b64(value), "lease": lease}},
                            {"request_put": {"key": b64(self.names.fence(key)), "value": ""}}],
                           [{"request_range": {"key": lock}}])
        self.line.granted(key, owner, txn.success)
        if rerun_marker is not None:
            # The marker read (never a success), now ours, on its own lease: its expiry is kept.
            marker = b64(self.names.marker(key, slot))
            txn.rerun_marker = rerun_marker
            txn.compare.append({"key": marker, "target": "MOD", "result": "EQUAL",
                                "mod_revision": rerun_marker.mod_revision})
            txn.success.append({"request_put": {"key": marker, "value": b64(owner), "lease": rerun_marker.lease}})
            txn.failure.append({"request_range": {"key": marker}})
        elif slot is not None:
            marker = b64(self.names.marker(key, slot))
            if not check_only:
                txn.marker_lease = self.gateway.grant_lease(lease_seconds(slot.marker_ttl, "once_per marker", 1.0))
            txn.compare.append({"key": marker, "target": "CREATE", "result": "EQUAL", "create_revision": 0})
            txn.success.append({"request_put": {"key": marker, "value": b64(owner), "lease": txn.marker_lease}})
            txn.failure.append({"request_range": {"key": marker}})
        for scope in pauses:
            name = b64(self.names.pause(scope))
            txn.compare.append({"key": name, "target": "VERSION", "result": "EQUAL", "version": 0})
            txn.failure.append({"request_range": {"key": name}})
        txn.scopes = tuple(pauses)
        if check_only:
            txn.success = []
        return txn

    def _send(self, txn):
        """The transaction's answer and its Date header; on any error, the
        leases granted for it are revoked."""
        try:
            response = self.gateway.post("/kv/txn", txn.payload(), dated=True)
            try:
                return response.json(), answer_date(response)
            except ValueError as exc:
                raise BackendError("etcd: unreadable answer to the grant: %s" % exc)
        except BackendError:
            txn.revoke(self.gateway)
            raise

    def _refused(self, key, owner, slot, txn, answer, revision, answered):
        """The answer to a transaction whose compare failed: None to try again."""
        held = first_kv(answer["responses"][0])
        if held is not None and held.lease == txn.lease:
            # Our own grant, applied by a try whose answer was lost before
            # another member was asked (a timeout is not a refusal).
            self.leases[(key, owner)] = txn.lease
            self.line.forget(key, owner)
            return Grant("granted", fence=held.create_revision, lease_age=self._lease_age(txn))
        # Refused, nothing written: a waiter keeps the lock's lease for its next try.
        txn.revoke(self.gateway, spare_to=lambda lease, seconds, kept_at: self.line.return_spare(
            key, owner, lease, seconds, kept_at))
        self.line.saw_refused(key, revision)
        refusal = self._pause_refusal(txn, answer, answered)
        if refusal is not True:
            return refusal
        marker_kv = first_kv(answer["responses"][1]) if slot is not None else None
        if txn.rerun_marker is not None:
            if held is None and (marker_kv is None or marker_kv.mod_revision != txn.rerun_marker.mod_revision):
                return None  # the marker changed since it was read: judge the rerun again
        elif marker_kv is not None:
            if slot.width is not None and not _in_window(slot, answered):
                # The marker of a slot that is over on the member's clock (an
                # estimate made before its edge): ask for the member's slot.
                self._slot_at_next_answer(slot, answered)
                return None
            return Grant("duplicate", holder=LockView(key, owner=marker_owner(marker_kv.value)))
        if held is None:  # free, but others came first
            return Grant("locked", holder=LockView(key, queued=self.line.waiters(key), server_time=time.time()))
        return Grant("locked", holder=lock_view(self.gateway, key, held))
