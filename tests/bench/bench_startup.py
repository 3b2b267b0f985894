"""Start-up of `dlock run -- true` against the bare interpreter and the bare
driver import, on each interpreter, measured side by side.

Not part of the pass/fail suite. One interleaved run (every contender once
per round, in turn), medians and ratios; writes tests/bench/report-startup.json.

The runner is started as on a node: the engine copied and byte-compiled
like the dlock_runner role does, and run through the role's own wrapper
(templates/dlock.sh.j2, rendered here), with a job's minimal environment,
against a real redis-server and PostgreSQL on loopback. Each interpreter
brings its own drivers: /usr/bin/python3 Debian's (python3-redis,
python3-psycopg: what the nodes install), this Python the newest from PyPI.

Targets (issue 14):
  file://      dlock run -- true  <= 2x    python3 -I -c pass
  redis://     dlock run -- true  <= 1.10x python3 -c "import redis"
  postgresql:// dlock run -- true <= 1.10x python3 -c "import psycopg"
  acquire+release on the lease table <= 1.15x a hand-written upsert/update
  pair with the same connection settings (bench_lock.pg_round_trips, run on
  each interpreter).

As root on a cgroup2 mount the runner makes a cgroup for each job; the job
units of the roles run as other users and make none (containment by the
guard alone): rows marked "(no cgroup)" run with DLOCK_CGROUP=off.

With --engine LABEL=DIR (a plugins/module_utils of another checkout, e.g.
a worktree of main), that engine is measured too, in the same rounds: a
before and after from one run.

  python tests/bench/bench_startup.py [--rounds N] [--python PY ...] [--engine LABEL=DIR ...]
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
MODULE_UTILS = os.path.join(ROOT, "plugins", "module_utils")
sys.path[:0] = [HERE, os.path.join(ROOT, "tests")]

import jinja2  # noqa: E402
import servers  # noqa: E402

DEBIAN_PYTHON = "/usr/bin/python3"
ROUND_TRIP = """
import json, sys
sys.path[:0] = [%(here)r, %(tests)r, %(engine)r]
# This engine's, imported first: bench_lock puts this checkout's engine ahead
# on sys.path, and its own import of dlock must find this one already loaded.
import dlock.backends
assert dlock.__file__.startswith(%(engine)r), dlock.__file__
import bench_lock

class Server(object):
    def url(self):
        return %(url)r
print(json.dumps(bench_lock.pg_round_trips(Server(), %(rounds)d)))
"""


def install_engine(python, source, directory):
    """The engine as dlock_runner installs it (tasks/main.yml: copy, then
    compileall with the node's interpreter), and the wrapper it renders."""
    engine = os.path.join(directory, "lib")
    shutil.copytree(os.path.join(source, "dlock"), os.path.join(engine, "dlock"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([python, "-m", "compileall", "-q", os.path.join(engine, "dlock")], check=True)
    with open(os.path.join(ROOT, "roles", "dlock_runner", "templates", "dlock.sh.j2")) as handle:
        text = jinja2.Template(handle.read()).render(ansible_managed="bench", dlock_runner_python=python,
                                                     dlock_runner_install_dir=engine)
    wrapper = os.path.join(directory, "dlock")
    with open(wrapper, "w") as handle:
        handle.write(text)
    os.chmod(wrapper, 0o755)
    return wrapper


def driver_versions(python):
    out = subprocess.run([python, "-c", "import sys, redis, psycopg; print(sys.version.split()[0], redis.__version__, "
                                        "psycopg.__version__, psycopg.pq.__impl__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    return {"python": out[0], "redis": out[1], "psycopg": out[2], "psycopg_impl": out[3]}


# FLOOR: what no file:// runner can go below: the interpreter started as the
# wrapper starts it (-I), the standard modules the runner cannot do without
# (json for its state and log line, which brings re; signal, which brings
# enum; select, fcntl for the flock) and one spawn of the job, waited for.
FLOOR = "python -I: runner's stdlib + spawn true (floor)"
BASELINES = (("python -I -c pass", ["-I", "-c", "pass"]), ("python -c 'import redis'", ["-c", "import redis"]),
             ("python -c 'import psycopg'", ["-c", "import psycopg"]),
             (FLOOR, ["-I", "-c", "import json, signal, select, fcntl, os; "
                                  "os.waitpid(os.posix_spawnp('true', ['true'], os.environ), 0)"]))


def runs(label, wrapper, urls):
    """`dlock run -- true` on each backend, with and without a cgroup."""
    rows = {}
    for kind, url in urls.items():
        argv = [wrapper, "run", "--job", "bench", "--ttl", "30s", "--backend", url, "--", "true"]
        rows["%sdlock run %s -- true" % (label, kind)] = argv
        rows["%sdlock run %s -- true (no cgroup)" % (label, kind)] = ["env", "DLOCK_CGROUP=off"] + argv
    return rows


def interleaved(commands, rounds, env):
    samples = dict((name, []) for name in commands)
    for _round in range(rounds):
        for name, argv in commands.items():
            start = time.perf_counter()
            subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            samples[name].append(time.perf_counter() - start)
    return samples


TARGETS = (("file://", "python -I -c pass", 2.0), ("redis://", "python -c 'import redis'", 1.10),
           ("postgresql://", "python -c 'import psycopg'", 1.10))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--python", action="append",
                        help="interpreter(s) to compare (default: %s and this one)" % DEBIAN_PYTHON)
    parser.add_argument("--engine", action="append", default=[], metavar="LABEL=DIR",
                        help="another engine (its plugins/module_utils) to measure in the same rounds")
    args = parser.parse_args()
    pythons = args.python or [p for p in (DEBIAN_PYTHON, sys.executable) if os.path.exists(p)]
    engines = [("", MODULE_UTILS)] + [("%s: " % label, path) for label, path in
                                      (entry.split("=", 1) for entry in args.engine)]
    scratch = tempfile.mkdtemp(prefix="dlock-bench-startup-")
    redis_server, pg_server = servers.RedisServer(), servers.PostgresServer()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}  # a job unit's, about
    report = {"rounds": args.rounds, "interpreters": {}}
    try:
        urls = {"file://": "file://" + os.path.join(scratch, "locks"), "redis://": redis_server.url,
                "postgresql://": pg_server.url()}
        commands = {}
        for number, python in enumerate(pythons):
            report["interpreters"][python] = {"versions": driver_versions(python)}
            for name, argv in BASELINES:
                commands[(python, name)] = [python] + argv
            for index, (label, source) in enumerate(engines):
                wrapper = install_engine(python, source, os.path.join(scratch, "py%d-engine%d" % (number, index)))
                for name, argv in runs(label, wrapper, urls).items():
                    commands[(python, name)] = argv
        for argv in commands.values():  # warm: schema, scripts, page cache
            subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        samples = interleaved(commands, args.rounds, env)
        for python in pythons:
            for label, source in engines:
                trips = subprocess.run([python, "-c", ROUND_TRIP % {
                    "here": HERE, "tests": os.path.join(ROOT, "tests"), "engine": source, "url": pg_server.url(),
                    "rounds": args.rounds * 20}], capture_output=True, text=True, check=True)
                report["interpreters"][python]["%sround_trip_postgresql" % label] = json.loads(trips.stdout)
    finally:
        redis_server.stop()
        pg_server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    for python in pythons:
        medians = dict((name, statistics.median(values)) for (py, name), values in samples.items() if py == python)
        section = report["interpreters"][python]
        section["median_ms"] = dict((name, round(value * 1000, 2)) for name, value in medians.items())
        section["ratios"] = {}
        for label, _source in engines:
            for kind, base, target in TARGETS:
                for suffix in ("", " (no cgroup)"):
                    name = "%sdlock run %s -- true%s" % (label, kind, suffix)
                    section["ratios"]["%s / %s" % (name, base)] = {"ratio": round(medians[name] / medians[base], 3),
                                                                   "target": target}
            trips = section["%sround_trip_postgresql" % label]
            if not label:
                section["ratios"]["%s / python -I -c pass" % FLOOR] = {
                    "ratio": round(medians[FLOOR] / medians["python -I -c pass"], 3), "target": 2.0}
            section["ratios"]["%sacquire+release / hand-written pair" % label] = {
                "ratio": round(trips["dlock acquire+release"] / trips["psycopg upsert + update"], 3), "target": 1.15}
        print("%s (%s)" % (python, ", ".join("%s %s" % kv for kv in sorted(section["versions"].items()))))
        for name, value in sorted(section["median_ms"].items()):
            print("  %-60s %8.2f ms" % (name, value))
        for name, row in section["ratios"].items():
            verdict = "met" if row["ratio"] <= row["target"] else "NOT met"
            print("  %-90s x%.3f  (target x%.2f: %s)" % (name, row["ratio"], row["target"], verdict))
    with open(os.path.join(HERE, "report-startup.json"), "w") as handle:
        json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
