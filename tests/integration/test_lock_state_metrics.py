"""`dlock metrics`: the lock state of a node's jobs for node_exporter (what the
dlock_metrics role's timer runs), against a real Redis."""

import json
import re
import subprocess
import time

from runner_proc import run_dlock, start_dlock


def value(text, pattern):
    match = re.search(r"^%s (\S+)$" % pattern, text, re.M)
    assert match, "no sample %s in:\n%s" % (pattern, text)
    return float(match.group(1))


def promtool_clean(text):
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr


def node(tmp_path, backend_url, job):
    """A node's files: dlock.json, one job file, one timer every 5 minutes,
    and the node's mirror of the pauses."""
    for name in ("jobs", "units", "metrics", "pauses"):
        (tmp_path / name).mkdir()
    (tmp_path / "dlock.json").write_text(json.dumps({"backend": backend_url, "jobs_dir": str(tmp_path / "jobs"),
                                                     "metrics_dir": str(tmp_path / "metrics"),
                                                     "pauses_dir": str(tmp_path / "pauses")}))
    (tmp_path / "jobs" / (job + ".json")).write_text(json.dumps({"command": ["sleep", "30"], "ttl": "20s"}))
    (tmp_path / "units" / ("dlock-%s.timer" % job)).write_text("[Timer]\nOnCalendar=*:0/5\n")
    return ["--config", str(tmp_path / "dlock.json"), "--unit-dir", str(tmp_path / "units")]


def test_lock_state_of_a_held_lock_then_its_last_run(redis_server, unique_key, tmp_path):
    job = "job-" + unique_key[-6:]
    flags = node(tmp_path, redis_server.url, job)
    output = tmp_path / "metrics" / "dlock-lock-state.prom"
    holder = start_dlock("run", "--job", job, "--config", str(tmp_path / "dlock.json"))
    try:
        deadline = time.monotonic() + 10
        while '"held": true' not in run_dlock("status", "--job", job, "--json", flags[0], flags[1]).stdout:
            assert time.monotonic() < deadline, "the holder never took the lock"
            time.sleep(0.1)
        time.sleep(1)
        done = run_dlock("metrics", *flags)  # default output: METRICS_DIR/dlock-lock-state.prom
        assert done.returncode == 0, done.stderr
        text = output.read_text()
        labels = r'\{job="%s",key="%s"\}' % (job, job)
        assert value(text, "dlock_lock_state_held" + labels) == 1
        assert value(text, r'dlock_lock_state_holder_info\{holder="[^"]+",job="%s",key="%s"\}' % (job, job)) == 1
        assert 1 <= value(text, "dlock_lock_state_age_seconds" + labels) < 15
        assert 5 < value(text, "dlock_lock_state_ttl_remaining_seconds" + labels) <= 20
        assert value(text, r'dlock_job_schedule_period_seconds\{job="%s"\}' % job) == 300
        assert value(text, "dlock_lock_state_refresh_success") == 1
        assert value(text, "dlock_clock_check_safe") == 1
        promtool_clean(text)
    finally:
        holder.terminate()
        holder.wait(30)
    assert run_dlock("metrics", *flags).returncode == 0
    text = output.read_text()
    assert value(text, r'dlock_lock_state_held\{job="%s",key="%s"\}' % (job, job)) == 0
    assert value(text, r'dlock_lock_state_last_exit_code\{job="%s",key="%s"\}' % (job, job)) == 128 + 15
    assert time.time() - 30 < value(text, r'dlock_lock_state_last_run_timestamp_seconds\{job="%s",key="%s"\}'
                                    % (job, job)) <= time.time()
    promtool_clean(text)


def test_an_unreachable_backend_is_reported_in_the_file_and_the_exit_code(tmp_path):
    flags = node(tmp_path, "redis://127.0.0.1:9/0", "orphan")  # port 9 (discard): refused
    done = run_dlock("metrics", *flags, "--output", "-")
    assert done.returncode == 75 and "redis" in done.stderr
    assert value(done.stdout, "dlock_lock_state_refresh_success") == 0
    assert value(done.stdout, r'dlock_job_schedule_period_seconds\{job="orphan"\}') == 300  # from the job files
    assert "dlock_lock_state_held" not in done.stdout
    promtool_clean(done.stdout)


def test_metrics_without_an_output_is_a_configuration_error(redis_server, tmp_path):
    (tmp_path / "dlock.json").write_text(json.dumps({"backend": redis_server.url}))  # no metrics_dir
    done = run_dlock("metrics", "--config", str(tmp_path / "dlock.json"))
    assert done.returncode == 78 and "give --output FILE, or set metrics_dir" in done.stderr, done.stderr


def test_an_output_that_cannot_be_written_is_named_before_any_work(redis_server, tmp_path):
    """A directory, or a file in a directory that does not exist: a clear
    error naming it (exit 78), once a traceback (IsADirectoryError, exit 1)."""
    flags = node(tmp_path, redis_server.url, "nightly")
    for output, message in ((str(tmp_path / "metrics"), "is a directory; name the file to write"),
                            (str(tmp_path / "nowhere" / "x.prom"), "its directory %s does not exist"
                             % (tmp_path / "nowhere"))):
        done = run_dlock("metrics", *flags, "--output", output)
        assert done.returncode == 78, done.stderr
        assert "--output %s: %s" % (output, message) in done.stderr and "Traceback" not in done.stderr, done.stderr
    # metrics_dir (the default output's directory) is checked the same way.
    (tmp_path / "dlock.json").write_text(json.dumps({"backend": redis_server.url, "jobs_dir": str(tmp_path / "jobs"),
                                                     "metrics_dir": str(tmp_path / "gone")}))
    done = run_dlock("metrics", *flags)
    assert done.returncode == 78 and "metrics_dir %s/dlock-lock-state.prom: its directory" % (tmp_path / "gone") \
        in done.stderr, done.stderr


def test_a_job_file_that_does_not_load_hides_that_job_only(redis_server, unique_key, tmp_path):
    """One broken job file (hand-edited, or written for a newer runner) leaves
    the other jobs in `dlock status` and in the exported state, names itself
    on stderr, is exported as dlock_job_file_invalid, and makes status exit
    78 (a configuration error) so that a script notices."""
    job = "job-" + unique_key[-6:]
    flags = node(tmp_path, redis_server.url, job)
    (tmp_path / "jobs" / "broken.json").write_text(json.dumps({"command": ["true"], "ttl": "20s", "tll": "1m"}))
    done = run_dlock("metrics", *flags, "--output", "-")
    assert done.returncode == 0, done.stderr
    assert value(done.stdout, r'dlock_lock_state_held\{job="%s",key="%s"\}' % (job, job)) == 0
    assert value(done.stdout, r'dlock_job_file_invalid\{job="broken"\}') == 1
    assert not re.search(r'dlock_job_file_invalid\{job="%s"\}' % job, done.stdout)
    assert "dlock metrics: job broken left out: " in done.stderr and "tll" in done.stderr, done.stderr
    promtool_clean(done.stdout)
    shown = run_dlock("status", "--json", *flags[:2])
    assert shown.returncode == 78, shown.stderr
    assert [row["job"] for row in json.loads(shown.stdout)] == [job]
    assert "dlock status: job broken left out: " in shown.stderr, shown.stderr


def test_a_paused_job_exports_its_pause(redis_server, unique_key, tmp_path):
    job = "job-" + unique_key[-6:]
    flags = node(tmp_path, redis_server.url, job)
    paused = run_dlock("pause", "--job", job, "--reason", "drill", "--until", "1h", flags[0], flags[1])
    assert paused.returncode == 0, paused.stderr
    try:
        done = run_dlock("metrics", "--output", "-", *flags)
        assert done.returncode == 0, done.stderr
        labels = r'\{job="%s",key="%s"\}' % (job, job)
        assert value(done.stdout, "dlock_paused" + labels) == 1
        start = value(done.stdout, "dlock_pause_start_timestamp_seconds" + labels)
        assert abs(value(done.stdout, "dlock_pause_until_timestamp_seconds" + labels) - (start + 3600)) < 0.01
        assert abs(start - time.time()) < 60
        assert value(done.stdout, "dlock_pause_mirror_only" + labels) == 0
        promtool_clean(done.stdout)
    finally:
        assert run_dlock("resume", "--job", job, flags[0], flags[1]).returncode == 0
    done = run_dlock("metrics", "--output", "-", *flags)
    assert value(done.stdout, r'dlock_paused\{job="%s",key="%s"\}' % (job, job)) == 0
    assert "dlock_pause_until_timestamp_seconds{" not in done.stdout


def test_a_pause_the_backend_lost_is_exported_as_held_by_the_mirror_only(redis_server, unique_key, tmp_path):
    """The node's mirror keeps a pause the backend no longer has (here: the
    backend's pause key deleted, as a restart with no data would): the job
    is still paused, and dlock_pause_mirror_only says the backend lost it."""
    job = "job-" + unique_key[-6:]
    flags = node(tmp_path, redis_server.url, job)
    paused = run_dlock("pause", "--job", job, "--reason", "drill", "--until", "1h", flags[0], flags[1])
    assert paused.returncode == 0, paused.stderr
    assert (tmp_path / "pauses" / ("job:%s.pause" % job)).exists()
    assert redis_server.client().delete("dlock:{%s}:pause" % job) == 1
    done = run_dlock("metrics", "--output", "-", *flags)
    assert done.returncode == 0, done.stderr
    labels = r'\{job="%s",key="%s"\}' % (job, job)
    assert (value(done.stdout, "dlock_paused" + labels), value(done.stdout, "dlock_pause_mirror_only" + labels)) == (1, 1)
    promtool_clean(done.stdout)
    resumed = run_dlock("resume", "--job", job, flags[0], flags[1])
    assert resumed.returncode == 0 and "removed this node's mirror" in resumed.stdout, resumed.stderr
    done = run_dlock("metrics", "--output", "-", *flags)
    assert (value(done.stdout, "dlock_paused" + labels), value(done.stdout, "dlock_pause_mirror_only" + labels)) == (0, 0)
