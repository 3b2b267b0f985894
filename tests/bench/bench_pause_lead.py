"""Pause lead time (issue 23): from the return of a pause to the point
where no node starts the job any more, on etcd, Redis, PostgreSQL and
file://, measured side by side in one run (each round: every backend once,
in turn). Not part of the pass/fail suite. Writes
tests/bench/report-pause-lead.json.

  python tests/bench/bench_pause_lead.py [--rounds N] [--nodes N]

Each round, on a fresh key: NODES loops stand for the fleet's nodes, each
running `dlock run` of the job back to back (no once_per: every grant that
the lock allows runs), the job writing the moment it starts. After WARM
seconds the operator's `dlock pause --key KEY` is run; its return is the
moment the pause is in force (the dlock_pause module writes the backend the
same way, then the nodes' mirrors, which only add refusals). The loops go on
for AFTER seconds. Reported:
- lead: the last job start after the return (0 when none started after it):
  the grant that was already granted when the pause was written, its
  runner starting its job; the target is at most 1 s;
- started after: how many jobs started more than that 1 s after the return
  (must be 0: every grant asked after the pause is refused, 72);
- refused: the runs that exited 72 after the return (the loops did ask);
- last start: the last job start, from the return (negative: before it).
The pause's own round trip (the CLI's start, a Python process, to its
return) is printed beside it, and the runs of the round (the loops ran).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "tests")]

import servers  # noqa: E402

DLOCK = [sys.executable, "-c", "from dlock.cli import main; raise SystemExit(main())"]
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "plugins", "module_utils"))
WARM = 1.5  # seconds of runs before the pause
AFTER = 2.5  # seconds of ticks after it
TARGET = 1.0  # issue 23: no node starts the job later than this after the module's return
PAUSED = 72


def node_loop(url, key, ledger, stop, exits, pauses_dir):
    """One node: `dlock run` of the job back to back until `stop`; each
    job appends the moment it starts to `ledger`; (exit code, ended at) of each run in `exits`."""
    job = "date +%%s.%%N >> %s; sleep 0.1" % ledger
    while not stop.is_set():
        done = subprocess.run(DLOCK + ["run", "--job", key, "--backend", url, "--pauses-dir", pauses_dir, "--ttl",
                                       "10s", "--", "sh", "-c", job],
                              env=ENV, capture_output=True, text=True, check=False)
        exits.append((done.returncode, time.time()))


def one_round(url, key, nodes):
    """One round on a fresh key. The nodes share this host's mirror of the
    pauses (a directory of the round's own, which `dlock pause` writes too),
    as the nodes of a fleet each have theirs: the backend's pause is what is
    measured, the mirror only adds refusals."""
    workdir = tempfile.mkdtemp(prefix="dlock-pause-lead-")
    ledger, pauses_dir = os.path.join(workdir, "ledger"), os.path.join(workdir, "pauses")
    open(ledger, "w").close()
    stop, exits = threading.Event(), []
    loops = [threading.Thread(target=node_loop, args=(url, key, ledger, stop, exits, pauses_dir))
             for _node in range(nodes)]
    for loop in loops:
        loop.start()
    try:
        time.sleep(WARM)  # runs going on: the pause meets grants in flight
        asked = time.time()
        paused = subprocess.run(DLOCK + ["pause", "--key", key, "--reason", "bench", "--until", "10m",
                                         "--backend", url, "--pauses-dir", pauses_dir],
                                env=ENV, capture_output=True, text=True, check=False)
        returned = time.time()
        if paused.returncode != 0:
            raise SystemExit("dlock pause failed: %s" % paused.stderr)
        time.sleep(AFTER)
    finally:
        stop.set()
        for loop in loops:
            loop.join()
    with open(ledger) as handle:
        starts = [float(line) for line in handle if line.strip()]
    shutil.rmtree(workdir)
    after = [start - returned for start in starts if start > returned]
    return {"lead": max(after) if after else 0.0, "pause round trip": returned - asked,
            "last start": max(starts) - returned if starts else None,
            "started after target": sum(1 for late in after if late > TARGET),
            "refused after": sum(1 for code, ended in exits if code == PAUSED and ended > returned),
            "runs": len(starts)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=4)
    args = parser.parse_args()
    with servers.every_backend("dlock-bench-pause-") as urls:
        results = dict((backend, []) for backend in urls)
        for number in range(args.rounds):
            for backend, url in urls.items():
                key = "pause-lead-%s-%d-%d" % (backend.split()[0], number, os.getpid())
                results[backend].append(one_round(url, key, args.nodes))
    report = {}
    print("pause lead time, %d rounds, %d nodes each (target: no job starts later than %gs after the pause "
          "returns)" % (args.rounds, args.nodes, TARGET))
    print("%-18s %10s %10s %18s %14s %13s %8s %6s %16s" % (
        "backend", "lead p50", "lead max", "lead max / target", "pause rtt p50", "started > 1s", "refused", "runs",
        "last start max"))
    for backend, rounds in results.items():
        leads = [r["lead"] for r in rounds]
        row = {"lead_p50_s": statistics.median(leads), "lead_max_s": max(leads),
               "lead_max_over_target": max(leads) / TARGET,
               "pause_round_trip_p50_s": statistics.median(r["pause round trip"] for r in rounds),
               "started_after_target": sum(r["started after target"] for r in rounds),
               "refused_after": sum(r["refused after"] for r in rounds), "runs": sum(r["runs"] for r in rounds),
               "last_start_max_s": max(r["last start"] for r in rounds if r["last start"] is not None)}
        report[backend] = row
        print("%-18s %8.0fms %8.0fms %18.2f %12.0fms %13d %8d %6d %14.0fms" % (
            backend, row["lead_p50_s"] * 1000, row["lead_max_s"] * 1000, row["lead_max_over_target"],
            row["pause_round_trip_p50_s"] * 1000, row["started_after_target"], row["refused_after"], row["runs"],
            row["last_start_max_s"] * 1000))
    with open(os.path.join(HERE, "report-pause-lead.json"), "w") as handle:
        json.dump(report, handle, indent=2, sort_keys=True)


if __name__ == "__main__":
    main()
