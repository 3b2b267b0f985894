"""The heartbeat thread and the descriptor it wakes the runner through.

A renew can be in flight when the job ends: the runner stops the heartbeat
and closes the pipe. What the late renew finds must then be dropped, not
written to a closed descriptor (or to a file that reused its number) and not
reported as the finished run's result. The backend here is a stand-in only
because the interleaving must be forced; the real backends are exercised in
tests/integration.
"""

import os
import threading
from types import SimpleNamespace

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.deadline import LeaseDeadline, now
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.heartbeat import Heartbeat


class HeldRenew(object):
    """A backend whose renew blocks until released, then says the lease is gone."""
    lease_survives_reconnect = True

    def __init__(self):
        self.called, self.release = threading.Event(), threading.Event()

    def renew(self, key, owner, ttl):
        self.called.set()
        self.release.wait(10)
        return False

    def reset(self):
        pass


def start(backend, wake_w):
    options = SimpleNamespace(ttl=30.0, renew_every=0.01, op_timeout=10.0)
    heartbeat = Heartbeat(backend, "k", "owner", options, LeaseDeadline(30.0, 1.0, 1.0, now()), wake_w)
    heartbeat.start()
    return heartbeat


def test_a_renew_that_answers_after_stop_writes_nothing_and_reports_nothing(monkeypatch):
    errors = []
    monkeypatch.setattr(threading, "excepthook", errors.append)
    backend = HeldRenew()
    wake_r, wake_w = os.pipe()
    heartbeat = start(backend, wake_w)
    assert backend.called.wait(10)
    heartbeat.stop()
    os.close(wake_r)
    os.close(wake_w)
    # The number the pipe had now names another file: a late write would land in it.
    reused_r, reused_w = os.pipe()
    try:
        backend.release.set()
        heartbeat.join(10)
        assert not heartbeat.is_alive()
        assert errors == [] and heartbeat.lost is None
        os.set_blocking(reused_r, False)
        assert _empty(reused_r)  # nothing written into the file that took the number
    finally:
        os.close(reused_r)
        os.close(reused_w)


def test_a_lost_lease_before_stop_wakes_the_runner():
    backend = HeldRenew()
    backend.release.set()
    wake_r, wake_w = os.pipe()
    try:
        heartbeat = start(backend, wake_w)
        assert os.read(wake_r, 1) == b"x"
        heartbeat.join(10)
        assert heartbeat.lost == "the lease is no longer ours (expired or broken)"
    finally:
        os.close(wake_r)
        os.close(wake_w)


def _empty(fd):
    try:
        return os.read(fd, 1) == b""
    except BlockingIOError:
        return True
