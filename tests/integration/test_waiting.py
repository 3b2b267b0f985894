"""Fair, notified waiting (waiting.py) against real servers: tickets in
arrival order, each with its own expiry, a wake-up on release, and no grant
from a wake-up alone. Every shared backend with a line: Redis, PostgreSQL
(lease table and advisory lock) and etcd."""

import collections
import threading
import time

import pytest

import servers
from ansible_collections.dlock.fleet.plugins.module_utils.dlock import waiting
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import open_backend, pg_common
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.options import LockOptions
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.runner import acquire as runner_acquire

# etcd lengthens leases below its minimum (1.5 election timeouts, ~2s): a
# ticket there lives at least that long.
SHORT_TICKET = {"etcd": 2.0}


@pytest.fixture
def backends(backend_url):
    opened = []

    def make():
        backend = open_backend(backend_url)
        opened.append(backend)
        return backend
    yield make
    for backend in opened:
        backend.close()


def scheme(url):
    return url.split("://")[0]


def test_the_lock_goes_to_the_tickets_in_arrival_order(backend_url, backends, unique_key):
    holder, a, b, c, late = (backends() for _n in range(5))
    assert holder.acquire(unique_key, "holder", 30).granted
    for backend, owner in ((a, "a"), (b, "b"), (c, "c")):
        backend.join_queue(unique_key, owner, 10)
    assert holder.release(unique_key, "holder")
    # Free, but a came first: neither b, c nor a caller without a ticket gets it.
    assert c.acquire(unique_key, "c", 30).status == "locked"
    assert b.acquire(unique_key, "b", 30).status == "locked"
    refused = late.acquire(unique_key, "late", 30)
    assert refused.status == "locked" and refused.holder.owner is None and refused.holder.queued >= 1
    served = []
    for backend, owner in ((a, "a"), (b, "b"), (c, "c")):
        grant = backend.acquire(unique_key, owner, 30)
        assert grant.granted, "%s is first in line and the lock is free" % owner
        backend.leave_queue(unique_key, owner)
        served.append((owner, grant.fence))
        assert backend.release(unique_key, owner)
    assert [owner for owner, _fence in served] == ["a", "b", "c"]
    assert served[0][1] < served[1][1] < served[2][1]
    assert late.acquire(unique_key, "late", 30).granted  # the line is empty again


def test_a_dead_waiters_ticket_expires_and_the_line_moves_on(backend_url, backends, unique_key):
    ticket = SHORT_TICKET.get(scheme(backend_url), 1.0)
    dead, alive = backends(), backends()
    dead.join_queue(unique_key, "dead", ticket)  # and never renewed: its waiter died
    alive.join_queue(unique_key, "alive", 30)
    joined = time.monotonic()
    assert alive.acquire(unique_key, "alive", 30).status == "locked"  # dead is first, for now
    deadline = joined + ticket + 5.0
    while True:
        grant = alive.acquire(unique_key, "alive", 30)
        if grant.granted or time.monotonic() > deadline:
            break
        alive.wait_change(unique_key, 0.05)
    assert grant.granted, "the dead waiter's ticket still blocks the line"
    assert time.monotonic() - joined >= ticket - 0.2  # it did hold the line until its expiry


def waiting_thread(backend, key):
    """backend.wait_change(key, 60) in a thread, far longer than any test:
    only a wake-up ends it early. Returns the thread and the list that gets
    the moment it woke; checks it is still waiting half a second later."""
    woke = []

    def wait():
        backend.wait_change(key, 60)
        woke.append(time.monotonic())
    thread = threading.Thread(target=wait)
    thread.start()
    thread.join(0.5)
    assert not woke, "the wait ended with the lock still held"
    return thread, woke


def test_a_release_wakes_the_first_waiter(backend_url, backends, unique_key):
    holder, waiter = backends(), backends()
    assert holder.acquire(unique_key, "holder", 60).granted
    waiter.join_queue(unique_key, "waiter", 60)
    assert waiter.acquire(unique_key, "waiter", 60).status == "locked"
    thread, woke = waiting_thread(waiter, unique_key)
    released = time.monotonic()
    assert holder.release(unique_key, "holder")
    thread.join(30)
    assert woke, "the waiter was not woken by the release"
    assert woke[0] - released < 5.0
    assert waiter.acquire(unique_key, "waiter", 60).granted


def _nudge(url, key, owner, backend):
    """A wake-up for `owner` that is no release: what each backend's waiter listens for."""
    kind = scheme(url)
    if kind == "redis":
        backend.client.call("PUBLISH", "dlock:{%s}:wake" % key, owner)
    elif kind.startswith("postgresql"):
        backend.conn.execute("SELECT pg_notify('dlock', %s)", ("%s %s" % (key, owner),))
    else:  # etcd: the waiter watches the ticket before its own; that one leaves the line
        backend.leave_queue(key, "ahead")


def test_a_wake_up_alone_grants_nothing(backend_url, backends, unique_key):
    holder, waiter, other = backends(), backends(), backends()
    assert holder.acquire(unique_key, "holder", 60).granted
    other.join_queue(unique_key, "ahead", 60)
    waiter.join_queue(unique_key, "waiter", 60)
    assert waiter.acquire(unique_key, "waiter", 60).status == "locked"
    thread, woke = waiting_thread(waiter, unique_key)
    _nudge(backend_url, unique_key, "waiter", other)
    thread.join(30)
    assert woke, "the nudge did not wake the waiter"
    refused = waiter.acquire(unique_key, "waiter", 60)
    assert refused.status == "locked" and refused.holder.owner == "holder"
    # The whole waiting loop, nudged all along, still grants nothing while the lock is held.
    stop = threading.Event()

    def keep_nudging():
        while not stop.wait(0.1):
            if scheme(backend_url) != "etcd":
                _nudge(backend_url, unique_key, "waiter", other)
    nudger = threading.Thread(target=keep_nudging)
    nudger.start()
    try:
        grant, attempts, _sent = waiting.acquire(waiter, unique_key, "waiter", 60, None, 2.0)
    finally:
        stop.set()
        nudger.join(10)
    assert grant.status == "locked" and grant.holder.owner == "holder"
    assert holder.query(unique_key).owner == "holder"
    if scheme(backend_url) != "etcd":
        assert attempts > 3  # it was woken, asked, and was refused, again and again


@pytest.mark.slow
def test_threads_of_one_process_are_all_served(backend_url, unique_key):
    """A waiter that releases and asks again goes to the end of the line: it
    can no longer take every grant (before, one thread took 200 of 200).
    Judged from the first grant after which every waiter has been served:
    before that, the others may not be in line yet (on a loaded machine,
    CI17, a thread took grants while the others waited for a core), and
    no backend can put a waiter in line before it asks."""
    waiters, grants = 6, 36
    options = LockOptions(ttl=10.0, on_contention="wait", wait_timeout=60.0)
    order, done, guard, errors = [], [0], threading.Lock(), []
    # Every waiter connected before the first asks: on a loaded machine a
    # connection took long enough for the first thread to take 15 of the 36
    # grants alone, with nobody in line behind it.
    all_connected = threading.Barrier(waiters, timeout=120)

    def waiter(number):
        backend, owner = open_backend(backend_url), "t%d" % number
        try:
            all_connected.wait()
            while True:
                with guard:
                    if done[0] >= grants:
                        return
                grant = runner_acquire(backend, unique_key, owner, options, None)[0]
                assert grant.granted, grant.status
                with guard:
                    done[0] += 1
                    order.append(number)
                backend.release(unique_key, owner)
        except Exception as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            backend.close()
    threads = [threading.Thread(target=waiter, args=(n,)) for n in range(waiters)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not errors, errors
    assert sorted(set(order)) == list(range(waiters)), "a waiter was never served: %r" % order
    everyone_served = max(order.index(number) for number in range(waiters))
    after = collections.Counter(order[everyone_served + 1:])
    fair = (len(order) - everyone_served - 1) / waiters
    assert max(after.values(), default=0) <= 2 * fair + 1, (order, after)


@pytest.fixture
def pgbouncer(pg_server):
    bouncer = servers.PgBouncer(pg_server)
    yield bouncer
    bouncer.stop()


def _noting_refusals(acquire, event):
    def noted(*args, **kwargs):
        grant = acquire(*args, **kwargs)
        if not grant.granted:
            event.set()
        return grant
    return noted


def test_waiting_through_pgbouncer_in_transaction_mode(pgbouncer, unique_key):
    """PgBouncer in transaction pooling runs each statement on any session of
    its pool, so a LISTEN does not stay with the waiter: notifications reach
    it late or never. The line and the grants are single statements and
    still hold; a waiter then finds the lock at its next look (it looks
    again at least every TICKET_REFRESH)."""
    holder = open_backend(pgbouncer.url())
    waiters = [open_backend(pgbouncer.url()) for _n in range(3)]
    served, errors = [], []
    try:
        assert holder.acquire(unique_key, "holder", 60).granted
        for number, waiter in enumerate(waiters):
            waiter.join_queue(unique_key, "w%d" % number, 30)  # the order of arrival
        # The holder releases once every waiter was refused a first time: a
        # waiter whose first try came after the release would be granted at
        # once, outside waiting.acquire's line, and keep the ticket joined above.
        refused = [threading.Event() for _waiter in waiters]
        for waiter, event in zip(waiters, refused):
            waiter.acquire = _noting_refusals(waiter.acquire, event)

        def wait(number):
            try:
                grant = waiting.acquire(waiters[number], unique_key, "w%d" % number, 60, None, 30)[0]
                assert grant.granted, grant.status
                served.append(("w%d" % number, grant.fence, time.monotonic()))
                assert waiters[number].release(unique_key, "w%d" % number)
            except Exception as exc:  # reported below, in the test's thread
                errors.append(exc)
        threads = [threading.Thread(target=wait, args=(n,)) for n in (2, 1, 0)]
        for thread in threads:
            thread.start()
        for event in refused:
            assert event.wait(30)
        released = time.monotonic()
        assert holder.release(unique_key, "holder")
        for thread in threads:
            thread.join(60)
        assert not errors, errors
        assert [owner for owner, _fence, _at in served] == ["w0", "w1", "w2"]
        assert served[0][1] < served[1][1] < served[2][1]
        previous = released
        for _owner, _fence, at in served:
            assert at - previous < waiting.TICKET_REFRESH + 3.0  # a look per second, on a loaded machine
            previous = at
    finally:
        for backend in [holder] + waiters:
            backend.close()


def test_postgresql_lean_grant_reads_the_line_from_the_lease_row(pg_server, unique_key):
    """The grant a runner sends first (UPSERT_LEASE_NO_LINE) reads the line
    from the lease row's line_until, which every join moves to its ticket's
    expiry (the same value): it refuses while a ticket may be live, even after
    the ticket's owner left, and grants itself once the last expiry passed."""
    waiter = open_backend(pg_server.url())
    params = {"key": unique_key, "owner": "late", "ttl_ms": 30000, "session": False, "scopes": []}
    line = "SELECT l.line_until, (SELECT max(expires_at) FROM dlock_wait w WHERE w.key = l.key) " \
           "FROM dlock_lease l WHERE l.key = %s"
    try:
        waiter.join_queue(unique_key, "w", 1.0)
        waiter.leave_queue(unique_key, "w")
        waiter.join_queue(unique_key, "w", 1.5)  # a new ticket: later than the first
        with pg_server.connect() as conn:
            line_until, ticket_expiry = conn.execute(line, (unique_key,)).fetchone()
            assert line_until == ticket_expiry
            assert waiter.query(unique_key).fence is None  # the row a join made: no grant yet
            waiter.leave_queue(unique_key, "w")
            assert conn.execute(pg_common.UPSERT_LEASE_NO_LINE, params).fetchone() == (None, None, None)
            # The server's own clock, up to the line's end (an expiry is a moment: nothing to be told of).
            conn.execute("SELECT pg_sleep(extract(epoch FROM %s - clock_timestamp())::float8)", (line_until,))
            assert conn.execute(pg_common.UPSERT_LEASE_NO_LINE, params).fetchone() == (1, None, None)
    finally:
        waiter.close()
