"""`dlock run`: take the lease, run the job under it, fence, release, report.

Order of a run: clock check -> acquire (skip, or wait in line: waiting.py) -> spawn
the job in its own process group -> heartbeat renews while the main loop
watches the LeaseDeadline, max_runtime and signals -> release (owner-checked,
min_hold kept) -> one log line and the metrics.

Three parts: Runner, the run's lifecycle (backend, clock, grant, release);
supervision.Supervisor, the job under the lease (spawn, heartbeat, the
watch); RunReport, what the run tells (the log line and the metrics).
"""

import copy
import time

from . import clock, report
from .backends import Slot, open_backend, pause_scopes
from .blackout import Blackout
from .boottime import now
from .deadline import LeaseDeadline
from .errors import EXIT_CONFIG, BackendError, ClockUnsafe, DlockError, OutcomeUnknown
from .history import RunHistory
from .owner import hostname, new_owner
from .pause_files import mirrored_pauses
from .slots import MANUAL_MARKER_TTL, boundary, manual_slot_number, marker_ttl, run_id, slot_lead, slot_number
from .supervision import Supervisor
from .validate import format_duration
from .waiting import acquire as acquire_waiting


def backend_of(settings):
    return open_backend(settings.backend_url, settings.password, settings.options.op_timeout, settings.ca_file,
                        settings.fence_epoch)


def acquire(backend, key, owner, options, slot, pauses=(), wait_for_holder=False):
    """(grant, attempts, boottime.now() when the granting request was sent):
    the boot-time clock the lease deadlines are judged on. A pause of one of
    the scopes `pauses` (base.pause_scopes: the job's key, its groups, every
    key) refuses the grant. `wait_for_holder`: wait in line for a run that
    holds the lock (up to wait_timeout) whatever the job's on_contention."""
    wait = options.wait_timeout if options.on_contention == "wait" or wait_for_holder else 0
    return acquire_waiting(backend, key, owner, options.ttl, slot, wait, clock=now, pauses=pauses)


def hand_fields(settings):
    """What a run asked for by hand says of itself: a rerun and its reason,
    a run-now's id, reason and whether it was forced past a pause; a
    missed slot caught up, or backfilled (and why)."""
    if settings.rerun is not None:
        return {"rerun": True, "rerun_reason": settings.reason}
    if settings.manual is not None:
        return {"manual_id": settings.manual, "manual_reason": settings.reason, "forced": settings.forced}
    if settings.backfill:
        return {"backfill": True, "backfill_reason": settings.reason}
    if settings.catch_up_slot is not None:
        return {"catch_up": True}
    return {}


class RunReport(object):
    """What a run tells: its log line's fields (`record`), written at its
    end, and its job's metrics (`gauges`), written once the granted job runs and at the end."""

    def __init__(self, settings, owner, stderr=None):
        self.settings = settings
        self.stderr = stderr
        self.record = {"job": settings.job, "key": settings.key, "owner": owner,
                       "host": hostname(), "attempt": 0, "wait_ms": 0}
        # In the log line and the last run's record (Runner._release).
        self.record.update(hand_fields(settings))
        self.gauges = {}
        self.job_ended = None  # time.monotonic() when the job was seen ended (Supervisor), if it ran

    def finish(self, result, code, started, started_wall):
        """The log line and the metrics of the run that ended."""
        self.record.update(result=result, exit_code=code, duration_ms=int((time.monotonic() - started) * 1000))
        if self.job_ended is not None:
            # On the same scale as duration_ms: what came after the job (the
            # release, the history) is their difference, and a job killed
            # before it could say so has its end here.
            self.record["job_ended_ms"] = int((self.job_ended - started) * 1000)
        report.log_line(self.record, self.stderr)
        self.write_metrics(result, code, started_wall)

    def _catch_up_kind(self):
        """report.CATCH_UP_KINDS: the run of a missed slot, found by a run or backfilled; None for any other."""
        if self.settings.backfill:
            return "backfill"
        return "catch_up" if self.settings.catch_up_slot is not None else None

    def write_metrics(self, result=None, code=None, started_wall=None):
        """The job's metrics; with no result, those of a lease just granted."""
        settings = self.settings
        if not settings.metrics_dir:
            return
        if result is not None:
            self.gauges.update(dlock_lock_held=0, dlock_lock_age_seconds=0, dlock_last_exit_code=code,
                               dlock_last_run_timestamp_seconds=round(time.time(), 3),
                               dlock_last_run_duration_seconds=round(time.time() - started_wall, 3))
        if result in ("skipped_paused", "skipped_blackout"):
            # DlockJobNotRun counts a job's silence from here, not from its last run before the pause or window.
            self.gauges["dlock_last_paused_timestamp_seconds"] = round(time.time(), 3)
        try:
            # The release's outcome is in the record by the run's end (none at the grant).
            report.write_metrics(settings.metrics_dir, settings.job, self.gauges, result, self.record.get("release"),
                                 self.record.get("history"), self.record.get("slots_missed", 0), self._catch_up_kind())
        except (IOError, OSError) as exc:
            report.log_line({"job": settings.job, "key": settings.key, "result": "metrics_error",
                             "error": "cannot write metrics in %s: %s" % (settings.metrics_dir, exc)},
                            self.stderr)


class Runner(object):
    """One run's lifecycle: open the backend, check the clock, take the
    lease, hand the job to its Supervisor, release, report."""

    def __init__(self, settings, stderr=None, job=None):
        self.settings = settings
        self.options = settings.options
        self.owner = new_owner()
        self.report = RunReport(settings, self.owner, stderr)
        self.record = self.report.record
        self.history = RunHistory(settings, self.record)
        # `job`: the job's guard and process, started early (Child.prepare),
        # or None: the Supervisor starts them at the grant.
        self.supervisor = Supervisor(settings, self.report, job)

    def _exit(self, name):
        return self.options.exit_codes[name]

    def run(self):
        started_wall, started = time.time(), time.monotonic()
        backend = None
        mirrored = None if self.settings.forced else self._mirrored_pause()
        if mirrored is not None:
            # Before the backend is asked: the node's mirror refuses alone,
            # and so also while the backend is away (pause_files.py).
            code, result = self._paused(mirrored, "node")
            self.history.write_mirrored_pause(result, code, self._slot(0.0), self._open_backend)
            self.report.finish(result, code, started, started_wall)
            return code
        try:
            try:
                backend = self._open_backend()
                code, result = self._locked_run(backend)
            except (BackendError, ClockUnsafe) as exc:
                self.record["error"] = str(exc)
                if not self.options.fail_open:
                    code, result = self._exit(exc.result), exc.result
                else:
                    code, result = self._unlocked_run(exc)
        finally:
            if backend is not None:
                backend.close()
        self.report.finish(result, code, started, started_wall)
        self._catch_up()
        return code

    def _catch_up(self):
        """Run the missed slots the run found to catch up (history.py), each
        a run of its own (its grant, fence, log line and entry), oldest
        first. The run's own exit code stands whatever they do."""
        for number in self.history.catch_up_slots:
            settings = copy.copy(self.settings)
            settings.catch_up_slot = number
            Runner(settings, self.report.stderr).run()

    def _open_backend(self):
        return backend_of(self.settings)

    # -- the locked path ------------------------------------------------------
    def _locked_run(self, backend):
        offset = self._check_clock(backend)
        slot = self._slot(offset)
        grant, sent = self._acquire(backend, slot)
        if grant.granted:
            return self._granted_run(backend, grant.fence, slot, sent)
        code, result = self._not_granted(grant, slot)
        self.history.write(backend, result, code, slot)
        return code, result

    def _check_clock(self, backend):
        """The backend's clock offset, refused past max_clock_skew (ClockUnsafe)."""
        offset, rtt = clock.measure_offset(backend)
        self.report.gauges["dlock_clock_offset_seconds"] = round(offset, 6)
        clock.check_offset(offset, rtt, self.options.max_clock_skew)
        return offset

    def _slot(self, offset):
        """The once_per slot this run asks for (or reruns), None without once_per."""
        once_per = self.options.once_per
        if self.settings.manual is not None:
            # A slot of its own, named by the id (slots.manual_slot_number): it runs once.
            return Slot(manual_slot_number(self.settings.manual), MANUAL_MARKER_TTL)
        if self.settings.rerun is not None:
            # The slot named: the backend grants it only if it may be rerun (base.rerun_refusal).
            return Slot(self.settings.rerun, marker_ttl(once_per), once_per, rerun=True, lead=self._slot_lead(),
                        blackout_of=self._blackout_of())
        window = self.options.catch_up["window"] if self.options.catches_up else None
        if self.settings.catch_up_slot is not None:
            # A past slot, its number as given: granted only while no marker
            # says it ran or is claimed (as a run-now's), its marker then
            # living as long as a catch-up may ask for it (a backfill's, as a run-now's).
            ttl = MANUAL_MARKER_TTL if self.settings.backfill else marker_ttl(once_per, window)
            return Slot(self.settings.catch_up_slot, ttl, blackout_of=self._blackout_of())
        if once_per:
            # An estimate: the backend decides the slot on its clock at grant time.
            number = slot_number(time.time() + offset, once_per, self._slot_lead())
            return Slot(number, marker_ttl(once_per, window), once_per, lead=self._slot_lead(),
                        blackout_of=self._blackout_of())
        return None

    def _blackout_of(self):
        """The job's blackout rule for its slots (base.Slot.blackout_of), None without windows."""
        if not self.options.blackout:
            return None
        windows = Blackout(self.options.blackout)
        width = self.options.once_per
        return lambda number: windows.of_slot(number, width)

    def _slot_lead(self):
        return slot_lead(self.options.once_per, self.options.max_clock_skew)

    def _acquire(self, backend, slot):
        """(grant, the boot-time clock when the granting request was sent), the
        attempts, the wait and the answering member in the report."""
        asked = time.monotonic()
        # A run-now with --force is not refused by a pause (the operator said why: hand_fields), and
        # waits in line for a run that holds the lock rather than skip: forced, never beside another run.
        pauses = () if self.settings.forced else pause_scopes(self.settings.key, self.settings.groups)
        grant, attempts, sent = acquire(backend, self.settings.key, self.owner, self.options, slot, pauses,
                                        wait_for_holder=self.settings.forced)
        if slot is not None and self.settings.manual is None:  # a run-now's: its manual_id
            self.record["slot"] = slot.number
        self.record.update(attempt=attempts, wait_ms=int((time.monotonic() - asked) * 1000))
        # The member that answered the acquire: on a cluster, the one that granted (or refused).
        member = backend.describe()["member"] or {}
        self.record.update(member=member.get("endpoint"), member_id=member.get("id"))
        self.report.gauges["dlock_lock_wait_seconds"] = round(time.monotonic() - asked, 3)
        return grant, sent

    def _not_granted(self, grant, slot):
        """(exit code, result) of a refused grant: held, slot done, or a refused rerun."""
        self.record["holder"] = grant.holder.owner if grant.holder else None
        if grant.status == "paused":
            return self._paused(grant.pause, "backend")
        if grant.status == "blackout":
            self.record["blackout"] = grant.window
            return self._exit("paused"), "skipped_blackout"
        if slot is not None and slot.rerun and grant.status != "locked":
            return self._rerun_refused(grant.status, slot)
        if grant.status == "duplicate":
            if self.settings.manual is not None:
                self.record["refused"] = ("run-now id %s already ran (an id runs once, for %s)"
                                          % (self.settings.manual, format_duration(MANUAL_MARKER_TTL)))
            return self._exit("duplicate"), "skipped_duplicate"
        return self._exit("locked"), "skipped_locked"

    def _mirrored_pause(self):
        """The first live pause of the job's scopes in this node's mirror, or None."""
        pauses = mirrored_pauses(self.settings.pauses_dir, pause_scopes(self.settings.key, self.settings.groups))
        return pauses[0] if pauses else None

    def _paused(self, pause, source):
        """(exit code, result) of a run refused by `pause`; `source`: whose
        record refused it, the backend's or this node's mirror."""
        self.record.update(paused=pause.scope, pause_reason=pause.reason, paused_until=pause.until,
                           paused_by=pause.by, pause_source=source)
        return self._exit("paused"), "skipped_paused"

    def _granted_run(self, backend, fence, slot, sent):
        """Run the job under the lease just granted, then release it, whatever happened."""
        self.record.update(fence=fence, run_id=run_id(self.settings.job, slot and slot.number,
                                                      self.options.once_per, fence, self.settings.manual))
        self.report.gauges.update(dlock_fencing_token=fence, dlock_lock_held=1, dlock_lock_age_seconds=0,
                                  dlock_lease_overrun_seconds=0)
        try:
            deadline = LeaseDeadline(self.options.ttl, self.options.margin, self.options.kill_grace, sent)
            code, result = self.supervisor.supervise(backend, deadline, self.owner)
        except BaseException as exc:
            # Whatever failed after the grant, the lease is not left held.
            self.record["error"] = "after the grant: %s" % (exc or exc.__class__.__name__)
            self._release(backend, "failed", None, slot)
            raise
        # The release first, at once after the job: the history's requests
        # (history.py) never stand between a job's end and its lock's.
        self._release(backend, result, code, slot)
        self.history.judge_missed(backend, slot)
        self.history.write(backend, result, code, slot)
        return code, result

    def _rerun_refused(self, status, slot):
        """(exit code, result) of a rerun the backend refused, with a message
        that says why: the slot succeeded (a success is final), has no
        marker, or has not begun."""
        named = "slot %s of %s" % (boundary(slot.number, self.options.once_per), self.settings.job)
        if status == "duplicate":
            self.record["refused"] = "%s succeeded; nothing to rerun" % named
            return self._exit("duplicate"), "skipped_duplicate"
        if status == "future":
            self.record["refused"] = "%s has not begun on the backend's clock; nothing to rerun" % named
        else:
            self.record["refused"] = (
                "%s has no marker on the backend: it never ran, or its marker expired (markers live %s from "
                "the slot's claim, 1.5 x once_per); running a slot that never ran is not a rerun"
                % (named, format_duration(marker_ttl(self.options.once_per))))
        # 78 whatever the job's exit_codes say, as any error in what the
        # operator asked for (a configuration error ends a run before they apply).
        return EXIT_CONFIG, "rerun_refused"

    def _release(self, backend, result, code, slot=None):
        last = {"result": result, "exit_code": code, "owner": self.owner, "host": self.record["host"],
                "fence": self.record.get("fence"), "run_id": self.record.get("run_id"), "finished_at": time.time()}
        if self.record.get("slot") is not None:
            last["slot"] = self.record["slot"]  # `dlock status --json` and the module's query show it
        last.update(hand_fields(self.settings))
        # The run is what the job made it whatever comes of its release: its
        # outcome (report.RELEASE_UNCONFIRMED) goes to the log line and the
        # metrics only. A lease not released expires by itself within its TTL.
        error = None
        try:
            released = backend.release(self.settings.key, self.owner, self.options.min_hold, last, slot)
        except OutcomeUnknown as exc:  # it may have happened: the lease may be free, the run recorded, or not
            outcome, error = "uncertain", str(exc)
        except DlockError as exc:  # the backend refused it, or was not reached: it did not happen
            outcome, error = "failed", str(exc)
        except Exception as exc:  # a backend's bug: nothing tells how far it got
            outcome, error = "uncertain", "%s: %s" % (exc.__class__.__name__, exc)
        else:
            outcome = "released" if released else "not_ours"  # not ours: expired, broken, or taken since
        self.record.update(release=outcome, release_error=error)

    # -- fail open ------------------------------------------------------------
    def _unlocked_run(self, exc):
        """fail_open: run without any lock, and say so loudly."""
        self.record.update(fail_open=True, warning="ran WITHOUT a lock (fail_open): %s" % exc)
        return self.supervisor.run_unlocked()


def backfill(settings, slots, out, stderr=None):
    """`dlock backfill`: each of `slots` (past slot numbers, oldest first) a
    run of its own, as a catch-up's (Runner._slot), but for those the
    history shows a success of; a line on `out` for each, then the count.
    Exit 0 when each slot ran, was done, or is in a blackout window (never
    to run), else the first other one's code."""
    done = set()
    if settings.options.history:
        backend = backend_of(settings)
        try:
            done = set(entry.get("slot") for entry in backend.read_history(settings.key, settings.options.history)
                       if entry.get("result") == "success")
        except DlockError as exc:
            out.write("backfill %s: the history could not be read (%s); the slots' markers decide alone\n"
                      % (settings.job, exc))
        finally:
            backend.close()
    outcome, counts = 0, {}
    for number in slots:
        named = boundary(number, settings.options.once_per)
        if number in done:
            result, code = "done_before", 0
        else:
            one = copy.copy(settings)
            one.catch_up_slot, one.backfill = number, True
            runner = Runner(one, stderr)
            code = runner.run()
            result = runner.record.get("result")
        counts[result] = counts.get(result, 0) + 1
        out.write("%s  %s (exit %d)\n" % (named, result, code))
        if outcome == 0 and result not in ("success", "done_before", "skipped_duplicate", "skipped_blackout"):
            outcome = code or 1
    out.write("backfill %s: %d slots: %s\n" % (settings.job, len(slots), ", ".join(
        "%d %s" % (count, result) for result, count in sorted(counts.items()))))
    return outcome


def run(settings, stderr=None, job=None):
    """Run the job of `settings` under its lock; `job`: a prepared Child for
    it (the caller dismisses it when the run started none), else one is
    made at the grant."""
    return Runner(settings, stderr, job).run()
