"""Takeover time: how soon a waiting runner (`dlock run --on-contention
wait`) starts its job once the holder is gone, on etcd, Redis and
PostgreSQL, measured side by side in one run (etcd Redis PostgreSQL, etcd
Redis PostgreSQL, ...). Not part of the pass/fail suite. Writes
tests/bench/report-takeover.json.

  python tests/bench/bench_takeover.py [--rounds N]

Two ways for the holder to go, each round a fresh key:
- killed: SIGKILL of the holder's runner and its job right after its grant
  (a node that died). The waiter can only have the lock once the lease
  expired, TTL after the grant: "from the kill" is what an operator sees,
  "beyond the lease" is the waiter's job start less (the holder's job
  start + TTL), i.e. what expiry and waiting add to the TTL.
- released: the holder's job ends after HOLD seconds and its runner
  releases: from the holder's job's last moment to the waiter's job's first.

Every round checks that the waiter did wait (its log line says attempt 2
or more): a waiter that started too late (a busy machine) came to a free
lock, so that round is run again (and counted as "late").

etcd is a 3-member cluster (the deployment issue #13 is about), its waiter
woken by a watch on its predecessor in line; Redis and PostgreSQL are single
servers, their waiters woken by pub/sub and LISTEN/NOTIFY. An expired lease
wakes nobody by itself: each waiter also sleeps only until the lease it saw
can have expired. All on loopback, real servers (tests/servers.py). Ratios
are to Redis.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "tests")]

import servers  # noqa: E402

TTL = 3.0  # short (etcd's shortest is 2s), yet longer than a waiter's start on a busy machine
HOLD = 2.0  # the holder's job in a release round: the waiter is waiting well before its end
RETRIES = 5  # a round whose waiter came late is run again, at most this often
DLOCK = [sys.executable, "-c", "from dlock.cli import main; raise SystemExit(main())", "run"]
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "plugins", "module_utils"))
STAMP = "date +%s.%N"


def runner(url, key, command, *flags):
    """`dlock run` of KEY on URL with `sh -c COMMAND` as its job."""
    return subprocess.Popen(DLOCK + ["--job", key, "--backend", url, "--ttl", "%gs" % TTL] + list(flags)
                            + ["--", "sh", "-c", command], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def waiter(url, key):
    return runner(url, key, STAMP, "--on-contention", "wait", "--wait-timeout", "30s")


class Late(Exception):
    """The waiter found the lock free at its first attempt: it did not wait."""


def waited(proc, timeout=60):
    """The waiter's job start (its stamp), after checking it waited for the lock."""
    out, err = proc.communicate(timeout=timeout)
    record = json.loads(err.strip().splitlines()[-1])
    if proc.returncode != 0:
        raise RuntimeError("the waiter failed (exit %s): %s" % (proc.returncode, err.strip()))
    if record["attempt"] < 2:
        raise Late()
    return float(out.split()[0])


def killed(url, key):
    holder = runner(url, key, 'echo "$$ $(%s)"; exec sleep 60' % STAMP)
    line = holder.stdout.readline().split()
    if len(line) != 2:
        raise RuntimeError("the holder did not run: %s" % holder.communicate()[1])
    job_pid, started = int(line[0]), float(line[1])
    waiting = waiter(url, key)
    killed_at = time.time()
    os.killpg(job_pid, signal.SIGKILL)  # the job leads its own process group
    holder.kill()
    holder.communicate()
    taken = waited(waiting)
    return {"from the kill": taken - killed_at, "beyond the lease": taken - (started + TTL)}


def released(url, key):
    holder = runner(url, key, "%s; sleep %g; %s" % (STAMP, HOLD, STAMP))
    if not holder.stdout.readline().strip():
        raise RuntimeError("the holder did not run: %s" % holder.communicate()[1])
    waiting = waiter(url, key)
    out, err = holder.communicate(timeout=60)
    if holder.returncode != 0:
        raise RuntimeError("the holder failed: %s" % err)
    return {"after a release": waited(waiting) - float(out.split()[-1])}


def p95(values):
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    etcd, redis_server, pg = servers.EtcdServer(members=3), servers.RedisServer(), servers.PostgresServer()
    urls = {"etcd (3 members)": etcd.url, "redis": redis_server.url, "postgresql": pg.url()}
    samples, late = {}, 0
    try:
        for number in range(args.rounds):
            for backend, url in urls.items():
                for scenario in (killed, released):
                    for attempt in range(RETRIES + 1):
                        try:
                            values = scenario(url, "takeover-%s-%d-%d" % (scenario.__name__, number, attempt))
                            break
                        except Late:
                            late += 1
                    else:
                        raise RuntimeError("%s: the waiter came late %d times in a row" % (backend, RETRIES + 1))
                    for name, value in values.items():
                        samples.setdefault(name, {}).setdefault(backend, []).append(value)
    finally:
        etcd.stop()
        redis_server.stop()
        pg.stop()
    report = {"rounds": args.rounds, "ttl_s": TTL, "late_rounds_run_again": late, "python": sys.version.split()[0]}
    print("rounds whose waiter came late, run again: %d" % late)
    for name, by_backend in samples.items():
        base = statistics.median(by_backend["redis"])
        report[name] = dict((backend, {"median_ms": round(statistics.median(v) * 1000, 1),
                                       "p95_ms": round(p95(v) * 1000, 1),
                                       "ratio_to_redis": round(statistics.median(v) / base, 3)})
                            for backend, v in by_backend.items())
        print("takeover %s (ttl %gs, %d rounds)" % (name, TTL, args.rounds))
        for backend, row in report[name].items():
            print("  %-18s median %8.1f ms   p95 %8.1f ms   x%.3f" % (backend, row["median_ms"], row["p95_ms"],
                                                                      row["ratio_to_redis"]))
    with open(os.path.join(HERE, "report-takeover.json"), "w") as handle:
        json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
