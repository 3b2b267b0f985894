"""The ledger of a lab job (ledger_job.py) and the runners' log lines, read
from the job nodes' journals, and the checks every fault test makes of it.

A run is one grant: its owner token names it. Its interval is the job's own
start and end (LEDGER_START, LEDGER). A job killed before its end line (its
runner lost the lease) ends at the latest when its runner logged its result:
the runner logs only after the job's whole process group is gone. Without a
start line, the runner's own start (its log time less its duration) opens
the run: earlier than the job, so any overlap still shows.
"""

import collections
import concurrent.futures
import json

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
    line gave the end)."""
    found = collections.OrderedDict()

    def run(owner, host):
        return found.setdefault(owner, {"owner": owner, "host": host, "fence": None, "run_id": None, "start": None,
                                        "runner_start": None, "end": None, "ended": None, "result": None})
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
            entry.update(result=record["result"], runner_start=at - record["duration_ms"] / 1000.0)
            entry["fence"] = entry["fence"] if entry["fence"] is not None else record["fence"]
            entry["run_id"] = entry["run_id"] or record["run_id"]
            if entry["ended"] is None:
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
