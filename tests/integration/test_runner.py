"""The runner's guarantees, each against real backends, with real processes."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from runner_proc import last_log, lines, run_dlock, start_dlock, wait_for
from servers import signal_processes

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import open_backend

JOB = [sys.executable, os.path.join(os.path.dirname(__file__), "jobfixture.py")]


@pytest.fixture(params=["redis", "postgresql", "postgresql+advisory", "file"])
def every_backend(request, tmp_path):
    if request.param == "file":
        return "file://%s" % (tmp_path / "locks")
    if request.param == "redis":
        return request.getfixturevalue("redis_server").url
    return request.getfixturevalue("pg_server").url(scheme=request.param)


def _args(url, key, *extra):
    return ["run", "--job", "job-" + key[-6:], "--key", key, "--backend", url] + list(extra)


@pytest.mark.slow
def test_concurrent_runners_exactly_one_runs(every_backend, unique_key, tmp_path):
    ledger = str(tmp_path / "ledger")
    for round_no in range(6):
        key = "%s-r%d" % (unique_key, round_no)
        # min_hold keeps the round's lock after the fast job, so a runner that
        # starts late (2 cores, 5 interpreters) still finds it taken.
        procs = [start_dlock(*_args(every_backend, key, "--min-hold", "20s", "--", *JOB, "interval", ledger, "0.2"))
                 for _runner in range(5)]
        codes = sorted(p.wait(60) for p in procs)
        assert codes == [0, 73, 73, 73, 73], codes
    assert len(lines(ledger)) == 6


@pytest.mark.slow
def test_waiting_runners_never_overlap_and_fences_increase(every_backend, unique_key, tmp_path):
    ledger = str(tmp_path / "ledger")
    for _round in range(2):
        procs = [start_dlock(*_args(every_backend, unique_key, "--on-contention", "wait", "--wait-timeout", "60s",
                                    "--", *JOB, "interval", ledger, "0.15"))
                 for _runner in range(5)]
        assert [p.wait(90) for p in procs] == [0] * 5
    runs = sorted(lines(ledger), key=lambda r: r["start"])
    assert len(runs) == 10
    for before, after in zip(runs, runs[1:]):
        assert before["end"] <= after["start"], "two jobs overlapped: %r %r" % (before, after)
        assert after["fence"] > before["fence"]


@pytest.mark.slow
def test_sigkill_of_holder_lease_expires_and_next_fence_is_higher(every_backend, unique_key, tmp_path):
    beat = str(tmp_path / "beat")
    holder = start_dlock(*_args(every_backend, unique_key, "--ttl", "3s", "--", *JOB, "beat", beat))
    wait_for(lambda: len(lines(beat)) > 2, 20, "the holder's job to start")
    first_fence = open_backend(every_backend).query(unique_key).fence
    killed_at = time.time()
    holder.kill()
    holder.wait(10)
    time.sleep(0.3)
    count = len(lines(beat))
    time.sleep(0.3)
    assert len(lines(beat)) == count, "the job outlived its killed runner (PR_SET_PDEATHSIG)"
    ledger = str(tmp_path / "ledger")
    taker = run_dlock(*_args(every_backend, unique_key, "--on-contention", "wait", "--wait-timeout", "15s",
                             "--", *JOB, "interval", ledger, "0"))
    assert taker.returncode == 0, taker.stderr
    run = lines(ledger)[0]
    assert run["fence"] > first_fence
    log = last_log(taker.stderr)
    if not every_backend.startswith(("file:", "postgresql+advisory:")):
        # A server-side lease outlives its dead holder until the TTL runs out:
        # the taker found it held, then got it within the TTL (plus slack for
        # a loaded 2-core machine).
        assert log["attempt"] > 1
        assert log["wait_ms"] / 1000.0 < 3 + 3.0
    assert run["start"] > killed_at


def _beat_until_exit(proc, beat, timeout=30):
    code = proc.wait(timeout)
    last_beat = max(r["t"] for r in lines(beat))
    return code, last_beat


@pytest.mark.slow
def test_redis_frozen_job_is_killed_before_the_lease_expires(own_redis, unique_key, tmp_path):
    beat = str(tmp_path / "beat")
    holder = start_dlock(*_args(own_redis.url, unique_key, "--ttl", "3s", "--renew-every", "600ms",
                                "--kill-grace", "500ms", "--op-timeout", "300ms", "--", *JOB, "beat", beat))
    client = own_redis.client()
    lease = "dlock:{%s}:lease" % unique_key
    wait_for(lambda: len(lines(beat)) > 2, 20, "the job to start")
    # Freeze right after a renewal, so the expiry we read cannot move any more.
    wait_for(lambda: client.pttl(lease) > 2900, 5, "a fresh renewal")
    expires_at = time.time() + client.pttl(lease) / 1000.0
    own_redis.pause()
    try:
        code, last_beat = _beat_until_exit(holder, beat)
    finally:
        own_redis.resume()
    assert code == 76, holder.stderr.read()
    assert last_beat < expires_at, "job still ran %.3fs after its lease expired" % (last_beat - expires_at)
    log = last_log(holder.stderr.read())
    assert log["result"] == "lock_lost" and log["exit_code"] == 76
    # The job's end is its own field: the runner logged after its release,
    # which waited op_timeout (300ms) on the frozen server once the job was dead.
    assert log["duration_ms"] - log["job_ended_ms"] >= 250, log


@pytest.mark.slow
def test_postgres_frozen_job_is_killed_before_the_lease_expires(pg_server, unique_key, tmp_path):
    beat = str(tmp_path / "beat")
    holder = start_dlock(*_args(pg_server.url(), unique_key, "--ttl", "3s", "--renew-every", "600ms",
                                "--kill-grace", "500ms", "--op-timeout", "300ms", "--", *JOB, "beat", beat))
    wait_for(lambda: len(lines(beat)) > 2, 20, "the job to start")

    def remaining():
        rows = pg_server.sql("SELECT extract(epoch FROM expires_at - now())::float8 FROM dlock_lease "
                             "WHERE key = '%s'" % unique_key, db="dlock")
        return rows[0][0]
    wait_for(lambda: remaining() > 2.9, 5, "a fresh renewal")
    expires_at = time.time() + remaining()
    pids = pg_server.all_pids()
    signal_processes(pids, signal.SIGSTOP)
    try:
        code, last_beat = _beat_until_exit(holder, beat)
    finally:
        signal_processes(pids, signal.SIGCONT)
    assert code == 76
    assert last_beat < expires_at


@pytest.mark.slow
def test_advisory_session_killed_means_lock_lost(pg_server, unique_key, tmp_path):
    beat = str(tmp_path / "beat")
    holder = start_dlock(*_args(pg_server.url(scheme="postgresql+advisory"), unique_key, "--ttl", "3s",
                                "--", *JOB, "beat", beat))
    wait_for(lambda: len(lines(beat)) > 2, 20, "the job to start")
    for pid in pg_server.backend_pids():
        pg_server.sql("SELECT pg_terminate_backend(%d)" % pid)
    terminated_at = time.time()
    code, last_beat = _beat_until_exit(holder, beat)
    assert code == 76
    assert last_beat - terminated_at < 1.0 + 0.5 + 0.6  # renew_every (ttl/3) + kill_grace (ttl/5) + slack


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["redis", "postgresql"])
def test_paused_runner_is_fenced_off(kind, request, unique_key, tmp_path):
    url = request.getfixturevalue("redis_server").url if kind == "redis" else \
        request.getfixturevalue("pg_server").url()
    ledger = str(tmp_path / "fenced")
    a = start_dlock(*_args(url, unique_key, "--ttl", "2s", "--", *JOB, "fenced", ledger))
    wait_for(lambda: len(lines(ledger)) > 3, 20, "A's job to write")
    os.kill(a.pid, signal.SIGSTOP)  # the runner only: its job keeps writing
    try:
        b = start_dlock(*_args(url, unique_key, "--ttl", "2s", "--on-contention", "wait", "--wait-timeout", "20s",
                               "--", *JOB, "fenced", ledger))
        wait_for(lambda: any(r["writer"] != lines(ledger)[0]["writer"] for r in lines(ledger)), 20, "B to write")
        time.sleep(1.0)
    finally:
        os.kill(a.pid, signal.SIGCONT)
    assert a.wait(10) == 76
    b.send_signal(signal.SIGTERM)
    b.wait(10)
    records = lines(ledger)
    a_owner = records[0]["writer"]
    b_token = min(r["token"] for r in records if r["writer"] != a_owner)
    first_b = min(i for i, r in enumerate(records) if r["writer"] != a_owner)
    stale = [r for r in records[first_b:] if r["writer"] == a_owner]
    assert stale, "A's job wrote nothing after B took over: the test did not exercise fencing"
    assert all(not r["accepted"] for r in stale), "a stale write was accepted"
    assert b_token > records[0]["token"]
    accepted = [r["token"] for r in records if r["accepted"]]
    assert accepted == sorted(accepted)


def test_once_per_slot_runs_once(backend_url, unique_key, tmp_path):
    ledger = str(tmp_path / "ledger")
    # 1h slots: two runs 2s apart share a slot unless a slot edge (at :30 past
    # an hour boundary) falls between them; then both legitimately run.
    first = run_dlock(*_args(backend_url, unique_key, "--once-per", "1h", "--", *JOB, "interval", ledger, "0"))
    time.sleep(2)
    second = run_dlock(*_args(backend_url, unique_key, "--once-per", "1h", "--", *JOB, "interval", ledger, "0"))
    first_log, second_log = last_log(first.stderr), last_log(second.stderr)
    if first_log["slot"] != second_log["slot"]:
        pytest.skip("crossed a slot edge between the two runs")
    assert (first.returncode, second.returncode) == (0, 74)
    assert second_log["result"] == "skipped_duplicate"
    assert len(lines(ledger)) == 1
    assert lines(ledger)[0]["run_id"].startswith(first_log["job"] + "@")


def test_next_slot_runs_again(redis_server, unique_key, tmp_path):
    ledger = str(tmp_path / "ledger")
    args = _args(redis_server.url, unique_key, "--once-per", "2s", "--", *JOB, "interval", ledger, "0")
    assert run_dlock(*args).returncode == 0
    time.sleep(2.2)
    assert run_dlock(*args).returncode == 0
    ids = [r["run_id"] for r in lines(ledger)]
    assert len(ids) == 2 and ids[0] != ids[1]


def test_exit_status_environment_and_release(redis_server, unique_key, tmp_path):
    envfile = str(tmp_path / "env.json")
    ok = run_dlock(*_args(redis_server.url, unique_key, "--", *JOB, "env", envfile))
    assert ok.returncode == 0, ok.stderr
    env = json.load(open(envfile))
    log = last_log(ok.stderr)
    assert 0 < log["job_ended_ms"] <= log["duration_ms"]
    assert env["DLOCK_JOB"] == log["job"] and env["DLOCK_KEY"] == unique_key
    assert env["DLOCK_FENCING_TOKEN"] == str(log["fence"]) and env["DLOCK_OWNER"] == log["owner"]
    assert env["DLOCK_RUN_ID"] == "%s#%d" % (log["job"], log["fence"])
    assert open_backend(redis_server.url).query(unique_key).owner is None  # released
    assert run_dlock(*_args(redis_server.url, unique_key, "--", "sh", "-c", "exit 3")).returncode == 3
    assert run_dlock(*_args(redis_server.url, unique_key, "--", "sh", "-c", "kill -9 $$")).returncode == 137
    missing = run_dlock(*_args(redis_server.url, unique_key, "--", "/nonexistent/job"))
    assert missing.returncode == 127 and "cannot start" in last_log(missing.stderr)["error"]


def test_the_command_is_found_on_path_as_execvp_finds_it(tmp_path, unique_key):
    """The job's command is searched on its PATH in order: a file there that
    cannot be run is passed over for a later one that can, and is named
    (Permission denied, exit 127) when no later one exists."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "job").write_text("#!/bin/sh\nexit 5\n")  # mode 0644: cannot be run
    (second / "job").write_text("#!/bin/sh\nexit 6\n")
    (second / "job").chmod(0o755)
    url = "file://%s" % (tmp_path / "locks")
    path = "%s:%s:/usr/bin:/bin" % (first, second)
    found = run_dlock(*_args(url, unique_key, "--", "job"), env={"PATH": path})
    assert found.returncode == 6, found.stderr
    (second / "job").unlink()
    refused = run_dlock(*_args(url, unique_key, "--", "job"), env={"PATH": path})
    assert refused.returncode == 127
    assert last_log(refused.stderr)["error"] == "cannot start 'job': Permission denied"
    missing = run_dlock(*_args(url, unique_key, "--", "no-such-job"), env={"PATH": path})
    assert last_log(missing.stderr)["error"] == "cannot start 'no-such-job': No such file or directory"


def test_sigterm_is_forwarded_and_lock_released(redis_server, unique_key, tmp_path):
    marker = str(tmp_path / "term")
    proc = start_dlock(*_args(redis_server.url, unique_key, "--", *JOB, "trap", marker))
    wait_for(lambda: os.path.exists(marker) and open(marker).read() == "ready", 30, "the job's SIGTERM handler")
    assert open_backend(redis_server.url).query(unique_key).owner is not None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert open(marker).read() == "TERM"
    assert open_backend(redis_server.url).query(unique_key).owner is None


def test_max_runtime_terminates_the_job(redis_server, unique_key, tmp_path):
    marker = str(tmp_path / "term")
    started = time.monotonic()
    done = run_dlock(*_args(redis_server.url, unique_key, "--max-runtime", "1s", "--", *JOB, "trap", marker))
    assert 1.0 <= time.monotonic() - started < 5
    assert done.returncode == 124
    assert last_log(done.stderr)["result"] == "failed"
    assert open(marker).read() == "TERM"


def test_fail_closed_and_fail_open(unique_key, tmp_path):
    ledger = str(tmp_path / "ledger")
    args = _args("redis://127.0.0.1:1/0", unique_key, "--op-timeout", "300ms", "--", *JOB, "interval", ledger, "0")
    closed = run_dlock(*args)
    assert closed.returncode == 75 and last_log(closed.stderr)["result"] == "backend_error"
    assert not lines(ledger)
    split = args.index("--")
    opened = run_dlock(*(args[:split] + ["--fail-open"] + args[split:]))
    assert opened.returncode == 0
    log = last_log(opened.stderr)
    assert log["fail_open"] is True and "WITHOUT a lock" in log["warning"]
    assert len(lines(ledger)) == 1


def test_skewed_clock_is_refused(redis_server, unique_key, tmp_path):
    ledger = str(tmp_path / "ledger")
    env = {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1", "FAKETIME": "+30s",
           "FAKETIME_DONT_FAKE_MONOTONIC": "1", "DONT_FAKE_MONOTONIC": "1"}
    skewed = run_dlock(*_args(redis_server.url, unique_key, "--", *JOB, "interval", ledger, "0"), env=env)
    assert skewed.returncode == 77, skewed.stderr
    assert "clock unsafe" in last_log(skewed.stderr)["error"]
    assert not lines(ledger)
    check = run_dlock("check-clock", "--backend", redis_server.url, "--max-skew", "5s", env=env)
    assert check.returncode == 77 and "UNSAFE" in check.stdout
    good = run_dlock("check-clock", "--backend", redis_server.url, "--json")
    assert good.returncode == 0 and abs(json.loads(good.stdout)["offset_seconds"]) < 0.5


def test_status_and_force_release_fence_the_holder(redis_server, unique_key, tmp_path):
    beat = str(tmp_path / "beat")
    holder = start_dlock(*_args(redis_server.url, unique_key, "--ttl", "6s", "--", *JOB, "beat", beat))
    wait_for(lambda: len(lines(beat)) > 2, 20, "the job to start")
    status = run_dlock("status", "--key", unique_key, "--backend", redis_server.url, "--json")
    row = json.loads(status.stdout)[0]
    assert row["held"] and row["owner"].split(":")[0] and 0 < row["ttl_remaining"] <= 6
    table = run_dlock("status", "--key", unique_key, "--backend", redis_server.url)
    assert unique_key in table.stdout and "HOLDER" in table.stdout
    no_reason = run_dlock("release", "--key", unique_key, "--backend", redis_server.url, "--force")
    assert no_reason.returncode == 78
    broke = run_dlock("release", "--key", unique_key, "--backend", redis_server.url, "--force",
                      "--reason", "test: holder is stuck")
    assert broke.returncode == 0 and row["owner"] in broke.stdout
    assert json.loads(broke.stderr)["reason"] == "test: holder is stuck"
    assert holder.wait(10) == 76  # its next renew finds the lease gone


def test_metrics_are_written_atomically_and_pass_promtool(redis_server, unique_key, tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    for command in (["true"], ["false"], ["true"]):
        run_dlock(*_args(redis_server.url, unique_key, "--metrics-dir", str(metrics), "--", *command))
    files = os.listdir(metrics)
    assert len(files) == 1 and files[0].endswith(".prom")
    text = (metrics / files[0]).read_text()
    job = "job-" + unique_key[-6:]
    assert 'dlock_runs_total{job="%s",result="success"} 2' % job in text
    assert 'dlock_runs_total{job="%s",result="failed"} 1' % job in text
    assert 'dlock_lock_held{job="%s"} 0' % job in text
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                           check=False)
    assert check.returncode == 0, check.stdout + check.stderr
