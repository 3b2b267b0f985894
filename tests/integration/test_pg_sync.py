"""PostgreSQL with strict synchronous replication (Patroni's synchronous_mode_strict),
against a real primary and a real streaming standby: a grant or a renewal counts
only when its commit is known to be on the standby; with the standby gone the
engine never hangs, never counts what it wrote, and leaves nothing held."""

import os
import socket
import sys
import time

import psycopg
import pytest
from runner_proc import last_log, lines, run_dlock, start_dlock, wait_for

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import Slot, open_backend
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import BackendError

JOB = [sys.executable, os.path.join(os.path.dirname(__file__), "jobfixture.py")]
SCHEMES = ["postgresql", "postgresql+advisory"]
OP_TIMEOUT = 0.5
# What an operation may take beyond op_timeout on a loaded 2-core machine:
# reconnecting, the undo of the grant, the interpreter.
SLACK = 3.0


def lease_row(server, key):
    """(owner, fence, seconds until expiry) of the key's lease row on server, or None."""
    try:
        rows = server.sql("SELECT owner, fence, extract(epoch FROM expires_at - clock_timestamp())::float8 "
                          "FROM dlock_lease WHERE key = '%s'" % key, db="dlock")
    except psycopg.errors.UndefinedTable:  # the standby has not replayed the CREATE TABLE yet
        return None
    return rows[0] if rows else None


def slot_owner(server, key, slot):
    rows = server.sql("SELECT owner FROM dlock_slot WHERE key = '%s' AND slot = %d" % (key, slot.number), db="dlock")
    return rows[0][0] if rows else None


def _args(url, key, *extra):
    return ["run", "--job", "job-" + key[-6:], "--key", key, "--backend", url] + list(extra)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_grant_renew_release_are_on_the_standby(pg_sync, unique_key, scheme):
    backend = open_backend(pg_sync.primary.url(scheme=scheme), op_timeout=OP_TIMEOUT)
    try:
        grant = backend.acquire(unique_key, "owner-a", 30)
        assert grant.granted
        # The commit waited for the standby's flush; its replay may trail a little.
        wait_for(lambda: (lease_row(pg_sync.standby, unique_key) or ())[:2] == ("owner-a", grant.fence), 10,
                 "the grant on the standby")
        assert backend.renew(unique_key, "owner-a", 30) is True
        assert backend.release(unique_key, "owner-a") is True
        wait_for(lambda: lease_row(pg_sync.standby, unique_key)[0] is None, 10, "the release on the standby")
    finally:
        backend.close()


@pytest.mark.parametrize("scheme,slot", [("postgresql", None), ("postgresql", Slot(4242, 600)),
                                         ("postgresql+advisory", None)])
def test_standby_down_no_grant_and_nothing_left_held(pg_sync, unique_key, scheme, slot):
    backend = open_backend(pg_sync.primary.url(scheme=scheme), op_timeout=OP_TIMEOUT)
    try:
        assert backend.query(unique_key).owner is None  # connected, tables there
        pg_sync.standby_down()
        started = time.monotonic()
        with pytest.raises(BackendError) as err:
            backend.acquire(unique_key, "owner-a", 30, slot)
        took = time.monotonic() - started
        assert OP_TIMEOUT <= took < OP_TIMEOUT + SLACK, took
        row = lease_row(pg_sync.primary, unique_key)
        if "the outcome of the write is unknown" in str(err.value):
            # The other way a loaded host (CI, once) ends it: the cancel sent
            # at op_timeout got no answer either, and the connection was shut;
            # the owner-checked release then found what was left, if anything.
            assert "the grant is not counted and " in str(err.value)
        else:
            assert "not known to be replicated to a synchronous standby" in str(err.value)
            assert "what it wrote was released" in str(err.value)
            assert row is not None and row[1] == 1  # committed on the primary, then released
        # No row on the primary carries an owner: nobody waits for its TTL.
        assert row is None or row[0] is None, row
        if slot is not None:
            assert slot_owner(pg_sync.primary, unique_key, slot) is None
        assert backend.query(unique_key).owner is None
    finally:
        backend.close()
    pg_sync.standby_up()
    other = open_backend(pg_sync.primary.url(scheme=scheme), op_timeout=OP_TIMEOUT)
    try:
        grant = other.acquire(unique_key, "owner-b", 30, slot)
        # Grants resume once the standby is back, above any fence written before.
        assert grant.granted and grant.fence == (row[1] if row else 0) + 1
    finally:
        other.close()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_runner_fails_closed_when_the_standby_is_down(pg_sync, unique_key, scheme, tmp_path):
    url = pg_sync.primary.url(scheme=scheme)
    backend = open_backend(url)
    backend.query(unique_key)  # the tables exist before the standby goes
    backend.close()
    pg_sync.standby_down()
    ledger = str(tmp_path / "ledger")
    started = time.monotonic()
    proc = run_dlock(*_args(url, unique_key, "--op-timeout", "%gs" % OP_TIMEOUT, "--", *JOB, "interval", ledger, "0"))
    took = time.monotonic() - started
    assert proc.returncode == 75, proc.stderr
    assert took < OP_TIMEOUT + SLACK + 2.0, took  # plus the interpreter's start
    assert lines(ledger) == [], "the job ran without a replicated grant"
    log = last_log(proc.stderr)
    assert log["result"] == "backend_error" and "not known to be replicated" in log["error"], log
    assert lease_row(pg_sync.primary, unique_key)[0] is None


@pytest.mark.slow
def test_holder_self_fences_when_the_standby_goes(pg_sync, unique_key, tmp_path):
    beat = str(tmp_path / "beat")
    # renew_every 2s leaves time to stop the standby between two renewals.
    holder = start_dlock(*_args(pg_sync.primary.url(), unique_key, "--ttl", "6s", "--renew-every", "2s",
                                "--kill-grace", "500ms", "--op-timeout", "%gs" % OP_TIMEOUT,
                                "--", *JOB, "beat", beat))
    try:
        wait_for(lambda: len(lines(beat)) > 2, 20, "the job to start")
        wait_for(lambda: lease_row(pg_sync.primary, unique_key)[2] > 5.8, 10, "a fresh renewal")
        # While the standby is up, a commit is visible only once the standby has
        # it (the wait comes before the commit becomes visible): this expiry is
        # the one a failover would keep, and no renewal can be confirmed any more.
        expires_at = time.time() + lease_row(pg_sync.primary, unique_key)[2]
        pg_sync.standby_down()
        code = holder.wait(30)
    finally:
        if holder.poll() is None:
            holder.kill()
    last_beat = max(r["t"] for r in lines(beat))
    assert code == 76
    assert last_beat < expires_at, "the job still ran %.3fs after its lease expired" % (last_beat - expires_at)
    log = last_log(holder.stderr.read())
    # The heartbeat gives up on a renewal at op_timeout, as the backend's cancel
    # request goes out: either one's words may be the last error.
    assert log["result"] == "lock_lost" and log["renew_error"], log


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_release_not_known_to_be_replicated_leaves_the_run_as_it_was(pg_sync, unique_key, scheme, tmp_path):
    """The standby goes while the job runs (before any renewal): the release
    after it commits on the primary alone, acknowledged with the warning once
    op_timeout's cancel ends its wait for the standby. The job's success
    stands (exit 0); the release is logged and counted as uncertain."""
    started, go, metrics = tmp_path / "started", tmp_path / "go", tmp_path / "metrics"
    metrics.mkdir()
    job = "touch %s; while [ ! -e %s ]; do sleep 0.02; done" % (started, go)
    # No renewal while the job runs (every 20s): the release is the first write after the grant.
    runner = start_dlock(*_args(pg_sync.primary.url(scheme=scheme), unique_key, "--ttl", "60s", "--renew-every",
                                "20s", "--op-timeout", "%gs" % OP_TIMEOUT, "--metrics-dir", str(metrics),
                                "--", "sh", "-c", job))
    try:
        wait_for(started.exists, 20, "the job to start")
        pg_sync.standby_down()
        go.touch()
        stderr = runner.communicate(timeout=OP_TIMEOUT + SLACK + 10)[1]
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate(timeout=30)
    log = last_log(stderr)
    assert (runner.returncode, log["result"], log["exit_code"]) == (0, "success", 0), stderr
    assert log["release"] == "uncertain", log
    assert "not known to be replicated to a synchronous standby" in log["release_error"], log
    job_name = "job-" + unique_key[-6:]
    text = (metrics / ("dlock_%s.prom" % job_name)).read_text()
    assert 'dlock_releases_unconfirmed_total{job="%s",outcome="uncertain"} 1' % job_name in text, text
    assert 'dlock_runs_total{job="%s",result="success"} 1' % job_name in text, text
    # Uncertain, not failed: it did commit on the primary (a failover could still lose it).
    assert lease_row(pg_sync.primary, unique_key)[0] is None


@pytest.mark.parametrize("scheme", SCHEMES)
def test_multi_host_url_lands_on_the_primary(pg_sync, unique_key, scheme, tmp_path):
    closed = "127.0.0.1:1"  # nothing listens there
    standby = "127.0.0.1:%d" % pg_sync.standby.port
    primary = "127.0.0.1:%d" % pg_sync.primary.port
    ledger = str(tmp_path / "ledger")
    for hosts in ([closed, primary], [standby, primary], [closed, standby, primary]):
        url = "%s://postgres@%s/dlock" % (scheme, ",".join(hosts))
        proc = run_dlock(*_args(url, unique_key, "--", *JOB, "interval", ledger, "0"))
        assert proc.returncode == 0, (hosts, proc.stderr)
    assert [run["fence"] for run in lines(ledger)] == [1, 2, 3]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_host_that_never_answers_does_not_hide_the_primary(pg_sync, unique_key, scheme, tmp_path):
    """The first host takes the connection and then says nothing (a frozen
    or partitioned former primary): the runner still reaches the primary
    named after it within its op_timeout (each host gets a share of it), and
    the one after that first, on its next connection."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # the kernel completes the handshakes; nobody ever answers
    try:
        hosts = ["127.0.0.1:%d" % silent.getsockname()[1], "127.0.0.1:%d" % pg_sync.primary.port]
        url = "%s://postgres@%s/dlock" % (scheme, ",".join(hosts))
        ledger = str(tmp_path / "ledger")
        start = time.monotonic()
        proc = run_dlock(*_args(url, unique_key, "--op-timeout", "5s", "--", *JOB, "interval", ledger, "0"))
        took = time.monotonic() - start
        assert proc.returncode == 0, proc.stderr
        assert [run["fence"] for run in lines(ledger)] == [1]
        assert took < 5 + SLACK, took
        backend = open_backend(url, op_timeout=5.0)
        try:
            assert backend.acquire(unique_key + "-2", "owner-a", 30) is not None
            assert backend.describe()["member"]["endpoint"] == hosts[1]
            backend.reset()  # a new session starts with the host that answered last
            start = time.monotonic()
            backend.query(unique_key + "-2")
            assert time.monotonic() - start < 1.5, "the silent host was asked first again"
        finally:
            backend.close()
    finally:
        silent.close()


def test_standby_alone_is_refused(pg_sync, unique_key):
    backend = open_backend(pg_sync.standby.url(), op_timeout=OP_TIMEOUT)
    try:
        with pytest.raises(BackendError) as err:
            backend.acquire(unique_key, "owner-a", 30)
    finally:
        backend.close()
    assert "read-only" in str(err.value)
