"""Redis: a grant whose answer is lost is undone (issue 25, defect 3).

The grant script may run on the server after the client gave up on its
answer: here it waits behind a DEBUG SLEEP on the same connection, as it
would behind a slow `appendfsync always` fsync. The grant must then not stay
on the server, under an owner nobody runs, for its whole TTL.
"""

import time

import pytest
import servers
from runner_proc import last_log, run_dlock

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import Slot, open_backend
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import BackendError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.slots import marker_ttl, slot_number

OP_TIMEOUT = 0.3
SLEEP = 1.0  # longer than op_timeout: the grant's answer comes too late


@pytest.fixture
def debug_redis():
    """A private redis-server that takes DEBUG from loopback."""
    server = servers.RedisServer(extra=("--enable-debug-command", "local"))
    yield server
    server.stop()


def _sleep_ahead(backend, seconds):
    """DEBUG SLEEP on the backend's own connection, its answer not read: the
    backend's next command waits behind it on the server, in order."""
    backend.client.send("DEBUG", "SLEEP", seconds)


def test_a_grant_whose_answer_timed_out_is_undone_and_the_next_runner_is_granted(debug_redis, unique_key):
    client = debug_redis.client()
    backend = open_backend(debug_redis.url, None, OP_TIMEOUT)
    width = 3600.0
    try:
        # Load the grant script first: a first EVALSHA would be refused
        # (NOSCRIPT) and the grant would never run.
        warm = backend.acquire(unique_key + "-warm", "warm-owner", 20.0)
        assert warm.granted
        backend.release(unique_key + "-warm", "warm-owner")
        slot = Slot(slot_number(backend.server_time(), width), marker_ttl(width), width)
        _sleep_ahead(backend, SLEEP)
        started = time.monotonic()
        with pytest.raises(BackendError) as err:
            backend.acquire(unique_key, "lost-owner", 20.0, slot)
        took = time.monotonic() - started
    finally:
        backend.close()
    assert client.ping()  # the server is awake: whatever the grant wrote is written
    lease = "dlock:{%s}:lease" % unique_key
    assert not client.exists(lease), "the undone grant left the lease for %dms: %s" % (
        client.pttl(lease), err.value)
    assert not list(client.scan_iter("dlock:{%s}:slot:*" % unique_key)), "the undone grant left its slot marker"
    assert "the grant is not counted" in str(err.value)
    assert took < OP_TIMEOUT * 5, "the undo is bounded (%.2fs)" % took
    # The next runner is granted at once, in the same once-per slot.
    result = run_dlock("run", "--job", "next", "--key", unique_key, "--backend", debug_redis.url, "--ttl", "20s",
                       "--once-per", "1h", "--", "true", timeout=30)
    log = last_log(result.stderr)
    assert (result.returncode, log["result"], log["attempt"]) == (0, "success", 1), result.stderr


def test_an_undone_rerun_leaves_the_slot_rerunnable(debug_redis, unique_key):
    """A rerun whose answer was lost is undone too, but its slot's marker
    stays (naming the undone owner, which counts as not done): deleting it,
    as an undone first claim does, would leave a slot that failed with no
    marker, which no rerun could run again."""
    client = debug_redis.client()
    backend = open_backend(debug_redis.url, None, OP_TIMEOUT)
    width = 3600.0
    try:
        slot = Slot(slot_number(backend.server_time(), width), marker_ttl(width), width)
        assert backend.acquire(unique_key, "first-owner", 20.0, slot).granted
        assert backend.release(unique_key, "first-owner", last={"result": "failed"}, slot=slot)
        rerun = Slot(slot.number, marker_ttl(width), width, rerun=True)
        _sleep_ahead(backend, SLEEP)
        with pytest.raises(BackendError, match="the grant is not counted"):
            backend.acquire(unique_key, "lost-owner", 20.0, rerun)
    finally:
        backend.close()
    assert client.ping()
    assert not client.exists("dlock:{%s}:lease" % unique_key)
    assert client.get("dlock:{%s}:slot:%d" % (unique_key, slot.number)) == "lost-owner"
    again = open_backend(debug_redis.url)
    try:
        assert again.acquire(unique_key, "next-owner", 20.0, rerun).granted
    finally:
        again.close()
