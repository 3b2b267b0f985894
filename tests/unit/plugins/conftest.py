"""An in-memory lock backend for the module and action plugin unit tests.

It follows the engine's Backend contract (owner-checked renew and release,
growing fences, leases that expire by the backend's clock), with a clock the
test moves by hand. Real Redis and PostgreSQL are in tests/integration.
"""

from __future__ import annotations

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils import dlock_task
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import Backend, Grant, LockView


class FakeBackend(Backend):
    name = "fake"

    def __init__(self):
        self.now = 1000.0
        self.leases = {}
        self.fences = {}
        self.calls = []
        self.closed = False

    def _live(self, key):
        lease = self.leases.get(key)
        if lease is not None and lease["expires"] <= self.now:
            del self.leases[key]
            lease = None
        return lease

    def server_time(self):
        return self.now

    def acquire(self, key, owner, ttl, slot=None, pauses=()):
        self.calls.append(("acquire", key, owner))
        if self._live(key) is not None:
            return Grant("locked", holder=self.query(key))
        fence = self.fences[key] = self.fences.get(key, 0) + 1
        self.leases[key] = dict(owner=owner, fence=fence, acquired=self.now, expires=self.now + ttl)
        return Grant("granted", fence=fence)

    def renew(self, key, owner, ttl):
        self.calls.append(("renew", key, owner))
        lease = self._live(key)
        if lease is None or lease["owner"] != owner:
            return False
        lease["expires"] = self.now + ttl
        return True

    def release(self, key, owner, min_hold=0.0, last=None, slot=None):
        self.calls.append(("release", key, owner))
        lease = self._live(key)
        if lease is None or lease["owner"] != owner:
            return False
        del self.leases[key]
        return True

    def force_release(self, key):
        self.calls.append(("force_release", key))
        holder = self.query(key)
        self.leases.pop(key, None)
        return holder

    def query(self, key):
        lease = self._live(key)
        if lease is None:
            return LockView(key, fence=self.fences.get(key, 0), server_time=self.now)
        return LockView(key, owner=lease["owner"], fence=lease["fence"], acquired_at=lease["acquired"],
                        ttl_remaining=lease["expires"] - self.now, server_time=self.now)

    def join_queue(self, key, owner, ttl):
        self.calls.append(("join_queue", key, owner))

    def leave_queue(self, key, owner):
        self.calls.append(("leave_queue", key, owner))

    def hold_by(self, key, owner, ttl=30.0):
        """Another owner takes the key."""
        assert self.acquire(key, owner, ttl).granted

    def close(self):
        self.closed = True


@pytest.fixture
def fake_backend(monkeypatch):
    """The FakeBackend that dlock_task.open_backend returns; opened with these arguments."""
    backend = FakeBackend()
    backend.opened_with = []

    def open_backend(url, password=None, op_timeout=2.0, ca_file=None, fence_epoch=0):
        backend.opened_with.append(dict(url=url, password=password, op_timeout=op_timeout, ca_file=ca_file,
                                        fence_epoch=fence_epoch))
        return backend

    monkeypatch.setattr(dlock_task, "open_backend", open_backend)
    return backend
