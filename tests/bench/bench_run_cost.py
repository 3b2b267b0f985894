"""What one run costs a node: CPU time and peak memory of `dlock run` of
`true` on each backend, beside the interpreter importing the driver.

Not part of the pass/fail suite. Each contender is started once a round,
in turn (interleaved), --rounds rounds, under GNU time (/usr/bin/time,
Debian's package `time`): its %M is the peak resident set of the largest
process of the run (the runner or its job). Not this process's own wait4:
the kernel counts the pages of the process that forked the child (this
Python, 38 MiB) into the child's peak, GNU time's are 1 MiB. The CPU time
(user + system) is os.wait4's of GNU time, which holds its child's, at
microseconds; the row `true` shows what GNU time and a spawn add to every
row. Medians, and the ratios to `python -I -c "import DRIVER"` (the least
any Python runner of that backend costs) and to `python -I -c pass`.

The runner is started as on a node: the engine copied and byte-compiled
and run through the dlock_runner role's wrapper (bench_startup.install_engine),
with a global config (dlock.json: the backend, the jobs directory) and a job
file (jobs/bench.json: the command `true`), as `dlock run --config FILE
--job bench`, with DLOCK_CGROUP=off: the job units of the roles run as
their own users and make no cgroup. The servers are real, on loopback
(tests/servers.py); the interpreter is --python (default: this one, which
has psycopg).

--before-ref REF adds, in the same interleaved rounds, the runs of the
engine of that git ref (e.g. one that imported etcd3gw for etcd; the
interpreter then needs what that engine imports).

  python tests/bench/bench_run_cost.py [--rounds N] [--python PY] [--quick] [--before-ref REF]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.join(ROOT, "tests")]

import servers  # noqa: E402
from bench_startup import MODULE_UTILS, install_engine  # noqa: E402

# What each backend imports to speak to its server: PostgreSQL's driver;
# for Redis and etcd, the standard library's modules the engine speaks their
# protocols with (backends/redis_resp.py, backends/etcd_http.py).
DRIVERS = (("file", None), ("redis", "socket, ssl, hashlib"), ("postgresql", "psycopg"),
           ("etcd", "http.client, ssl"))


def node_files(directory, url):
    """dlock.json and jobs/bench.json as the roles write them (to_nice_json)."""
    jobs = os.path.join(directory, "jobs")
    os.makedirs(jobs)
    config = os.path.join(directory, "dlock.json")
    with open(config, "w") as handle:
        json.dump({"backend": url, "jobs_dir": jobs, "fence_epoch": 0}, handle, indent=4)
    with open(os.path.join(jobs, "bench.json"), "w") as handle:
        json.dump({"command": ["true"], "environment": {}, "ttl": "5m"}, handle, indent=4)
    return config


GNU_TIME = "/usr/bin/time"


def cost(argv, env, scratch):
    """(CPU seconds, peak RSS in KiB) of one run of argv."""
    out = os.path.join(scratch, "rss")
    proc = subprocess.Popen([GNU_TIME, "-f", "%M", "-o", out] + argv, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError("%s exited %d" % (" ".join(argv), proc.returncode))
    with open(out) as handle:
        return usage.ru_utime + usage.ru_stime, int(handle.read().split()[-1])


def interleaved(commands, rounds, env, scratch):
    samples = dict((name, []) for name in commands)
    for _round in range(rounds):
        for name, argv in commands.items():
            samples[name].append(cost(argv, env, scratch))
    return samples


def engine_of(ref, scratch):
    """The engine's source (plugins/module_utils/dlock) at git REF, extracted into SCRATCH."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", ref, "plugins/module_utils/dlock"], capture_output=True,
                             check=True).stdout
    into = os.path.join(scratch, "source-" + ref.replace("/", "_"))
    os.makedirs(into)
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return os.path.join(into, "plugins", "module_utils")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--python", default=sys.executable, help="the nodes' interpreter, with the three drivers")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 rounds")
    parser.add_argument("--before-ref", help="also run the engine of this git ref, side by side")
    args = parser.parse_args()
    if not os.access(GNU_TIME, os.X_OK):
        parser.error("needs GNU time at %s (apt-get install time; scripts/setup.sh installs it)" % GNU_TIME)
    rounds = 3 if args.quick else args.rounds
    scratch = tempfile.mkdtemp(prefix="dlock-bench-run-cost-")
    redis_server, pg_server, etcd_server = servers.RedisServer(), servers.PostgresServer(), servers.EtcdServer()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "DLOCK_CGROUP": "off"}
    urls = {"file": "file://" + os.path.join(scratch, "locks"), "redis": redis_server.url,
            "postgresql": pg_server.url(), "etcd": etcd_server.url}
    try:
        wrapper = install_engine(args.python, MODULE_UTILS, os.path.join(scratch, "engine"))
        before = install_engine(args.python, engine_of(args.before_ref, scratch), os.path.join(scratch, "before")) \
            if args.before_ref else None
        commands = {"true": ["true"], "python -I -c pass": [args.python, "-I", "-c", "pass"]}
        for backend, driver in DRIVERS:
            if driver:
                commands["python -I -c 'import %s'" % driver] = [args.python, "-I", "-c", "import " + driver]
            config = node_files(os.path.join(scratch, backend), urls[backend])
            commands["dlock run %s -- true" % backend] = [wrapper, "run", "--config", config, "--job", "bench"]
            if before:
                name = "  %s at %s" % (backend, args.before_ref)
                commands[name] = [before, "run", "--config", config, "--job", "bench"]
        for argv in commands.values():  # warm: the schema, the scripts, the page cache
            cost(argv, env, scratch)
        samples = interleaved(commands, rounds, env, scratch)
    finally:
        redis_server.stop()
        pg_server.stop()
        etcd_server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    medians = dict((name, (statistics.median(s[0] for s in values), statistics.median(s[1] for s in values)))
                   for name, values in samples.items())
    report = {"rounds": rounds, "python": args.python, "rows": {}}
    base_cpu, base_rss = medians["python -I -c pass"]
    print("%-40s %9s %9s %9s %9s %10s %10s" % ("", "CPU", "/driver", "/pass", "peak RSS", "/driver", "/pass"))
    for backend, driver in DRIVERS:
        names = ["python -I -c 'import %s'" % driver] if driver else []
        ref_rows = ["  %s at %s" % (backend, args.before_ref)] if args.before_ref else []
        for name in names + ["dlock run %s -- true" % backend] + ref_rows:
            cpu, rss = medians[name]
            anchor_cpu, anchor_rss = medians[names[0]] if driver else (base_cpu, base_rss)
            report["rows"][name] = {"cpu_ms": round(cpu * 1000, 2), "peak_rss_kib": rss,
                                    "cpu_to_driver": round(cpu / anchor_cpu, 3), "cpu_to_pass": round(cpu / base_cpu, 3),
                                    "rss_to_driver": round(rss / float(anchor_rss), 3),
                                    "rss_to_pass": round(rss / float(base_rss), 3)}
            row = report["rows"][name]
            print("%-40s %7.1fms %8.2fx %8.2fx %7.1fMiB %9.2fx %9.2fx" % (
                name, row["cpu_ms"], row["cpu_to_driver"], row["cpu_to_pass"], rss / 1024.0, row["rss_to_driver"],
                row["rss_to_pass"]))
    for name in ("python -I -c pass", "true"):
        cpu, rss = medians[name]
        report["rows"][name] = {"cpu_ms": round(cpu * 1000, 2), "peak_rss_kib": rss}
        print("%-40s %7.1fms %19s %7.1fMiB" % (name, cpu * 1000, "", rss / 1024.0))
    print("(medians of %d interleaved rounds; file's /driver column is to python -I -c pass)" % rounds)
    with open(os.path.join(HERE, "report-run-cost.json"), "w") as handle:
        json.dump(report, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
