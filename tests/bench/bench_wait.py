"""Waiting for a busy lock, before and after issue 14 (fair, notified waiting).

Not part of the pass/fail suite. Every comparison runs its contenders
interleaved in one run (A B C A B C ...), so machine noise hits them alike:

- contention: W waiters (8), each a loop that starts one process per grant
  (`dlock run --on-contention wait -- sleep 0.05`, and `etcdctl lock KEY
  sleep 0.05` on the same etcd), for a few seconds per turn: grants per
  second, and the longest wait (a process's wall time less the job and the
  median uncontended start-up of the same command) against 8 x (job +
  start-up); and the CPU time each grant cost (the processes' user and
  system time, jobs included), with the rate the machine's cores could at
  most give at that cost;
- driver floor: beside them, the CPU that `python -c "import DRIVER"` and
  the job cost, which every runner starting one Python process per grant
  pays before its own code runs, and the rate the cores could at most give
  at that cost (a row below etcdctl's grants per second means no such
  runner can match etcdctl on this machine);
- threads: W threads of one process taking and releasing one key through
  the engine's acquire (the runner's), G grants in all: grants per thread;
- takeover: a waiting `dlock run` already in line; the holder (another
  process) releases, or is SIGKILLed and its lease expires: time from the
  release (or the lease's end) to the waiter's job start, once the waiter
  is seen waiting in the server's own counters.
- handoff: the same with a `dlock run` as the holder, end to end: from the
  holder's job's last instruction to the waiter's job's first (both `date`),
  so the holder's side counts too (seeing its job end, the release);
  beside `etcdctl lock` run the same way on the same etcd. Both versions
  have the line of waiters (issue 14): only what came after differs.

"before" is the engine of a git ref (default: main), extracted with
`git archive` into a temp dir; "after" is this checkout's working tree.
Both are byte-compiled by the interpreter that runs them, as dlock_runner
installs the engine on a node. --python picks that interpreter (default:
this one, with .venv's newest drivers; /usr/bin/python3 has Debian's, as on
the nodes). Prints the table and writes tests/bench/report_wait.json.

  python tests/bench/bench_wait.py [--before-ref main] [--seconds 6] [--rounds 2] [--python PY]
      [--only contention|threads|takeover|handoff]
"""

import argparse
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "tests")]

import servers  # noqa: E402

JOB_SECONDS = 0.05
# What each backend imports (Redis and etcd: the standard library modules the engine speaks them with).
DRIVERS = {"redis": "socket, ssl, hashlib", "postgresql": "psycopg", "etcd": "http.client, ssl"}
HELD_AFTER_IN_LINE = 2.0  # takeover after a release: the lock is released this long after the waiter asked
ENTRY = "import sys; sys.argv[0] = 'dlock'; from dlock.cli import main; raise SystemExit(main())"

# A holder in a process of its own: takes the key, says when it asked, then
# releases when told (a line on stdin) or waits to be killed.
HOLDER = """
import sys, time
from dlock.backends import open_backend
url, key, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
backend = open_backend(url)
asked = time.time()
assert backend.acquire(key, "bench-holder", ttl).granted
print(asked, flush=True)
sys.stdin.readline()
sent = time.time()
assert backend.release(key, "bench-holder")
print(sent, flush=True)
"""

# W threads of one process through the engine's acquire (runner.acquire, the
# same in both versions): how many grants each one gets out of G.
THREADS = """
import collections, json, sys, threading, time
from dlock.backends import open_backend
from dlock.options import LockOptions
from dlock.runner import acquire
url, key, waiters, grants = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
options = LockOptions(ttl=10.0, on_contention="wait", wait_timeout=60.0)
counts, done, guard = collections.Counter(), [0], threading.Lock()
started = time.monotonic()
def waiter(number):
    backend, owner = open_backend(url), "t%d" % number
    counts[number] += 0
    while True:
        with guard:
            if done[0] >= grants:
                break
        grant = acquire(backend, key, owner, options, None)[0]
        if not grant.granted:
            continue
        with guard:
            done[0] += 1
            if done[0] <= grants:
                counts[number] += 1
        time.sleep(0.005)
        backend.release(key, owner)
    backend.close()
threads = [threading.Thread(target=waiter, args=(n,)) for n in range(waiters)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps({"per_thread": sorted(counts.values()), "seconds": time.monotonic() - started}))
"""


# The interpreter of the dlock processes (--python): this one by default.
PYTHON = [sys.executable]


def extract(ref, into):
    """The engine of git ref `ref` ("." for this checkout's working tree) as a
    PYTHONPATH directory, byte-compiled by the interpreter that runs it, as
    the dlock_runner role installs it on a node: a process that compiled the
    engine again at every start would spend on that what a node does not."""
    path = os.path.join(into, "plugins", "module_utils")
    os.makedirs(path)
    if ref == ".":
        subprocess.run(["cp", "-r", os.path.join(ROOT, "plugins", "module_utils", "dlock"), path], check=True)
    else:
        archive = subprocess.run(["git", "-C", ROOT, "archive", ref, "plugins/module_utils/dlock"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    subprocess.run(PYTHON + ["-m", "compileall", "-q", os.path.join(path, "dlock")], check=True)
    return path


def has_driver(python, module):
    found = subprocess.run([python, "-c", "import %s" % module], capture_output=True, check=False).returncode == 0
    if not found:
        print("%s has no %s: its backend is left out" % (python, module), file=sys.stderr)
    return found


def env_for(path):
    return dict(os.environ, PYTHONPATH=path)


def dlock_run(url, key, *extra):
    return PYTHON + ["-c", ENTRY, "run", "--job", "bench", "--key", key, "--backend", url, "--ttl", "10s"] \
        + list(extra)


def children_cpu():
    """CPU seconds (user + system) of this process's waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def contention_turn(argv, env, waiters, seconds):
    """Each waiter starts one process per grant until `seconds` are up: wall
    times of every process, the turn's length, failures, and the CPU time
    the turn's processes used (their whole process trees: jobs included)."""
    cpu = children_cpu()
    end = time.monotonic() + seconds
    walls, failures = [[] for _n in range(waiters)], []

    def loop(number):
        while time.monotonic() < end:
            start = time.monotonic()
            code = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False).returncode
            if code != 0:
                failures.append(code)
                continue
            walls[number].append(time.monotonic() - start)
    started = time.monotonic()
    threads = [threading.Thread(target=loop, args=(n,)) for n in range(waiters)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return walls, time.monotonic() - started, failures, children_cpu() - cpu


def startup(argv, env, rounds=5):
    """Median wall time of the command alone (no contention), with `true` as the job."""
    samples = []
    for _round in range(rounds):
        start = time.monotonic()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        samples.append(time.monotonic() - start)
    return statistics.median(samples)


def contention(contenders, waiters, seconds, rounds):
    """contenders: name -> (argv with the job, argv with `true`, env). Interleaved turns."""
    results = dict((name, {"walls": [[] for _n in range(waiters)], "seconds": 0.0, "failures": 0, "startup": [],
                           "cpu": 0.0}) for name in contenders)
    for _round in range(rounds):
        for name, (argv, alone, env) in contenders.items():
            walls, took, failures, cpu = contention_turn(argv, env, waiters, seconds)
            row = results[name]
            row["cpu"] += cpu
            for number in range(waiters):
                row["walls"][number] += walls[number]
            row["seconds"] += took
            row["failures"] += len(failures)
            row["startup"].append(startup(alone, env))
    report = {}
    for name, row in results.items():
        every = [wall for walls in row["walls"] for wall in walls]
        start_up = statistics.median(row["startup"])
        bound = waiters * (JOB_SECONDS + start_up)
        longest_wait = max(every) - JOB_SECONDS - start_up
        cpu_per_grant = row["cpu"] / max(1, len(every) + row["failures"])
        # On this machine's cores, no contender that needs cpu_per_grant of
        # CPU for each grant can serve more than this, whatever its waiting.
        cpu_bound = (os.cpu_count() or 1) / cpu_per_grant if cpu_per_grant else None
        report[name] = {"grants_per_s": round(len(every) / row["seconds"], 2),
                        "cpu_ms_per_grant": round(cpu_per_grant * 1000, 1),
                        "cpu_bound_grants_per_s": round(cpu_bound, 1) if cpu_bound else None,
                        "startup_ms": round(start_up * 1000, 1),
                        "longest_wait_s": round(longest_wait, 3), "bound_s": round(bound, 3),
                        "longest_wait_to_bound": round(longest_wait / bound, 3),
                        "grants_per_waiter": sorted(len(walls) for walls in row["walls"]),
                        "failures": row["failures"]}
    return report


def driver_floor(drivers, rounds=15):
    """CPU (user + system) that any runner which starts one process per
    grant must spend on each grant before its own code runs: this
    interpreter importing the backend's driver (`python -c "import redis"`),
    plus the job itself (`sleep`). Medians of `rounds` runs, one at a time,
    interleaved; with the rate the machine's cores could at most give at
    that cost, whatever the runner and its waiting do."""
    commands = dict(("%s (python -c 'import %s')" % (backend, driver), PYTHON + ["-c", "import %s" % driver])
                    for backend, driver in drivers.items())
    commands["job (sleep %s)" % JOB_SECONDS] = ["sleep", str(JOB_SECONDS)]
    samples = dict((name, []) for name in commands)
    for _round in range(rounds):
        for name, argv in commands.items():
            cpu = children_cpu()
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            samples[name].append(children_cpu() - cpu)
    job = statistics.median(samples.pop("job (sleep %s)" % JOB_SECONDS))
    report = {}
    for name, values in samples.items():
        per_grant = statistics.median(values) + job
        report[name] = {"cpu_ms_per_grant": round(per_grant * 1000, 1),
                        "cpu_bound_grants_per_s": round((os.cpu_count() or 1) / per_grant, 1)}
    return report


def threads(paths, urls, waiters, grants):
    report = {}
    for version, path in paths.items():
        for backend, url in urls.items():
            key = "bench-threads-%s-%s" % (version, backend)
            out = subprocess.run(PYTHON + ["-c", THREADS, url, key, str(waiters), str(grants)],
                                 env=env_for(path), capture_output=True, text=True, check=True, timeout=600).stdout
            answer = json.loads(out)
            report["%s %s" % (backend, version)] = {"grants_per_thread": answer["per_thread"],
                                                    "grants_per_s": round(grants / answer["seconds"], 1)}
    return report


class EtcdDeletions(threading.Thread):
    """`etcdctl watch` on one name: when etcd deleted it (for an expiry: when
    etcd's lessor revoked the lease, which it looks for every 500 ms)."""

    def __init__(self, endpoint, name):
        threading.Thread.__init__(self, daemon=True)
        self.proc = subprocess.Popen(["etcdctl", "--endpoints", endpoint, "watch", name], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=dict(os.environ, ETCDCTL_API="3"))
        self.deleted = None
        self.start()

    def run(self):
        for line in self.proc.stdout:
            if line.strip() == "DELETE" and self.deleted is None:
                self.deleted = time.time()

    def stop(self):
        self.proc.kill()
        self.proc.wait()


class InLine(object):
    """Whether a waiter has asked once and is waiting (in line, for "after"),
    read from each server's own counters, so a release or an expiry is never
    measured against a waiter still starting up (seconds on a loaded machine)."""

    def __init__(self, redis_server, pg_server, etcd_server):
        import psycopg
        self.redis = redis_server.client()
        self.pg = psycopg.connect(pg_server.url(), autocommit=True)
        self.etcd_metrics = "http://127.0.0.1:%d/metrics" % etcd_server.client_ports[0]

    def _evalsha_calls(self):
        return self.redis.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)

    def _watchers(self):
        with urllib.request.urlopen(self.etcd_metrics, timeout=5) as answer:
            text = answer.read().decode()
        return int(float(re.search(r"^etcd_debugging_mvcc_watcher_total (\S+)$", text, re.M).group(1)))

    def baseline(self, backend):
        return {"redis": self._evalsha_calls, "etcd": self._watchers, "postgresql": lambda: 0}[backend]()

    def ready(self, backend, version, key, baseline):
        if backend == "redis":
            if version == "after":
                return self.redis.zcard("dlock:{%s}:queue" % key) >= 1  # joined; subscribed before that
            return self._evalsha_calls() > baseline  # its first (refused) grant script ran
        if backend == "etcd":
            return self._watchers() > baseline  # it watches
        if version == "after":
            return self.pg.execute("SELECT count(*) FROM dlock_wait WHERE key = %s", (key,)).fetchone()[0] >= 1
        # The holder's session and the waiter's, both after a statement on the lease table.
        return self.pg.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dlock' "
                               "AND state = 'idle' AND query LIKE '%%dlock_lease%%'").fetchone()[0] >= 2

    def wait(self, backend, version, key, baseline, waiter):
        deadline = time.monotonic() + 60
        while not self.ready(backend, version, key, baseline):
            assert waiter.poll() is None, "the waiter did not wait"
            assert time.monotonic() < deadline, "the waiter never got in line"
            time.sleep(0.02)
        time.sleep(0.05)  # from its grant script to its wait: a few statements more


def takeover_once(path, url, key, expiry, in_line, backend, version, etcd_endpoint=None):
    """Seconds from the holder's release (or its lease's end) to the waiter's
    job start; on etcd after an expiry also from etcd's deletion of the key."""
    env = env_for(path)
    deletions = EtcdDeletions(etcd_endpoint, "/dlock/%s/lock" % key) if etcd_endpoint and expiry else None
    # Long enough to outlast the waiter's start-up on a loaded machine; a release comes first.
    ttl = 8.0 if expiry else 60.0
    holder = subprocess.Popen(PYTHON + ["-c", HOLDER, url, key, str(ttl)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    asked = float(holder.stdout.readline())
    baseline = in_line.baseline(backend)
    waiter = subprocess.Popen(dlock_run(url, key, "--on-contention", "wait", "--wait-timeout", "60s", "--ttl", "3s",
                                        "--", "date", "+%s.%N"),
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    in_line.wait(backend, version, key, baseline, waiter)
    if expiry:
        assert time.time() < asked + ttl, "the waiter got in line after the lease's end"
        holder.kill()
        holder.wait()
        # The lease cannot end before `asked + ttl` (the backend starts counting after the request).
        ended = asked + ttl
    else:
        # A waiter that has waited a while (the old backoff had grown by then).
        time.sleep(HELD_AFTER_IN_LINE)
        holder.stdin.write("\n")
        holder.stdin.flush()
        ended = float(holder.stdout.readline())
        holder.wait(30)
    out, _err = waiter.communicate(timeout=60)
    started = float(out.strip().splitlines()[-1])
    if deletions is None:
        return started - ended, None
    deletions.stop()
    return started - ended, (started - deletions.deleted) if deletions.deleted else None


def takeover(paths, urls, rounds, etcd_endpoint, in_line):
    samples, failures = {}, {}
    for number in range(rounds):
        for case in ("release", "expiry"):
            for backend, url in urls.items():
                for version, path in paths.items():
                    key = "bench-takeover-%s-%s-%d" % (version, case, number)
                    name = "%s after %s, %s" % (backend, case, version)
                    try:
                        total, after_delete = takeover_once(path, url, key, case == "expiry", in_line, backend,
                                                            version, etcd_endpoint if backend == "etcd" else None)
                    except (AssertionError, ValueError) as exc:  # a waiter that failed (exit 75, 77 on a loaded machine)
                        failures.setdefault(name, []).append(str(exc) or exc.__class__.__name__)
                        continue
                    samples.setdefault(name, []).append(total)
                    if after_delete is not None:
                        samples.setdefault(name + " (from etcd's deletion)", []).append(after_delete)
    report = dict((name, {"median_ms": round(statistics.median(v) * 1000, 1), "max_ms": round(max(v) * 1000, 1),
                          "samples": len(v)}) for name, v in samples.items())
    for name, errors in failures.items():
        report.setdefault(name, {})["failures"] = errors
    return report


def handoff_once(holder_argv, waiter_argv, env, backend, key, in_line, tmp):
    """Seconds from the holder's job end to the waiter's job start. The
    holder's job waits on a FIFO until the waiter is seen in line; each job
    writes `date` to a file of marks."""
    fifo, marks = os.path.join(tmp, "handoff.fifo"), os.path.join(tmp, "handoff.marks")
    for path in (fifo, marks):
        if os.path.exists(path):
            os.unlink(path)
    os.mkfifo(fifo)
    holder = subprocess.Popen(holder_argv + ["sh", "-c", "read _ < %s; echo E $(date +%%s.%%N) >> %s" % (fifo, marks)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:  # the holder's job holds the lock once it reads the FIFO (opening it for writing succeeds)
        try:
            told = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:
            assert holder.poll() is None and time.monotonic() < deadline, "the holder never started its job"
            time.sleep(0.01)
    baseline = in_line.baseline(backend)
    waiter = subprocess.Popen(waiter_argv + ["sh", "-c", "echo S $(date +%%s.%%N) >> %s" % marks],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    in_line.wait(backend, "after", key, baseline, waiter)
    os.write(told, b"go\n")
    os.close(told)
    assert holder.wait(60) == 0 and waiter.wait(60) == 0, "a run failed"
    with open(marks) as handle:
        times = dict(line.split() for line in handle)
    return float(times["S"]) - float(times["E"])


def handoff(paths, urls, rounds, etcd_endpoint, in_line):
    """The handoff of each backend and version, and etcdctl lock's, interleaved by round."""
    samples, tmp = {}, tempfile.mkdtemp(prefix="dlock-bench-handoff-")
    etcdctl = ["etcdctl", "--endpoints", etcd_endpoint, "lock"]
    try:
        for number in range(rounds):
            key = "bench-handoff-etcdctl-%d" % number
            samples.setdefault("etcdctl lock", []).append(handoff_once(
                etcdctl + [key, "--"], etcdctl + [key, "--"], dict(os.environ, ETCDCTL_API="3"), "etcd", key, in_line, tmp))
            for backend, url in urls.items():
                for version, path in paths.items():
                    key = "bench-handoff-%s-%d" % (version, number)
                    argv = dlock_run(url, key, "--on-contention", "wait", "--wait-timeout", "60s", "--ttl", "30s", "--")
                    samples.setdefault("dlock %s %s" % (backend, version), []).append(
                        handoff_once(argv, argv, env_for(path), backend, key, in_line, tmp))
    finally:
        subprocess.run(["rm", "-rf", tmp], check=False)
    report = {}
    for name, values in samples.items():
        values.sort()
        report[name] = {"median_ms": round(statistics.median(values) * 1000, 1),
                        "p90_ms": round(values[int(len(values) * 0.9)] * 1000, 1), "samples": len(values)}
    anchor = report["etcdctl lock"]["median_ms"]
    for row in report.values():
        row["median_to_etcdctl"] = round(row["median_ms"] / anchor, 2)
    return report


def save(report):
    with open(os.path.join(HERE, "report_wait.json"), "w") as handle:
        json.dump(report, handle, indent=2)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before-ref", default="main")
    parser.add_argument("--seconds", type=float, default=6.0, help="length of one contention turn")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--waiters", type=int, default=8)
    parser.add_argument("--grants", type=int, default=200, help="grants of the threads comparison")
    parser.add_argument("--only", choices=("contention", "threads", "takeover", "handoff"))
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter of the dlock processes, with its drivers (e.g. /usr/bin/python3: Debian's, "
                             "as on the nodes); a backend whose driver it lacks is left out")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="dlock-bench-before-")
    PYTHON[:] = [args.python]
    paths = {"before": extract(args.before_ref, os.path.join(tmp, "before")),
             "after": extract(".", os.path.join(tmp, "after"))}
    redis_server, pg_server, etcd_server = servers.RedisServer(), servers.PostgresServer(), servers.EtcdServer()
    urls = dict((backend, url) for backend, url in (
        ("redis", redis_server.url), ("postgresql", pg_server.url()), ("etcd", etcd_server.url))
        if has_driver(args.python, DRIVERS[backend]))
    report = {"before_ref": args.before_ref, "waiters": args.waiters, "job_ms": JOB_SECONDS * 1000}
    try:
        endpoint = "127.0.0.1:%d" % etcd_server.client_ports[0]
        if args.only in (None, "contention"):
            etcdctl = ["etcdctl", "--endpoints", endpoint, "lock", "bench-etcdctl"]
            contenders = {"etcdctl lock": (etcdctl + ["sleep", str(JOB_SECONDS)], etcdctl + ["true"], dict(os.environ))}
            for backend, url in urls.items():
                for version, path in paths.items():
                    key = "bench-contention-%s" % version
                    wait = ["--on-contention", "wait", "--wait-timeout", "5m", "--"]
                    contenders["dlock %s %s" % (backend, version)] = (
                        dlock_run(url, key, *(wait + ["sleep", str(JOB_SECONDS)])), dlock_run(url, key, *(wait + ["true"])),
                        env_for(path))
            report["contention"] = contention(contenders, args.waiters, args.seconds, args.rounds)
            report["driver_floor"] = driver_floor(dict((backend, DRIVERS[backend]) for backend in urls))
            base = report["contention"]["etcdctl lock"]["grants_per_s"]
            for row in report["contention"].values():
                row["grants_to_etcdctl"] = round(row["grants_per_s"] / base, 3)
            for row in report["driver_floor"].values():  # the most any such runner could reach, to etcdctl's rate
                row["most_to_etcdctl"] = round(row["cpu_bound_grants_per_s"] / base, 3)
            save(report)
        if args.only in (None, "threads"):
            report["threads"] = threads(paths, urls, args.waiters, args.grants)
            save(report)
        if args.only in (None, "takeover"):
            in_line = InLine(redis_server, pg_server, etcd_server)
            report["takeover"] = takeover(paths, urls, max(3, args.rounds * 2), endpoint, in_line)
        if args.only in (None, "handoff"):
            in_line = InLine(redis_server, pg_server, etcd_server)
            report["handoff"] = handoff(paths, urls, max(10, args.rounds * 10), endpoint, in_line)
    finally:
        redis_server.stop()
        pg_server.stop()
        etcd_server.stop()
        subprocess.run(["rm", "-rf", tmp], check=False)
    print(json.dumps(report, indent=1))
    save(report)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
