"""A run's entry in its job's fleet-wide history (docs/runner.md, "History").

The backend keeps the newest entries of each lock key (Backend.add_history;
the job option `history`, 0: none). Each runner writes its own run's entry
after the release, one more operation outside the grant, so that a history
that cannot be written never fails, delays or changes a run: the failure is
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
    entry), a refused rerun, nor a run that never reached the backend.
"""

import time

from . import report
from .errors import DlockError
from .slots import MANUAL_MARKER_TTL, run_id

SKIPS_ONCE_PER_SLOT = ("skipped_paused", "skipped_locked")
NOT_RECORDED = ("skipped_duplicate", "rerun_refused", "backend_error", "clock_unsafe")
# The log line's fields an entry carries, when the run has them.
ENTRY_FIELDS = ("host", "owner", "fence", "run_id", "slot", "exit_code", "result", "release", "holder", "paused",
                "pause_reason", "pause_source", "rerun", "rerun_reason", "manual_id", "manual_reason", "forced",
                "member")


def once_id(result, slot):
    """The id of a slot's skip (base.history_record): one entry per slot and reason."""
    return "%s@%d" % (result, slot.number)


class RunHistory(object):
    """The entry of one run, written once it has ended."""

    def __init__(self, settings, record):
        self.settings = settings
        self.record = record  # the run's log line: most of the entry
        self.started_at = time.time()

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
        entry = dict((name, self.record[name]) for name in ENTRY_FIELDS if self.record.get(name) is not None)
        if once is not None:  # a skip: the slot it skipped, named as its run would have been
            entry["run_id"] = run_id(self.settings.job, slot.number, slot.width, None, self.settings.manual)
        entry.update(result=result, exit_code=code, started_at=round(self.started_at, 3),
                     finished_at=round(time.time(), 3))
        unrecorded = self._unrecorded()
        if unrecorded:
            entry["unrecorded_before"] = unrecorded
        once_ttl = None if slot is None else (MANUAL_MARKER_TTL if slot.width is None else slot.marker_ttl)
        try:
            written = backend.add_history(self.settings.key, entry, keep, once, once_ttl)
        except DlockError as exc:
            self.record.update(history="failed", history_error=str(exc))
        except Exception as exc:  # a backend's bug: never the run's end
            self.record.update(history="failed", history_error="%s: %s" % (exc.__class__.__name__, exc))
        else:
            self.record["history"] = "written" if written else "already_recorded"

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

    def _unrecorded(self):
        """This node's entries of the job that could not be written since
        its last one that was (the metrics keep the count)."""
        if not self.settings.metrics_dir:
            return 0
        return int(report.read_gauges(self.settings.metrics_dir, self.settings.job).get("dlock_history_unrecorded", 0))
