"""The ledger of a lab job (ledger_job.py) and the runners' log lines, read
from the job nodes' journals, and the checks every fault test makes of it.

A run is one grant: its owner token names it. Its interval is the job's own
start and end (LEDGER_START, LEDGER). A job killed before its end line (its
runner lost the lease) ends at the latest when its runner logged its result:
the runner logs only after the job's whole process group is gone. Without a
start line, the runner's own start (its log time less its duration) opens
the run: earlier than the job, so any overlap still shows.
"""

import calendar
import collections
import concurrent.futures
import json
import math
import time

START, END = "LEDGER_START ", "LEDGER "


def journal(lab, unit, since):
    """(node, realtime seconds, message) of UNIT's journal lines on every job
    node, logged at or after SINCE (a float: lines of the same second from
    before it are left out)."""
    def read(node):
        out = lab.ssh(node, "journalctl -u %s --since @%d -o json --output-fields=MESSAGE --no-pager"
                      % (unit, int(since)), check=True).stdout
        lines = []
        for text in out.splitlines():
            entry = json.loads(text)
            at = int(entry["__REALTIME_TIMESTAMP"]) / 1e6
            if at >= since and isinstance(entry.get("MESSAGE"), str):  # binary messages are a list of bytes
                lines.append((node, at, entry["MESSAGE"]))
        return lines
    nodes = lab.group("dlock_nodes")
    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
        return [line for lines in pool.map(read, nodes) for line in lines]


def runs(lines):
    """The granted runs found in journal lines, one dict each: host, owner,
    fence, run_id, start, end (None while unknown: still running), result
    (the runner's, None until it logged), ended ('job' or 'runner': which
    line gave the end; the runner's says when it saw the job ended, or
    without that field, when it logged), logged (when the runner logged its
    result: after its release)."""
    found = collections.OrderedDict()

    def run(owner, host):
        return found.setdefault(owner, {"owner": owner, "host": host, "fence": None, "run_id": None, "start": None,
                                        "runner_start": None, "end": None, "ended": None, "result": None,
                                        "logged": None})
    for node, at, message in sorted(lines, key=lambda line: line[1]):
        if message.startswith(START) or message.startswith(END):
            record = json.loads(message.split(" ", 1)[1])
            entry = run(record["owner"], node)
            entry.update(fence=record["fence"], run_id=record["run_id"], start=record["start"])
            if message.startswith(END):
                entry.update(end=record["end"], ended="job")
        elif message.startswith("{"):
            record = json.loads(message)
            if record.get("fence") is None:
                continue  # no grant: skipped, or the backend failed before one
            entry = run(record["owner"], node)
            entry.update(result=record["result"], runner_start=at - record["duration_ms"] / 1000.0, logged=at)
            entry["fence"] = entry["fence"] if entry["fence"] is not None else record["fence"]
            entry["run_id"] = entry["run_id"] or record["run_id"]
            if entry["ended"] is None and record.get("job_ended_ms") is not None:
                # Killed before it could write its end: when its runner saw it
                # ended (job_ended_ms, on duration_ms's scale), not when the
                # runner logged, after its release and history writes.
                entry.update(end=at - (record["duration_ms"] - record["job_ended_ms"]) / 1000.0, ended="runner")
            elif entry["ended"] is None:
                entry.update(end=at, ended="runner")
    for entry in found.values():
        if entry["start"] is None:
            entry["start"] = entry["runner_start"]
    return list(found.values())


def check(granted):
    """Assert the guarantees over the runs of one key: no two overlap, no slot
    (run id) ran twice, fencing tokens strictly increase in grant order.
    Returns the gaps between consecutive runs: (seconds, before, after)."""
    problems = []
    ordered = sorted(granted, key=lambda r: r["start"])
    for r in ordered:
        if r["end"] is None:
            problems.append("a run has no end (still running, or its runner vanished): %r" % r)

    def end(r):
        return float("inf") if r["end"] is None else r["end"]  # a run with no end may still be running
    latest, gaps = None, []  # latest: the run that ends last among those started so far
    for r in ordered:
        if latest is not None:
            if r["start"] < end(latest):
                problems.append("runs overlap by %.3fs: %r and %r" % (end(latest) - r["start"], latest, r))
            else:
                gaps.append((r["start"] - end(latest), latest, r))
        if latest is None or end(r) > end(latest):
            latest = r
    for before, after in zip(ordered, ordered[1:]):
        if not after["fence"] > before["fence"]:
            problems.append("fencing token did not increase: %r then %r" % (before, after))
    twice = [run_id for run_id, count in collections.Counter(r["run_id"] for r in ordered).items() if count > 1]
    for run_id in twice:
        same = [r for r in ordered if r["run_id"] == run_id]
        problems.append("slot %s ran %d times: %r" % (run_id, len(same), same))
    assert not problems, "%d problem(s) in the ledger of %d runs:\n%s" % (len(problems), len(ordered),
                                                                          "\n".join(problems[:20]))
    return gaps


def longest_gap_across(gaps, start, end):
    """The longest of GAPS (check's) that overlaps [START, END]: how long
    the fleet went without a run across something that happened then (a
    leader change). 0.0 when a run held the lock all that time."""
    return max([seconds for seconds, before, after in gaps if before["end"] < end and after["start"] > start] or [0.0])


def slot_of(run):
    """The boundary (epoch seconds) of the once-per slot a run claimed, from
    its run id (JOB@2026-11-29T08:20:14Z); None for a run without one."""
    run_id = run.get("run_id") or ""
    if "@" not in run_id:
        return None
    return calendar.timegm(time.strptime(run_id.split("@", 1)[1], "%Y-%m-%dT%H:%M:%SZ"))


# The fields of a runner's record that say why its run ended as it did.
WHY_FIELDS = ("error", "reason", "renew_error", "renewals", "lease_overrun_ms")


def results(lines):
    """{result: (count, why the last one ended so)} of the runners' log lines
    among LINES. Why: the node, and what its record says (error, reason, the
    last renewal's error), so that a failure read from the test's output
    names its cause (None when the record says nothing)."""
    found = {}
    for node, _at, message in sorted(lines, key=lambda line: line[1]):
        if message.startswith("{"):
            record = json.loads(message)
            count, why = found.get(record["result"], (0, None))
            said = ["%s: %s" % (field, record[field]) for field in WHY_FIELDS if record.get(field)]
            found[record["result"]] = (count + 1, "%s: %s" % (node, "; ".join(said)) if said else why)
    return found


def attempts(lines):
    """Every runner's attempt found in journal lines, granted or not, one
    dict each: host, fired (when its timer started the service: systemd's
    "Starting" line; without one, the runner's own start), logged (when its
    runner logged its result), result, slot (the boundary a granted run
    claimed; None without a grant). A job's service is Type=oneshot, so
    a node's attempts follow one another: each record belongs to the last
    "Starting" line before it on its node."""
    fired_on, found = {}, []
    for node, at, message in sorted(lines, key=lambda line: line[1]):
        if message.startswith("Starting "):
            fired_on[node] = at
        elif message.startswith("{"):
            record = json.loads(message)
            fired = fired_on.pop(node, None)
            found.append({"host": node, "fired": at - record["duration_ms"] / 1000.0 if fired is None else fired,
                          "logged": at, "result": record["result"], "slot": slot_of(record)})
    return found


def slot_share(granted, tried, period, since, until, firing):
    """Which slots ran, of those the fleet could have run, in [SINCE, UNTIL).

    A slot (a boundary, a multiple of PERIOD, whose whole slot lies in the
    span) could run unless it was refused as it should be, or its runners
    were too slow for it. Its attempts are those of TRIED (attempts())
    whose timers fired in time: by boundary + FIRING (the randomized delay,
    the accuracy, and systemd's own lateness on a busy host). A timer that
    fires while its node's last run goes on starts the service only when
    that run ends (a oneshot's start job waits): such a late attempt asks in
    a later slot, and is not this slot's.
    - Refused as it should be: every attempt was refused skipped_locked
      while a granted run held the lock; or there was no attempt in time,
      and a run held the lock at boundary + FIRING.
    - Too slow (LATE): the backend, whose clock decides the slot, answered
      every attempt for a later slot (a grant of it, or a duplicate of it:
      this slot did not run), or refused it as it should be. Each such
      answer shows its runner asked after this slot had closed: the slot
      was lost on the node (a runner's start on a loaded host), not by the
      backend.
    A run holds from its runner's start, which is before its grant, until
    its runner logged, which is after its release. A slot whose attempt
    failed on the backend, or was refused while nothing held, could run.
    Returns (the slots that ran, the slots that could, the slots LATE)."""
    ran_slots = set(slot_of(run) for run in granted)

    def holds(run, start, end):
        """Whether RUN held the lock at some moment in [START, END]."""
        run_start = min(value for value in (run["start"], run.get("runner_start")) if value is not None)
        ends = [value for value in (run["end"], run.get("logged")) if value is not None]
        run_end = max(ends) if run["end"] is not None else float("inf")
        return run_start <= end and start < run_end

    def refused_as_it_should(attempt):
        return attempt["result"] == "skipped_locked" and \
            any(holds(run, attempt["fired"], attempt["logged"]) for run in granted)

    def answered_for_a_later_slot(attempt, boundary):
        return attempt["result"] == "skipped_duplicate" or (attempt["slot"] or boundary) > boundary
    ran, could, late = [], [], []
    boundary = math.ceil(since / period) * period
    while boundary + period <= until:
        in_time = [attempt for attempt in tried if boundary <= attempt["fired"] <= boundary + firing]
        if boundary in ran_slots:
            ran.append(boundary)
            could.append(boundary)
        elif in_time and all(refused_as_it_should(attempt) for attempt in in_time):
            pass
        elif in_time and all(refused_as_it_should(attempt) or answered_for_a_later_slot(attempt, boundary)
                             for attempt in in_time):
            late.append(boundary)
        elif in_time or not any(holds(run, boundary + firing, boundary + firing) for run in granted):
            could.append(boundary)
        boundary += period
    return ran, could, late
