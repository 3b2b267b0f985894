import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import Backend, Grant, LockView
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.child import exit_status
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import BackendError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.deadline import LeaseDeadline
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.slots import marker_ttl, run_id, slot_lead, slot_number
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.waiting import EXPIRY_SLACK, wake_after
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.waiting import acquire as waiting_acquire


def test_deadline_kills_strictly_before_expiry():
    d = LeaseDeadline(ttl=30, margin=0.6, kill_grace=5, sent_at=100.0)
    assert d.expires_at == 130.0
    assert d.kill_by == pytest.approx(129.4)
    assert d.terminate_at == pytest.approx(124.4)
    assert d.terminate_at < d.kill_by < d.expires_at


def test_deadline_moves_only_forward():
    d = LeaseDeadline(ttl=30, margin=0.6, kill_grace=5, sent_at=100.0)
    d.renewed(110.0)
    assert d.expires_at == 140.0
    d.renewed(105.0)  # a late answer to an older request
    assert d.expires_at == 140.0


@pytest.mark.parametrize("now,lead,number", [
    (3600.0, 0.0, 1), (3600 + 3599.9, 0.0, 1), (7200.0, 0.0, 2), (3599.9, 0.0, 0),
    (3600 - 2.0, 2.0, 1), (3600 - 2.1, 2.0, 0), (7200 - 2.1, 2.0, 1), (7200 - 2.0, 2.0, 2),
])
def test_a_slot_opens_its_lead_before_its_boundary(now, lead, number):
    assert slot_number(now, 3600, lead) == number


@pytest.mark.parametrize("width,skew,lead", [(60, 2.0, 2.0), (3, 2.0, 1.5), (1, 0.0, 0.0)])
def test_the_lead_is_the_skew_allowed_at_most_half_a_slot(width, skew, lead):
    assert slot_lead(width, skew) == lead


def test_a_runner_late_by_more_than_half_a_slot_still_claims_its_own():
    # The window centred on the boundary gave a runner 2.5 s of a 5 s slot,
    # then claimed the next slot for it (measured on the 20-node lab).
    assert slot_number(1000.0 + 4.0, 5.0, slot_lead(5.0, 0.5)) == 200


def test_slot_marker_outlives_the_window_and_run_id_is_stable():
    assert marker_ttl(60) >= 60
    assert run_id("report", 29_000_000, 60, fence=7) == "report@2025-02-19T21:20:00Z"
    assert run_id("report", 29_000_000, 60, fence=8) == run_id("report", 29_000_000, 60, fence=7)
    assert run_id("report", None, None, fence=8) == "report#8"


def test_exit_status_uses_shell_convention():
    assert exit_status(0) == 0 and exit_status(3) == 3
    assert exit_status(-15) == 143 and exit_status(-9) == 137


def test_a_waiter_wakes_by_the_first_of_its_reasons():
    held = Grant("locked", holder=LockView("k", owner="other", ttl_remaining=0.25))
    assert wake_after(held, remaining=30.0, refresh_in=1.0) == pytest.approx(0.25 + EXPIRY_SLACK)  # the lease's end
    assert wake_after(held, remaining=0.1, refresh_in=1.0) == pytest.approx(0.1)  # the end of the wait
    session = Grant("locked", holder=LockView("k", owner="other", ttl_remaining=None))  # no expiry to wait for
    assert wake_after(session, remaining=30.0, refresh_in=0.7) == pytest.approx(0.7)  # the ticket's renewal
    queued = Grant("locked", holder=LockView("k", queued=3))  # free, others first: no lease to wait for
    assert wake_after(queued, remaining=30.0, refresh_in=1.0) == pytest.approx(1.0)
    assert wake_after(held, remaining=-1.0, refresh_in=1.0) == 0.0


class _LineBackend(Backend):
    """Held by another owner for ever; its line cannot be left (the backend is gone by then)."""

    def __init__(self):
        self.calls = []

    def acquire(self, key, owner, ttl, slot=None, pauses=()):
        self.calls.append("acquire")
        return Grant("locked", holder=LockView(key, owner="other", ttl_remaining=60.0))

    def join_queue(self, key, owner, ttl):
        self.calls.append("join")

    def leave_queue(self, key, owner):
        self.calls.append("leave")
        raise BackendError("gone")

    def wait_change(self, key, timeout):
        self.calls.append("wait")
        self.now += timeout


def test_waiting_gives_up_its_place_and_a_failure_to_leave_is_not_an_error():
    backend = _LineBackend()
    backend.now = 0.0
    grant, attempts, _sent = waiting_acquire(backend, "k", "me", 10.0, None, 2.5, clock=lambda: backend.now)
    assert grant.status == "locked" and grant.holder.owner == "other"
    assert backend.calls[:4] == ["acquire", "join", "acquire", "wait"]
    assert backend.calls.count("join") == 3  # at 0, 1 and 2 seconds: the ticket is renewed
    assert backend.calls[-1] == "leave" and attempts == 4


def test_one_try_and_no_ticket_without_wait():
    backend = _LineBackend()
    backend.now = 0.0
    grant, attempts, _sent = waiting_acquire(backend, "k", "me", 10.0, None, 0.0, clock=lambda: backend.now)
    assert grant.status == "locked" and attempts == 1 and backend.calls == ["acquire"]


class _SpareLeaseBackend(_LineBackend):
    """Held on the first `refusals` tries, then granted on a lease that had
    been counting `age` seconds when the try began (an etcd waiter's spare)."""

    def __init__(self, refusals, age):
        _LineBackend.__init__(self)
        self.refusals, self.age = refusals, age

    def acquire(self, key, owner, ttl, slot=None, pauses=()):
        self.calls.append("acquire")
        self.now += 0.01  # the request's round trip
        if self.calls.count("acquire") <= self.refusals:
            return Grant("locked", holder=LockView(key, owner="other", ttl_remaining=60.0))
        return Grant("granted", fence=7, lease_age=self.age)

    def leave_queue(self, key, owner):
        self.calls.append("leave")


@pytest.mark.parametrize("refusals", [0, 2])  # granted at once, and after waiting in line
def test_a_lease_taken_ahead_moves_the_deadline_back_by_its_age(refusals):
    """The deadline counts from the send time of the request that last set
    the lease's expiry: a grant whose lease was counting `lease_age` before
    the try began is that much earlier than the try's own send time."""
    backend = _SpareLeaseBackend(refusals, age=0.75)
    backend.now = 100.0
    grant, attempts, sent = waiting_acquire(backend, "k", "me", 10.0, None, 30.0, clock=lambda: backend.now)
    assert grant.granted and attempts == refusals + 1
    asked = backend.now - 0.01  # the granting try was sent one round trip ago
    assert sent == pytest.approx(asked - 0.75)
    assert LeaseDeadline(10.0, 0.5, 0.5, sent).kill_by == pytest.approx(asked - 0.75 + 10.0 - 0.5)
