"""etcd's gRPC gateway (JSON over HTTP, /v3/) on the members of a URL: which
member is asked, within which time, with which token, and what the members
say of their cluster. The lock's keys and transactions are etcd_lease.py's.

Each member is spoken to over HTTP by etcd_http.py (the standard library
alone: no driver). Each call is bounded by op_timeout, shared across the
members tried, carries the auth token, and says which member failed; the
Date header of an answer is our only reading of the server's clock, and a
watch is read with a timeout. Keys, values and 64-bit numbers are base64 or
strings in the gateway's JSON.
"""

import base64
import calendar
import email.utils
import json
import math
import time

from ..errors import AuthError, BackendError, OutcomeUnknown
from ..validate import MAX_DURATION
from .base import endpoint, lease_ms
from .etcd_http import Member, Unavailable
from .tls import tls_context


def lease_seconds(ttl, field, minimum):
    """A lease TTL for etcd: whole seconds, rounded up (a longer lease is
    safe: the runner kills its job by its own, shorter, deadline)."""
    return int(math.ceil(lease_ms(ttl, field, minimum, 1.5 * MAX_DURATION) / 1000.0))


def b64(text):
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def unb64(data):
    return base64.b64decode(data or "").decode("utf-8")


class KV(object):
    """One key as the gateway returns it."""

    def __init__(self, item):
        self.value = unb64(item.get("value"))
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


def first_kv(response):
    """The key of a range answer inside a transaction, or None."""
    kvs = response.get("response_range", {}).get("kvs") or []
    return KV(kvs[0]) if kvs else None


# The part of what is left of op_timeout that the member which answered the
# last call gets to answer this one (post() says why); the others share the rest.
TRUSTED_SHARE = 0.75


class NoAnswer(OutcomeUnknown):
    """No member answered within op_timeout. A write may still have been
    applied: a member that timed out, broke the connection or answered 503
    ("request timed out") may have had it. Raised too when every member
    refused the connection (each try's Unavailable.maybe_applied tells that
    case apart; the call's outcome does not use it yet)."""


class EtcdGateway(object):
    """The members of the URL, asked one after the other until one answers:
    the one that answered last first."""

    def __init__(self, endpoints, protocol, op_timeout, user=None, password=None, ca_file=None, cert=None,
                 key_file=None):
        self.endpoints = endpoints  # [(host, port)]
        self.protocol = protocol
        self.op_timeout = op_timeout
        self.user = user
        self.password = password
        self.ca_file = ca_file
        self.cert = cert
        self.key_file = key_file
        self._clients = None
        self._current = 0  # the member that answered last is asked first
        self._answered = False  # whether _current has answered yet
        # Whether post() waits on _current longest: until a call found no
        # member answering, and again once one has. The first member of the URL
        # too, before any call: a member that refuses or cannot be reached
        # costs nothing more, and a slow cluster is then waited on from the
        # first call of a process (a runner makes few).
        self._trusted = True
        self._member_ids = {}  # endpoint index -> the member id its answers' headers carry
        self._member_names = {}  # member id -> name, from the member list (describe(cluster=True))
        self._token = None
        # Whether the last call was answered by a member after another may
        # have applied it without answering: a write's answer (a compare
        # that failed) may then describe the state after our own write.
        self.answered_after_a_lost_try = False

    def _members(self):
        """The members' connections, made at the first call (the TLS files
        are read then)."""
        if self._clients is None:
            tls = tls_context(self.ca_file, self.cert, self.key_file) if self.protocol == "https" else None
            self._clients = [Member(host, port, tls) for host, port in self.endpoints]
        return self._clients

    def _ordered(self):
        """Each member once, starting with the one that answered last."""
        clients = self._members()
        start = self._current
        return [(i % len(clients), clients[i % len(clients)]) for i in range(start, start + len(clients))]

    def post(self, path, payload, stream=False, read_timeout=None, dated=False):
        """POST to the gateway on the first member that answers, within
        op_timeout for all the members tried. Returns the answer's JSON;
        with `dated`, the answer (etcd_http.Answer: its headers too, for
        answer_date), on the kept-alive connection as every call; with
        `stream`, a Stream on a connection of its own, for a watch, which
        the caller closes. An unreachable member, or one that cannot
        serve (503: no leader, partitioned), is not an outage while another
        answers.

        Each try connects within an equal share of what is left, so a member
        that is down or cut off costs no more than its share to connect to.
        The member that answered the last call then waits for its answer for
        most of what is left (TRUSTED_SHARE): every write goes through the
        leader whichever member is asked, so a slow but live cluster (a
        loaded leader's fsync) is better waited on than left for another
        member, which would forward to the same leader. When that member took
        that time and did not answer (a frozen process, or one cut off
        behind a connection still open) and no other did, the next call
        shares equally, each member's answer waited on for its share."""
        deadline = time.monotonic() + self.op_timeout
        tried = self._ordered()
        trusted, self._trusted = self._trusted, False  # until a member answers this call
        errors = []
        self.answered_after_a_lost_try = lost_try = False
        for number, (index, client) in enumerate(tried):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            share = left / (len(tried) - number)
            wait = max(share, left * TRUSTED_SHARE) if trusted and number == 0 else share
            try:
                response = self._post_to(client, path, payload, (share, wait), stream, read_timeout, dated)
            except Unavailable as exc:
                errors.append("%s:%s: %s" % (client.host, client.port, exc))
                lost_try = lost_try or exc.maybe_applied
                continue
            self._current, self._answered, self._trusted = index, True, True
            self.answered_after_a_lost_try = lost_try
            if not (stream or dated) and response.get("header", {}).get("member_id"):
                self._member_ids[index] = response["header"]["member_id"]
            return response
        raise NoAnswer("etcd: no member answered within op_timeout (%.3gs): %s"
                       % (self.op_timeout, "; ".join(errors) or "no time left"))

    def _post_to(self, client, path, payload, timeouts, stream, read_timeout=None, dated=False):
        """One member's answer: TIMEOUTS (connect, answer) bound the request
        and the login before it (itself a write through the leader, and the
        first call of a process makes it); a stream's reads wait READ_TIMEOUT
        instead."""
        connect_timeout, answer_timeout = timeouts
        for attempt in (1, 2):
            headers = {"Authorization": self._login(client, timeouts)} if self.password is not None else {}
            response = client.post(path, payload, headers, (connect_timeout, read_timeout or answer_timeout), stream)
            if response.status_code == 200:
                return response if stream or dated else response.json()
            error = _error_text(response)
            response.close()
            if response.status_code == 401 and self.password is not None and attempt == 1:
                self._token = None  # expired (simple tokens live 5 minutes unused) or revoked: log in again
                continue
            self._refuse(response.status_code, error)
        raise AuthError("etcd: the server refused a fresh token (user %s)" % self.user)

    def _refuse(self, status, error):
        """The error of a member's answer other than 200 (and a first 401)."""
        if status in (401, 403) or "authentication failed" in error:
            raise AuthError("etcd: %s (user %s)" % (error, self.user))
        if "user name is empty" in error:
            raise AuthError("etcd: the server has auth enabled: name the user in the URL "
                            "(etcd://USER@host:2379,...) and give its password file")
        if status == 503:
            raise Unavailable(error)
        raise BackendError("etcd: %s" % error)

    def _login(self, client, timeouts):
        """The auth token (gateway /v3/auth/authenticate), fetched once,
        within TIMEOUTS (connect, answer)."""
        if self._token is None:
            try:
                response = client.post("/auth/authenticate", {"name": self.user, "password": self.password}, {},
                                       timeouts)
            except Unavailable as exc:
                raise Unavailable(exc, maybe_applied=False)  # the login, not the request
            if response.status_code != 200:
                error = _error_text(response)
                if response.status_code == 503:
                    raise Unavailable(error, maybe_applied=False)
                # Never the password: the error is the server's text.
                raise AuthError("etcd: cannot log in as %s: %s" % (self.user, error))
            self._token = response.json()["token"]
        return self._token

    # -- the requests the lock is made of -------------------------------------
    def txn(self, compare, success, failure):
        return self.post("/kv/txn", {"compare": compare, "success": success, "failure": failure})

    def get(self, name, serializable=False):
        """The KV of `name`, or None. serializable: as the member that answers
        has it, without asking the leader (it may be behind)."""
        request = {"key": b64(name)}
        if serializable:
            request["serializable"] = True
        kvs = self.post("/kv/range", request).get("kvs") or []
        return KV(kvs[0]) if kvs else None

    def grant_lease(self, seconds):
        return _lease_id(self.post("/lease/grant", {"TTL": seconds}))

    def grant_dated_lease(self, seconds):
        """(lease id, its TTL as granted, the Date header of the answer: the
        member's clock when it granted it, whole seconds)."""
        response = self.post("/lease/grant", {"TTL": seconds}, dated=True)
        try:
            answer, date = response.json(), answer_date(response)
        except ValueError as exc:
            raise BackendError("etcd: unreadable answer to a lease grant: %s" % exc)
        return _lease_id(answer), int(answer.get("TTL", seconds)), date

    def keepalive(self, lease):
        """Seconds the lease lasts from now; 0 when it expired or was revoked."""
        return int(self.post("/lease/keepalive", {"ID": lease}).get("result", {}).get("TTL", 0))

    def revoke(self, lease):
        """Revoke a lease we no longer need; if that fails it expires by itself."""
        try:
            self.post("/lease/revoke", {"ID": lease})
        except BackendError:
            pass

    def lease_ttl(self, lease):
        """Seconds left on a lease (etcd rounds to whole seconds); None when it is gone."""
        ttl = int(self.post("/lease/timetolive", {"ID": lease}).get("TTL", -1))
        return ttl if ttl >= 0 else None

    # -- the members, for describe() -------------------------------------------
    def answered(self, cluster=None):
        """The member that answered last (Backend.describe's member), or None."""
        return self._member(self._current, cluster) if self._answered else None

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

    def cluster(self):
        """The cluster as this node sees it: voting members in the member
        list, the members of the URL that answer and know a leader, and
        the leader."""
        seen, leaders = self._statuses()
        voting = self._read_member_list()
        for row in seen:  # names, now that the list was read
            name = self._member_names.get(int(row.get("id", "0"), 16))
            if name:
                row["name"] = name
        leader_id = "%x" % leaders.pop() if len(leaders) == 1 else None
        return {"members": voting, "healthy": len([r for r in seen if r.get("leader") and "error" not in r]),
                "leader_id": leader_id, "leader": self._member_names.get(int(leader_id, 16)) if leader_id else None,
                "endpoints": seen}

    def _statuses(self):
        """Each member's status (maintenance/status), all within one
        op_timeout: a row per member, and the leaders they name."""
        deadline = time.monotonic() + self.op_timeout
        clients = self._members()
        seen, leaders = [], set()
        for index, client in enumerate(clients):
            # An equal share of what is left each, as post() gives its tries.
            share = (deadline - time.monotonic()) / (len(clients) - index)
            try:
                if share <= 0:
                    raise Unavailable("no time left")
                status = self._post_to(client, "/maintenance/status", {}, (share, share), False)
            except Unavailable as exc:
                seen.append(dict(self._member(index), error=str(exc)))
                continue
            self._member_ids[index] = status.get("header", {}).get("member_id") or self._member_ids.get(index)
            errors = status.get("errors") or []
            leader = int(status.get("leader") or 0)  # 0 (left out of the JSON): no leader known
            if leader and not errors:
                leaders.add(leader)
            seen.append(dict(self._member(index), leader="%x" % leader if leader else None,
                             **({"error": "; ".join(errors)} if errors else {})))
        return seen, leaders

    def _read_member_list(self):
        """The number of voting members, None when no member answered; the
        members' names are kept for _member."""
        voting = None
        try:
            members = self.post("/cluster/member/list", {}).get("members") or []
        except BackendError:
            members = []  # no member answered: the statuses say why
        else:
            voting = len([m for m in members if not m.get("isLearner")])
        self._member_names.update((int(m["ID"]), m.get("name") or "") for m in members)
        return voting

    def close(self):
        clients, self._clients = self._clients, None
        for client in clients or ():
            client.close()


def _lease_id(answer):
    if answer.get("error"):
        raise BackendError("etcd: cannot grant a lease: %s" % answer["error"])
    return int(answer["ID"])


def answer_date(response):
    """The HTTP Date header of an answer (post's `dated`), in epoch seconds: the
    member's wall clock, whole seconds; the response is closed."""
    try:
        date = email.utils.parsedate(response.headers.get("Date", ""))
    finally:
        response.close()
    if date is None:
        raise BackendError("etcd: the answer had no Date header to read the server's clock from")
    return calendar.timegm(date)


def prefix_end(prefix):
    """The range_end that covers every key starting with prefix (etcd's clientv3.GetPrefixRangeEnd)."""
    data = bytearray(prefix.encode("utf-8"))
    data[-1] += 1  # prefixes here end in '/', never 0xff
    return bytes(data).decode("utf-8")


def json_lines(response):
    """The messages of a gateway stream: one JSON object per line."""
    pending = b""
    for chunk in response.chunks():
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
