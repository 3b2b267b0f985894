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

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.boottime import now
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.deadline import LeaseDeadline
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


class FailingRenew(object):
    """A backend whose renew fails, after HANG seconds, every time; it
    records when each call began, and sets `enough` at the third."""
    lease_survives_reconnect = True

    def __init__(self, hang):
        self.hang, self.began, self.enough = hang, [], threading.Event()

    def renew(self, key, owner, ttl):
        self.began.append(now())
        if len(self.began) >= 3:
            self.enough.set()
        threading.Event().wait(self.hang)
        raise ConnectionError("refused")

    def reset(self):
        pass


def _tries(hang, op_timeout):
    """When the first three renewals of a failing backend began, relative to
    the first, and the heartbeat's last error: renew_every 2s, so
    retry_every 1s. A try's time is taken in its worker thread, which may
    start late on a loaded host: the tests allow half a retry_every of that."""
    backend = FailingRenew(hang)
    options = SimpleNamespace(ttl=30.0, renew_every=2.0, op_timeout=op_timeout)
    wake_r, wake_w = os.pipe()
    heartbeat = Heartbeat(backend, "k", "owner", options, LeaseDeadline(30.0, 1.0, 1.0, now()), wake_w)
    heartbeat.start()
    try:
        assert backend.enough.wait(20)
    finally:
        heartbeat.stop()
        heartbeat.wait_done(5)
        os.close(wake_r)
        os.close(wake_w)
    assert heartbeat.lost is None  # this backend's lease outlives a failed try: each failure is retried
    return [began - backend.began[0] for began in backend.began[:3]], heartbeat.last_error


def test_a_refusal_that_comes_at_once_is_retried_after_retry_every():
    tries, error = _tries(hang=0.0, op_timeout=5.0)
    assert tries[1] - tries[0] > 0.5 and tries[2] - tries[1] > 0.5  # 1s each; a busy loop: none
    assert error == "refused"


def test_a_try_that_hung_for_op_timeout_is_followed_at_once():
    """The hung try spent op_timeout (1.2s, more than retry_every) of the
    lease: the next begins when it is given up (1.2s after it began), not
    retry_every after that (2.2s)."""
    tries, error = _tries(hang=3.0, op_timeout=1.2)
    assert 0.7 < tries[1] - tries[0] < 1.7 and 0.7 < tries[2] - tries[1] < 1.7
    assert error == "renew got no answer within op_timeout (1.200s)"
