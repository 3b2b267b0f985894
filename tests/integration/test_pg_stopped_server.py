"""PostgreSQL: op_timeout bounds a call to a server process that does not run
(issue 25, defect 5).

A stopped server process (SIGSTOP here; in production one stuck in the
kernel on a hung disk) never acts on the cancel request of op_timeout, and
its kernel still acknowledges our packets. After a grace the engine shuts the
connection's socket down: the call fails as a backend error within
op_timeout + grace.
"""

import os
import signal
import threading
import time

import pytest
from runner_proc import last_log, start_dlock, wait_for

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import open_backend
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.pg_advisory import _holder_pids
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.pg_session import shutdown_grace
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import BackendError

OP_TIMEOUT = 0.5
# What a call may take past op_timeout + grace on a loaded machine (the
# cancel request, the runner's log line and exit).
SLACK = 1.0
BOUND = OP_TIMEOUT + shutdown_grace(OP_TIMEOUT) + SLACK


def _local_ports(pid):
    """The local TCP ports of the sockets process pid holds open."""
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as handle:
            for line in list(handle)[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _server_process_of(pg_server, runner_pid):
    """The pid of the server process that serves the runner's session."""
    ports = _local_ports(runner_pid)
    with pg_server.connect() as admin:
        rows = admin.execute("SELECT pid, client_port FROM pg_stat_activity WHERE application_name = 'dlock'"
                             ).fetchall()
    pids = [pid for pid, port in rows if port in ports]
    assert len(pids) == 1, (rows, ports)
    return pids[0]


def test_release_to_a_stopped_server_process_ends_within_op_timeout_and_grace(pg_server, unique_key, tmp_path):
    started, go = tmp_path / "started", tmp_path / "go"
    job = "touch %s; while [ ! -e %s ]; do sleep 0.02; done" % (started, go)
    # No renewal while the job runs (renew every 10s): the release is the
    # first call after the grant.
    runner = start_dlock("run", "--job", "stopped", "--key", unique_key, "--backend", pg_server.url(),
                         "--ttl", "30s", "--renew-every", "10s", "--op-timeout", "%gs" % OP_TIMEOUT,
                         "--", "sh", "-c", job)
    stopped = None
    try:
        wait_for(started.exists, 20, "the job to start")
        stopped = _server_process_of(pg_server, runner.pid)
        os.kill(stopped, signal.SIGSTOP)
        go.touch()  # the job ends: the runner releases, to the stopped process
        ended = time.monotonic()
        try:
            stderr = runner.communicate(timeout=BOUND + 5)[1]
        except Exception:
            stderr = None
        took = time.monotonic() - ended
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        if runner.poll() is None:
            runner.kill()
        runner.communicate(timeout=30)
    assert stderr is not None and took < BOUND, "the release hung %.1fs past the job's end" % took
    log = last_log(stderr)
    # A release whose outcome is unknown is logged as such; the run's result is the job's.
    assert (runner.returncode, log["result"]) == (0, "success"), stderr
    assert log["release"] == "uncertain" and "the connection was shut down" in log["release_error"], log


@pytest.mark.parametrize("call", ["clock check", "grant"])
def test_a_call_to_a_stopped_server_process_fails_within_op_timeout_and_grace(call, pg_server, unique_key):
    backend = open_backend(pg_server.url(), None, OP_TIMEOUT)
    outcome = []

    def make_the_call():
        begun = time.monotonic()
        try:
            if call == "clock check":
                backend.server_time()
            else:
                backend.acquire(unique_key, "owner-of-a-stopped-session", 30.0)
        except BackendError as exc:
            outcome.append(exc)
        outcome.append(time.monotonic() - begun)
    # On its own thread: a call that hangs is seen hanging, then the server
    # process is resumed so that the call and the test end.
    caller = threading.Thread(target=make_the_call, daemon=True)
    stopped = None
    try:
        backend.server_time()  # connected: the session's server process is known
        stopped = backend.conn.info.backend_pid
        os.kill(stopped, signal.SIGSTOP)
        caller.start()
        caller.join(BOUND + 5)
        hung = caller.is_alive()
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        if caller.ident is not None:
            caller.join(30)
    try:
        assert not hung, "the %s hung until the server process was resumed" % call
        error, took = outcome
        assert isinstance(error, BackendError) and took < BOUND, "%s took %.1fs: %s" % (call, took, error)
        assert "the connection was shut down" in str(error)
        # The connection shut down is never used again: the next call gets a new session.
        assert backend.conn.info.backend_pid != stopped
    finally:
        backend.close()


def test_an_advisory_grant_whose_session_was_dropped_at_op_timeout_is_not_counted(pg_server, unique_key):
    """A grant that answers just as op_timeout runs out: the watchdog has sent
    its cancel request, so the connection is dropped (the cancel could land on
    the next statement), and with it the session that holds an advisory lock.
    Such a grant must not count: the job would run with no lock held until
    the first renewal. The race is made certain here by having the watchdog
    report that it fired; the rest (the grant, the drop, pg_locks) is real."""
    backend = open_backend(pg_server.url(scheme="postgresql+advisory"), None, OP_TIMEOUT)
    disarm = backend.session._watchdog.disarm
    backend.session._watchdog.disarm = lambda: disarm() or True  # the cancel went out as the answer came
    try:
        with pytest.raises(BackendError) as raised:
            backend.acquire(unique_key, "owner-late", 30.0)
        assert "not counted" in str(raised.value), raised.value
    finally:
        backend.session._watchdog.disarm = disarm
        backend.close()
    with pg_server.connect() as admin:
        assert _holder_pids(admin, unique_key) == []  # nobody holds the key's advisory lock
        owner = admin.execute("SELECT owner FROM dlock_lease WHERE key = %s", (unique_key,)).fetchone()
    assert owner is None or owner[0] is None, owner  # the grant's row was released, owner-checked
    other = open_backend(pg_server.url(scheme="postgresql+advisory"), None, OP_TIMEOUT)
    try:
        assert other.acquire(unique_key, "owner-next", 30.0).granted
    finally:
        other.release(unique_key, "owner-next")
        other.close()
