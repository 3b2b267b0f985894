"""The job under the lease: start it, keep the lease renewed, and stop it in
time; or, with fail_open, run it with no lease at all.

The one rule of this module: the job never outlives the lease. The main loop
(Supervisor._watch) waits for the job on CLOCK_BOOTTIME and SIGKILLs it
before the lease's earliest expiry, whatever the heartbeat does.
"""

import os
import signal
import time

from .child import Child, drain, exit_status
from .boottime import now
from .heartbeat import Heartbeat
from .validate import shown

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
EXIT_MAX_RUNTIME = 124  # as timeout(1): the job was stopped for running too long


def _restore_signals(previous):
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _reap_killed(child):
    child.kill()
    returncode = None
    while returncode is None:
        returncode = child.wait(1.0)
    return returncode


def _job_result(returncode):
    code = exit_status(returncode)
    return code, "success" if code == 0 else "failed"


class _Stop(object):
    """Where the stopping of the job stands: why it was asked (None: not yet),
    when its SIGKILL is due, and whether that was sent."""

    def __init__(self, deadline, runtime_end):
        self.deadline = deadline
        self.runtime_end = runtime_end
        self.reason, self.kill_at, self.killed = None, None, False

    def ask_when_due(self, child, heartbeat, current, kill_grace):
        """SIGTERM the job once the lease is lost or about to be, or max_runtime is up."""
        if self.reason is not None:
            return
        if heartbeat.lost or current >= self.deadline.terminate_at:
            self.reason = "lock_lost"
        elif current >= self.runtime_end:
            self.reason = "max_runtime"
        if self.reason is not None:
            child.signal_group(signal.SIGTERM)
            self.kill_at = current + kill_grace

    def kill_when_due(self, child, current):
        if self.reason is None:
            return
        # Never let the job outlive the lease, whatever started the stop.
        self.kill_at = min(self.kill_at or self.deadline.kill_by, self.deadline.kill_by)
        if current >= self.kill_at and not self.killed:
            child.kill()
            self.killed = True

    def wait_for(self, current):
        """How long the next wait for the job may last. Only deadlines still
        ahead: one passed would make every wait return at once, a busy loop
        for the whole kill_grace."""
        if self.reason is None:
            events = [self.deadline.terminate_at, self.runtime_end]
        elif not self.killed:
            events = [self.kill_at]
        else:
            events = []  # killed: only the guard's report is left to wait for
        return min(events + [current + 1.0]) - current


class Supervisor(object):
    """Starts the job of `settings` and watches it; what it sees goes to the
    run's `report` (a RunReport). `job`: a prepared Child, or None (one is
    made when the job starts)."""

    def __init__(self, settings, report, job=None):
        self.settings = settings
        self.options = settings.options
        self.report = report
        self.record = report.record
        self.job = job

    def _exit(self, name):
        return self.options.exit_codes[name]

    def job_env(self, fence, owner):
        env = dict(os.environ)
        env.update(self.settings.environment)
        env.update(DLOCK_JOB=self.settings.job, DLOCK_KEY=self.settings.key, DLOCK_OWNER=owner,
                   DLOCK_FENCING_TOKEN="" if fence is None else str(fence),
                   DLOCK_RUN_ID=self.record.get("run_id") or "")
        return env

    def _spawn(self, env, guard_fds=()):
        """(the job, the signal handlers it replaced), or (None, None).
        guard_fds: what the job's guard keeps until the job is dead (Child.start).

        SIGTERM, SIGINT and SIGHUP are forwarded from before the job starts:
        one that comes while it starts is held and passed on once it runs
        (unhandled, it would end the runner, and the job with it)."""
        started, pending = [], []

        def forward(signum, _frame):
            if started:
                started[0].signal_group(signum)
            else:
                pending.append(signum)
        previous = dict((sig, signal.signal(sig, forward)) for sig in FORWARDED_SIGNALS)
        command = self.settings.command
        try:
            job, self.job = self.job or Child.prepare(self.settings.cgroup), None
            job.start(command, env, self.settings.working_directory, guard_fds)
            started.append(job)
        except (OSError, ValueError) as exc:
            _restore_signals(previous)
            self.record["error"] = "cannot start %s: %s" % (shown(command[0]), getattr(exc, "strerror", None) or exc)
            return None, None
        for signum in pending:
            started[0].signal_group(signum)
        return started[0], previous

    # -- under the lease ----------------------------------------------------------
    def supervise(self, backend, deadline, owner):
        """Run the job under the lease of `owner`; (exit code, result)."""
        if now() >= deadline.terminate_at:  # a pause or a slow grant ate the lease before the job started
            self.record["reason"] = "the lease could expire before the job started; it was not started"
            return self._exit("lock_lost"), "lock_lost"
        key = self.settings.key
        child, previous = self._spawn(self.job_env(self.record["fence"], owner), backend.guard_fds(key))
        if child is None:
            return 127, "failed"
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)  # drained after each wake-up (_watch)
        heartbeat = Heartbeat(backend, key, owner, self.options, deadline, wake_w)
        self.record["containment"] = child.containment
        heartbeat.start()
        try:
            # The grant's gauges (the lock held, its fence), once the job runs:
            # a file written between the grant and the job's start delays the job.
            self.report.write_metrics()
            returncode, reason = self._watch(child, deadline, heartbeat, wake_r)
            self.report.job_ended = time.monotonic()
        finally:
            heartbeat.stop()  # once it returns, nothing writes to wake_w
            _restore_signals(previous)
            child.close()
            os.close(wake_r)
            os.close(wake_w)
            # Then, the job stopped, a renewal in flight ends before the
            # release: the two would share the backend's session, and the
            # renewal's end could disarm the release's own op_timeout guard.
            # op_timeout, and a second for a PostgreSQL call's cancel.
            heartbeat.wait_done(self.options.op_timeout + 1.0)
        self._note_leftovers(child)
        return self._outcome(heartbeat, returncode, reason)

    def _outcome(self, heartbeat, returncode, reason):
        """(exit code, result) of a supervised run, and why in the record."""
        self.record["renewals"] = heartbeat.renewals
        if heartbeat.last_error:
            self.record["renew_error"] = heartbeat.last_error
        overrun = self.report.gauges.get("dlock_lease_overrun_seconds")
        if overrun:
            self.record.update(lease_overrun_ms=int(overrun * 1000), reason=(
                "the runner was not running (stopped, paused) when its lease could expire: the job ran unsupervised "
                "up to %.3fs past the lease's earliest expiry; the job's status (%d) is not the run's result"
                % (overrun, exit_status(returncode))))
            return self._exit("lock_lost"), "lock_lost"
        if reason == "lock_lost" or heartbeat.lost:
            self.record["reason"] = heartbeat.lost or "could not renew before the lease deadline"
            return self._exit("lock_lost"), "lock_lost"
        if reason == "max_runtime":
            self.record["reason"] = "max_runtime exceeded; the job was terminated (its status: %d)" \
                % exit_status(returncode)
            return EXIT_MAX_RUNTIME, "failed"
        return _job_result(returncode)

    def _missed(self, deadline, killed):
        """True when, not having killed the job, we find ourselves past the
        lease's earliest expiry: we were not running when the kill was due
        (SIGSTOP, a frozen VM), so the job ran unsupervised. The overrun goes
        to the log and the metrics, and the run is lock_lost whatever the job did."""
        overrun = deadline.overrun(now())
        if killed or overrun <= 0:
            return False
        self.report.gauges["dlock_lease_overrun_seconds"] = round(overrun, 3)
        return True

    def _watch(self, child, deadline, heartbeat, wake_fd):
        """Wait for the job; terminate it on lock loss or max_runtime, and always
        SIGKILL it before the lease can expire. Returns (returncode, reason)."""
        max_runtime = self.options.max_runtime
        stop = _Stop(deadline, now() + max_runtime if max_runtime else float("inf"))
        while True:
            if self._missed(deadline, stop.killed):
                stop.reason, stop.killed = "lock_lost", True
                child.kill()
            current = now()
            stop.ask_when_due(child, heartbeat, current, self.options.kill_grace)
            stop.kill_when_due(child, current)
            returncode = child.wait(stop.wait_for(current), wake_fd)
            # The heartbeat writes here once, when the lease is lost: read, it
            # must not wake every later wait (the loop would spin).
            drain(wake_fd)
            # The clock before the job's status: a job that ended while we were
            # stopped may have outlived the lease.
            if self._missed(deadline, stop.killed):
                return returncode if returncode is not None else _reap_killed(child), "lock_lost"
            if returncode is not None:
                return returncode, stop.reason

    def _note_leftovers(self, child):
        # What the job left behind (background processes) was killed by its
        # guard before the run's end: nothing of it outlives the lock.
        if child.leftovers:
            self.record["leftovers"] = "killed %d remaining process(es) of the job" % child.leftovers
        if child.trouble:
            self.record["guard"] = child.trouble

    # -- fail open ------------------------------------------------------------------
    def run_unlocked(self):
        """fail_open: run the job without any lock; (exit code, result)."""
        child, previous = self._spawn(self.job_env(None, ""))
        if child is None:
            return 127, "failed"
        try:
            while True:
                returncode = child.wait(1.0)
                if returncode is not None:
                    break
            self.report.job_ended = time.monotonic()
        finally:
            _restore_signals(previous)
            child.close()
        self._note_leftovers(child)
        return _job_result(returncode)
