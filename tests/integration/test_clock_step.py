"""Issue 25, defect 2: a step of the backend host's wall clock must not
shorten a live lease below what the runner's deadline counts.

Redis (PEXPIRE) and PostgreSQL's lease table (expires_at against
clock_timestamp()) count the TTL on the server's wall clock. The runner checks
that clock once, before the grant, and accepts an offset within
max_clock_skew either way: a correction from -skew to +skew while the lease
lives passes every check and takes 2 x skew off the lease. The rule now counts
it (options.clock_margin): such options are refused, and with the tightest
options it accepts, the holder's job is dead before the stepped lease expires.

A PostgreSQL of its own runs under libfaketime with its clock 0.9 s behind;
after A's grant it is stepped to 0.9 s ahead (FAKETIME_NO_CACHE: the offset
file is read at each clock call). B waits for the key; both jobs append their
wall time (this host's clock, not faked) every 20 ms to a ledger of their
own. To show the worst case the rule is for, the second test also cuts A off
its server after the grant (A's server processes stopped), so A cannot renew
and must fence by its own deadline. Redis follows the same rule (the unit
tests of options.py); redis-server 7.0 does not start under libfaketime
(its clock_gettime recursion check aborts it), so it is not stepped here.
"""

import os
import shutil
import signal
import sys
import tempfile
import time

import pytest
import servers
from runner_proc import lines, start_dlock, wait_for

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import EXIT_CONFIG

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
JOB = [sys.executable, os.path.join(os.path.dirname(__file__), "jobfixture.py")]
SKEW = 0.9  # the server's clock: SKEW behind, then SKEW ahead
# The reproduction's options (issue 25), valid before: 4s + 400ms + 300ms +
# 100ms = 4.8s < 5s; now + 2 x max_clock_skew (2s) = 6.8s, refused.
REPRODUCTION = ["--ttl", "5s", "--renew-every", "4s", "--op-timeout", "400ms", "--kill-grace", "300ms",
                "--max-clock-skew", "1s"]
# The tightest ttl the new rule accepts with the same others: 6.7s + 2% of ttl < ttl.
TIGHTEST = ["--ttl", "7s", "--renew-every", "4s", "--op-timeout", "400ms", "--kill-grace", "300ms",
            "--max-clock-skew", "1s"]

pytestmark = pytest.mark.skipif(not os.path.exists(LIBFAKETIME), reason="libfaketime (Debian package faketime)")


class FakeClock(object):
    """The offset file libfaketime reads: the server's wall clock is this
    host's plus its content (the monotonic clock is left alone)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="dlock-faketime-")
        os.chmod(self.dir, 0o755)  # the server's user reads the offset file
        self.path = os.path.join(self.dir, "offset")
        self.set(0)

    def set(self, seconds):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as handle:
            handle.write("%+.3f\n" % seconds)
        os.chmod(tmp, 0o644)
        os.rename(tmp, self.path)  # never a half-written offset

    def environment(self):
        return dict(LD_PRELOAD=LIBFAKETIME, FAKETIME_TIMESTAMP_FILE=self.path, FAKETIME_NO_CACHE="1",
                    FAKETIME_DONT_FAKE_MONOTONIC="1")

    def started(self, start):
        """start() with this clock in the environment the server inherits."""
        saved = dict(os.environ)
        os.environ.update(self.environment())
        try:
            return start()
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)


class FakeClockPostgres(servers.PostgresServer):
    def __init__(self):
        self.clock = FakeClock()
        super().__init__()

    def start(self):
        self.clock.started(super().start)

    def server_minus_local(self):
        [(seconds,)] = self.sql("SELECT extract(epoch FROM clock_timestamp())::float8 - %.6f" % time.time())
        return seconds

    def cut_off(self):
        """A's server processes (the only runner connected yet) stopped; returns the undo."""
        pids = self.backend_pids()
        assert pids, "no session of A's runner on the server"
        servers.signal_processes(pids, signal.SIGSTOP)
        return lambda: servers.signal_processes(pids, signal.SIGCONT)

    def stop(self):
        super().stop()
        self.clock.remove()


@pytest.fixture(scope="module")
def fake_clock_server():
    server = FakeClockPostgres()
    yield server
    server.stop()


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _run_step(server, key, tmp_path, options, cut_off_holder):
    """A holds `key` with `options` while the server's clock steps from -SKEW
    to +SKEW; B waits for the key. cut_off_holder: right after the grant A
    can no longer reach its server, so it cannot renew and must fence by its
    own deadline (the worst case the rule is for). Returns (A's runner, A's
    ledger, B's ledger), both runners ended."""
    ledger_a, ledger_b = str(tmp_path / "a.ledger"), str(tmp_path / "b.ledger")
    server.clock.set(-SKEW)
    wait_for(lambda: server.server_minus_local() < -SKEW + 0.2, 10, "the server's clock behind")
    holder = start_dlock("run", "--job", "step-a", "--key", key, "--backend", server.url(), *options,
                         "--", *JOB, "pidbeat", ledger_a)
    waiter = undo_cut_off = None
    try:
        wait_for(lambda: lines(ledger_a) or holder.poll() is not None, 20, "A's grant or A's end")
        if holder.poll() is not None:
            return holder, [], []
        job_pid = lines(ledger_a)[0]["pid"]
        if cut_off_holder:
            undo_cut_off = server.cut_off()
        server.clock.set(+SKEW)  # the step: 2 x SKEW off A's lease
        waiter = start_dlock("run", "--job", "step-b", "--key", key, "--backend", server.url(), *options,
                             "--on-contention", "wait", "--wait-timeout", "20s", "--", *JOB, "pidbeat", ledger_b)
        wait_for(lambda: lines(ledger_b) or waiter.poll() is not None, 25, "B's grant")
        wait_for(lambda: not _alive(job_pid), 15, "A's job to end")
    finally:
        if undo_cut_off is not None:
            undo_cut_off()
        for proc in (waiter, holder):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (waiter, holder):
            if proc is not None:
                try:
                    proc.wait(20)
                except Exception:  # pylint: disable=broad-exception-caught
                    proc.kill()
                    proc.wait()
        server.clock.set(0)
    return holder, lines(ledger_a), lines(ledger_b)


def _overlap(ledger_a, ledger_b):
    """A's writes at or after B's first: (count, seconds)."""
    assert ledger_b, "B was never granted"
    first_b = min(record["t"] for record in ledger_b)
    late = [record["t"] for record in ledger_a if record["t"] >= first_b]
    return len(late), (max(late) - first_b if late else 0.0)


def test_the_reproduction_s_options_are_refused_naming_the_rule(fake_clock_server, unique_key, tmp_path):
    """Before: accepted, and A's job (fence 1) wrote on beside B's after the step."""
    holder, ledger_a, ledger_b = _run_step(fake_clock_server, unique_key, tmp_path, REPRODUCTION, False)
    stderr = holder.stderr.read()
    if ledger_a:
        count, seconds = _overlap(ledger_a, ledger_b)
        pytest.fail("the options were accepted (A exited %s); A's job wrote %d times for %.3fs after B's first write"
                    % (holder.returncode, count, seconds))
    assert holder.returncode == EXIT_CONFIG, stderr
    assert ("renew_every (4s) + op_timeout (400ms) + kill_grace (300ms) + clock margin (100ms) + "
            "2 x max_clock_skew (2s) = 6.8s must be below ttl (5s)") in stderr
    assert "postgresql:// counts the lease on the server's wall clock" in stderr


def test_with_the_tightest_accepted_options_a_step_does_not_overlap(fake_clock_server, unique_key, tmp_path):
    """A cannot renew (cut off its server) and the server's clock steps by
    2 x 0.9s: A's job must have stopped writing before B's first write."""
    holder, ledger_a, ledger_b = _run_step(fake_clock_server, unique_key, tmp_path, TIGHTEST, True)
    stderr = holder.stderr.read()
    assert ledger_a, "A never held the key: %s" % stderr
    count, seconds = _overlap(ledger_a, ledger_b)
    assert count == 0, "A's job wrote %d times for %.3fs after B's first write" % (count, seconds)
    assert max(r["t"] for r in ledger_a) < min(r["t"] for r in ledger_b)
    assert holder.returncode == 76, stderr  # lock_lost: A fenced its job
