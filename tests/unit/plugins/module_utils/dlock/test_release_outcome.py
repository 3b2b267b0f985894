"""What becomes of the lease after the job does not change what the run was.

A release that fails, or whose outcome is unknown (a PostgreSQL commit not
known to be replicated, an answer lost), leaves the run's result and exit
code as the job made them; the lease then expires by itself. The release's
outcome is a field of its own in the log line, and a release the backend
did not confirm is counted in the job's metrics.

The backend is file:// (a real lock), with its release replaced where the
test needs an outcome the file backend never has.
"""

import io
import json
import sys
import threading

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import runner
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import open_backend
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.pg_session import CommitUnknown
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.redis_lease import NoAnswer
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.config import load_settings
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import BackendError

JOB = "nightly"
UNREPLICATED = ("postgresql: the commit is not known to be replicated to a synchronous standby: canceling wait "
                "for synchronous replication due to user request (The transaction has already committed locally, "
                "but might not have been replicated to the standby.)")


class ReleaseAs(object):
    """The backend, whose release does the real one and then answers with
    `outcome`: an exception to raise, or what to return."""

    def __init__(self, backend, outcome):
        self._backend = backend
        self._outcome = outcome

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def release(self, *args, **kwargs):
        self._backend.release(*args, **kwargs)
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return self._outcome


@pytest.fixture
def run(tmp_path, monkeypatch):
    """run(status, outcome): one `dlock run` of a job that exits with
    `status`, on a file:// lock whose release answers with `outcome` (None:
    the real release); (exit code, log line, metrics text). `source`: the
    job's Python code instead; `options`: more settings; `wrap`: the
    backend's wrapper instead of ReleaseAs."""
    monkeypatch.setenv("DLOCK_CGROUP", "off")  # no cgroup to make: the guard alone
    config = tmp_path / "dlock.json"
    config.write_text("{}")
    (tmp_path / "lock").mkdir()
    (tmp_path / "metrics").mkdir()

    def run_once(status=0, outcome=None, source=None, options=None, wrap=None):
        if wrap is None and outcome is not None:
            def wrap(backend):
                return ReleaseAs(backend, outcome)
        monkeypatch.setattr(runner, "open_backend", open_backend if wrap is None else
                            lambda *args: wrap(open_backend(*args)))
        flags = dict({"config": str(config), "jobs_dir": str(tmp_path), "backend": "file://%s" % (tmp_path / "lock"),
                      "metrics_dir": str(tmp_path / "metrics")}, **(options or {}))
        settings = load_settings(flags, job=JOB, need_command=True,
                                 command=[sys.executable, "-c", source or "raise SystemExit(%d)" % status])
        stderr = io.StringIO()
        code = runner.Runner(settings, stderr).run()
        log = [json.loads(line) for line in stderr.getvalue().splitlines()]
        return code, log[-1], (tmp_path / "metrics" / ("dlock_%s.prom" % JOB)).read_text()
    return run_once


def counter(text, outcome):
    """The value of the job's unconfirmed-release counter for outcome, None when it is not there."""
    for line in text.splitlines():
        if line.startswith('dlock_releases_unconfirmed_total{job="%s",outcome="%s"} ' % (JOB, outcome)):
            return int(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.parametrize("status,result", [(0, "success"), (3, "failed")])
@pytest.mark.parametrize("error", [CommitUnknown(UNREPLICATED), NoAnswer("redis: Timeout reading from socket")],
                         ids=["commit_unknown", "no_answer"])
def test_an_uncertain_release_leaves_the_run_as_the_job_made_it(run, status, result, error):
    code, log, metrics = run(status, error)
    assert (code, log["result"], log["exit_code"]) == (status, result, status)
    assert log["release"] == "uncertain"
    assert log["release_error"] == str(error)
    assert "error" not in log  # the run had none
    assert 'dlock_runs_total{job="%s",result="%s"} 1' % (JOB, result) in metrics
    assert 'result="backend_error"} 0' in metrics
    assert (counter(metrics, "uncertain"), counter(metrics, "failed")) == (1, 0)


def test_a_release_that_failed_is_told_from_an_uncertain_one(run):
    code, log, metrics = run(0, BackendError("postgresql: permission denied for table dlock_lease"))
    assert (code, log["result"]) == (0, "success")
    assert log["release"] == "failed"
    assert log["release_error"] == "postgresql: permission denied for table dlock_lease"
    assert (counter(metrics, "uncertain"), counter(metrics, "failed")) == (0, 1)


def test_a_release_that_raises_what_no_backend_should_still_leaves_the_result(run):
    # A bug, or a driver's error no backend turned into a BackendError (etcd's
    # gateway reads a 200 answer's JSON outside its error handling): the run
    # still ends with its log line, its metrics and the job's exit code.
    code, log, metrics = run(0, ValueError("Expecting value: line 1 column 1 (char 0)"))
    assert (code, log["result"]) == (0, "success")
    assert log["release"] == "uncertain"  # nothing tells how far it got
    assert log["release_error"] == "ValueError: Expecting value: line 1 column 1 (char 0)"
    assert counter(metrics, "uncertain") == 1


def test_a_confirmed_release_is_logged_and_not_counted(run):
    code, log, metrics = run(0)
    assert (code, log["result"], log["release"]) == (0, "success", "released")
    assert "release_error" not in log
    assert (counter(metrics, "uncertain"), counter(metrics, "failed")) == (0, 0)


def test_a_lease_no_longer_ours_is_a_confirmed_answer(run):
    code, log, metrics = run(0, False)
    assert (code, log["result"], log["release"]) == (0, "success", "not_ours")
    assert (counter(metrics, "uncertain"), counter(metrics, "failed")) == (0, 0)


def test_the_counter_carries_over_from_run_to_run(run):
    run(0, CommitUnknown(UNREPLICATED))
    run(0)
    _code, _log, metrics = run(0, BackendError("redis: NOPERM"))
    _code, _log, metrics = run(0, CommitUnknown(UNREPLICATED))
    assert (counter(metrics, "uncertain"), counter(metrics, "failed")) == (2, 1)
    assert 'dlock_runs_total{job="%s",result="success"} 4' % JOB in metrics


class SlowRenewal(object):
    """The backend, whose renewals each take `hold` seconds after telling the
    job to exit (by creating `go`); its release notes whether a renewal was
    still in flight when it began."""

    def __init__(self, backend, go, hold):
        self._backend = backend
        self._go = go
        self._hold = hold
        self._in_flight = threading.Event()
        self.released_during_renewal = None

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def renew(self, *args, **kwargs):
        self._in_flight.set()
        try:
            self._go.touch()
            threading.Event().wait(self._hold)  # a slow answer, not a synchronisation
            return self._backend.renew(*args, **kwargs)
        finally:
            self._in_flight.clear()

    def release(self, *args, **kwargs):
        self.released_during_renewal = self._in_flight.is_set()
        return self._backend.release(*args, **kwargs)


@pytest.mark.parametrize("hold, op_timeout", [(0.5, "2s"), (1.2, "0.5s")], ids=["within_op_timeout", "past_it"])
def test_the_release_waits_for_a_renewal_in_flight(run, tmp_path, hold, op_timeout):
    """A renewal still in flight when the job ends is waited for before the
    release, even one the heartbeat gave up on at op_timeout (a PostgreSQL
    commit's wait ends only at its cancel, up to a second later): the two
    never share the backend's session at once (the renewal's end could
    disarm the release's own op_timeout guard, or make a clean release look
    uncertain)."""
    go = tmp_path / "go"
    backends = []

    def slow(backend):
        backends.append(SlowRenewal(backend, go, hold))
        return backends[-1]
    waits_for_go = "import os, time\nwhile not os.path.exists(%r): time.sleep(0.01)\n" % str(go)
    # A ttl of 20s: past op_timeout, no renewal counts, so the job must end
    # before the deadline its grant set (about ttl - op_timeout - kill_grace);
    # with 6s that was 4s, which a loaded CI machine's Python start can pass.
    code, log, _metrics = run(source=waits_for_go, wrap=slow,
                              options={"ttl": "20s", "renew_every": "0.2s", "op_timeout": op_timeout})
    assert code == 0
    assert log["result"] == "success" and log["release"] == "released", log
    assert backends[0].released_during_renewal is False


class BrokenHistory(object):
    """The backend, whose history calls fail as a backend's bug would."""

    def __init__(self, backend):
        self._backend = backend

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def read_history(self, key, limit):
        raise RuntimeError("history bug")

    def add_history(self, *args, **kwargs):
        raise RuntimeError("history bug")


def test_a_history_that_breaks_changes_nothing_of_the_run_nor_its_release(run, tmp_path):
    """The missed slots are judged and the entry written before the release:
    anything they raise is the history's, never the run's end."""
    (tmp_path / ("%s.json" % JOB)).write_text(json.dumps({"once_per": "1h", "every_slot": True}))
    code, log, metrics = run(3, wrap=BrokenHistory)
    assert (code, log["result"], log["release"]) == (3, "failed", "released")
    assert log["history"] == "failed" and log["history_error"] == "RuntimeError: history bug"
    assert 'dlock_history_writes_total{job="%s",outcome="failed"} 1' % JOB in metrics
    assert 'dlock_slots_missed_total{job="%s"} 0' % JOB in metrics
