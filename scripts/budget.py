"""The test suite's budget table: what each stage cost and what it checked.

scripts/test.sh names a file in DLOCK_SUITE_COUNT and three kinds of JSON
lines land in it:
- "stage": one per stage, from `budget.py stage` at the stage's end (its
  name, lane, seconds, exit status and the checks its output reports);
- "playbook": one per ansible-playbook run in a lab stage, from the
  callback tests/budget/callback_plugins/dlock_suite_count.py;
- "up": one per `lab.py up` that booted nodes (tests/lab/lab.py);
- "node_cpu": one per lab node removed, the CPU time its cgroup used.

    budget.py stage --name NAME --lane LANE --seconds N --rc N --output FILE [--cpu-seconds N]
    budget.py cpu      # before and after the lanes: how busy the cores were
    budget.py table

`table` prints one row a stage and the totals: its CPU time (its own
processes on the host, from the cgroup scripts/test.sh runs it in, plus its
lab nodes'; on two cores the suite cannot end before half the total),  the rollouts of
playbooks/site.yml (a molecule converge.yml imports it and counts as one),
in check mode, and failing (the preflight tests' rollouts fail on purpose),
and the labs and nodes booted. Then, for each stage that failed, what failed
(pytest's FAILED/ERROR lines, ansible's fatal lines, sanity's ERROR lines, or
else the stage's last lines): the end of a CI log is what gets read.
"""

import argparse
import json
import os
import re
import sys

ROLLOUT_PLAYBOOKS = ("site.yml", "converge.yml")

# pytest's closing line: "==== 12 passed, 1 skipped in 3.41s ====", or without the
# rules under -q; molecule frames its verify's output ("  │ ==== 78 passed in 151.74s").
PYTEST_SUMMARY = re.compile(r"^(?:=+ )?(?P<counts>\d+ \w+.*?) in [\d.]+s(?: \([^)]*\))?(?: =+)?$")
# Colours and terminal hyperlinks (molecule and ansible-lint write them even to a pipe).
TERMINAL_CODES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|\x1b\]8;;[^\x1b]*\x1b\\")
FRAME = " \t\u2502"  # molecule's frame around a command's output
PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")
OTHER_CHECKS = {
    "sanity tests": re.compile(r"^Running sanity test [\"'][^\"']+[\"']"),
    "rule files": re.compile(r"^SUCCESS: \d+ rules found$"),
    "rule tests": re.compile(r"^Unit Testing: "),
    # molecule's own line (its closing summary repeats it without the level).
    "idempotence": re.compile(r"Idempotence completed successfully|^INFO\s.*idempotence: Executed: Successful"),
    "molecule syntax": re.compile(r"^INFO\s.*syntax: Executed: Successful"),
}
LINT = re.compile(r"^Passed: 0 failure\(s\), 0 warning\(s\) (?:on|in) (\d+) files")
# The lines that say what failed: pytest's short summary, ansible's failed tasks,
# ansible-test's and ansible-lint's errors, molecule's and nox's verdicts.
FAILURE = re.compile(r"^(?:FAILED |ERROR |ERROR: |fatal: |failed: |CRITICAL |nox > Session .* failed)")
FAILURES_KEPT = 25  # a stage's failure lines shown at most
LAST_LINES = 15  # shown when a failed stage's output has none of those lines


def cpu_times():
    """(busy, total) jiffies of all the machine's cores, from /proc/stat."""
    with open("/proc/stat") as handle:
        fields = [int(v) for v in handle.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


def checks_in(text):
    """{what: count} of the checks an output reports having run."""
    counts = {}
    for line in TERMINAL_CODES.sub("", text).splitlines():
        line = line.strip(FRAME)
        summary = PYTEST_SUMMARY.match(line)
        if summary:
            for number, word in PYTEST_COUNT.findall(summary.group("counts")):
                word = "error" if word.startswith("error") else word
                counts[word] = counts.get(word, 0) + int(number)
            continue
        lint = LINT.match(line)
        if lint:
            counts["lint files"] = counts.get("lint files", 0) + int(lint.group(1))
            continue
        for what, pattern in OTHER_CHECKS.items():
            if pattern.search(line):
                counts[what] = counts.get(what, 0) + 1
    return counts


def failures_in(text):
    """The lines of a failed stage's output that say what failed (its last lines if none does)."""
    lines = [line.strip(FRAME) for line in TERMINAL_CODES.sub("", text).splitlines()]
    failures = [line[:300] for line in lines if FAILURE.match(line)]
    if not failures:
        return [line[:300] for line in lines if line.strip()][-LAST_LINES:]
    if len(failures) > FAILURES_KEPT:
        failures = failures[:FAILURES_KEPT] + ["... and %d more" % (len(failures) - FAILURES_KEPT)]
    return failures


def append(record):
    """One JSON line in the file DLOCK_SUITE_COUNT names, with the stage
    (DLOCK_SUITE_STAGE) that wrote it; False, and nothing written, when no
    file is named. The one writer of those lines: this script's commands,
    the callback and lab.py all call it. O_APPEND and one short write: lines
    from parallel lanes never interleave."""
    path = os.environ.get("DLOCK_SUITE_COUNT")
    if not path:
        return False
    record = dict(record, stage=os.environ.get("DLOCK_SUITE_STAGE", ""))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)
    return True


def read(path):
    records = []
    with open(path) as handle:
        for line in handle:
            if line.strip():
                records.append(json.loads(line))
    return records


def describe(counts):
    order = ["passed", "failed", "error", "skipped", "xfailed", "xpassed", "deselected",
             "sanity tests", "rule files", "rule tests", "lint files", "idempotence"]
    return ", ".join("%d %s" % (counts[key], key) for key in order if counts.get(key))


def table(records):
    stages = [r for r in records if r["event"] == "stage"]
    rows = []
    totals = {"seconds": 0, "rollouts": 0, "check": 0, "failing": 0, "other": 0, "labs": 0, "nodes": 0,
              "host_cpu": 0.0, "node_cpu": 0.0}
    for stage in stages:
        runs = [r for r in records if r["event"] == "playbook" and r.get("stage") == stage["name"]]
        ups = [r for r in records if r["event"] == "up" and r.get("stage") == stage["name"]]
        rollouts = [r for r in runs if r["playbook"] in ROLLOUT_PLAYBOOKS]
        row = {
            "host_cpu": stage.get("cpu_seconds"),  # None: not measured (no cgroup2)
            "node_cpu": sum(r["seconds"] for r in records if r["event"] == "node_cpu" and r.get("stage") == stage["name"]),
            "rollouts": sum(1 for r in rollouts if not r["check"] and not r["failed"]),
            "check": sum(1 for r in rollouts if r["check"]),
            "failing": sum(1 for r in rollouts if r["failed"] and not r["check"]),
            "other": len(runs) - len(rollouts),
            "labs": sum(1 for r in ups if r["new_lab"]),
            "nodes": sum(r["booted"] for r in ups),
        }
        for key, value in row.items():
            totals[key] += value or 0
        rows.append((stage, row))
    header = "%-14s %-8s %6s %4s %6s %6s %5s %5s %5s %5s %4s %5s  %s" % (
        "stage", "lane", "secs", "rc", "cpu", "nodes'", "full", "check", "fail", "other", "labs", "nodes", "checks run")
    print(header)
    print("-" * len(header))
    for stage, row in rows:
        print("%-14s %-8s %6d %4d %6s %6d %5d %5d %5d %5d %4d %5d  %s" % (
            stage["name"][:14], stage["lane"], stage["seconds"], stage["rc"],
            "-" if row["host_cpu"] is None else "%d" % row["host_cpu"], row["node_cpu"],
            row["rollouts"], row["check"], row["failing"], row["other"], row["labs"], row["nodes"],
            describe(stage["checks"])))
    print("-" * len(header))
    print("CPU time: %d s in all, %d s of it in lab nodes (cpu: a stage's processes on the host; nodes': "
          "its lab nodes')" % (totals["host_cpu"] + totals["node_cpu"], totals["node_cpu"]))
    marks = [r for r in records if r["event"] == "cpu"]
    if len(marks) >= 2:
        busy = marks[-1]["busy"] - marks[0]["busy"]
        total = marks[-1]["total"] - marks[0]["total"]
        cores = os.cpu_count() or 1
        print("cores busy while the lanes ran: %.2f of %d on average (%.0f%%)"
              % (cores * busy / max(total, 1), cores, 100.0 * busy / max(total, 1)))
    print("site.yml rollouts: %d full, %d in check mode, %d failing (on purpose: preflight tests); "
          "%d other playbook runs; labs booted: %d (%d nodes)"
          % (totals["rollouts"], totals["check"], totals["failing"], totals["other"], totals["labs"], totals["nodes"]))
    for stage in stages:
        if stage["rc"]:
            print("\n=== what failed in %s (exit %d):" % (stage["name"], stage["rc"]))
            print("\n".join("  " + line for line in stage.get("failures") or ["(its output said nothing)"]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    stage = sub.add_parser("stage", help="record a finished stage (its checks are read from its output)")
    stage.add_argument("--name", required=True)
    stage.add_argument("--lane", required=True)
    stage.add_argument("--seconds", type=int, required=True)
    stage.add_argument("--rc", type=int, required=True)
    stage.add_argument("--output", required=True, help="the stage's whole output")
    stage.add_argument("--cpu-seconds", type=float, help="the CPU time of the stage's processes on the host")
    sub.add_parser("cpu", help="record the machine's CPU time so far (the table shows the share used between marks)")
    sub.add_parser("table", help="print the table of the stages recorded so far")
    args = parser.parse_args(argv)
    if args.command in ("stage", "cpu") and not os.environ.get("DLOCK_SUITE_COUNT"):
        raise SystemExit("budget.py: DLOCK_SUITE_COUNT names no file")
    if args.command == "stage":
        with open(args.output, errors="replace") as handle:
            output = handle.read()
        append({"event": "stage", "name": args.name, "lane": args.lane, "seconds": args.seconds,
                "rc": args.rc, "cpu_seconds": args.cpu_seconds, "checks": checks_in(output),
                "failures": failures_in(output) if args.rc else []})
        return 0
    if args.command == "cpu":
        busy, total = cpu_times()
        append({"event": "cpu", "busy": busy, "total": total})
        return 0
    path = os.environ.get("DLOCK_SUITE_COUNT", "")
    if not os.path.exists(path):
        print("budget.py: no stage was recorded (DLOCK_SUITE_COUNT=%r)" % path, file=sys.stderr)
        return 1
    table(read(path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
