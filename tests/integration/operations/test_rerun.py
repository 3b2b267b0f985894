"""Re-running a failed once-per slot (`dlock run --rerun`), at the backends.

The slot's marker records its run's outcome at the release (slots.py); a
rerun is granted inside the backend's atomic grant step, on its clock, only
for a slot whose marker lives and does not record a success, not in the
future, while the lock is free (base.rerun_refusal). Every backend variant,
against real servers on loopback.
"""

import threading
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import Slot, open_backend
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.slots import marker_ttl, slot_number
from runner_proc import wait_for
from servers import url_of

WIDTH = 30.0  # markers live 45s: long past any test below that does not wait for their expiry
SHORT = 1.0  # for the expiry test: markers live 1.5s (etcd: 2s, reaped up to a second late)
BACKENDS = ["redis", "postgresql", "postgresql+advisory", "etcd", "file"]


@pytest.fixture(params=BACKENDS)
def clients(request, tmp_path):
    """Three clients of one backend (three runners): a, b, c."""
    url = url_of(request, request.param, tmp_path)
    opened = [open_backend(url) for _client in range(3)]
    yield opened
    for backend in opened:
        backend.close()


def claim(backend, key, owner, width=WIDTH):
    """The first run of the backend's current slot: granted; (slot number, fence)."""
    slot = Slot(slot_number(backend.server_time(), width), marker_ttl(width), width)
    grant = backend.acquire(key, owner, 10, slot)
    assert grant.granted, grant.status
    return slot.number, grant.fence


def rerun(backend, key, owner, number, width=WIDTH):
    return backend.acquire(key, owner, 10, Slot(number, marker_ttl(width), width, rerun=True))


def finish(backend, key, owner, number, result, width=WIDTH):
    """The owner-checked release of a run of slot `number` that ended with `result`."""
    assert backend.release(key, owner, last={"result": result, "owner": owner},
                           slot=Slot(number, marker_ttl(width), width))


def test_a_failed_slot_is_rerun_once_with_a_higher_fence(clients, unique_key):
    a, b, c = clients
    number, first = claim(a, unique_key, "owner-a")
    finish(a, unique_key, "owner-a", number, "failed")
    again = rerun(b, unique_key, "owner-b", number)
    assert again.granted and again.fence > first
    finish(b, unique_key, "owner-b", number, "success")
    # The rerun succeeded: the slot is done, for a rerun and for its own runs alike.
    refused = rerun(c, unique_key, "owner-c", number)
    assert refused.status == "duplicate" and refused.holder.owner == "owner-b"
    assert c.acquire(unique_key, "owner-c", 10, Slot(number, marker_ttl(WIDTH), WIDTH)).status == "duplicate"


def test_a_succeeded_slot_is_refused(clients, unique_key):
    a, b, _c = clients
    number, _fence = claim(a, unique_key, "owner-a")
    finish(a, unique_key, "owner-a", number, "success")
    refused = rerun(b, unique_key, "owner-b", number)
    # The duplicate's holder is the owner, whatever outcome its marker records.
    assert refused.status == "duplicate" and refused.holder.owner == "owner-a"
    assert not b.query(unique_key).owner


def test_a_slot_that_never_ran_is_refused(clients, unique_key):
    a, _b, _c = clients
    number = slot_number(a.server_time(), WIDTH)
    assert rerun(a, unique_key, "owner-a", number - 1).status == "unknown"
    assert a.query(unique_key).owner is None


def test_a_slot_whose_marker_expired_is_refused(clients, unique_key):
    a, b, _c = clients
    number, _fence = claim(a, unique_key, "owner-a", SHORT)
    finish(a, unique_key, "owner-a", number, "failed", SHORT)
    # Markers live 1.5 slots from the claim (etcd: whole seconds, reaped late).
    wait_for(lambda: slot_number(b.server_time(), SHORT) >= number + 4, 20, "the slot's marker to expire")
    assert rerun(b, unique_key, "owner-b", number, SHORT).status == "unknown"


def test_a_future_slot_is_refused_even_with_a_marker(clients, unique_key):
    a, b, _c = clients
    ahead = slot_number(a.server_time(), WIDTH) + 2
    # A marker on a slot ahead (a grant without a width takes its number as
    # given): the rerun is refused by the backend's clock, not for the marker.
    assert a.acquire(unique_key, "owner-a", 10, Slot(ahead, marker_ttl(WIDTH))).granted
    finish(a, unique_key, "owner-a", ahead, "failed")
    assert rerun(b, unique_key, "owner-b", ahead).status == "future"
    assert rerun(b, unique_key, "owner-b", ahead + 1000).status == "future"


def test_two_reruns_of_one_slot_one_holds_the_other_is_locked(clients, unique_key):
    a, b, c = clients
    number, _fence = claim(a, unique_key, "owner-a")
    finish(a, unique_key, "owner-a", number, "failed")
    assert rerun(b, unique_key, "owner-b", number).granted
    refused = rerun(c, unique_key, "owner-c", number)
    assert refused.status == "locked" and refused.holder.owner == "owner-b"
    # The refused rerun took nothing: the marker still names b, whose success it records.
    finish(b, unique_key, "owner-b", number, "success")
    assert rerun(c, unique_key, "owner-c", number).status == "duplicate"


def test_two_reruns_sent_together_exactly_one_is_granted(clients, unique_key):
    a, b, c = clients
    number, _fence = claim(a, unique_key, "owner-a")
    finish(a, unique_key, "owner-a", number, "failed")
    start, answers = threading.Barrier(2), {}

    def try_rerun(backend, owner):
        start.wait()
        answers[owner] = rerun(backend, unique_key, owner, number).status
    threads = [threading.Thread(target=try_rerun, args=pair) for pair in ((b, "owner-b"), (c, "owner-c"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(answers.values()) == ["granted", "locked"], answers


def test_a_rerun_that_fails_can_be_rerun_again(clients, unique_key):
    a, b, c = clients
    number, first = claim(a, unique_key, "owner-a")
    finish(a, unique_key, "owner-a", number, "failed")
    second = rerun(b, unique_key, "owner-b", number)
    assert second.granted
    finish(b, unique_key, "owner-b", number, "lock_lost")
    third = rerun(c, unique_key, "owner-c", number)
    assert third.granted and first < second.fence < third.fence


def test_the_slot_of_a_runner_that_died_can_be_rerun(clients, unique_key):
    """Its marker is the bare owner token (no release recorded an outcome),
    its lease gone: the slot did not succeed."""
    a, b, _c = clients
    slot = Slot(slot_number(a.server_time(), WIDTH), marker_ttl(WIDTH), WIDTH)
    assert a.acquire(unique_key, "owner-a", 2, slot).granted
    if a.lease_survives_reconnect:  # a lease on the server: it ends at its ttl
        wait_for(lambda: b.query(unique_key).owner is None, 20, "the dead runner's lease to expire")
    else:  # a session lock or a flock: it goes with the process's connection or descriptor
        a.close()
    assert b.query(unique_key).owner is None
    assert rerun(b, unique_key, "owner-b", slot.number).granted


def test_a_release_without_an_outcome_leaves_the_slot_rerunnable(clients, unique_key):
    """The marker records a success only from a release that says so: a
    release without the run's record (the module, a tool) keeps it bare."""
    a, b, _c = clients
    number, _fence = claim(a, unique_key, "owner-a")
    assert a.release(unique_key, "owner-a")
    assert rerun(b, unique_key, "owner-b", number).granted


# Each step: the outcome of a rerun, if granted, or None: a rerun tried while
# another one holds the slot.
OUTCOMES = st.lists(st.sampled_from(["success", "failed", "lock_lost", None]), min_size=1, max_size=6)


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.sampled_from(["success", "failed"]), steps=OUTCOMES)
def test_reruns_never_overlap_and_a_success_is_final(clients, first, steps):
    """Over any sequence of outcomes: a rerun is granted exactly while no run
    of the slot has succeeded, never beside another holder, with a fence
    above every earlier one."""
    a, b, c = clients
    key = "rerun-%s" % uuid.uuid4().hex[:12]
    number, fence = claim(a, key, "owner-0")
    finish(a, key, "owner-0", number, first)
    done = first == "success"
    for index, outcome in enumerate(steps, 1):
        owner = "owner-%d" % index
        grant = rerun(b, key, owner, number)
        if done:
            assert grant.status == "duplicate"
            continue
        assert grant.granted and grant.fence > fence
        fence = grant.fence
        # Never two holders: a rerun beside it is refused.
        assert rerun(c, key, owner + "-beside", number).status == "locked"
        if outcome is None:
            # This holder dies (its lease is cut as an expiry would): the slot stays rerunnable.
            if b.lease_survives_reconnect:
                b.force_release(key)
            else:
                b.close()
            continue
        finish(b, key, owner, number, outcome)
        done = outcome == "success"


def test_a_failed_slot_can_be_rerun_after_the_next_slot_ran(clients, unique_key):
    """Each slot keeps its own marker while it lives: the next slot's run
    does not take the failed one's away."""
    a, b, _c = clients
    now = slot_number(a.server_time(), WIDTH)
    earlier = Slot(now - 1, marker_ttl(WIDTH))  # claimed as given: the slot before the current one
    assert a.acquire(unique_key, "owner-a", 10, earlier).granted
    finish(a, unique_key, "owner-a", earlier.number, "failed")
    number, _fence = claim(a, unique_key, "owner-b")
    finish(a, unique_key, "owner-b", number, "success")
    assert rerun(b, unique_key, "owner-c", earlier.number).granted
    finish(b, unique_key, "owner-c", earlier.number, "success")
    assert rerun(b, unique_key, "owner-d", earlier.number).status == "duplicate"
    assert rerun(b, unique_key, "owner-d", number).status == "duplicate"
