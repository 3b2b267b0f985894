"""Containment: nothing of a job outlives its runner, however the runner ends.

The jobs are the `sh -c` form of docs/runner.md (Containment): one whose shell forks a
grandchild (a background process beside the foreground one), and one that
double-forks out of the job's session (`setsid` in a subshell that exits, so
the escaped process is an orphan in a session of its own). Every process of
the tree appends {"pid", "t"} to a ledger; once the runner is SIGKILLed, each
pid that wrote must be gone and the ledger must stop growing.

Both containments run on this host: the cgroup v2 of the job's own where the
runner may make one (root on a cgroup2 mount), and the guard alone
(DLOCK_CGROUP=off), which is what runs where no cgroup can be made.
"""

import os
import signal
import sys
import time

import pytest

from runner_proc import last_log, lines, run_dlock, start_dlock, wait_for
from test_pg_stopped_server import _server_process_of

JOB = "%s %s" % (sys.executable, os.path.join(os.path.dirname(__file__), "jobfixture.py"))
# sh -c scripts; L is the ledger. Each leaves two writers running.
SCRIPTS = {
    "grandchild": "{job} pidbeat {L} & {job} pidbeat {L}",
    "double-fork": "(setsid {job} pidbeat {L} &); {job} pidbeat {L}",
}


sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "plugins", "module_utils"))
from dlock.backends.pg_advisory import _holder_pids  # noqa: E402  (needs the path above)
from dlock import child  # noqa: E402  (needs the path above)
from dlock.child import _own_cgroup, make_cgroup, remove_cgroup  # noqa: E402  (needs the path above)


def _cgroup_possible():
    path = make_cgroup()
    if path:
        remove_cgroup(path)
    return path is not None


CONTAINMENTS = [pytest.param("cgroup", marks=pytest.mark.skipif(not _cgroup_possible(), reason="no cgroup v2 to make here")),
                "guard"]


def _alive(pid):
    """True while pid exists and is not a zombie (a zombie writes nothing)."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (IOError, OSError):
        return False


def _job_cgroup(runner_pid):
    """The cgroup the runner (our child: same cgroup as us) made for its job."""
    return os.path.join(_own_cgroup() or "/nonexistent", "dlock-job-%d" % runner_pid)


def _env(containment):
    return {"DLOCK_CGROUP": "off"} if containment == "guard" else {}


def _backend(kind, request, tmp_path):
    return request.getfixturevalue("redis_server").url if kind == "redis" else "file://%s" % (tmp_path / "locks")


@pytest.mark.parametrize("containment", CONTAINMENTS)
@pytest.mark.parametrize("script", sorted(SCRIPTS))
@pytest.mark.parametrize("kind", ["file", "redis"])
def test_sigkill_of_the_runner_ends_the_whole_job(kind, script, containment, request, unique_key, tmp_path):
    ledger = str(tmp_path / "ledger")
    command = SCRIPTS[script].format(job=JOB, L=ledger)
    runner = start_dlock("run", "--job", "contain", "--key", unique_key, "--backend", _backend(kind, request, tmp_path), "--ttl", "30s",
                         "--", "/bin/sh", "-c", command, env=_env(containment))
    try:
        wait_for(lambda: len(set(r["pid"] for r in lines(ledger))) == 2 or runner.poll() is not None, 20,
                 "both processes of the job to write")
        assert runner.poll() is None, runner.communicate()[1]
        pids = set(r["pid"] for r in lines(ledger))
        if containment == "cgroup":
            assert os.path.isdir(_job_cgroup(runner.pid))
        assert all(_alive(pid) for pid in pids)
        if script == "double-fork":  # the escape did happen: one writer is in a session of its own
            assert len(set(os.getsid(pid) for pid in pids)) == 2
        runner.send_signal(signal.SIGKILL)
        runner.wait(10)
        wait_for(lambda: not any(_alive(pid) for pid in pids), 10, "every process of the job to end")
        killed_at, written = time.time(), len(lines(ledger))
        # Two more beats of the writers' 20ms period: the ledger no longer grows.
        wait_for(lambda: time.time() > killed_at + 0.1, 1, "100ms")
        assert len(lines(ledger)) == written
        assert max(r["t"] for r in lines(ledger)) < killed_at
        assert set(r["pid"] for r in lines(ledger)) == pids
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(10)
    # The guard removes the job's cgroup once it is empty.
    wait_for(lambda: not os.path.exists(_job_cgroup(runner.pid)), 5, "the job's cgroup to be removed")


@pytest.mark.parametrize("containment", CONTAINMENTS)
def test_what_a_finished_job_left_behind_is_killed_and_reported(containment, unique_key, tmp_path):
    ledger = str(tmp_path / "ledger")
    # The job ends once the process it left behind has written (CI: under
    # load, a fixed 0.3 s once ended it before that process had started).
    command = "(setsid {job} pidbeat {L} &); {job} until {L} 20".format(job=JOB, L=ledger)
    runner = start_dlock("run", "--job", "contain", "--backend", "file://%s" % (tmp_path / "locks"),
                         "--", "/bin/sh", "-c", command, env=_env(containment))
    stderr = runner.communicate(timeout=30)[1]
    log = last_log(stderr)
    assert (runner.returncode, log["result"]) == (0, "success"), stderr
    assert log["containment"] == containment
    assert log["leftovers"] == "killed 1 remaining process(es) of the job"
    pids = set(r["pid"] for r in lines(ledger))
    assert len(pids) == 1 and not any(_alive(pid) for pid in pids)
    assert not os.path.exists(_job_cgroup(runner.pid))


def _children(pid):
    with open("/proc/%d/task/%d/children" % (pid, pid)) as handle:
        return [int(word) for word in handle.read().split()]


@pytest.mark.parametrize("containment,script", [
    pytest.param("cgroup", "double-fork", marks=CONTAINMENTS[0].marks),
    pytest.param("cgroup", "grandchild", marks=CONTAINMENTS[0].marks),
    ("guard", "grandchild"),
])
def test_a_killed_guard_leaves_the_runner_to_end_the_job(containment, script, unique_key, tmp_path):
    """Without the guard, the runner kills the job's process group, and the
    job's cgroup where there is one (a setsid escape without a cgroup is the
    case docs/runner.md lists as not covered)."""
    ledger = str(tmp_path / "ledger")
    runner = start_dlock("run", "--job", "contain", "--key", unique_key, "--backend", "file://%s" % (tmp_path / "locks"),
                         "--", "/bin/sh", "-c", SCRIPTS[script].format(job=JOB, L=ledger), env=_env(containment))
    try:
        wait_for(lambda: len(set(r["pid"] for r in lines(ledger))) == 2 or runner.poll() is not None, 20,
                 "both processes of the job to write")
        pids = set(r["pid"] for r in lines(ledger))
        (guard,) = _children(runner.pid)
        os.kill(guard, signal.SIGKILL)
        stderr = runner.communicate(timeout=30)[1]
        wait_for(lambda: not any(_alive(pid) for pid in pids), 10, "every process of the job to end")
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(10)
    log = last_log(stderr)
    assert (runner.returncode, log["result"]) == (137, "failed"), stderr
    assert "guard" in log["guard"] and "died" in log["guard"]
    assert not os.path.exists(_job_cgroup(runner.pid))


@pytest.mark.parametrize("value", ["of", "OFF", "false", "", "off\n", "auto ", " off", "0"])
def test_a_bad_dlock_cgroup_is_refused_before_anything_runs(value, tmp_path):
    """DLOCK_CGROUP is auto or off: anything else (a typo that would quietly
    leave the job's tree less contained) is a configuration error that names
    the variable, before the backend is asked and before the job starts."""
    marker = tmp_path / "ran"
    done = run_dlock("run", "--job", "contain", "--backend", "file://%s" % (tmp_path / "locks"),
                     "--", "/bin/sh", "-c", "touch %s" % marker, env={"DLOCK_CGROUP": value})
    assert done.returncode == 78, done.stderr
    assert "DLOCK_CGROUP" in done.stderr and "auto, off" in done.stderr, done.stderr
    assert not marker.exists()
    assert not (tmp_path / "locks").exists() or not os.listdir(str(tmp_path / "locks"))


def _holder_then_waiter(locks, key, tmp_path, holder_job, holder_options=(), env=None):
    """Holder A (dlock run `holder_options`), its job the jobfixture mode
    `holder_job` writing into tmp_path/a; once that job wrote, waiter B on the
    same key (it waits; its job writes its start into tmp_path/b). Returns
    (A, B, ledger_a, ledger_b); A is killed if B cannot be started."""
    ledger_a, ledger_b = str(tmp_path / "a"), str(tmp_path / "b")
    holder = start_dlock("run", "--job", "holder", "--key", key, "--backend", locks, *holder_options,
                         "--", *JOB.split(), holder_job, ledger_a, env=env)
    try:
        wait_for(lambda: lines(ledger_a) or holder.poll() is not None, 20, "the holder's job to write")
        assert holder.poll() is None, holder.communicate()[1]
        waiter = start_dlock("run", "--job", "waiter", "--key", key, "--backend", locks,
                             "--on-contention", "wait", "--wait-timeout", "60s",
                             "--", *JOB.split(), "interval", ledger_b, "0", env=env)
    except BaseException:
        holder.kill()
        holder.wait(10)
        raise
    return holder, waiter, ledger_a, ledger_b


def _a_dead_holders_lock_waits_for_its_job(locks, containment, key, tmp_path, beats, while_stopped=lambda: None):
    """Holder A runs a job that beats into a ledger, waiter B waits on the
    same key; A's guard is stopped, A SIGKILLed. B's job must not start while
    A's job writes on (`beats` more beats, of 20 ms each: longer than B takes
    to look again), and once the guard is resumed B runs, after A's last
    write. while_stopped() looks at the backend meanwhile."""
    holder, waiter, ledger_a, ledger_b = _holder_then_waiter(locks, key, tmp_path, "pidbeat", env=_env(containment))
    guard = None
    try:
        # The waiter's guard is forked first thing: it is starting, then asks again and again.
        wait_for(lambda: waiter.poll() is not None or _children(waiter.pid), 20, "the waiter to start")
        (guard,) = _children(holder.pid)
        os.kill(guard, signal.SIGSTOP)
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        # While the guard is stopped, the holder's job runs on, and the
        # waiter, alive and asking, got nothing.
        written = len(lines(ledger_a))
        wait_for(lambda: len(lines(ledger_a)) >= written + beats or os.path.exists(ledger_b), 20,
                 "the holder's job to write on")
        assert not os.path.exists(ledger_b), "the waiter's job ran while the dead holder's job still ran"
        assert waiter.poll() is None, waiter.communicate()[1]
        while_stopped()
        os.kill(guard, signal.SIGCONT)
        stderr = waiter.communicate(timeout=30)[1]
    finally:
        if guard is not None and _alive(guard):
            os.kill(guard, signal.SIGCONT)  # it ends the job, whatever failed here
        for runner in (holder, waiter):
            if runner.poll() is None:
                runner.kill()
                runner.wait(10)
    assert (waiter.returncode, last_log(stderr)["result"]) == (0, "success"), stderr
    wait_for(lambda: not any(_alive(r["pid"]) for r in lines(ledger_a)), 10, "the holder's job to end")
    (started,) = lines(ledger_b)
    assert max(r["t"] for r in lines(ledger_a)) < started["start"]
    # The waiter's release freed the lock at once: no guard holds it any more.
    again = run_dlock("run", "--job", "after", "--key", key, "--backend", locks, "--", "true")
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize("containment", CONTAINMENTS)
def test_a_file_lock_outlives_a_sigkilled_runner_until_its_job_is_dead(containment, unique_key, tmp_path):
    """flock(2) goes with the last descriptor of its open file. It was the
    runner's alone: SIGKILLed, its lock was free at once, and a waiting
    runner started its job while the dead runner's job still ran, for as
    long as the guard took to see the end and kill it (tens of ms, more on a
    loaded host). The guard, stopped here, now holds a copy of the lock's
    descriptor until it has killed the job. The waiter tries every 10 ms: 50
    beats (1 s) leave it ample time."""
    _a_dead_holders_lock_waits_for_its_job("file://%s" % (tmp_path / "locks"), containment, unique_key, tmp_path, 50)


@pytest.mark.parametrize("containment", CONTAINMENTS)
def test_an_advisory_lock_outlives_a_sigkilled_runner_until_its_job_is_dead(containment, pg_server, unique_key, tmp_path):
    """A session's advisory lock goes with the session, which the server ends
    when the connection closes, and the kernel closes it with the last
    descriptor of its socket. That was the runner's alone: SIGKILLed, its
    lock was free at once, as with file://. The guard, stopped here, now
    holds a copy of the socket: the dead runner's session keeps the lock
    until the guard has killed the job. The waiter is woken by no release
    (nobody unlocked) and looks again at least every TICKET_REFRESH (1 s):
    150 beats (3 s) leave it two looks."""
    def the_dead_runners_session_holds_the_lock():
        with pg_server.connect() as conn:
            assert len(_holder_pids(conn, unique_key)) == 1
    _a_dead_holders_lock_waits_for_its_job(pg_server.url(scheme="postgresql+advisory"), containment, unique_key,
                                           tmp_path, 150, the_dead_runners_session_holds_the_lock)


ADVISORY_KILL_GRACE = 2.0


def test_an_advisory_lock_outlives_a_failed_renewal_until_its_job_is_dead(pg_server, unique_key, tmp_path):
    """A renewal that fails fences the job, but the session, and the lock
    with it, must last until the job is dead. The runner closed the lock's
    connection at once: its close sends Terminate on the socket (the guard's
    copy keeps the socket, not the session), so the lock was free while the
    runner still stopped its job for kill_grace. Here the holder's server
    process is stopped: its renewal gets no answer within op_timeout (the
    lock is lost: SIGTERM to a job that ignores it); the process is resumed
    at once, the session alive. The waiter, in line, looks again at least
    every TICKET_REFRESH (1 s) and must not start before the holder's job's
    last write, kill_grace later."""
    holder, waiter, ledger_a, ledger_b = _holder_then_waiter(
        pg_server.url(scheme="postgresql+advisory"), unique_key, tmp_path, "stubborn",
        ("--ttl", "20s", "--renew-every", "500ms", "--op-timeout", "500ms", "--kill-grace", "%gs" % ADVISORY_KILL_GRACE))
    stopped = None
    try:
        def in_line():
            with pg_server.connect() as conn:
                return conn.execute("SELECT count(*) FROM dlock_wait WHERE key = %s", (unique_key,)).fetchone()[0]
        wait_for(lambda: in_line() or waiter.poll() is not None, 20, "the waiter to join the line")
        stopped = _server_process_of(pg_server, holder.pid)
        os.kill(stopped, signal.SIGSTOP)
        wait_for(lambda: any("term" in r for r in lines(ledger_a)) or holder.poll() is not None, 20,
                 "the holder's job's SIGTERM (its renewal got no answer)")
        termed = time.monotonic()
        os.kill(stopped, signal.SIGCONT)
        stopped = None
        holder_stderr = holder.communicate(timeout=ADVISORY_KILL_GRACE + 20)[1]
        ended = time.monotonic() - termed
        waiter_stderr = waiter.communicate(timeout=30)[1]
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        for runner in (holder, waiter):
            if runner.poll() is None:
                runner.kill()
                runner.wait(10)
    log = last_log(holder_stderr)
    assert (holder.returncode, log["result"]) == (76, "lock_lost"), holder_stderr
    assert "renew got no answer within op_timeout" in log["reason"], log
    # kill_grace, then the guard's report and a release that does not wait on the server.
    assert ended < ADVISORY_KILL_GRACE + 1.5, "the holder ended %.1fs after its job's SIGTERM" % ended
    assert (waiter.returncode, last_log(waiter_stderr)["result"]) == (0, "success"), waiter_stderr
    (started,) = lines(ledger_b)
    last_write = max(r.get("t", r.get("term")) for r in lines(ledger_a))
    assert last_write < started["start"], \
        "the waiter's job started %.2fs before the holder's job's last write" % (last_write - started["start"])


def _exists(pid):
    """True while pid is in the process table, a zombie included."""
    return os.path.exists("/proc/%d" % pid)


def test_the_guards_report_ends_the_wait_not_its_exit(monkeypatch):
    """Child.wait returns once the guard has reported the job's end (nothing
    of the job is left then), not once the guard has exited: its exit would
    stand between the job's end and the release. A guard still exiting is
    reaped by a later close() of the same process: it never stays a zombie
    behind the next run. The fault: a guard that lingers 3 s after its report."""
    send = child._send

    def linger_after_the_report(fd, text):
        send(fd, text)
        if text.startswith("exit "):
            time.sleep(3)
    monkeypatch.setattr(child, "_send", linger_after_the_report)
    job = child.Child(["true"], dict(os.environ), cgroup=False)  # the guard is forked with the fault
    monkeypatch.setattr(child, "_send", send)
    code = None
    while code is None:
        code = job.wait(10)
    assert code == 0
    assert _alive(job.pid), "the wait ended only once the guard had exited"
    job.close()
    assert job.pid in child._EXITING_GUARDS
    wait_for(lambda: not _alive(job.pid), 10, "the guard's exit")
    assert _exists(job.pid)  # a zombie until a close() reaps it
    other = child.Child(["true"], dict(os.environ), cgroup=False)
    while other.wait(10) is None:
        pass
    other.close()
    assert job.pid not in child._EXITING_GUARDS and not _exists(job.pid)
    wait_for(lambda: not _alive(other.pid), 10, "the second guard's exit")
    child.reap_exited()
    assert not child._EXITING_GUARDS
