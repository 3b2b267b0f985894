"""What containment costs and how fast it ends a job's tree, side by side.

Not part of the pass/fail suite. Interleaved rounds (A B C A B C ...), medians.

1. Start + wait of `true`, in process: subprocess.Popen with PDEATHSIG and a
   new session (what the runner did before the guard), against child.Child
   under the guard alone (DLOCK_CGROUP=off) and, where one can be made, with
   a cgroup of the job's own.
2. `dlock run --backend file:// -- true`, guard against cgroup.
3. From SIGKILL of the runner to the death of every process of an
   `sh -c` job that double-forks out of its session (pidfd of each).

  python tests/bench/bench_containment.py [--rounds N]
"""

import argparse
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODULE_UTILS = os.path.join(ROOT, "plugins", "module_utils")
sys.path[:0] = [HERE, os.path.join(ROOT, "tests"), MODULE_UTILS]

from bench_lock import timed_calls as medians  # noqa: E402
from dlock import child  # noqa: E402
from runner_proc import dlock_argv, runner_env  # noqa: E402


def _popen_before():
    preexec = child._prctl()
    proc = subprocess.Popen(["true"], start_new_session=True,
                            preexec_fn=lambda: preexec(child.PR_SET_PDEATHSIG, signal.SIGKILL))
    proc.wait()


def _guarded(cgroup):
    def run():
        os.environ["DLOCK_CGROUP"] = "auto" if cgroup else "off"
        job = child.Child(["true"], dict(os.environ))
        while job.wait(1.0) is None:
            pass
        job.close()
    return run


def _command(argv, env):
    return lambda: subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)


def _kill_latency(env, directory):
    """Seconds from SIGKILL of the runner to the last death in its job's tree."""
    ledger = os.path.join(directory, "pids")
    script = "(setsid sh -c 'echo $$ >> {L}; exec sleep 600' &); echo $$ >> {L}; sleep 600 & echo $! >> {L}; wait"
    runner = subprocess.Popen(dlock_argv("run", "--job", "bench", "--backend", "file://" + directory, "--",
                                         "/bin/sh", "-c", script.format(L=ledger)),
                              env=env, stderr=subprocess.DEVNULL)
    pids = []
    while len(pids) < 3:
        time.sleep(0.01)
        if os.path.exists(ledger):
            with open(ledger) as handle:
                pids = [int(line) for line in handle if line.strip()]
    fds = [os.pidfd_open(pid) for pid in pids]
    killed = time.perf_counter()
    runner.kill()
    pending = list(fds)
    while pending:
        ready = select.select(pending, [], [], 10)[0]
        assert ready, "a process of the job survived its runner for 10s"
        pending = [fd for fd in pending if fd not in ready]
    took = time.perf_counter() - killed
    runner.wait()
    for fd in fds:
        os.close(fd)
    os.unlink(ledger)
    return took


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    can_cgroup = child.make_cgroup()
    if can_cgroup:
        child.remove_cgroup(can_cgroup)
    spawn = {"popen+pdeathsig (before)": _popen_before, "guard": _guarded(False)}
    if can_cgroup:
        spawn["guard+cgroup"] = _guarded(True)
    directory = tempfile.mkdtemp()
    envs = {"guard": runner_env({"DLOCK_CGROUP": "off"})}
    if can_cgroup:
        envs["guard+cgroup"] = runner_env({"DLOCK_CGROUP": "auto"})
    sections = [
        ("start + wait of `true`", medians(spawn, args.rounds * 5)),
        ("dlock run --backend file:// -- true",
         medians(dict((name, _command(dlock_argv("run", "--job", "bench", "--backend", "file://" + directory, "--",
                                                 "true"), env)) for name, env in envs.items()), args.rounds)),
    ]
    for title, values in sections:
        base = list(values.values())[0]
        print(title)
        for name, value in values.items():
            print("  %-28s %8.2f ms  %.2fx" % (name, value * 1000, value / base))
    print("SIGKILL of the runner -> whole tree (3 processes, one setsid'd) dead")
    for name, env in envs.items():
        took = statistics.median(_kill_latency(env, directory) for _round in range(max(3, args.rounds // 3)))
        print("  %-28s %8.2f ms" % (name, took * 1000))


if __name__ == "__main__":
    main()
