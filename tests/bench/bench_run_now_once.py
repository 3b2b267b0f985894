"""Run-now, exactly once (issue 23): `dlock run-now JOB --id ID` sent twice
from each of 3 nodes at once, 100 trials, on etcd, Redis, PostgreSQL and
file://, side by side in one run (each trial: every backend in turn). Not
part of the pass/fail suite. Writes tests/bench/report-run-now-once.json.

  python tests/bench/bench_run_now_once.py [--trials N]

Each trial has an id of its own; its six commands start together (three
nodes, each sending it twice, as an operator who retries would) and the
job, which holds its lock a little (HOLD), appends the id to a ledger. A
trial counts when the ledger names its id exactly once; each command's exit
code is counted too (0 ran it, 73 found the lock held, 74 found the id
done: nothing else is expected). Printed: the trials run exactly once out
of those run, beside the share of commands that found the id done (74)
rather than the lock held (73): how often a send came after the run ended.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "tests")]

import servers  # noqa: E402

DLOCK = [sys.executable, "-c", "from dlock.cli import main; raise SystemExit(main())"]
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "plugins", "module_utils"))
NODES, SENDS = 3, 2
HOLD = 0.2  # seconds the job holds the lock: the six commands overlap it


def node_dirs(workdir, url, key):
    """The job `billing` (its key KEY) in a jobs directory of its own, and its ledger."""
    jobs, ledger = os.path.join(workdir, "jobs"), os.path.join(workdir, "ledger")
    os.makedirs(jobs)
    script = ("import os, sys, time; open(sys.argv[1], 'a').write(os.environ['DLOCK_RUN_ID'] + '\\n'); "
              "time.sleep(%g)" % HOLD)
    with open(os.path.join(jobs, "billing.json"), "w") as handle:
        json.dump({"command": [sys.executable, "-c", script, ledger], "key": key}, handle)
    flags = ["--backend", url, "--jobs-dir", jobs, "--pauses-dir", os.path.join(workdir, "pauses")]
    return flags, ledger


def trial(flags, ledger, run_id):
    """(how many times the id ran, the commands' exit codes)."""
    commands = [subprocess.Popen(DLOCK + ["run-now", "billing", "--id", run_id] + flags, env=ENV,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for _command in range(NODES * SENDS)]
    codes = [command.wait(timeout=120) for command in commands]
    with open(ledger) as handle:
        ran = sum(1 for line in handle if line.strip() == "billing@manual:" + run_id)
    return ran, codes


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=100)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="dlock-bench-run-now-nodes-")
    nodes, results = {}, {}
    try:
        with servers.every_backend("dlock-bench-run-now-") as urls:
            for backend, url in urls.items():
                key = "run-now-once-%s-%d" % (backend.split()[0], os.getpid())
                nodes[backend] = node_dirs(os.path.join(workdir, backend.split()[0]), url, key)
                results[backend] = {"once": 0, "trials": 0, "codes": {}}
            for number in range(args.trials):
                for backend in urls:
                    ran, codes = trial(nodes[backend][0], nodes[backend][1], "trial-%d" % number)
                    row = results[backend]
                    row["trials"] += 1
                    row["once"] += ran == 1
                    for code in codes:
                        row["codes"][str(code)] = row["codes"].get(str(code), 0) + 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("run-now, %d nodes each sending one id %d times at once, %d trials" % (NODES, SENDS, args.trials))
    print("%-18s %18s %10s %26s" % ("backend", "ran exactly once", "ratio", "exit codes (count)"))
    for backend, row in results.items():
        row["ratio"] = float(row["once"]) / row["trials"]
        print("%-18s %11d of %3d %10.2f %26s" % (backend, row["once"], row["trials"], row["ratio"],
                                                 " ".join("%s:%d" % item for item in sorted(row["codes"].items()))))
    with open(os.path.join(HERE, "report-run-now-once.json"), "w") as handle:
        json.dump(results, handle, indent=2, sort_keys=True)


if __name__ == "__main__":
    main()
