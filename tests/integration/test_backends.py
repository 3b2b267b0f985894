"""Backend contracts against real servers: grant, owner checks, fences, slots."""

import time

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import Slot, open_backend
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import AuthError, BackendError, ConfigError


@pytest.fixture
def pair(backend_url):
    """Two independent clients of one backend (two runners)."""
    a, b = open_backend(backend_url), open_backend(backend_url)
    yield a, b
    a.close()
    b.close()


def test_one_grant_at_a_time_and_fences_grow(pair, unique_key):
    a, b = pair
    first = a.acquire(unique_key, "owner-a", 5)
    assert first.granted
    busy = b.acquire(unique_key, "owner-b", 5)
    assert busy.status == "locked"
    assert busy.holder.owner == "owner-a"
    assert a.release(unique_key, "owner-a")
    second = b.acquire(unique_key, "owner-b", 5)
    assert second.granted and second.fence > first.fence


def test_wrong_owner_cannot_renew_or_release(pair, unique_key):
    a, b = pair
    assert a.acquire(unique_key, "owner-a", 5).granted
    before = b.query(unique_key)
    assert b.renew(unique_key, "intruder", 5) is False
    assert b.release(unique_key, "intruder") is False
    after = b.query(unique_key)
    assert after.owner == "owner-a" and after.fence == before.fence
    assert b.acquire(unique_key, "owner-b", 5).status == "locked"
    assert a.renew(unique_key, "owner-a", 5) is True


def test_slot_marker_refuses_a_second_run_of_the_slot(pair, unique_key):
    a, b = pair
    slot = Slot(123456, marker_ttl=30)
    assert a.acquire(unique_key, "owner-a", 5, slot).granted
    assert a.release(unique_key, "owner-a")
    dup = b.acquire(unique_key, "owner-b", 5, slot)
    assert dup.status == "duplicate" and dup.holder.owner == "owner-a"
    assert b.acquire(unique_key, "owner-b", 5, Slot(123457, 30)).granted


# How long past acquired + min_hold a released key may stay held: etcd moves it
# to a lease of whole seconds, and revokes expired leases every 500ms.
MIN_HOLD_SLACK = {"etcd": 1.6}


def test_min_hold_keeps_the_lock_after_release(pair, unique_key):
    a, b = pair
    asked = time.monotonic()
    assert a.acquire(unique_key, "owner-a", 10).granted
    granted = time.monotonic()  # the backend granted it, on its clock, between asked and granted
    assert a.release(unique_key, "owner-a", min_hold=1.5)
    assert b.acquire(unique_key, "owner-b", 10).status == "locked"
    # Time passing is what is tested: ask until the key is free again. A
    # refusal counts against the bound by when it was asked for, not by
    # when its answer came back (a loaded CI host once took over 0.3 s to
    # answer a PostgreSQL acquire, and the grant itself may be that late).
    give_up = granted + 1.5 + MIN_HOLD_SLACK.get(b.name, 0.3)
    while True:
        sent = time.monotonic()
        if b.acquire(unique_key, "owner-b", 10).granted:
            break
        assert sent < give_up, "still held well after acquired + min_hold"
        time.sleep(0.05)
    assert time.monotonic() - asked >= 1.5


def test_force_release_reports_and_breaks_the_holder(pair, unique_key):
    a, b = pair
    grant = a.acquire(unique_key, "owner-a", 10)
    holder = b.force_release(unique_key)
    assert holder.owner == "owner-a" and holder.fence == grant.fence
    time.sleep(0.3)  # advisory: the holder's session is being terminated
    assert a.renew(unique_key, "owner-a", 10) is False
    assert b.acquire(unique_key, "owner-b", 10).granted


def test_last_run_is_recorded(pair, unique_key):
    a, b = pair
    a.acquire(unique_key, "owner-a", 5)
    a.release(unique_key, "owner-a", last={"result": "success", "exit_code": 0, "host": "n1"})
    assert b.query(unique_key).last == {"result": "success", "exit_code": 0, "host": "n1"}


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "postgresql://postgres@127.0.0.1:1/dlock"])
def test_unreachable_backend_is_a_backend_error(url):
    backend = open_backend(url, op_timeout=0.5)
    with pytest.raises(BackendError) as err:
        backend.acquire("k", "o", 5)
    assert "127.0.0.1" in str(err.value) or "refused" in str(err.value).lower()


def test_wrong_password_is_an_auth_error(pg_server):
    backend = open_backend(pg_server.url("locker"), password="not-the-password")
    with pytest.raises(AuthError) as err:
        backend.acquire("k", "o", 5)
    assert "not-the-password" not in str(err.value)


def test_password_in_url_is_refused():
    with pytest.raises(ConfigError) as err:
        open_backend("redis://user:hunter2@127.0.0.1:6379/0")
    assert "password file" in str(err.value)


def test_redis_fence_survives_restart(own_redis, unique_key):
    backend = open_backend(own_redis.url)
    first = backend.acquire(unique_key, "a", 30).fence
    backend.close()
    own_redis.client().bgrewriteaof()
    time.sleep(0.5)
    own_redis.restart()
    backend = open_backend(own_redis.url)
    assert backend.query(unique_key).owner == "a"  # AOF kept the lease too
    backend.force_release(unique_key)
    assert backend.acquire(unique_key, "b", 30).fence > first
    backend.close()


def test_pg_lease_survives_reconnect(pg_server, unique_key):
    backend = open_backend(pg_server.url())
    backend.acquire(unique_key, "a", 30)
    for pid in pg_server.backend_pids():
        pg_server.sql("SELECT pg_terminate_backend(%d)" % pid)
    with pytest.raises(BackendError):
        backend.renew(unique_key, "a", 30)  # the dead connection fails once...
    assert backend.renew(unique_key, "a", 30) is True  # ...then a new one renews the row
    backend.close()


def test_file_backend_is_exclusive_per_host(tmp_path, unique_key):
    a, b = open_backend("file://%s" % tmp_path), open_backend("file://%s" % tmp_path)
    assert a.acquire(unique_key, "a", 5).granted
    assert b.acquire(unique_key, "b", 5).status == "locked"
    assert b.query(unique_key).owner == "a"
    a.release(unique_key, "a")
    grant = b.acquire(unique_key, "b", 5)
    assert grant.granted and grant.fence == 2


def test_postgresql_judges_expiry_when_the_statement_runs(pg_server, unique_key):
    """A takeover that waited on the lease row's lock judges expiry by the
    clock when it got the row (clock_timestamp()), not when its statement
    began (now()): a lease that expired during the wait is granted."""
    import threading
    holder, taker = open_backend(pg_server.url()), open_backend(pg_server.url())
    blocker, monitor = pg_server.connect(), pg_server.connect()  # pg_stat_activity is frozen inside a transaction
    try:
        assert holder.acquire(unique_key, "owner-a", 1.5).granted
        blocker.execute("BEGIN")
        expires = blocker.execute("SELECT expires_at FROM dlock_lease WHERE key = %s FOR UPDATE",
                                  (unique_key,)).fetchone()[0]
        result = {}
        taking = threading.Thread(target=lambda: result.update(grant=taker.acquire(unique_key, "owner-b", 5)))
        taking.start()
        # The taker's statement began while the lease was live, and now waits for the row.
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%dlock_lease%'"
        while monitor.execute(waiting).fetchone()[0] == 0:
            assert taking.is_alive() and blocker.execute("SELECT clock_timestamp() < %s", (expires,)).fetchone()[0], \
                "the taker did not queue on the row before the lease expired"
        while blocker.execute("SELECT clock_timestamp() <= %s", (expires,)).fetchone()[0]:
            pass  # the lease expires while the taker waits
        blocker.execute("COMMIT")
        taking.join(10)
        assert result["grant"].granted, result["grant"].status
    finally:
        blocker.close()
        monitor.close()
        holder.close()
        taker.close()


@pytest.mark.parametrize("ttl", [float("nan"), float("inf"), 1e308, -1.0, 0.0, True, "60", None])
@pytest.mark.parametrize("server", ["redis", "postgresql", "etcd"])
def test_a_lease_length_that_is_no_length_is_refused_and_nothing_is_held(request, server, ttl, unique_key):
    """The last wall before the server (base.lease_ms): whatever reaches an
    engine's acquire as a ttl, only a finite, bounded number becomes a lease."""
    url = request.getfixturevalue("pg_server").url() if server == "postgresql" \
        else request.getfixturevalue("%s_server" % server).url
    backend = open_backend(url)
    try:
        with pytest.raises(ConfigError, match="is not a lease length"):
            backend.acquire(unique_key, "owner", ttl)
        assert backend.query(unique_key).owner is None
    finally:
        backend.close()
