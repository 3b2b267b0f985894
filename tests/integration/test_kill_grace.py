"""The runner while it stops its job: it sleeps through kill_grace, it does not spin.

Once the lease is lost (or max_runtime has passed) the runner SIGTERMs the job
and SIGKILLs it kill_grace later. A job that ignores SIGTERM keeps the runner
in that grace for all of it; the runner then has nothing to do but wait for
the deadline and for the guard's report. It used to spin instead: the
heartbeat's wake-up pipe was never read (every wait returned at once after
a lost lease) and the deadlines already passed (max_runtime's end, the
SIGTERM's) were still waited for, with a timeout of 0: a core's worth of CPU
for the whole grace. The runner's CPU time over the grace is measured from
/proc (its own threads: not the guard's, not the job's).
"""

import os
import sys
import time

import pytest

from runner_proc import last_log, lines, run_dlock, start_dlock, wait_for

JOB = [sys.executable, os.path.join(os.path.dirname(__file__), "jobfixture.py")]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
KILL_GRACE = 2.0
# Waking up for the SIGKILL's deadline and the guard's report costs under
# 10 ms (0.000s measured); the spinning runner used up to a core's worth for
# the whole grace (0.44-0.61s of the 2s on a loaded 2-core machine).
MOST_CPU = 0.1


def _cpu_seconds(pid):
    """User + system CPU time of pid's threads (fields 14 and 15 of
    /proc/PID/stat), or None once it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (IOError, OSError):
        return None
    return (int(fields[11]) + int(fields[12])) / float(CLOCK_TICKS)


@pytest.mark.parametrize("ending", ["lease lost", "max_runtime"])
def test_the_runner_sleeps_through_kill_grace(ending, request, unique_key, tmp_path):
    ledger = str(tmp_path / "ledger")
    if ending == "lease lost":
        url = request.getfixturevalue("redis_server").url
        timing = ["--ttl", "10s", "--renew-every", "500ms"]
    else:
        url = "file://%s" % (tmp_path / "locks")
        timing = ["--max-runtime", "1s"]
    runner = start_dlock("run", "--job", "grace", "--key", unique_key, "--backend", url,
                         "--kill-grace", "%gs" % KILL_GRACE, *timing, "--", *JOB, "stubborn", ledger)
    try:
        wait_for(lambda: lines(ledger) or runner.poll() is not None, 20, "the job to start")
        if ending == "lease lost":
            broke = run_dlock("release", "--key", unique_key, "--backend", url, "--force",
                              "--reason", "test: the holder loses its lease")
            assert broke.returncode == 0, broke.stderr
        wait_for(lambda: any("term" in r for r in lines(ledger)) or runner.poll() is not None, 20,
                 "the job's SIGTERM")
        first = last = (time.monotonic(), _cpu_seconds(runner.pid))
        assert first[1] is not None and runner.poll() is None, runner.communicate()[1]
        # Sample the runner's CPU until it ends (at the SIGKILL, KILL_GRACE
        # after the SIGTERM): the last sample is within one period of its end.
        give_up = time.monotonic() + KILL_GRACE + 20
        while runner.poll() is None and time.monotonic() < give_up:
            cpu = _cpu_seconds(runner.pid)
            if cpu is not None:
                last = (time.monotonic(), cpu)
            time.sleep(0.02)
        stderr = runner.communicate(timeout=10)[1]
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(10)
    log = last_log(stderr)
    assert log["result"] == ("lock_lost" if ending == "lease lost" else "failed"), stderr
    assert last[0] - first[0] > KILL_GRACE * 0.75, "the samples cover %.2fs of the grace" % (last[0] - first[0])
    used = last[1] - first[1]
    assert used < MOST_CPU, "the runner used %.2fs of CPU in %.2fs of kill_grace" % (used, last[0] - first[0])
