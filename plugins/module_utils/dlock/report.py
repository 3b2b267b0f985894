"""What a run leaves behind: one JSON log line, and the job's textfile metrics.

Metrics go to METRICS_DIR/dlock_JOB.prom for node_exporter's textfile
collector, written to a temp file in the same directory and renamed, so a
scrape never sees half a file. Counters carry over from the previous file.

The metrics directory is shared (the dlock_runner role makes it 2775, group
dlock: every job's user writes there), so what lies in it is not trusted: the
previous file is read only if it is a regular file (a FIFO or a link there
starts the counters over, and the rename replaces it), the new one is
written through safefile.replace_file, and the directory's flock, which
anyone who can open the directory can take, is waited for at most
METRICS_LOCK_SECONDS: a run is never held up by its metrics.
"""

import errno
import fcntl
import json
import os
import re
import sys
import time

from .errors import ConfigError
from .safefile import read_regular, replace_file

LOG_FIELDS = ("job", "key", "owner", "fence", "run_id", "attempt", "wait_ms", "duration_ms", "result", "exit_code")

# (name, type, help); names and units follow Prometheus' rules (contract).
METRICS = (
    ("dlock_runs_total", "counter", "Runs of the job on this node, by result."),
    ("dlock_releases_unconfirmed_total", "counter",
     "Releases of the job's lease on this node that the backend did not confirm, by outcome "
     "(uncertain: it may have happened; failed: it did not). The run's result stands; the lease expires by itself."),
    ("dlock_history_writes_total", "counter",
     "Entries of the job's fleet-wide history this node wrote, by outcome (already_recorded: another node "
     "had written that slot's skip; failed: not written, the run unchanged)."),
    ("dlock_history_unrecorded", "gauge",
     "Entries of the job's history this node could not write since its last one that was written."),
    ("dlock_skipped_total", "counter",
     "Runs of the job on this node that did not run it, by reason (locked: another run held the lock; "
     "duplicate: the slot was done; paused; blackout: the slot is in a blackout window)."),
    ("dlock_catch_up_runs_total", "counter",
     "Runs of missed slots of the job on this node, by kind (catch_up: found by a run after a gap, the job's "
     "catch_up; backfill: dlock backfill), whatever their result (dlock_runs_total has it)."),
    ("dlock_slots_missed_total", "counter",
     "Slots of the job's schedule that elapsed with no run, no skip and no pause recorded in the fleet-wide "
     "history, found by this node's runs (each slot is counted by one node: sum over the nodes)."),
    ("dlock_lock_wait_seconds", "gauge", "Time the last run waited for the lock."),
    ("dlock_last_run_timestamp_seconds", "gauge", "Unix time at which the last run ended."),
    ("dlock_last_run_duration_seconds", "gauge", "Wall time of the last run, lock handling included."),
    ("dlock_last_exit_code", "gauge", "Exit code of the last run of the runner."),
    ("dlock_last_paused_timestamp_seconds", "gauge",
     "Unix time at which a pause or a blackout window last refused a run of the job on this node: that slot was "
     "skipped, not missed."),
    ("dlock_lock_held", "gauge", "1 while this node holds the job's lock."),
    ("dlock_lock_age_seconds", "gauge", "Age of the lease this node holds (0 when it holds none)."),
    ("dlock_fencing_token", "gauge", "Fencing token of this node's last grant of the lock."),
    ("dlock_clock_offset_seconds", "gauge", "Backend clock minus local clock, measured at the last run."),
    ("dlock_lease_overrun_seconds", "gauge",
     "How far past its lease's earliest expiry the last run's job ran unsupervised (runner stopped or paused); 0: not at all."),
)
SKIP_REASONS = ("locked", "duplicate", "paused", "blackout")
CATCH_UP_KINDS = ("catch_up", "backfill")
SKIPPED = "skipped_"  # a result that did not run the job: SKIPPED + its reason
RESULTS = ("success", "failed") + tuple(SKIPPED + reason for reason in SKIP_REASONS) + (
    "lock_lost", "backend_error", "clock_unsafe", "rerun_refused")
# The release's outcome (Runner._release), the log line's `release`:
# released, not_ours (the backend answered: the lease was no longer ours),
# or one the backend did not confirm, which is counted.
RELEASE_UNCONFIRMED = ("uncertain", "failed")
# Each counter: its label and the values it counts, all of them written
# from 0 on (a rate needs the series before its first increase); a label of
# None: the counter has the job's label only.
# The history's write (history.py), the log line's `history`.
HISTORY_OUTCOMES = ("written", "already_recorded", "failed")
COUNTERS = {"dlock_runs_total": ("result", RESULTS),
            "dlock_releases_unconfirmed_total": ("outcome", RELEASE_UNCONFIRMED),
            "dlock_history_writes_total": ("outcome", HISTORY_OUTCOMES),
            "dlock_skipped_total": ("reason", SKIP_REASONS),
            "dlock_catch_up_runs_total": ("kind", CATCH_UP_KINDS),
            "dlock_slots_missed_total": (None, (None,))}
_COUNTER_LINE = re.compile(r'^(dlock_[a-z_]+_total)\{job="[^"]*"(?:,([a-z_]+)="([a-z_]+)")?\} (\d+)$')
METRICS_LOCK_SECONDS = 2.0


def log_line(record, stream=None):
    """One JSON object on one line (stderr -> journald), contract fields first."""
    ordered = dict((name, record.get(name)) for name in LOG_FIELDS)
    ordered.update((k, v) for k, v in record.items() if k not in ordered and v is not None)
    (stream or sys.stderr).write(json.dumps(ordered) + "\n")


def _escape(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def metrics_path(directory, job):
    return os.path.join(directory, "dlock_%s.prom" % job)


def _read_previous(path):
    """The text of the job's previous metrics file; "" when there is none, or
    when what is there is not a regular file of ours to read."""
    try:
        return read_regular(path, "metrics file", follow=False)
    except (IOError, OSError, ConfigError):
        return ""


def _counters(text):
    """{counter: {value of its label: count}} of the previous file, every value of COUNTERS from 0."""
    counts = dict((name, dict((value, 0) for value in values)) for name, (_label, values) in COUNTERS.items())
    for line in text.splitlines():
        match = _COUNTER_LINE.match(line.strip())
        if match and match.group(1) in COUNTERS and COUNTERS[match.group(1)][0] == match.group(2):
            counts[match.group(1)][match.group(3)] = int(match.group(4))
    return counts


def render_families(families):
    """Exposition text of [(name, type, help, [(labels dict, value), ...])];
    families without samples are left out."""
    lines = []
    for name, kind, help_text, samples in families:
        if not samples:
            continue
        lines.append("# HELP %s %s" % (name, help_text))
        lines.append("# TYPE %s %s" % (name, kind))
        for labels, value in samples:
            text = ",".join('%s="%s"' % (k, _escape(v)) for k, v in sorted(labels.items()))
            lines.append("%s%s %s" % (name, "{%s}" % text if text else "", _number(value)))
    return "\n".join(lines) + "\n"


def render(job, counts, gauges):
    labels = {"job": job}
    families = []
    for name, kind, help_text in METRICS:
        if name in COUNTERS:
            label = COUNTERS[name][0]
            samples = [(dict(labels, **{label: value}) if label else labels, counts[name][value])
                       for value in sorted(counts[name], key=str)]
        elif gauges.get(name) is not None:
            samples = [(labels, gauges[name])]
        else:
            samples = []
        families.append((name, kind, help_text, samples))
    return render_families(families)


def write_textfile(path, text):
    """A new file renamed over the old: a scrape never sees half a file."""
    replace_file(path, text, 0o644)


def _number(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def read_gauges(directory, job):
    """The gauges of the job's metrics file ({} when there is none)."""
    return _gauges(_read_previous(metrics_path(directory, job)))


def write_metrics(directory, job, gauges, result=None, release=None, history=None, missed=0, catch_up=None):
    """Update the job's file: count `result` (if given), the release's
    outcome `release` if the backend did not confirm it, the history
    write's outcome `history`, the `missed` slots the run found and, for
    the run of a missed slot, its kind `catch_up` (CATCH_UP_KINDS), and set
    the gauges given.

    The directory's flock serialises two runners of one job on one node."""
    path = metrics_path(directory, job)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _lock_within(dir_fd, METRICS_LOCK_SECONDS, directory)
        text = _read_previous(path)
        counts, previous = _counters(text), _gauges(text)
        previous.update((k, v) for k, v in gauges.items() if v is not None)
        if result is not None:
            counts["dlock_runs_total"][result] = counts["dlock_runs_total"].get(result, 0) + 1
            if result.startswith(SKIPPED) and result[len(SKIPPED):] in SKIP_REASONS:
                counts["dlock_skipped_total"][result[len(SKIPPED):]] += 1
            if catch_up in CATCH_UP_KINDS:
                counts["dlock_catch_up_runs_total"][catch_up] += 1
        if release in RELEASE_UNCONFIRMED:
            counts["dlock_releases_unconfirmed_total"][release] += 1
        counts["dlock_slots_missed_total"][None] += missed
        if history in HISTORY_OUTCOMES:
            counts["dlock_history_writes_total"][history] += 1
            # An entry written carries the count before it (unrecorded_before): it starts over.
            unrecorded = int(previous.get("dlock_history_unrecorded", 0))
            previous["dlock_history_unrecorded"] = unrecorded + 1 if history == "failed" else \
                0 if history == "written" else unrecorded
        write_textfile(path, render(job, counts, previous))
    finally:
        os.close(dir_fd)


def _lock_within(fd, seconds, what):
    """flock(fd) exclusively, waiting at most `seconds` (flock(2) has no
    timeout of its own); OSError(EWOULDBLOCK) naming `what` after that."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise OSError(errno.EWOULDBLOCK, "%s: its lock was held by another process for over %gs"
                              % (what, seconds))
            time.sleep(0.01)


def _gauges(text):
    """The gauges of the previous file (so a partial update keeps the others),
    up to the first line that is not one of ours."""
    gauges = {}
    for line in text.splitlines():
        if line.startswith("dlock_") and line.split("{", 1)[0] not in COUNTERS:
            try:
                gauges[line.split("{", 1)[0]] = float(line.rsplit(" ", 1)[1])
            except (ValueError, IndexError):
                break
    return gauges
