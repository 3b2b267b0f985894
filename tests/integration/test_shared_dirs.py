"""What lies in a file:// lock directory, or in the metrics directory, is
not trusted.

Either directory may be shared by the jobs of several users (the lock must be
one for all of them). Whatever one of them plants there (a FIFO, a symbolic
link to a file of root's, a state file of other types) must neither hang a
runner, nor make it write through a link, nor crash it: the run fails
closed (75) naming the file, or, for a state file dlock did not write, the
key starts over as before any grant.
"""

import fcntl
import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import open_backend, pause_scopes
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import BackendError
from runner_proc import last_log, run_dlock

import pytest

KEY = "k"


def dlock_run(directory, marker):
    """`dlock run` of a job that leaves `marker` behind, on file://directory."""
    return run_dlock("run", "--job", KEY, "--backend", "file://%s" % directory, "--", "touch", str(marker),
                     timeout=30)


@pytest.mark.parametrize("name", ["k.json", "k.lock"])
def test_a_fifo_in_the_lock_directory_fails_the_run_at_once(tmp_path, name):
    locks = tmp_path / "locks"
    locks.mkdir()
    os.mkfifo(str(locks / name))
    marker = tmp_path / "ran"
    run = dlock_run(locks, marker)  # hung for ever on k.json before (timeout: 30 s)
    assert run.returncode == 75, run.stderr
    record = last_log(run.stderr)
    assert record["result"] == "backend_error"
    assert "is not a regular file" in record["error"] and str(locks / name) in record["error"], record
    assert not marker.exists()
    assert stat.S_ISFIFO(os.stat(str(locks / name)).st_mode)
    status = run_dlock("status", "--key", KEY, "--backend", "file://%s" % locks, timeout=30)
    assert status.returncode == 75 and "is not a regular file" in status.stderr, status.stdout + status.stderr


@pytest.mark.parametrize("name", ["k.json", "k.lock"])
def test_a_link_in_the_lock_directory_is_never_followed(tmp_path, name):
    locks = tmp_path / "locks"
    locks.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.symlink(str(victim), str(locks / name))
    marker = tmp_path / "ran"
    run = dlock_run(locks, marker)
    assert run.returncode == 75, run.stderr
    assert "is a symbolic link" in last_log(run.stderr)["error"]
    assert not marker.exists()
    assert victim.read_text() == "precious\n"
    assert os.path.islink(str(locks / name))


@pytest.mark.parametrize("name", ["_pause.lock", "all.pause", "job:k.pause"])
@pytest.mark.parametrize("planted", ["a FIFO", "a link"])
def test_a_fifo_or_a_link_at_a_pause_file_fails_the_run_at_once(tmp_path, name, planted):
    """The pauses a grant reads (the key's, every key's) and the lock that
    orders them with pauses: the run fails closed naming the file."""
    locks = tmp_path / "locks"
    locks.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    if planted == "a FIFO":
        os.mkfifo(str(locks / name))
    else:
        os.symlink(str(victim), str(locks / name))
    marker = tmp_path / "ran"
    run = dlock_run(locks, marker)
    assert run.returncode == 75, run.stderr
    error = last_log(run.stderr)["error"]
    assert ("is not a regular file" if planted == "a FIFO" else "is a symbolic link") in error, error
    assert str(locks / name) in error and not marker.exists() and victim.read_text() == "precious\n"


def test_the_pause_lock_one_user_made_is_taken_by_anothers_grants(tmp_path):
    """Every grant takes _pause.lock, whichever user made it: readable by
    all even where its maker's umask would have kept it private."""
    shared = tempfile.mkdtemp(prefix="dlock-shared-", dir="/tmp")  # tmp_path is root's alone
    try:
        os.chmod(shared, 0o1777)
        old_umask = os.umask(0o077)
        try:
            backend = open_backend("file://%s" % shared)
            assert backend.acquire("root-job", "owner-a", 5, None, pause_scopes("root-job")).granted
            backend.close()
        finally:
            os.umask(old_umask)
        child = os.fork()
        if child == 0:  # a runner of another user, on a key of its own
            code = 1
            try:
                nobody = pwd.getpwnam("nobody")
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
                other = open_backend("file://%s" % shared)
                code = 0 if other.acquire("its-job", "owner-b", 5, None, pause_scopes("its-job")).granted else 2
            finally:
                os._exit(code)
        assert os.waitpid(child, 0)[1] == 0
    finally:
        shutil.rmtree(shared)


def test_a_link_planted_at_the_old_temporary_name_is_not_written_through(tmp_path):
    """The state used to be written to KEY.json.PID.tmp, opened with
    O_TRUNC: a link planted at the next pids' names made a root runner
    overwrite the link's target. Here the pid is known (this process)."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.symlink(str(victim), str(tmp_path / ("%s.json.%d.tmp" % (KEY, os.getpid()))))
    backend = open_backend("file://%s" % tmp_path)
    try:
        grant = backend.acquire(KEY, "owner-a", 5)
        assert grant.granted and grant.fence == 1
        assert backend.release(KEY, "owner-a")
    finally:
        backend.close()
    assert victim.read_text() == "precious\n"
    assert json.loads((tmp_path / "k.json").read_text())["fence"] == 1
    assert not [name for name in os.listdir(str(tmp_path)) if name.endswith(".tmp") and not os.path.islink(
        str(tmp_path / name))], "a temporary file was left behind"


@pytest.fixture
def immutable(tmp_path):
    """A lock directory in which nothing can be created, root included
    (chattr +i; root bypasses permissions): the state cannot be written."""
    locks = tmp_path / "locks"
    locks.mkdir()
    backend = open_backend("file://%s" % locks)
    assert backend.acquire(KEY, "owner-a", 5).granted and backend.release(KEY, "owner-a")
    backend.close()
    subprocess.run(["chattr", "+i", str(locks)], check=True)
    yield locks
    subprocess.run(["chattr", "-i", str(locks)], check=True)


def test_a_failed_write_of_the_state_fails_closed_and_holds_nothing(immutable):
    before = (immutable / "k.json").read_text()
    backend = open_backend("file://%s" % immutable)
    try:
        with pytest.raises(BackendError, match="cannot write"):
            backend.acquire(KEY, "owner-b", 5)
        assert backend.query(KEY).owner is None
        assert not backend.release(KEY, "owner-b")
    finally:
        backend.close()
    other = open_backend("file://%s" % immutable)  # the flock was let go: another runner gets that far too
    try:
        with pytest.raises(BackendError, match="cannot write"):
            other.acquire(KEY, "owner-c", 5)
    finally:
        other.close()
    assert (immutable / "k.json").read_text() == before
    assert sorted(os.listdir(str(immutable))) == ["_pause.lock", "k.json", "k.lock"]


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=8)
STATE = st.fixed_dictionaries({}, optional={"fence": JSON, "owner": JSON, "acquired_at": JSON, "hold_until": JSON,
                                            "slot": JSON, "last": JSON})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(state=st.one_of(JSON, STATE))
def test_any_state_file_gives_a_grant_with_a_whole_fence(tmp_path, state):
    """Whatever JSON k.json holds (written by hand, or by someone else), a
    grant comes with a whole number as its fence, above the file's own when
    that one is sane, and the run's record is written back in dlock's form."""
    (tmp_path / "k.json").write_text(json.dumps(state))
    backend = open_backend("file://%s" % tmp_path)
    try:
        grant = backend.acquire(KEY, "owner-a", 5)
        if grant.status == "locked":  # a sane state whose min_hold (hold_until) is still ahead
            assert state["hold_until"] > 0 and grant.holder.owner == state.get("owner")
            return
        assert grant.granted, grant.status
        assert backend.release(KEY, "owner-a", last={"result": "success"})
    finally:
        backend.close()
    assert isinstance(grant.fence, int) and not isinstance(grant.fence, bool) and grant.fence >= 1
    old = state.get("fence") if isinstance(state, dict) else None
    if grant.fence != 1:  # the file's own fence was kept: it was a whole number, and this grant's is the next
        assert isinstance(old, int) and not isinstance(old, bool) and grant.fence == old + 1
    written = json.loads((tmp_path / "k.json").read_text())
    assert written["fence"] == grant.fence and written["last"] == {"result": "success"}


# -- the metrics directory (2775 root:dlock: every job's user writes there) --------------
def metrics_run(tmp_path, metrics):
    """A file:// run of job k that writes its metrics to `metrics`."""
    return run_dlock("run", "--job", KEY, "--backend", "file://%s" % (tmp_path / "locks"), "--metrics-dir",
                     str(metrics), "--", "true", timeout=30)


def successes(metrics):
    text = (metrics / ("dlock_%s.prom" % KEY)).read_text()
    return [line for line in text.splitlines() if line.startswith('dlock_runs_total{job="k",result="success"}')]


def test_a_fifo_at_the_metrics_file_neither_hangs_nor_stops_the_run(tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    os.mkfifo(str(metrics / "dlock_k.prom"))
    run = metrics_run(tmp_path, metrics)  # hung for ever before, reading the FIFO (timeout: 30 s)
    assert run.returncode == 0, run.stderr
    assert last_log(run.stderr)["result"] == "success"
    assert stat.S_ISREG(os.stat(str(metrics / "dlock_k.prom")).st_mode)  # replaced by the rename
    assert successes(metrics) == ['dlock_runs_total{job="k",result="success"} 1']


def test_a_link_at_the_metrics_file_is_replaced_not_followed(tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    victim = tmp_path / "victim"
    victim.write_text('dlock_runs_total{job="k",result="success"} 41\n')
    victim.chmod(0o600)
    os.symlink(str(victim), str(metrics / "dlock_k.prom"))
    run = metrics_run(tmp_path, metrics)
    assert run.returncode == 0, run.stderr
    assert victim.read_text() == 'dlock_runs_total{job="k",result="success"} 41\n'
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert not os.path.islink(str(metrics / "dlock_k.prom"))
    assert successes(metrics) == ['dlock_runs_total{job="k",result="success"} 1']  # not carried over from the link


def test_links_planted_at_the_old_temporary_names_are_not_written_through(tmp_path):
    """The metrics used to be written to dlock_JOB.prom.PID.tmp (O_TRUNC),
    then chmod 0644 by path: a job's user who planted links at the next pids'
    names had a root runner overwrite a file of root's and make it readable
    by all. Links for a whole range of pids here (ours are not predictable
    in a test), and a run after each of a few runs."""
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    victim.chmod(0o600)
    with open("/proc/sys/kernel/ns_last_pid") as handle:
        last = int(handle.read())
    for pid in range(last, last + 400):
        os.symlink(str(victim), str(metrics / ("dlock_k.prom.%d.tmp" % pid)))
    for _run in range(3):
        run = metrics_run(tmp_path, metrics)
        assert run.returncode == 0, run.stderr
    assert victim.read_text() == "precious\n" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert successes(metrics) == ['dlock_runs_total{job="k",result="success"} 3']


def test_a_metrics_directory_locked_by_someone_else_holds_up_no_run(tmp_path):
    """Anyone who can open the directory can flock it; the run waits for
    that lock a bounded time, says so in a log line, and goes on."""
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    holder = os.open(str(metrics), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        run = metrics_run(tmp_path, metrics)
    finally:
        os.close(holder)
    assert run.returncode == 0, run.stderr
    records = [json.loads(line) for line in run.stderr.splitlines() if line.startswith("{")]
    # Two tries to write (at the grant, at the end), each given up after its bound.
    assert [r["result"] for r in records] == ["metrics_error", "success", "metrics_error"], run.stderr
    assert all("held by another process for over 2s" in records[n]["error"] for n in (0, 2)), run.stderr
    assert not os.path.exists(str(metrics / "dlock_k.prom"))
