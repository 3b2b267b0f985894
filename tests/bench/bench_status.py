"""`dlock status` on a node with 1000 jobs, on each backend.

Not part of the pass/fail suite. A node's files as the roles write them
(dlock.json; one job file a job in the jobs directory) and, on the backend,
each job's lock as a run leaves it: taken and released once, with the last
run's record (what status shows in LAST RESULT). Then `dlock status
--config FILE` (every job of the jobs directory: each job file loaded, each
lock queried), started as on a node (bench_startup.install_engine: the
engine byte-compiled, the role's wrapper), on jobs directories of 10, 100
and 1000 jobs, with `python -I -c pass` beside them, each once a round in
turn (interleaved), --rounds rounds: median wall times, and the CPU time
(user + system, os.wait4) of the largest.

Target (issue 26): 1000 jobs in at most 1 s. Beside it, the cost of a job
between 10 and 100 jobs and between 100 and 1000 ((t(1000) - t(100)) / 900),
and their ratio, "growth": above 1, a job costs more the more jobs there are.

  python tests/bench/bench_status.py [--rounds N] [--python PY] [--quick]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.join(ROOT, "tests")]

import servers  # noqa: E402
from bench_startup import MODULE_UTILS, install_engine  # noqa: E402

sys.path.insert(0, MODULE_UTILS)
from dlock.backends import open_backend  # noqa: E402

TARGET_JOBS, TARGET_SECONDS = 1000, 1.0


def job_name(number):
    return "job-%04d" % number


def node(directory, url, jobs):
    """dlock.json and a jobs directory of `jobs` job files; returns the config's path."""
    jobs_dir = os.path.join(directory, "jobs")
    os.makedirs(jobs_dir)
    for number in range(jobs):
        with open(os.path.join(jobs_dir, job_name(number) + ".json"), "w") as handle:
            json.dump({"command": ["/usr/local/bin/report", "--part", str(number)], "environment": {},
                       "ttl": "5m", "description": "bench job %d" % number}, handle, indent=4)
    config = os.path.join(directory, "dlock.json")
    with open(config, "w") as handle:
        json.dump({"backend": url, "jobs_dir": jobs_dir, "fence_epoch": 0}, handle, indent=4)
    return config


def ran_once(url, jobs):
    """Each job's lock as after one run of it: granted, then released with
    its last run's record (runner.Runner._release's fields)."""
    backend = open_backend(url)
    try:
        for number in range(jobs):
            key, owner = job_name(number), "node01:%d:%d" % (os.getpid(), number)
            grant = backend.acquire(key, owner, 300)
            assert grant.granted
            backend.release(key, owner, 0.0, {"result": "success", "exit_code": 0, "owner": owner, "host": "node01",
                                              "fence": grant.fence, "run_id": "%s@bench" % key,
                                              "finished_at": time.time()})
    finally:
        backend.close()


def timed(argv, env):
    """(wall seconds, CPU seconds, stdout) of one run of argv."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = proc.stdout.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.stdout.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError("%s exited %d" % (" ".join(argv), proc.returncode))
    return wall, usage.ru_utime + usage.ru_stime, out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--python", default=sys.executable, help="the nodes' interpreter, with the three drivers")
    parser.add_argument("--backends", default="file,redis,postgresql,etcd")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 10, 20 and 100 jobs, 2 rounds")
    args = parser.parse_args()
    sizes, rounds = ((10, 20, 100), 2) if args.quick else ((10, 100, 1000), args.rounds)
    kinds = args.backends.split(",")
    scratch = tempfile.mkdtemp(prefix="dlock-bench-status-")
    started = {}
    try:
        for kind in kinds:
            if kind == "redis":
                started[kind] = servers.RedisServer()
            elif kind == "postgresql":
                started[kind] = servers.PostgresServer()
            elif kind == "etcd":
                started[kind] = servers.EtcdServer()
        urls = {"file": "file://" + os.path.join(scratch, "locks")}
        urls.update((kind, server.url() if kind == "postgresql" else server.url) for kind, server in started.items())
        wrapper = install_engine(args.python, MODULE_UTILS, os.path.join(scratch, "engine"))
        commands = {("python -I -c pass", 0): [args.python, "-I", "-c", "pass"]}
        for kind in kinds:
            ran_once(urls[kind], max(sizes))
            for size in sizes:
                config = node(os.path.join(scratch, "%s-%d" % (kind, size)), urls[kind], size)
                commands[(kind, size)] = [wrapper, "status", "--config", config]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        samples, cpu = dict((name, []) for name in commands), dict((name, []) for name in commands)
        for _round in range(rounds + 1):  # the first warms the page cache: not counted
            for name, argv in commands.items():
                wall, used, out = timed(argv, env)
                samples[name].append(wall)
                cpu[name].append(used)
                if name[1]:
                    assert out.count("success (exit 0) on node01") == name[1], out[-500:]
    finally:
        for server in started.values():
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    medians = dict((name, statistics.median(values[1:])) for name, values in samples.items())
    cpu_medians = dict((name, statistics.median(values[1:])) for name, values in cpu.items())
    floor = medians[("python -I -c pass", 0)]
    report = {"rounds": rounds, "python": args.python, "pass_ms": round(floor * 1000, 1), "backends": {}}
    small, middle, large = sizes
    print("%-11s %9s %9s %9s %9s %9s %16s %16s %9s" % (
        "backend", "%d jobs" % small, "%d jobs" % middle, "%d jobs" % large, "(CPU)", "/pass",
        "ms/job %d-%d" % (small, middle), "ms/job %d-%d" % (middle, large), "growth"))
    for kind in kinds:
        times = [medians[(kind, size)] for size in sizes]
        low = (times[1] - times[0]) / (middle - small)
        high = (times[2] - times[1]) / (large - middle)
        row = {"wall_ms": dict((size, round(t * 1000, 1)) for size, t in zip(sizes, times)),
               "ms_per_job_low": round(low * 1000, 3), "ms_per_job_high": round(high * 1000, 3),
               "growth": round(high / low, 2) if low > 0 else None, "to_pass": round(times[2] / floor, 2),
               "cpu_ms": round(cpu_medians[(kind, large)] * 1000, 1)}
        report["backends"][kind] = row
        verdict = ""
        if large == TARGET_JOBS:
            verdict = "  target <= %gs: %s" % (TARGET_SECONDS, "met" if times[2] <= TARGET_SECONDS else "NOT met")
        print("%-11s %7.0fms %7.0fms %7.0fms %7.0fms %8.1fx %16.3f %16.3f %9s%s" % (
            kind, times[0] * 1000, times[1] * 1000, times[2] * 1000, row["cpu_ms"], row["to_pass"], low * 1000, high * 1000,
            "%.2fx" % row["growth"] if row["growth"] else "n/a", verdict))
    print("python -I -c pass %.1fms; medians of %d interleaved rounds; (CPU): user + system of the largest; "
          "growth: the ms a job between %d and %d jobs over the same between %d and %d (1.0: linear)"
          % (floor * 1000, rounds, middle, large, small, middle))
    with open(os.path.join(HERE, "report-status.json"), "w") as handle:
        json.dump(report, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
