"""The once-per slot is decided at grant time on the backend's clock.

A runner estimates its slot from its own clock, then asks for the grant. If
it is delayed in between (stopped, paused, a slow network) past the slot's
window, its estimate names a slot whose marker may have expired: claiming it
would run that slot twice. The backend decides the slot instead (Redis: TIME
in the grant script; PostgreSQL: clock_timestamp() in the claim statement;
etcd: the Date header of the transaction's own answer; file: the host's
clock), so a delayed grant claims the backend's current slot.
"""

import time

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import Slot, open_backend
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.file_lock import FileBackend
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.slots import marker_ttl, slot_number
from runner_proc import wait_for

WIDTH = 2.0  # markers live 3s
LONG = 30 * 86400.0  # the longest once_per: its windows' edges are far from any test's grant


@pytest.fixture(params=["redis", "postgresql", "postgresql+advisory", "etcd", "file"])
def two_clients(request, tmp_path):
    if request.param == "file":
        url = "file://%s" % tmp_path
    elif request.param == "redis":
        url = request.getfixturevalue("redis_server").url
    elif request.param == "etcd":
        url = request.getfixturevalue("etcd_server").url
    else:
        url = request.getfixturevalue("pg_server").url(scheme=request.param)
    a, b = open_backend(url), open_backend(url)
    yield a, b
    a.close()
    b.close()


def _slot(backend):
    return slot_number(backend.server_time(), WIDTH)


def test_a_delayed_grant_claims_the_backends_slot_not_its_stale_estimate(two_clients, unique_key):
    a, b = two_clients
    first = Slot(_slot(a), marker_ttl(WIDTH), WIDTH)
    assert a.acquire(unique_key, "owner-a", 5, first).granted
    claimed = first.number
    assert a.release(unique_key, "owner-a")
    # B estimated the same slot as A, then was delayed until A's marker had
    # expired (claimed at the window's start at the earliest, it lives 1.5
    # windows; etcd rounds leases up to whole seconds and reaps them late).
    stale = Slot(claimed, marker_ttl(WIDTH), WIDTH)
    wait_for(lambda: _slot(b) >= claimed + 4, 20, "the slot's marker to expire")
    before = _slot(b)
    grant = b.acquire(unique_key, "owner-b", 5, stale)
    after = _slot(b)
    assert grant.granted
    assert stale.number != claimed and before <= stale.number <= after
    assert b.release(unique_key, "owner-b")
    # The hazard was real: a grant that took the caller's number as given
    # (no width, as before) claims the expired slot a second time.
    assert b.acquire(unique_key, "owner-c", 5, Slot(claimed, marker_ttl(WIDTH))).granted


def test_a_grant_refused_as_locked_claims_no_slot(two_clients, unique_key):
    a, b = two_clients
    assert a.acquire(unique_key, "owner-a", 5).granted  # no once_per
    slot = Slot(slot_number(b.server_time(), LONG), marker_ttl(LONG), LONG)
    assert b.acquire(unique_key, "owner-b", 5, slot).status == "locked"
    assert a.release(unique_key, "owner-a")
    assert b.acquire(unique_key, "owner-b", 5, Slot(slot.number, marker_ttl(LONG), LONG)).granted


def test_an_estimate_from_an_earlier_slot_is_still_a_duplicate_of_the_current_one(two_clients, unique_key):
    a, b = two_clients
    first = Slot(_slot(a), marker_ttl(WIDTH), WIDTH)
    assert a.acquire(unique_key, "owner-a", 5, first).granted
    assert a.release(unique_key, "owner-a")
    late = Slot(first.number - 1, marker_ttl(WIDTH), WIDTH)
    grant = b.acquire(unique_key, "owner-b", 5, late)
    if late.number != first.number:
        pytest.skip("a window edge passed between the two grants")
    assert grant.status == "duplicate"
    if not isinstance(b, FileBackend):  # the file's state keeps no owner of a released run
        assert grant.holder.owner == "owner-a"


def test_a_slot_window_opens_its_lead_before_the_boundary(two_clients, unique_key):
    """slots.py's rule in each backend's own grant step: slot N is open from
    N*W - lead, so the same moment is in the next slot with a lead that
    reaches back over it and in this one with a lead that does not."""
    a, b = two_clients
    now = a.server_time()
    number = slot_number(now, LONG)
    to_boundary = (number + 1) * LONG - now
    if not 300 < to_boundary < LONG - 300:
        pytest.skip("within 5 minutes of a 30-day boundary")
    still_open = Slot(number, marker_ttl(LONG), LONG, lead=to_boundary - 120)  # the next opens in 2 min
    assert a.acquire(unique_key, "owner-a", 5, still_open).granted
    assert still_open.number == number
    assert a.release(unique_key, "owner-a")
    next_open = Slot(number, marker_ttl(LONG), LONG, lead=to_boundary + 120)  # the next opened 2 min ago
    assert b.acquire(unique_key, "owner-b", 5, next_open).granted
    assert next_open.number == number + 1
    assert b.release(unique_key, "owner-b")


SLOW_REQUEST = 0.35  # each request to etcd this much late: a full try (4-5 requests) takes about 1.6s


def test_on_a_slow_etcd_a_grant_asks_for_the_slot_open_when_its_answer_comes(etcd_server, unique_key, monkeypatch):
    """A slow leader (issue 24): every request SLOW_REQUEST late, so a try
    takes most of a 2s slot. Each grant starts from an estimate of the slot
    before, so its first try always answers outside its window and asks
    again. Asking for the slot open at that answer's Date would be over by
    the next answer, again and again (SLOT_TRIES, then 'the slot kept
    moving'); asking for the slot open when the next answer will come (the
    Date plus as long as the try took) lands: every grant succeeds, in the
    slot its answer came in."""
    backend = open_backend(etcd_server.url)
    gateway_post = backend.gateway.post

    def slow_post(*args, **kwargs):
        time.sleep(SLOW_REQUEST)  # the request's way to a slow leader
        return gateway_post(*args, **kwargs)
    try:
        for number in range(3):
            key = "%s-%d" % (unique_key, number)
            monkeypatch.setattr(backend.gateway, "post", slow_post)
            slot = Slot(_slot(backend) - 1, marker_ttl(WIDTH), WIDTH)
            grant = backend.acquire(key, "owner", 5, slot)
            monkeypatch.undo()
            now = _slot(backend)
            assert grant.granted, grant
            # The slot open when its answer came: this one, or the one before
            # if an edge passed since.
            assert now - 1 <= slot.number <= now, (slot, now)
            assert backend.release(key, "owner")
    finally:
        backend.close()
