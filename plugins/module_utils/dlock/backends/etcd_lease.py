"""etcd v3 lease: the lock is a key attached to an etcd lease (a server-side
TTL), created by one transaction that compares its create_revision with 0.

Keys, under the URL's prefix P (default /dlock; an etcd role with a
readwrite permission on the prefix P/ suffices):
  P/KEY/lock    JSON {owner, acquired_at}, attached to the holder's lease
  P/KEY/fence   empty, written in every grant: its mod_revision is the last fence
  P/KEY/slot/N  once-per marker of slot N (slots.py: the owner, or the outcome), with its own lease
  P/KEY/last    JSON of the last finished run
  P/KEY/queue/OWNER  a waiter's ticket, attached to a lease of its own
Lock keys cannot hold '/', so no key's names reach into another key's.

The line of waiters is etcd's own lock recipe (its concurrency package):
tickets in the order of their create_revision. The grant's transaction
compares, besides the lock key, the whole P/KEY/queue/ range: every live
ticket there must be ours or younger than ours (none at all for a caller
without a ticket). A waiter keeps its ticket's lease alive while it waits;
a dead waiter's ticket goes with its lease.

Fencing token: the lock key's create_revision, the store's revision of the
grant. etcd's revision only grows (across grants, leader changes and
restarts: it is in the data directory), so each grant's is greater than
every earlier one's.

The driver is etcd3gw (python3-etcd3gw on Debian 12), which talks to etcd's
gRPC gateway (JSON over HTTP, /v3/; keys, values and 64-bit numbers are
base64 or strings in JSON). We use its client for each member's URL and its
requests session (TLS: CA, client certificate), and send the requests
through that session ourselves, because etcd3gw cannot:
- bound a call: etcd3gw 2.0 (Debian 12) puts its timeout on the session,
  where requests ignores it, and 2.7's post() refuses a per-call one; we need
  op_timeout per call, shared across the members we try;
- send the auth token, report which member failed, or return headers (the
  Date header is our only reading of the server's clock);
- watch with a timeout (its watch runs in a thread pool that nothing stops).
"""

import base64
import calendar
import email.utils
import json
import math
import time

from ..errors import AuthError, BackendError, ConfigError, MissingDriver
from ..options import BACKEND_MIN_TTL
from ..safefile import require_regular
from ..slots import SLOT_TRIES, marker_owner, outcome_marker, slot_number
from ..validate import MAX_DURATION, backend_url
from .base import Backend, Grant, LockView, endpoint, lease_ms, rerun_refusal

try:
    import requests
    from etcd3gw.client import Etcd3Client
except ImportError:
    Etcd3Client = None

DEFAULT_PORT = 2379


def _b64(text):
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def _unb64(data):
    return base64.b64decode(data or "").decode("utf-8")


def _seconds(ttl, field, minimum):
    """A lease TTL for etcd: whole seconds, rounded up (a longer lease is
    safe: the runner kills its job by its own, shorter, deadline)."""
    return int(math.ceil(lease_ms(ttl, field, minimum, 1.5 * MAX_DURATION) / 1000.0))


class _KV(object):
    """One key as the gateway returns it."""

    def __init__(self, item):
        self.value = _unb64(item.get("value"))
        self.lease = int(item.get("lease", 0))
        self.create_revision = int(item.get("create_revision", 0))
        self.mod_revision = int(item.get("mod_revision", 0))

    def record(self):
        """The JSON a lock or last key holds; {} when it is not ours to read."""
        try:
            value = json.loads(self.value)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


def _first_kv(response):
    """The key of a range answer inside a transaction, or None."""
    kvs = response.get("response_range", {}).get("kvs") or []
    return _KV(kvs[0]) if kvs else None


class _Unavailable(Exception):
    """This member did not answer (or cannot serve): try the next one."""


class EtcdBackend(Backend):
    name = "etcd"

    def __init__(self, url, password=None, op_timeout=2.0, ca_file=None):
        if Etcd3Client is None:
            raise MissingDriver("etcd3gw", "python3-etcd3gw", "etcd://")
        parts = backend_url(url)
        self.prefix = parts.path
        self.user = parts.user
        self.password = password
        if password is not None and not self.user:
            raise ConfigError("backend: etcd has no default user: name the user in the URL "
                              "(etcd://USER@host:2379,...) to log in with a password")
        self.op_timeout = op_timeout
        self.protocol = "https" if parts.scheme == "etcd+https" else "http"
        self.ca_file = ca_file
        # Files the driver opens itself must be regular files (a FIFO would
        # block it beyond any timeout of ours).
        self.cert = parts.query.get("cert")
        self.key_file = parts.query.get("key")
        if self.cert:
            require_regular(self.cert, "TLS client certificate")
            require_regular(self.key_file, "TLS client key")
        self.min_ttl = BACKEND_MIN_TTL[parts.scheme]
        self.endpoints = [(host, port or DEFAULT_PORT) for host, port in parts.hosts]
        self._clients = None
        self._current = 0  # the member that answered last is asked first
        self._answered = False  # whether _current has answered yet
        self._member_ids = {}  # endpoint index -> the member id its answers' headers carry
        self._member_names = {}  # member id -> name, from the member list (describe(cluster=True))
        self._token = None
        self._leases = {}  # (key, owner) -> the lease id of our grant, for renew
        self._seen = {}  # key -> revision at which we last saw it held, for wait_change
        self._tickets = {}  # (key, owner) -> (lease id or None, create_revision) of our place in line
        self._watched = {}  # key -> the one name whose deletion moves us up the line (wait_change)

    # -- transport --------------------------------------------------------------
    def _members(self):
        if self._clients is None:
            self._clients = [Etcd3Client(host=host, port=port, protocol=self.protocol, ca_cert=self.ca_file,
                                         cert_cert=self.cert, cert_key=self.key_file, api_path="/v3/")
                             for host, port in self.endpoints]
            if self.ca_file:
                for client in self._clients:
                    # requests lets REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE in the environment replace the
                    # session's CA (ca_file) on every request: the CA given must be the one verified.
                    client.session.trust_env = False
        return self._clients

    def _ordered(self):
        """Each member once, starting with the one that answered last."""
        clients = self._members()
        start = self._current
        return [(i % len(clients), clients[i % len(clients)]) for i in range(start, start + len(clients))]

    def _post(self, path, payload, stream=False, read_timeout=None):
        """POST to the gateway on the first member that answers, within
        op_timeout for all the members tried. Returns the response (JSON
        read unless `stream`). An unreachable member, or one that cannot
        serve (503: no leader, partitioned), is not an outage while another
        answers. Each try gets an equal share of what is left, so one member
        that accepts connections but never answers (a frozen process) cannot
        use up the whole budget."""
        deadline = time.monotonic() + self.op_timeout
        tried = self._ordered()
        errors = []
        for number, (index, client) in enumerate(tried):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            share = left / (len(tried) - number)
            try:
                response = self._post_to(client, path, payload, share, stream, read_timeout)
            except _Unavailable as exc:
                errors.append("%s:%s: %s" % (client.host, client.port, exc))
                continue
            self._current, self._answered = index, True
            if not stream and response.get("header", {}).get("member_id"):
                self._member_ids[index] = response["header"]["member_id"]
            return response
        raise BackendError("etcd: no member answered within op_timeout (%.3gs): %s"
                           % (self.op_timeout, "; ".join(errors) or "no time left"))

    def _post_to(self, client, path, payload, timeout, stream, read_timeout):
        for attempt in (1, 2):
            headers = {"Authorization": self._login(client, timeout)} if self.password is not None else {}
            try:
                response = client.session.post(client.get_url(path), json=payload, headers=headers, stream=stream,
                                               timeout=(timeout, read_timeout or timeout))
            except requests.RequestException as exc:
                raise _Unavailable(exc.__class__.__name__ if isinstance(exc, requests.Timeout) else exc)
            if response.status_code == 200:
                return response if stream else response.json()
            error = _error_text(response)
            response.close()
            if response.status_code == 401 and self.password is not None and attempt == 1:
                self._token = None  # expired (simple tokens live 5 minutes unused) or revoked: log in again
                continue
            if response.status_code in (401, 403) or "authentication failed" in error:
                raise AuthError("etcd: %s (user %s)" % (error, self.user))
            if "user name is empty" in error:
                raise AuthError("etcd: the server has auth enabled: name the user in the URL "
                                "(etcd://USER@host:2379,...) and give its password file")
            if response.status_code == 503:
                raise _Unavailable(error)
            raise BackendError("etcd: %s" % error)
        raise AuthError("etcd: the server refused a fresh token (user %s)" % self.user)

    def _login(self, client, timeout):
        """The auth token (gateway /v3/auth/authenticate), fetched once."""
        if self._token is None:
            try:
                response = client.session.post(client.get_url("/auth/authenticate"),
                                               json={"name": self.user, "password": self.password},
                                               timeout=(timeout, timeout))
            except requests.RequestException as exc:
                raise _Unavailable(exc)
            if response.status_code != 200:
                error = _error_text(response)
                if response.status_code == 503:
                    raise _Unavailable(error)
                # Never the password: the error is the server's text.
                raise AuthError("etcd: cannot log in as %s: %s" % (self.user, error))
            self._token = response.json()["token"]
        return self._token

    def _txn(self, compare, success, failure):
        return self._post("/kv/txn", {"compare": compare, "success": success, "failure": failure})

    def _grant_lease(self, seconds):
        answer = self._post("/lease/grant", {"TTL": seconds})
        if answer.get("error"):
            raise BackendError("etcd: cannot grant a lease: %s" % answer["error"])
        return int(answer["ID"])

    def _revoke(self, lease):
        """Revoke a lease we no longer need; if that fails it expires by itself."""
        try:
            self._post("/lease/revoke", {"ID": lease})
        except BackendError:
            pass

    def _lease_ttl(self, lease):
        """Seconds left on a lease (etcd rounds to whole seconds); None when it is gone."""
        ttl = int(self._post("/lease/timetolive", {"ID": lease}).get("TTL", -1))
        return ttl if ttl >= 0 else None

    def _get(self, name):
        kvs = self._post("/kv/range", {"key": _b64(name)}).get("kvs") or []
        return _KV(kvs[0]) if kvs else None

    def _names(self, key):
        base = "%s/%s/" % (self.prefix, key)
        return base + "lock", base + "fence", base + "last"

    def _queue(self, key):
        return "%s/%s/queue/" % (self.prefix, key)

    def _marker(self, key, slot):
        return "%s/%s/slot/%d" % (self.prefix, key, slot.number)

    def _rerun_marker(self, key, slot):
        """The marker a rerun of slot may replace, or the refusal (a Grant):
        base.rerun_refusal, on the member's clock (the Date header of the
        read's answer, the start of its second: a slot that began within
        that second may be refused, never one in the future granted). The
        grant's transaction then compares the marker's mod_revision with
        this read's, so the rule holds at the grant: a marker changed
        meanwhile (a rerun, a release, its expiry) fails the compare."""
        response = self._post("/kv/range", {"key": _b64(self._marker(key, slot))}, stream=True)
        try:
            kvs, answered = response.json().get("kvs") or [], _date(response)
        except ValueError as exc:
            raise BackendError("etcd: unreadable answer to the read of a slot marker: %s" % exc)
        marker = _KV(kvs[0]) if kvs else None
        refusal = rerun_refusal(slot.number, slot_number(answered, slot.width), marker and marker.value)
        if refusal == "duplicate":
            return Grant(refusal, holder=LockView(key, owner=marker_owner(marker.value)))
        return Grant(refusal) if refusal else marker

    def _queue_compare(self, key, owner):
        """The grant's condition on the line: no live ticket older than ours
        (a range compare holds for every key in the range; an empty range
        compares as create_revision 0)."""
        queue = self._queue(key)
        ticket = self._tickets.get((key, owner))
        compare = {"key": _b64(queue), "range_end": _b64(_prefix_end(queue)), "target": "CREATE"}
        if ticket is None:
            compare.update(result="EQUAL", create_revision=0)
        else:
            compare.update(result="GREATER", create_revision=ticket[1] - 1)
        return compare

    # -- the Backend contract ---------------------------------------------------
    def server_time(self):
        """The member's wall clock, from the HTTP Date header of an answer:
        etcd's API has no clock (its response header holds none), and the
        Date header has whole seconds, so this is the middle of that second
        and clock_resolution tells the check it is 1s coarse."""
        return _date(self._post("/maintenance/status", {}, stream=True)) + 0.5

    clock_resolution = 1.0

    def acquire(self, key, owner, ttl, slot=None):
        """The grant, with the once-per slot checked on the member's clock:
        an etcd transaction has no clock to compare with, so the slot comes
        from the runner's clock (checked against the member's by the clock
        check) and the grant stands only if the Date header of the
        transaction's own answer (whole seconds) says that slot's window was
        open then; otherwise it is revoked and asked again for the member's slot."""
        for _try in range(SLOT_TRIES):
            grant = self._acquire(key, owner, ttl, slot)
            if grant is not None:
                return grant
        raise BackendError("etcd: the slot kept moving during the grant of %s (once_per too short?)" % key)

    def _acquire(self, key, owner, ttl, slot):
        lock, fence, _last = self._names(key)
        if (key, owner) in self._tickets:
            # A waiter: most of its tries are refused; a read says so without
            # the lease grant and revoke (two writes through Raft) of a full try.
            refusal = self._refused_in_line(key, owner)
            if refusal is not None:
                return refusal
        rerun = slot is not None and slot.rerun
        if rerun:
            seen = self._rerun_marker(key, slot)
            if isinstance(seen, Grant):
                return seen
        lease = self._grant_lease(_seconds(ttl, "ttl", self.min_ttl))
        value = json.dumps({"owner": owner, "acquired_at": time.time()}, sort_keys=True)
        compare = [{"key": _b64(lock), "target": "CREATE", "result": "EQUAL", "create_revision": 0},
                   self._queue_compare(key, owner)]
        success = [{"request_put": {"key": _b64(lock), "value": _b64(value), "lease": lease}},
                   {"request_put": {"key": _b64(fence), "value": ""}}]
        failure = [{"request_range": {"key": _b64(lock)}}]
        marker_lease = None
        if rerun:
            # The marker read (never a success), now ours, on its own lease: its expiry is kept.
            marker = _b64(self._marker(key, slot))
            compare.append({"key": marker, "target": "MOD", "result": "EQUAL", "mod_revision": seen.mod_revision})
            success.append({"request_put": {"key": marker, "value": _b64(owner), "lease": seen.lease}})
            failure.append({"request_range": {"key": marker}})
        elif slot is not None:
            marker = self._marker(key, slot)
            marker_lease = self._grant_lease(_seconds(slot.marker_ttl, "once_per marker", 1.0))
            compare.append({"key": _b64(marker), "target": "CREATE", "result": "EQUAL", "create_revision": 0})
            success.append({"request_put": {"key": _b64(marker), "value": _b64(owner), "lease": marker_lease}})
            failure.append({"request_range": {"key": _b64(marker)}})
        try:
            response = self._post("/kv/txn", {"compare": compare, "success": success, "failure": failure}, stream=True)
            try:
                answer, answered = response.json(), _date(response)
            except ValueError as exc:
                raise BackendError("etcd: unreadable answer to the grant: %s" % exc)
        except BackendError:
            self._revoke(lease)
            if marker_lease:
                self._revoke(marker_lease)
            raise
        revision = int(answer["header"]["revision"])
        if answer.get("succeeded") and marker_lease and slot.width is not None and not (
                (slot.number - 0.5) * slot.width < answered + 1 and answered < (slot.number + 0.5) * slot.width):
            # Granted outside the slot's window on the member's clock (a delayed
            # grant): undo it (revoking the leases deletes both keys), ask again.
            self._revoke(lease)
            self._revoke(marker_lease)
            slot.number = slot_number(answered + 0.5, slot.width)
            return None
        if answer.get("succeeded"):
            self._leases[(key, owner)] = lease
            return Grant("granted", fence=revision)  # the lock key's create_revision
        held = _first_kv(answer["responses"][0])
        if held is not None and held.lease == lease:
            # Our own grant, applied by a try whose answer was lost before
            # another member was asked (a timeout is not a refusal).
            self._leases[(key, owner)] = lease
            return Grant("granted", fence=held.create_revision)
        self._revoke(lease)
        if marker_lease:
            self._revoke(marker_lease)
        self._seen[key] = revision
        marker_kv = _first_kv(answer["responses"][1]) if slot is not None else None
        if rerun:
            if held is None and (marker_kv is None or marker_kv.mod_revision != seen.mod_revision):
                return None  # the marker changed since it was read: judge the rerun again
        elif marker_kv is not None:
            return Grant("duplicate", holder=LockView(key, owner=marker_owner(marker_kv.value)))
        if held is None:  # free, but others came first
            return Grant("locked", holder=LockView(key, queued=self._waiters(key), server_time=time.time()))
        return Grant("locked", holder=self._holder(key, held))

    def _holder(self, key, held, last=None, fence=0):
        if held is None:
            return LockView(key, fence=fence, last=last, server_time=time.time())
        record = held.record()
        return LockView(key, owner=record.get("owner"), fence=held.create_revision,
                      acquired_at=record.get("acquired_at"), ttl_remaining=self._lease_ttl(held.lease),
                      last=last, server_time=time.time())

    def renew(self, key, owner, ttl):
        """Keep our lease alive, then check the key is still ours and on that
        lease (after the keep-alive: a key seen ours afterwards cannot go
        before the renewed lease). etcd cannot change a lease's TTL: it must
        already be at least ttl."""
        lock = self._names(key)[0]
        lease = self._leases.get((key, owner))
        if lease is None:  # another process took it (the module's later task, the hold renewer)
            held = self._get(lock)
            if held is None or held.record().get("owner") != owner:
                return False
            lease = held.lease
        answer = self._post("/lease/keepalive", {"ID": lease})
        left = int(answer.get("result", {}).get("TTL", 0))
        if left <= 0:
            return False  # the lease expired or was revoked
        held = self._get(lock)
        if held is None or held.lease != lease or held.record().get("owner") != owner:
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
        lock, _fence, last_name = self._names(key)
        held = self._get(lock)
        if held is None or held.record().get("owner") != owner:
            return False
        keep = (held.record().get("acquired_at") or 0) + lease_ms(min_hold, "min_hold", 0.0) / 1000.0 - time.time()
        success, short = [], None
        if last:
            success.append({"request_put": {"key": _b64(last_name), "value": _b64(json.dumps(last, sort_keys=True))}})
        if keep <= 0:
            success.append({"request_delete_range": {"key": _b64(lock)}})
        else:
            left = self._lease_ttl(held.lease)
            if left is not None and math.ceil(keep) < left:
                short = self._grant_lease(int(math.ceil(keep)))
                success.append({"request_put": {"key": _b64(lock), "ignore_value": True, "lease": short}})
        # mod_revision: the key is still the one we read (owner and lease).
        compare = [{"key": _b64(lock), "target": "MOD", "result": "EQUAL", "mod_revision": held.mod_revision}]
        marker = self._get(self._marker(key, slot)) if slot is not None and last else None
        answer = None
        if marker is not None and marker.value == owner:
            # The slot's marker records the outcome, on its own lease (its
            # expiry kept), if it is still the one read (else: the release
            # without it, below).
            name = _b64(self._marker(key, slot))
            answer = self._txn(compare + [{"key": name, "target": "MOD", "result": "EQUAL",
                                           "mod_revision": marker.mod_revision}],
                               success + [{"request_put": {"key": name, "value": _b64(outcome_marker(
                                   owner, last.get("result"))), "lease": marker.lease}}], [])
        if answer is None or not answer.get("succeeded"):
            answer = self._txn(compare, success, [])
        self._leases.pop((key, owner), None)
        if not answer.get("succeeded"):
            if short:
                self._revoke(short)
            return False
        if keep <= 0 or short:
            self._revoke(held.lease)
        return True

    def force_release(self, key):
        """Delete the lock key and revoke its lease, so the holder's next
        renew says False at once."""
        lock = self._names(key)[0]
        before = self.query(key)
        held = self._get(lock)
        if held is None:
            before.owner = None
            return before
        compare = [{"key": _b64(lock), "target": "MOD", "result": "EQUAL", "mod_revision": held.mod_revision}]
        answer = self._txn(compare, [{"request_delete_range": {"key": _b64(lock)}}], [])
        if not answer.get("succeeded"):
            raise BackendError("etcd: %s changed while it was being broken; try again" % key)
        self._revoke(held.lease)
        # Report the holder we actually removed (it may have changed since the query).
        before.owner = held.record().get("owner")
        before.fence = held.create_revision
        return before

    def query(self, key):
        lock, fence, last_name = self._names(key)
        # One read-only transaction: the three keys at one revision.
        answer = self._txn([], [{"request_range": {"key": _b64(name)}} for name in (lock, fence, last_name)], [])
        held, fence_kv, last_kv = (_first_kv(response) for response in answer["responses"])
        last = (last_kv.record() or None) if last_kv is not None else None
        return self._holder(key, held, last, fence_kv.mod_revision if fence_kv is not None else 0)

    # -- waiting ----------------------------------------------------------------
    def _refused_in_line(self, key, owner):
        """A "locked" Grant when the lock is held or another ticket comes
        first, from one read-only transaction; None when a grant may succeed."""
        lock, queue = self._names(key)[0], self._queue(key)
        queue_range = {"key": _b64(queue), "range_end": _b64(_prefix_end(queue))}
        # The ticket just before ours, the one whose deletion lets us move up.
        before = dict(queue_range, max_create_revision=self._tickets[(key, owner)][1] - 1, sort_order="DESCEND",
                      sort_target="CREATE", limit=1, keys_only=True)
        answer = self._txn([{"key": _b64(lock), "target": "CREATE", "result": "EQUAL", "create_revision": 0},
                            self._queue_compare(key, owner)], [],
                           [{"request_range": {"key": _b64(lock)}},
                            {"request_range": dict(queue_range, count_only=True)},
                            {"request_range": before}])
        if answer.get("succeeded"):
            return None
        self._seen[key] = int(answer["header"]["revision"])
        ahead = (answer["responses"][2].get("response_range", {}).get("kvs") or [None])[0]
        # Like etcd's recipe, each waiter watches only the one before it (the
        # first in line watches the lock): a release wakes one waiter, not all.
        self._watched[key] = _unb64(ahead["key"]) if ahead else lock
        held = _first_kv(answer["responses"][0])
        if held is None:
            waiters = int(answer["responses"][1].get("response_range", {}).get("count", 0))
            return Grant("locked", holder=LockView(key, queued=waiters, server_time=time.time()))
        # No ttl_remaining (one more round trip): the watch tells of the lease's end.
        record = held.record()
        return Grant("locked", holder=LockView(key, owner=record.get("owner"), fence=held.create_revision,
                                             acquired_at=record.get("acquired_at"), server_time=time.time()))

    def _waiters(self, key):
        queue = self._queue(key)
        answer = self._post("/kv/range", {"key": _b64(queue), "range_end": _b64(_prefix_end(queue)), "count_only": True})
        return int(answer.get("count", 0))

    def join_queue(self, key, owner, ttl):
        """A ticket P/KEY/queue/OWNER on a lease of its own, created once and
        kept alive; one whose lease ran out is taken anew, at the end of the line."""
        ticket = self._tickets.get((key, owner))
        if ticket is not None:
            lease = ticket[0]
            if lease is None or int(self._post("/lease/keepalive", {"ID": lease}).get("result", {}).get("TTL", 0)) > 0:
                return  # ours and alive (or another process's, with the same owner, which keeps it)
            del self._tickets[(key, owner)]
        name = self._queue(key) + owner
        lease = self._grant_lease(_seconds(ttl, "ticket ttl", self.min_ttl))
        try:
            answer = self._txn([{"key": _b64(name), "target": "CREATE", "result": "EQUAL", "create_revision": 0}],
                               [{"request_put": {"key": _b64(name), "value": "", "lease": lease}}],
                               [{"request_range": {"key": _b64(name)}}])
        except BackendError:
            self._revoke(lease)
            raise
        if answer.get("succeeded"):
            self._tickets[(key, owner)] = (lease, int(answer["header"]["revision"]))
            return
        self._revoke(lease)
        existing = _first_kv(answer["responses"][0])
        if existing is not None:  # a task of the same run (same owner) on another host waits too
            self._tickets[(key, owner)] = (None, existing.create_revision)

    def leave_queue(self, key, owner):
        ticket = self._tickets.pop((key, owner), None)
        if ticket is not None and ticket[0] is not None:
            self._revoke(ticket[0])  # deletes the ticket; its deletion wakes the others

    def wait_change(self, key, timeout):
        """Watch for a deletion (release, force_release, a lease's expiry, a
        ticket leaving the line) of the one name the last refusal named, or
        else of any of the key's names, from just after the
        revision at which we saw it refused, so one in between is not
        missed; at most `timeout`. Any trouble with the watch ends in a plain
        sleep: the caller asks again, and a backend that is down then says so."""
        base = "%s/%s/" % (self.prefix, key)
        since = self._seen.get(key)
        watched = self._watched.pop(key, None)
        if watched is not None:
            request = {"key": _b64(watched), "filters": ["NOPUT"]}
        else:
            request = {"key": _b64(base), "range_end": _b64(_prefix_end(base)), "filters": ["NOPUT"]}
        if since is not None:
            request["start_revision"] = since + 1
        deadline = time.monotonic() + timeout
        try:
            response = self._post("/watch", {"create_request": request}, stream=True, read_timeout=timeout)
        except BackendError:
            time.sleep(max(0.0, deadline - time.monotonic()))
            return
        try:
            for message in _json_lines(response):
                result = message.get("result", {})
                if result.get("events") or result.get("canceled") or "error" in message:
                    return  # deleted, or compacted past `since`: ask again
                if time.monotonic() >= deadline:
                    return
        except (requests.RequestException, ValueError):
            return  # the read timed out (no release within timeout) or the stream broke
        finally:
            response.close()

    def describe(self, cluster=False):
        """The member that answered last: its endpoint in the URL and the
        member id of its answers' header (its name once the member list
        was read). With cluster=True, every member of the URL is asked for
        its status (maintenance/status: its leader, its errors such as "no
        leader" or an alarm) within one op_timeout, and any member for the
        member list; etcd 3.4 lets any authenticated user call both."""
        info = {"backend": self.name, "member": None, "cluster": None}
        if cluster:
            info["cluster"] = self._cluster()
        if self._answered:
            info["member"] = self._member(self._current, info["cluster"])
        return info

    def _member(self, index, cluster=None):
        member = {"endpoint": endpoint(*self.endpoints[index])}
        member_id = self._member_ids.get(index)
        if member_id:
            member["id"] = "%x" % int(member_id)
            if int(member_id) in self._member_names:
                member["name"] = self._member_names[int(member_id)]
            if cluster and cluster.get("leader_id"):
                member["role"] = "leader" if member["id"] == cluster["leader_id"] else "follower"
        return member

    def _cluster(self):
        """The cluster as this node sees it: voting members in the member
        list, the members of the URL that answer and know a leader, and
        the leader."""
        deadline = time.monotonic() + self.op_timeout
        clients = self._members()
        seen, leaders = [], set()
        for index, client in enumerate(clients):
            # An equal share of what is left each, as _post gives its tries.
            share = (deadline - time.monotonic()) / (len(clients) - index)
            try:
                if share <= 0:
                    raise _Unavailable("no time left")
                status = self._post_to(client, "/maintenance/status", {}, share, False, None)
            except _Unavailable as exc:
                seen.append(dict(self._member(index), error=str(exc)))
                continue
            self._member_ids[index] = status.get("header", {}).get("member_id") or self._member_ids.get(index)
            errors = status.get("errors") or []
            leader = int(status.get("leader") or 0)  # 0 (left out of the JSON): no leader known
            if leader and not errors:
                leaders.add(leader)
            seen.append(dict(self._member(index), leader="%x" % leader if leader else None,
                             **({"error": "; ".join(errors)} if errors else {})))
        voting = None
        try:
            members = self._post("/cluster/member/list", {}).get("members") or []
        except BackendError:
            members = []  # no member answered: the statuses say why
        else:
            voting = len([m for m in members if not m.get("isLearner")])
        self._member_names.update((int(m["ID"]), m.get("name") or "") for m in members)
        for row in seen:  # names, now that the list was read
            name = self._member_names.get(int(row.get("id", "0"), 16))
            if name:
                row["name"] = name
        leader_id = "%x" % leaders.pop() if len(leaders) == 1 else None
        return {"members": voting, "healthy": len([r for r in seen if r.get("leader") and "error" not in r]),
                "leader_id": leader_id, "leader": self._member_names.get(int(leader_id, 16)) if leader_id else None,
                "endpoints": seen}

    def reset(self):
        clients, self._clients = self._clients, None
        for client in clients or ():
            client.session.close()

    def close(self):
        self.reset()


def _date(response):
    """The HTTP Date header of a (streamed) answer, in epoch seconds: the
    member's wall clock, whole seconds; the response is closed."""
    try:
        date = email.utils.parsedate(response.headers.get("Date", ""))
    finally:
        response.close()
    if date is None:
        raise BackendError("etcd: the answer had no Date header to read the server's clock from")
    return calendar.timegm(date)


def _prefix_end(prefix):
    """The range_end that covers every key starting with prefix (etcd's clientv3.GetPrefixRangeEnd)."""
    data = bytearray(prefix.encode("utf-8"))
    data[-1] += 1  # prefixes here end in '/', never 0xff
    return bytes(data).decode("utf-8")


def _json_lines(response):
    """The messages of a gateway stream: one JSON object per line."""
    pending = b""
    for chunk in response.iter_content(chunk_size=None):
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                yield json.loads(line.decode("utf-8"))


def _error_text(response):
    """The gateway's error message (JSON {"error": ...}), else the HTTP status."""
    try:
        return str(response.json().get("error") or response.status_code)[:300]
    except ValueError:
        return "HTTP %d %s" % (response.status_code, response.reason)
