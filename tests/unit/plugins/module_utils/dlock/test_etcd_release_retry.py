"""An etcd release that one member may have applied without answering.

The gateway sends a call to the next member when one gives no answer. For a
write that is not neutral: the first member may have applied the release
(a read timeout, a connection broken after the request was sent), and the
next then finds the lock changed, by our own release. The release must say
so (uncertain), not that the lease was no longer ours. A member that was
never reached (refused) applied nothing: the next member's answer stands.

The members are stand-ins for etcd_http.Member sharing one store: enough of
/kv/range, /kv/txn and /lease/revoke for a release. What a real socket's
failure says (maybe_applied) is test_etcd_http.py's.
"""

import base64
import json

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.etcd_http import Unavailable
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.etcd_lease import EtcdBackend
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import OutcomeUnknown

OWNER = "node-1:1234:abcd"


def b64(text):
    return base64.b64encode(text.encode()).decode()


class Store(object):
    """The cluster's state: one lock key, at a mod revision."""

    def __init__(self, lock_name):
        self.lock = b64(lock_name)
        self.value = json.dumps({"owner": OWNER, "acquired_at": 0})
        self.revision = 5
        self.present = True

    def answer(self, path, payload):
        if path == "/kv/range":
            kvs = [{"key": self.lock, "value": b64(self.value), "mod_revision": str(self.revision), "lease": "7"}]
            return {"kvs": kvs if payload["key"] == self.lock and self.present else []}
        if path == "/kv/txn":
            holds = all(c["key"] != self.lock or (self.present and int(c["mod_revision"]) == self.revision)
                        for c in payload["compare"])
            if holds:
                for op in payload["success"]:
                    if op.get("request_delete_range", {}).get("key") == self.lock:
                        self.present = False
            return {"succeeded": holds}
        return {}


class Answer(object):
    status_code = 200

    def __init__(self, body):
        self.body = body

    def json(self):
        return self.body


class Member(object):
    """One member. `fails`: None (answers), "lost" (applies a txn, then the
    answer times out) or "refused" (no connection: nothing applied)."""

    def __init__(self, store, number, fails=None):
        self.store, self.host, self.port, self.fails = store, "10.0.0.%d" % number, 2379, fails

    def post(self, path, payload, _headers, _timeouts, stream=False):
        assert not stream
        if self.fails == "refused":
            raise Unavailable("ConnectionRefusedError: [Errno 111] Connection refused", maybe_applied=False)
        body = self.store.answer(path, payload)
        if self.fails == "lost" and path == "/kv/txn":
            raise Unavailable("timed out")
        return Answer(body)

    def close(self):
        """Nothing to close."""


def backend(first_fails, changed_by_another=False):
    """An etcd backend on two stand-in members, the first failing as told."""
    etcd = EtcdBackend("etcd://10.0.0.1:2379,10.0.0.2:2379/dlock")
    store = Store(etcd.names.lock("job"))
    etcd.gateway._clients = [Member(store, 1, first_fails), Member(store, 2)]  # pylint: disable=protected-access
    if changed_by_another:
        original = store.answer

        def answer(path, payload):
            if path == "/kv/txn":
                store.revision += 1  # another writer moved the lock before our transaction
            return original(path, payload)
        store.answer = answer
    return etcd, store


def test_a_release_applied_by_a_member_that_gave_no_answer_is_uncertain():
    etcd, store = backend("lost")
    with pytest.raises(OutcomeUnknown, match="may have applied it"):
        etcd.release("job", OWNER, 0.0, {"result": "success"})
    assert not store.present  # it was released, by the first member


def test_a_member_never_reached_applied_nothing_and_the_next_answer_stands():
    etcd, store = backend("refused")
    assert etcd.release("job", OWNER, 0.0, {"result": "success"}) is True
    assert not store.present


def test_a_lock_changed_by_another_after_a_refused_member_is_not_ours():
    etcd, _store = backend("refused", changed_by_another=True)
    assert etcd.release("job", OWNER, 0.0, {"result": "success"}) is False


def test_a_lost_answer_is_uncertain_even_when_the_lock_had_changed_otherwise():
    """What cannot be told apart is not guessed: uncertain."""
    etcd, _store = backend("lost", changed_by_another=True)
    with pytest.raises(OutcomeUnknown):
        etcd.release("job", OWNER, 0.0, {"result": "success"})
