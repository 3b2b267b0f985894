"""Honest results after a pause of the runner itself.

A runner stopped (SIGSTOP, a frozen VM) for longer than its TTL cannot kill
its job in time: the job runs on unsupervised, and may even finish by itself
while its lease has expired on the backend. On waking, the runner judges its
deadline (CLOCK_BOOTTIME) before the job's status: the run is lock_lost
(exit 76) with the overrun in the log line and in dlock_lease_overrun_seconds.
"""

import os
import signal
import sys

from runner_proc import last_log, lines, run_dlock, start_dlock, wait_for

JOB = [sys.executable, os.path.join(os.path.dirname(__file__), "jobfixture.py")]


def _metrics(path):
    values = {}
    with open(path) as handle:
        for line in handle:
            if line.startswith("dlock_"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
    return values


def test_a_job_that_finished_while_its_runner_was_stopped_past_the_ttl_is_lock_lost(redis_server, unique_key, tmp_path):
    ledger, metrics = str(tmp_path / "ledger"), tmp_path / "metrics"
    metrics.mkdir()
    runner = start_dlock("run", "--job", "paused", "--key", unique_key, "--backend", redis_server.url, "--ttl", "2s",
                         "--metrics-dir", str(metrics), "--", *JOB, "phases", ledger, "0.5")
    lease = "dlock:{%s}:lease" % unique_key
    client = redis_server.client()
    try:
        wait_for(lambda: [r["phase"] for r in lines(ledger)] == ["start"], 20, "the job to start")
        os.kill(runner.pid, signal.SIGSTOP)
        # The job ends by itself (exit 0), then the lease expires on the server
        # while the runner is still stopped.
        wait_for(lambda: [r["phase"] for r in lines(ledger)] == ["start", "end"], 10, "the job to end")
        wait_for(lambda: not client.exists(lease), 10, "the lease to expire on the server")
    finally:
        os.kill(runner.pid, signal.SIGCONT)
    stderr = runner.communicate(timeout=30)[1]
    log = last_log(stderr)
    assert (runner.returncode, log["result"], log["exit_code"]) == (76, "lock_lost", 76), stderr
    assert log["lease_overrun_ms"] > 0
    assert "not running" in log["reason"] and "(0)" in log["reason"]
    values = _metrics(metrics / "dlock_paused.prom")
    assert values['dlock_runs_total{job="paused",result="lock_lost"}'] == 1
    assert values['dlock_runs_total{job="paused",result="success"}'] == 0
    assert values['dlock_lease_overrun_seconds{job="paused"}'] * 1000 >= log["lease_overrun_ms"] > 0


def test_an_unpaused_run_has_no_overrun(redis_server, unique_key, tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    result = run_dlock("run", "--job", "steady", "--key", unique_key, "--backend", redis_server.url, "--ttl", "2s",
                       "--metrics-dir", str(metrics), "--", *JOB, "phases", str(tmp_path / "ledger"), "0.1")
    log = last_log(result.stderr)
    assert (result.returncode, log["result"]) == (0, "success"), result.stderr
    assert "lease_overrun_ms" not in log
    assert _metrics(metrics / "dlock_steady.prom")['dlock_lease_overrun_seconds{job="steady"}'] == 0
