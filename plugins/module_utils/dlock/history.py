"""A run's entry in its job's fleet-wide history (docs/runner.md, "History").

The backend keeps the newest entries of each lock key (Backend.add_history;
the job option `history`, 0: none). Each runner writes its own run's entry
after the release, one more operation outside the grant, so that a history
that cannot be written never fails, delays or changes a run or its release: the failure is
in the log line (`history`, `history_error`), the metrics
(dlock_history_writes_total{outcome="failed"}, dlock_history_unrecorded) and,
with the node's next entry that is written, the history itself
(`unrecorded_before`).

What is recorded:
  - every run that was granted, whatever its end (success, failed, lock_lost);
  - a slot's skip by a pause or a run still holding the lock, once per slot
    and reason whichever nodes were refused (a `once` id): a job without
    once_per has no slot, and its skips, every other node's tick, are not;
  - not a slot found done (skipped_duplicate: the run that did it is the
    entry), a refused rerun, nor a run that never reached the backend;
  - a missed slot (judge_missed): for a job whose schedule fires in every
    once_per slot (the job file's every_slot, which the dlock_jobs role
    sets), the run that is granted slot N looks at the history once it has
    released: each slot between the newest slot there and N that has no
    entry and no live marker (the run that freed the lock for N writes its
    entry after its release: it may still be on its way) had no run, no
    skip and no pause refusal: it is recorded as `missed`,
    once (its id `missed@SLOT`), and counted (dlock_slots_missed_total). A
    history with no slot before N (new, or every entry older than the
    entries kept) judges nothing, and a fleet that is down as a whole is
    seen only once it runs again: only a heartbeat from outside sees it
    while it lasts;
  - the slots of that gap that a blackout window covered (blackout.py) or
    a pause (the backend's pause log, base.log_pause: the whole fleet was
    down, so no node was refused) are recorded skipped_blackout and
    skipped_paused, once each, and are neither missed nor caught up;
  - with the job's catch_up (options.check_catch_up) latest or all, the
    slots of that gap that ended within its window, the newest `max`, are not missed:
    the run caught them up (Runner._catch_up), each a run of its own whose
    grant claims the slot's marker as a run-now's does, refused when a
    marker says the slot ran or is claimed; markers then live as long as a
    catch-up may ask (slots.marker_ttl), so a node that rejoins late cannot
    run a slot that is done.
"""

import time

from . import report
from .backends import PAUSE_LOG_KEEP, pause_scopes, paused_spans
from .errors import DlockError
from .slots import MANUAL_MARKER_TTL, run_id
from .validate import PAUSE_LOG_KEY

SKIPS_ONCE_PER_SLOT = ("skipped_paused", "skipped_blackout", "skipped_locked")
# The newest entries a run reads to find the slot before its own (each slot
# has at most a run, two skips and a missed entry), and the most missed
# slots it records (a longer gap is counted whole, its newest recorded).
JUDGE_ENTRIES = 20
MAX_MISSED_RECORDED = 100
NOT_RECORDED = ("skipped_duplicate", "rerun_refused", "backend_error", "clock_unsafe")
# The log line's fields an entry carries, when the run has them.
ENTRY_FIELDS = ("host", "owner", "fence", "run_id", "exit_code", "result", "holder", "paused",
                "pause_reason", "pause_source", "blackout", "rerun", "rerun_reason", "manual_id", "manual_reason",
                "forced", "catch_up", "backfill", "backfill_reason", "member")


def entry_slot(entry):
    """The schedule's slot an entry is of, or None (a run-now's, an unreadable one)."""
    number = entry.get("slot")
    return number if isinstance(number, int) and not isinstance(number, bool) else None


def once_id(result, slot):
    """The id of a slot's skip (base.history_record): one entry per slot and reason."""
    return "%s@%d" % (result, slot.number)


class RunHistory(object):
    """The entry of one run, written once it has ended."""

    def __init__(self, settings, record):
        self.settings = settings
        self.record = record  # the run's log line: most of the entry
        self.started_at = time.time()
        self.catch_up_slots = []  # the missed slots to run now (the job's catch_up), oldest first

    def write(self, backend, result, code, slot):
        """Write the run's entry with `backend`, if it is one the history keeps."""
        keep = self.settings.options.history
        if not keep or result in NOT_RECORDED:
            return
        once = None
        if result in SKIPS_ONCE_PER_SLOT:
            if slot is None:
                return
            once = once_id(result, slot)
        once_ttl = None if slot is None else (MANUAL_MARKER_TTL if slot.width is None else slot.marker_ttl)
        try:
            written = backend.add_history(self.settings.key, self._entry(result, code, slot, once), keep, once,
                                          once_ttl)
        except DlockError as exc:
            self.record.update(history="failed", history_error=str(exc))
        except Exception as exc:  # a backend's bug: never the run's end
            self.record.update(history="failed", history_error="%s: %s" % (exc.__class__.__name__, exc))
        else:
            self.record["history"] = "written" if written else "already_recorded"

    def _entry(self, result, code, slot, once):
        entry = dict((name, self.record[name]) for name in ENTRY_FIELDS if self.record.get(name) is not None)
        if slot is not None and self.settings.manual is None:
            entry["slot"] = slot.number  # a schedule's slot, or one caught up (a run-now's is its id)
        if once is not None:  # a skip: the slot it skipped, named as its run would have been
            entry["run_id"] = run_id(self.settings.job, slot.number, self.settings.options.once_per, None,
                                     self.settings.manual)
        entry.update(result=result, exit_code=code, started_at=round(self.started_at, 3),
                     finished_at=round(time.time(), 3))
        unrecorded = self._unrecorded()
        if unrecorded:
            entry["unrecorded_before"] = unrecorded
        return entry

    def judge_missed(self, backend, slot):
        """Record the slots before `slot`, the one this run was granted,
        that the history shows nothing of (module docstring), before this
        run's own entry; their count in the log line (`slots_missed`) and
        the metrics. A failure to read or write is the history's own, as
        write's: the run is not changed by it."""
        settings = self.settings
        if not (settings.every_slot and settings.options.history and slot is not None and slot.width is not None
                and not slot.rerun and settings.manual is None):
            return
        try:
            entries = backend.read_history(settings.key, min(settings.options.history, JUDGE_ENTRIES))
            before = [entry_slot(entry) for entry in entries]
            before = [number for number in before if number is not None and number < slot.number]
            if not before:
                return
            gap = list(range(max(before) + 1, slot.number))
            # A run writes its entry after its release, so the run that freed
            # the lock for this one may not have yet: a slot whose marker
            # still lives was claimed (its run done, going on, or its runner
            # dead), not missed. Markers live 1.5 slots (the newest two at
            # most), a catching-up job's as long as its window.
            recent = slot.number - 2 if not settings.options.catches_up else slot.number - 1 - MAX_MISSED_RECORDED
            gap = [number for number in gap if number < recent or not backend.slot_claimed(settings.key, number)]
            blacked_out = self._blacked_out_in(gap, slot)
            gap = [number for number in gap if number not in blacked_out]
            self._record_skips(backend, "skipped_blackout", sorted(blacked_out.items())[-MAX_MISSED_RECORDED:], slot)
            paused = self._paused_in(backend, gap, slot.width)
            gap = [number for number in gap if number not in paused]
            self._record_skips(backend, "skipped_paused", sorted(paused.items())[-MAX_MISSED_RECORDED:], slot)
            self.catch_up_slots = self._to_catch_up(gap, slot.width)
            if self.catch_up_slots:
                self.record["catching_up"] = len(self.catch_up_slots)
            gap = [number for number in gap if number not in self.catch_up_slots]
            recorded = 0
            for number in gap[-MAX_MISSED_RECORDED:]:
                entry = {"result": "missed", "slot": number, "host": self.record.get("host"),
                         "run_id": run_id(settings.job, number, slot.width, None), "found_by": self.record.get("owner"),
                         "finished_at": round(time.time(), 3)}
                if backend.add_history(settings.key, entry, settings.options.history, "missed@%d" % number,
                                       slot.marker_ttl):
                    recorded += 1
            missed = recorded + max(0, len(gap) - MAX_MISSED_RECORDED)
        except DlockError as exc:
            self.record.update(history="failed", history_error="finding missed slots: %s" % exc)
            return
        except Exception as exc:  # a backend's bug: never the run's end, nor its release
            self.record.update(history="failed", history_error="finding missed slots: %s: %s"
                               % (exc.__class__.__name__, exc))
            return
        if missed:
            self.record["slots_missed"] = missed

    @staticmethod
    def _blacked_out_in(gap, slot):
        """{slot: the window that blacked it out} for the slots of `gap` in a blackout window (blackout.py)."""
        if slot.blackout_of is None:
            return {}
        windows = dict((number, slot.blackout_of(number)) for number in gap)
        return dict((number, {"blackout": window}) for number, window in windows.items() if window is not None)

    def _paused_in(self, backend, gap, width):
        """{slot: what paused it} for the slots of `gap` whose boundary a
        pause of the job's scopes covered, from the backend's pause log
        (base.log_pause): no node was there to be refused (the fleet was
        down), yet the slot was paused. Read only when there is a gap."""
        if not gap:
            return {}
        scopes = pause_scopes(self.settings.key, self.settings.groups)
        spans = paused_spans(backend.read_history(PAUSE_LOG_KEY, PAUSE_LOG_KEEP), scopes)
        paused = {}
        for number in gap:
            pause = next((entry for start, end, entry in spans if start <= number * width < end), None)
            if pause is not None:
                paused[number] = {"paused": pause["scope"], "pause_reason": pause.get("reason"),
                                  "pause_source": "pause log"}
        return paused

    def _record_skips(self, backend, result, skipped, slot):
        """Slots of a gap that were skipped, not missed (a blackout window or
        a pause covered them): never caught up; each recorded `result` once,
        as a node refused at its grant would have. `skipped`: [(slot, the
        entry's fields that say why)]."""
        settings = self.settings
        for number, why in skipped:
            entry = dict(why, result=result, slot=number, run_id=run_id(settings.job, number, slot.width, None),
                         host=self.record.get("host"), found_by=self.record.get("owner"),
                         finished_at=round(time.time(), 3))
            backend.add_history(settings.key, entry, settings.options.history, "%s@%d" % (result, number),
                                slot.marker_ttl)

    def write_mirrored_pause(self, result, code, slot, open_backend):
        """A run the node's mirror refused never opened the backend: the
        slot's skip is written with one opened here (`open_backend()`), so
        that a paused slot is in the history also when every node refuses
        from its mirror. `slot`: estimated on this node's clock, which the
        runs' clock check keeps within max_clock_skew of the backend's."""
        if slot is None or not self.settings.options.history:
            return
        try:
            backend = open_backend()
        except DlockError as exc:
            self.record.update(history="failed", history_error=str(exc))
            return
        try:
            self.write(backend, result, code, slot)
        finally:
            backend.close()

    def _to_catch_up(self, gap, width):
        """The slots of `gap` the job's catch_up runs: those that ended
        within its window of now, the newest `max` of them, oldest first
        (policy latest: max is 1). The others are missed."""
        options = self.settings.options
        if not options.catches_up:
            return []
        since = time.time() - options.catch_up["window"]
        return [number for number in gap if (number + 1) * width >= since][-options.catch_up["max"]:]

    def _unrecorded(self):
        """This node's entries of the job that could not be written since
        its last one that was (the metrics keep the count)."""
        if not self.settings.metrics_dir:
            return 0
        return int(report.read_gauges(self.settings.metrics_dir, self.settings.job).get("dlock_history_unrecorded", 0))
