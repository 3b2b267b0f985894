"""The backends under a fleet's load: 20 nodes x 50 jobs, at rising rates.

Not part of the pass/fail suite. 1000 job keys (50 on each of 20 nodes),
each taken and released once per period at its slot, the slots spread
evenly over the period; node N's job J is key number J * 20 + N, so
consecutive slots fall on different nodes. At R grants a minute one grant
starts every 60/R s, open loop (a timer fires whether the previous run has
finished or not), in real time: a step does not compress the clock, it runs
the first --seconds of the schedule (24 s: 40% of a minute), so a step at
250 a minute takes 100 grants and one at 4000 a minute 1600, each key at
most twice. The rate, not the length of the step, is what the server sees.

The nodes are --workers processes (4 by default), each driving 20/W nodes,
and each node its own backend object, so the server sees 20 connections as
from 20 nodes. Not one process per node: on 2 cores 20 Python processes
would fight the server for the CPU and measure their own scheduling; the
client work in all is the same and so is what the server sees (20
connections, the keys, the arrival times). A grant that starts late
because its worker was busy is counted in the "late p99" column: when that
grows, the rows above it no longer measure the server alone.

For each backend and rate it reports the grant's latency (the engine's
acquire call: one round trip on Redis, a transaction on PostgreSQL, a lease
grant and a transaction on etcd) p50 and p99; the server process's CPU
time per grant (utime + stime from /proc, PostgreSQL's postmaster with all
its children, less the probe's share measured alone beforehand, on a new
connection for the new-connection row); and beside
them the bare driver's round trip on the same server, in the same step, by a
probe that interleaves with the load (one pair of calls for every grant, at
most 10 a second): redis-py SET NX PX + DEL, psycopg INSERT .. ON CONFLICT
+ DELETE in autocommit, etcd3gw put + delete (the client whose session the
engine's gateway uses). Then grant p99 / bare p99 (target, issue 26: at most
3x at 1000 a minute), and the first rate at which the grant p99 is twice the
lowest rate's. A last row per backend takes each grant on a new connection,
as each `dlock run` process does (the engine connects in its first call):
that is the grant a node's timer really waits for. Its bare pair is on a new
connection too (connect, the pair, close), so that its ratio compares like
with like: a connection's own round trips (TCP, PostgreSQL's startup and
SCRAM login, a fork on the server) are in both.

PostgreSQL runs twice: one server ("postgresql"), and a primary with a
synchronous standby ("postgresql-sync"), the data path of a Patroni cluster
as the dlock_postgresql role leaves it: every commit, the grant's and the
bare pair's alike, waits for the standby's acknowledgement, and the server
CPU counted is both servers'. Patroni's agent is not on a grant's path (the
engine talks to the primary; Patroni only decides which member that is),
so this row is what a grant costs on Patroni while the cluster is whole;
what a leader change costs is measured by the lab's fault tests
(tests/lab/test_pg_faults.py).

  python tests/bench/bench_backend_load.py [--rates 250,500,...] [--seconds 24] [--workers 4] [--quick]
"""

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODULE_UTILS = os.path.join(ROOT, "plugins", "module_utils")
sys.path[:0] = [os.path.join(ROOT, "tests"), MODULE_UTILS]

NODES, JOBS_PER_NODE = 20, 50
KEYS = NODES * JOBS_PER_NODE
TTL = 30.0
PROBE_MAX_PER_S = 10.0
TARGET_RATE, TARGET_RATIO = 1000, 3.0


def key_of(index):
    """Slot `index` of the period: node index % 20, job index // 20."""
    return "load-n%02d-j%02d" % (index % NODES, index // NODES)


def percentile(values, fraction):
    """Nearest-rank percentile (p99 of 100 samples is the 99th smallest)."""
    ordered = sorted(values)
    return ordered[max(0, int(math.ceil(fraction * len(ordered))) - 1)]


# -- the nodes (a worker process) ---------------------------------------------

def worker(url, nodes):
    """Drive `nodes` (node numbers): read a step from stdin, take its
    grants at their times, answer with what they took; until stdin closes."""
    from dlock.backends import open_backend
    backends = dict((node, open_backend(url)) for node in nodes)
    for node, backend in backends.items():  # connect, load scripts, make the schema: not in the figures
        owner = "node%02d:%d:warm" % (node, os.getpid())
        assert backend.acquire("load-warm-%02d" % node, owner, TTL).granted
        backend.release("load-warm-%02d" % node, owner)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        step = json.loads(line)
        print(json.dumps(run_step(url, backends, step)), flush=True)
    for backend in backends.values():
        backend.close()


def run_step(url, backends, step):
    from dlock.backends import open_backend
    from dlock.errors import BackendError
    gap = 60.0 / step["rate"]
    count = int(step["seconds"] / gap)
    mine = [i for i in range(count) if (step["offset"] + i) % NODES in backends]
    grants, late, releases, refused, errors = [], [], [], 0, 0
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    for i in mine:
        index = (step["offset"] + i) % KEYS
        node, key = index % NODES, key_of(index)
        due = step["start"] + i * gap
        pause = due - time.time()
        if pause > 0:
            time.sleep(pause)
        backend = open_backend(url) if step["fresh"] else backends[node]
        owner = "node%02d:%d:%d" % (node, os.getpid(), i)
        started = time.time()
        try:
            grant = backend.acquire(key, owner, TTL)
        except BackendError:  # op_timeout (2 s) passed: the server no longer keeps up
            grant = None
            errors += 1
        granted = time.time()
        if grant and grant.granted:
            backend.release(key, owner, 0.0, {"result": "success", "exit_code": 0, "owner": owner,
                                              "host": "node%02d" % node, "finished_at": time.time()})
            releases.append(time.time() - granted)
            grants.append(granted - started)
            late.append(started - due)
        elif grant:
            refused += 1
        if step["fresh"]:
            backend.close()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"grants": grants, "late": late, "releases": releases, "refused": refused, "errors": errors,
            "cpu": after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime}


# -- the servers --------------------------------------------------------------

def cpu_of(root):
    """CPU seconds of process `root` and its children: the time on a CPU
    of each of their threads (/proc/PID/task/TID/schedstat, in ns: stat's
    utime and stime count 10 ms ticks, too coarse for a step's few
    milliseconds on Redis) and what `root` reaped (stat's cutime and
    cstime: PostgreSQL's ended sessions)."""
    total = 0.0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            if int(name) != root and int(fields[1]) != root:
                continue
            for task in os.listdir("/proc/%s/task" % name):
                with open("/proc/%s/task/%s/schedstat" % (name, task)) as handle:
                    total += int(handle.read().split()[0]) / 1e9
        except OSError:  # ended meanwhile
            continue
        if int(name) == root:
            total += (int(fields[13]) + int(fields[14])) / float(os.sysconf("SC_CLK_TCK"))
    return total


class Bare(object):
    """The bare driver's pair of calls on one server, on key `bare-N`."""

    def __init__(self, kind, server, number=0):
        self.kind, self.server, self.number = kind, server, number
        if kind == "redis":
            self.client = server.client()
        elif kind.startswith("postgresql"):
            import psycopg
            self.client = psycopg.connect(server.url(), autocommit=True, prepare_threshold=None)
            if not number:  # the first: the table, once
                self.client.execute("CREATE TABLE IF NOT EXISTS bench_bare (key text PRIMARY KEY, owner text, "
                                    "expires_at timestamptz)")
        else:
            from etcd3gw.client import Etcd3Client
            self.client = Etcd3Client(host="127.0.0.1", port=server.client_ports[0], api_path="/v3/")

    def pair(self):
        self.number += 1
        key = "bare-%d" % (self.number % KEYS)
        if self.kind == "redis":
            assert self.client.set(key, "owner", nx=True, px=int(TTL * 1000))
            self.client.delete(key)
        elif self.kind.startswith("postgresql"):
            assert self.client.execute(
                "INSERT INTO bench_bare VALUES (%s, %s, now() + %s * interval '1 millisecond') ON CONFLICT (key) "
                "DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at "
                "WHERE bench_bare.expires_at <= now() RETURNING 1", (key, "owner", int(TTL * 1000))).fetchone()
            self.client.execute("DELETE FROM bench_bare WHERE key = %s AND owner = %s", (key, "owner"))
        else:
            assert self.client.put(key, "owner")
            assert self.client.delete(key)

    def timed(self):
        started = time.perf_counter()
        self.pair()
        return time.perf_counter() - started

    def timed_fresh(self):
        """The pair on a connection of its own, opened and closed around it:
        what a process that runs one grant pays with the bare driver (the
        'new conn' rows' comparison)."""
        started = time.perf_counter()
        other = Bare(self.kind, self.server, self.number + 1)
        try:
            other.pair()
        finally:
            other.close()
        self.number = other.number
        return time.perf_counter() - started

    def close(self):
        if self.kind == "etcd":
            self.client.session.close()
        else:
            self.client.close()


class Backend(object):
    """The servers on loopback, the engine URL, the pids whose CPU is
    counted (each with its children). `server`: where the bare pair goes;
    `running`: what stop() stops (the pair of servers, or `server`)."""

    def __init__(self, kind):
        import servers
        self.kind = kind
        if kind == "redis":
            self.server = servers.RedisServer()
            self.url, self.pids = self.server.url, [self.server.pid]
        elif kind == "postgresql":
            self.server = servers.PostgresServer()
            self.url, self.pids = self.server.url(), [self.server.postmaster_pid]
        elif kind == "postgresql-sync":
            pair = servers.PostgresSyncPair()
            self.server, self.running = pair.primary, pair
            self.url, self.pids = self.server.url(), [pair.primary.postmaster_pid, pair.standby.postmaster_pid]
        else:
            self.server = servers.EtcdServer()
            self.url, self.pids = self.server.url, [self.server.procs[0].pid]
        if kind != "postgresql-sync":
            self.running = self.server

    def stop(self):
        self.running.stop()

    def cpu(self):
        """CPU seconds of the backend's servers so far."""
        return sum(cpu_of(pid) for pid in self.pids)


def start_workers(url, workers):
    procs = []
    for number in range(workers):
        nodes = [n for n in range(NODES) if n % workers == number]
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", url, ",".join(map(str, nodes))],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for proc in procs:
        assert json.loads(proc.stdout.readline())["ready"]
    return procs


def idle_cost(backend, seconds=3.0):
    """Server CPU a second with no client at all (Redis's cron, etcd's raft
    ticks, PostgreSQL's background workers), subtracted from the steps'."""
    before = backend.cpu()
    time.sleep(seconds)
    return (backend.cpu() - before) / seconds


def probe_cost(backend, bare, idle, pairs=300, fresh=False):
    """Server CPU of one bare pair, alone, above idle (subtracted from the
    steps'), and the bare round trip on an otherwise idle server; with
    FRESH, of the pair on a new connection (the 'new conn' step's probe)."""
    before, started = backend.cpu(), time.monotonic()
    times = [bare.timed_fresh() if fresh else bare.timed() for _pair in range(pairs)]
    took = time.monotonic() - started
    return max(0.0, backend.cpu() - before - idle * took) / pairs, times


def step(backend, procs, bare, base, rate, seconds, offset, fresh):
    """One step: every worker takes its nodes' grants at `rate` a minute for
    `seconds`, while this process times the bare pair between them."""
    start = time.time() + 0.3
    order = json.dumps({"rate": rate, "seconds": seconds, "offset": offset, "start": start, "fresh": fresh})
    before, began = backend.cpu(), time.monotonic()
    for proc in procs:
        proc.stdin.write(order + "\n")
        proc.stdin.flush()
    gap = max(60.0 / rate, 1.0 / PROBE_MAX_PER_S)
    bare_times, due = [], start + gap / 2  # between two grants
    while due < start + seconds:
        pause = due - time.time()
        if pause > 0:
            time.sleep(pause)
        bare_times.append(bare.timed_fresh() if fresh else bare.timed())
        due += gap
    answers = [json.loads(proc.stdout.readline()) for proc in procs]
    idle, probe_cpu = base
    server_cpu = backend.cpu() - before - probe_cpu * len(bare_times) - idle * (time.monotonic() - began)
    grants = [g for a in answers for g in a["grants"]]
    late = [g for a in answers for g in a["late"]]
    releases = [r for a in answers for r in a["releases"]]
    return {"rate": rate, "fresh": fresh, "grants": len(grants), "refused": sum(a["refused"] for a in answers),
            "errors": sum(a["errors"] for a in answers), "release_p99_ms": percentile(releases, 0.99) * 1000,
            "grant_p50_ms": percentile(grants, 0.5) * 1000, "grant_p99_ms": percentile(grants, 0.99) * 1000,
            "late_p99_ms": percentile(late, 0.99) * 1000,
            "server_cpu_us_per_grant": max(0.0, server_cpu) / len(grants) * 1e6,
            "client_cpu_us_per_grant": sum(a["cpu"] for a in answers) / len(grants) * 1e6,
            "bare_samples": len(bare_times), "bare_p50_ms": percentile(bare_times, 0.5) * 1000,
            "bare_p99_ms": percentile(bare_times, 0.99) * 1000}


def measure(kind, rates, seconds, workers):
    backend = Backend(kind)
    procs, bare = [], None
    try:
        procs = start_workers(backend.url, workers)
        bare = Bare(kind, backend.server)
        bare.timed()
        idle = idle_cost(backend)
        probe_cpu, alone = probe_cost(backend, bare, idle)
        fresh_probe_cpu, _times = probe_cost(backend, bare, idle, pairs=100, fresh=True)
        rows, offset = [], 0
        for rate in rates:
            rows.append(step(backend, procs, bare, (idle, probe_cpu), rate, seconds, offset, False))
            offset += int(seconds * rate / 60.0)
        fresh_rate = TARGET_RATE if TARGET_RATE in rates else rates[-1]
        rows.append(step(backend, procs, bare, (idle, fresh_probe_cpu), fresh_rate, seconds, offset, True))
        return {"idle_server_cpu_ms_per_s": idle * 1e3, "probe_server_cpu_us": probe_cpu * 1e6,
                "bare_idle_p50_ms": percentile(alone, 0.5) * 1000, "bare_idle_p99_ms": percentile(alone, 0.99) * 1000,
                "steps": rows}
    finally:
        for proc in procs:
            proc.stdin.close()
            proc.wait(60)
        if bare is not None:
            bare.close()
        backend.stop()


def doubling_rate(rows):
    """The first rate whose grant p99 is at least twice the lowest rate's, or None."""
    for row in rows[1:]:
        if row["grant_p99_ms"] >= 2 * rows[0]["grant_p99_ms"]:
            return row["rate"]
    return None


def show(report):
    header = ("backend", "grants/min", "n", "failed", "grant p50", "grant p99", "bare p50", "bare p99", "p99/bare",
              "srv CPU/grant", "cli CPU/grant", "late p99")
    print("%-15s %12s %5s %6s %10s %10s %9s %9s %8s %13s %13s %9s" % header)
    for kind, result in report["backends"].items():
        for row in result["steps"]:
            label = "%d%s" % (row["rate"], " new conn" if row["fresh"] else "")
            ratio = row["grant_p99_ms"] / row["bare_p99_ms"]
            mark = ""
            if row["rate"] == TARGET_RATE and not row["fresh"]:
                mark = "  target <= %gx: %s" % (TARGET_RATIO, "met" if ratio <= TARGET_RATIO else "NOT met")
            print("%-15s %12s %5d %6d %8.2fms %8.2fms %7.2fms %7.2fms %7.2fx %11.0fus %11.0fus %7.1fms%s" % (
                kind, label, row["grants"], row["refused"] + row["errors"], row["grant_p50_ms"], row["grant_p99_ms"],
                row["bare_p50_ms"], row["bare_p99_ms"], ratio, row["server_cpu_us_per_grant"],
                row["client_cpu_us_per_grant"], row["late_p99_ms"], mark))
        rate = doubling_rate([row for row in result["steps"] if not row["fresh"]])
        print("%-15s p99 doubles from the lowest rate's at: %s; bare pair alone p50 %.2fms p99 %.2fms; "
              "server CPU subtracted: idle %.1fms/s, probe %.0fus a pair" % (
                  kind, "%d a minute" % rate if rate else "no rate measured", result["bare_idle_p50_ms"],
                  result["bare_idle_p99_ms"], result["idle_server_cpu_ms_per_s"], result["probe_server_cpu_us"]))


def main():
    if sys.argv[1:2] == ["--worker"]:
        return worker(sys.argv[2], [int(n) for n in sys.argv[3].split(",")])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="250,500,1000,2000,4000", help="grants a minute, one step each")
    parser.add_argument("--seconds", type=float, default=24.0, help="length of one step")
    parser.add_argument("--workers", type=int, default=4, help="processes driving the 20 nodes")
    parser.add_argument("--backends", default="redis,postgresql,postgresql-sync,etcd")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 s steps at 120 and 240 a minute")
    args = parser.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    if args.quick:
        rates, args.seconds = [120, 240], 3.0
    report = {"nodes": NODES, "jobs_per_node": JOBS_PER_NODE, "seconds": args.seconds, "workers": args.workers,
              "backends": {}}
    for kind in args.backends.split(","):
        report["backends"][kind] = measure(kind, rates, args.seconds, args.workers)
    show(report)
    with open(os.path.join(HERE, "report-backend-load.json"), "w") as handle:
        json.dump(report, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
