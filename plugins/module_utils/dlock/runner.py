"""`dlock run`: take the lease, run the job under it, fence, release, report.

Order of a run: clock check -> acquire (skip, or wait in line: waiting.py) -> spawn
the job in its own process group -> heartbeat renews while the main loop
watches the LeaseDeadline, max_runtime and signals -> release (owner-checked,
min_hold kept) -> one log line and the metrics.
"""

import os
import signal
import time

from . import clock, report
from .backends import Slot, open_backend
from .child import Child, drain, exit_status
from .deadline import LeaseDeadline, now
from .errors import EXIT_CONFIG, BackendError, ClockUnsafe, DlockError
from .heartbeat import Heartbeat
from .owner import hostname, new_owner
from .slots import boundary, marker_ttl, run_id, slot_number
from .validate import format_duration, shown
from .waiting import acquire as acquire_waiting

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
EXIT_MAX_RUNTIME = 124  # as timeout(1): the job was stopped for running too long


def acquire(backend, key, owner, options, slot):
    """(grant, attempts, deadline.now() when the granting request was sent):
    the boot-time clock the lease deadlines are judged on."""
    wait = options.wait_timeout if options.on_contention == "wait" else 0
    return acquire_waiting(backend, key, owner, options.ttl, slot, wait, clock=now)


class Runner(object):
    def __init__(self, settings, stderr=None, job=None):
        self.s = settings
        # The job's guard and process, started early (Child.prepare), or None:
        # started at the grant.
        self.job = job
        self.o = settings.options
        self.owner = new_owner()
        self.stderr = stderr
        self.record = {"job": settings.job, "key": settings.key, "owner": self.owner,
                       "host": hostname(), "attempt": 0, "wait_ms": 0}
        if settings.rerun is not None:
            # In the log line and the last run's record (_release).
            self.record.update(rerun=True, rerun_reason=settings.reason)
        self.gauges = {}

    def _exit(self, name):
        return self.o.exit_codes[name]

    def run(self):
        started_wall, started = time.time(), time.monotonic()
        backend = None
        try:
            try:
                backend = open_backend(self.s.backend_url, self.s.password, self.o.op_timeout, self.s.ca_file,
                                       self.s.fence_epoch)
                code, result = self._locked_run(backend)
            except (BackendError, ClockUnsafe) as exc:
                self.record["error"] = str(exc)
                if not self.o.fail_open:
                    code, result = self._exit(exc.result), exc.result
                else:
                    code, result = self._unlocked_run(exc)
        finally:
            if backend is not None:
                backend.close()
        self.record.update(result=result, exit_code=code, duration_ms=int((time.monotonic() - started) * 1000))
        report.log_line(self.record, self.stderr)
        self._write_metrics(result, code, started_wall)
        return code

    # -- the locked path ------------------------------------------------------
    def _locked_run(self, backend):
        offset, rtt = clock.measure_offset(backend)
        self.gauges["dlock_clock_offset_seconds"] = round(offset, 6)
        clock.check_offset(offset, rtt, self.o.max_clock_skew)
        slot = None
        if self.s.rerun is not None:
            # The slot named: the backend grants it only if it may be rerun (base.rerun_refusal).
            slot = Slot(self.s.rerun, marker_ttl(self.o.once_per), self.o.once_per, rerun=True)
        elif self.o.once_per:
            # An estimate: the backend decides the slot on its clock at grant time.
            number = slot_number(time.time() + offset, self.o.once_per)
            slot = Slot(number, marker_ttl(self.o.once_per), self.o.once_per)
        asked = time.monotonic()
        grant, attempts, sent = acquire(backend, self.s.key, self.owner, self.o, slot)
        if slot is not None:
            self.record["slot"] = slot.number
        self.record.update(attempt=attempts, wait_ms=int((time.monotonic() - asked) * 1000))
        # The member that answered the acquire: on a cluster, the one that granted (or refused).
        member = backend.describe()["member"] or {}
        self.record.update(member=member.get("endpoint"), member_id=member.get("id"))
        self.gauges["dlock_lock_wait_seconds"] = round(time.monotonic() - asked, 3)
        if not grant.granted:
            self.record["holder"] = grant.holder.owner if grant.holder else None
            if slot is not None and slot.rerun and grant.status != "locked":
                return self._rerun_refused(grant.status, slot)
            if grant.status == "duplicate":
                return self._exit("duplicate"), "skipped_duplicate"
            return self._exit("locked"), "skipped_locked"

        fence = grant.fence
        self.record.update(fence=fence, run_id=run_id(self.s.job, slot and slot.number, self.o.once_per, fence))
        self.gauges.update(dlock_fencing_token=fence, dlock_lock_held=1, dlock_lock_age_seconds=0,
                           dlock_lease_overrun_seconds=0)
        try:
            self._write_metrics(None, None, None)
            deadline = LeaseDeadline(self.o.ttl, self.o.margin, self.o.kill_grace, sent)
            code, result = self._supervise(backend, deadline)
        except BaseException as exc:
            # Whatever failed after the grant, the lease is not left held.
            self.record["error"] = "after the grant: %s" % (exc or exc.__class__.__name__)
            self._release(backend, "failed", None, slot)
            raise
        self._release(backend, result, code, slot)
        return code, result

    def _rerun_refused(self, status, slot):
        """(exit code, result) of a rerun the backend refused, with a message
        that says why: the slot succeeded (a success is final), has no
        marker, or has not begun."""
        named = "slot %s of %s" % (boundary(slot.number, self.o.once_per), self.s.job)
        if status == "duplicate":
            self.record["refused"] = "%s succeeded; nothing to rerun" % named
            return self._exit("duplicate"), "skipped_duplicate"
        if status == "future":
            self.record["refused"] = "%s has not begun on the backend's clock; nothing to rerun" % named
        else:
            self.record["refused"] = (
                "%s has no marker on the backend: it never ran, or its marker expired (markers live %s from "
                "the slot's claim, 1.5 x once_per); running a slot that never ran is not a rerun"
                % (named, format_duration(marker_ttl(self.o.once_per))))
        # 78 whatever the job's exit_codes say, as any error in what the
        # operator asked for (a configuration error ends a run before they apply).
        return EXIT_CONFIG, "rerun_refused"

    def _release(self, backend, result, code, slot=None):
        last = {"result": result, "exit_code": code, "owner": self.owner, "host": self.record["host"],
                "fence": self.record.get("fence"), "run_id": self.record.get("run_id"), "finished_at": time.time()}
        if self.s.rerun is not None:
            last.update(rerun=True, rerun_reason=self.s.reason)
        try:
            if not backend.release(self.s.key, self.owner, self.o.min_hold, last, slot) and result != "lock_lost":
                self.record["release"] = "not ours any more (expired or broken)"
        except DlockError as exc:
            # The lease then expires by itself within its TTL.
            self.record["release"] = "failed: %s" % exc

    def _job_env(self, fence, owner):
        env = dict(os.environ)
        env.update(self.s.environment)
        env.update(DLOCK_JOB=self.s.job, DLOCK_KEY=self.s.key, DLOCK_OWNER=owner,
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
        try:
            job, self.job = self.job or Child.prepare(self.s.cgroup), None
            job.start(self.s.command, env, self.s.working_directory, guard_fds)
            started.append(job)
        except (OSError, ValueError) as exc:
            self._restore_signals(previous)
            self.record["error"] = "cannot start %s: %s" % (shown(self.s.command[0]), getattr(exc, "strerror", None) or exc)
            return None, None
        for signum in pending:
            started[0].signal_group(signum)
        return started[0], previous

    def _supervise(self, backend, deadline):
        if now() >= deadline.terminate_at:  # a pause or a slow grant ate the lease before the job started
            self.record["reason"] = "the lease could expire before the job started; it was not started"
            return self._exit("lock_lost"), "lock_lost"
        child, previous = self._spawn(self._job_env(self.record["fence"], self.owner),
                                      backend.guard_fds(self.s.key))
        if child is None:
            return 127, "failed"
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)  # drained after each wake-up (_watch)
        heartbeat = Heartbeat(backend, self.s.key, self.owner, self.o, deadline, wake_w)
        self.record["containment"] = child.containment
        heartbeat.start()
        try:
            returncode, reason = self._watch(child, deadline, heartbeat, wake_r)
        finally:
            heartbeat.stop()
            self._restore_signals(previous)
            child.close()
            os.close(wake_r)
            os.close(wake_w)
        self._note_leftovers(child)
        self.record["renewals"] = heartbeat.renewals
        if heartbeat.last_error:
            self.record["renew_error"] = heartbeat.last_error
        overrun = self.gauges.get("dlock_lease_overrun_seconds")
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
        code = exit_status(returncode)
        return code, "success" if code == 0 else "failed"

    def _missed(self, deadline, killed):
        """True when, not having killed the job, we find ourselves past the
        lease's earliest expiry: we were not running when the kill was due
        (SIGSTOP, a frozen VM), so the job ran unsupervised. The overrun goes
        to the log and the metrics, and the run is lock_lost whatever the job did."""
        overrun = deadline.overrun(now())
        if killed or overrun <= 0:
            return False
        self.gauges["dlock_lease_overrun_seconds"] = round(overrun, 3)
        return True

    def _watch(self, child, deadline, heartbeat, wake_fd):
        """Wait for the job; terminate it on lock loss or max_runtime, and always
        SIGKILL it before the lease can expire. Returns (returncode, reason)."""
        start = now()
        runtime_end = start + self.o.max_runtime if self.o.max_runtime else float("inf")
        reason, kill_at, killed = None, None, False
        while True:
            if self._missed(deadline, killed):
                reason, killed = "lock_lost", True
                child.kill()
            current = now()
            if reason is None:
                if heartbeat.lost or current >= deadline.terminate_at:
                    reason = "lock_lost"
                elif current >= runtime_end:
                    reason = "max_runtime"
                if reason is not None:
                    child.signal_group(signal.SIGTERM)
                    kill_at = current + self.o.kill_grace
            if reason is not None:
                # Never let the job outlive the lease, whatever started the stop.
                kill_at = min(kill_at or deadline.kill_by, deadline.kill_by)
                if current >= kill_at and not killed:
                    child.kill()
                    killed = True
            # Only deadlines still ahead: one passed would make every wait
            # return at once, a busy loop for the whole kill_grace.
            if reason is None:
                events = [deadline.terminate_at, runtime_end]
            elif not killed:
                events = [kill_at]
            else:
                events = []  # killed: only the guard's report is left to wait for
            timeout = min(events + [current + 1.0]) - current
            returncode = child.wait(timeout, wake_fd)
            # The heartbeat writes here once, when the lease is lost: read, it
            # must not wake every later wait (the loop would spin).
            drain(wake_fd)
            # The clock before the job's status: a job that ended while we were
            # stopped may have outlived the lease.
            if self._missed(deadline, killed):
                return returncode if returncode is not None else self._reap_killed(child), "lock_lost"
            if returncode is not None:
                return returncode, reason

    @staticmethod
    def _reap_killed(child):
        child.kill()
        returncode = None
        while returncode is None:
            returncode = child.wait(1.0)
        return returncode

    def _note_leftovers(self, child):
        # What the job left behind (background processes) was killed by its
        # guard before the run's end: nothing of it outlives the lock.
        if child.leftovers:
            self.record["leftovers"] = "killed %d remaining process(es) of the job" % child.leftovers
        if child.trouble:
            self.record["guard"] = child.trouble

    @staticmethod
    def _restore_signals(previous):
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    # -- fail open ------------------------------------------------------------
    def _unlocked_run(self, exc):
        """fail_open: run without any lock, and say so loudly."""
        self.record.update(fail_open=True, warning="ran WITHOUT a lock (fail_open): %s" % exc)
        child, previous = self._spawn(self._job_env(None, ""))
        if child is None:
            return 127, "failed"
        try:
            while True:
                returncode = child.wait(1.0)
                if returncode is not None:
                    break
        finally:
            self._restore_signals(previous)
            child.close()
        self._note_leftovers(child)
        code = exit_status(returncode)
        return code, "success" if code == 0 else "failed"

    # -- metrics ----------------------------------------------------------------
    def _write_metrics(self, result, code, started_wall):
        if not self.s.metrics_dir:
            return
        if result is not None:
            self.gauges.update(dlock_lock_held=0, dlock_lock_age_seconds=0, dlock_last_exit_code=code,
                               dlock_last_run_timestamp_seconds=round(time.time(), 3),
                               dlock_last_run_duration_seconds=round(time.time() - started_wall, 3))
        try:
            report.write_metrics(self.s.metrics_dir, self.s.job, self.gauges, result)
        except (IOError, OSError) as exc:
            report.log_line({"job": self.s.job, "key": self.s.key, "result": "metrics_error",
                             "error": "cannot write metrics in %s: %s" % (self.s.metrics_dir, exc)},
                            self.stderr)


def run(settings, stderr=None, job=None):
    """Run the job of `settings` under its lock; `job`: a prepared Child for
    it (the caller dismisses it when the run started none), else one is
    made at the grant."""
    return Runner(settings, stderr, job).run()
