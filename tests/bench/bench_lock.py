"""Benchmarks of the runner and the lock round trips, measured side by side.

Not part of the pass/fail suite. Each comparison interleaves its contenders
in one run (A B C A B C ...) so machine noise hits all of them alike, and
reports medians and ratios. Writes tests/bench/report.json.

  python tests/bench/bench_lock.py [--rounds N]

Targets (issue #2): `dlock run -- true` within 1.15x of interpreter + driver
import; acquire+release within 1.3x of the same two calls on the bare client.
etcd and PostgreSQL HA (issue #13): acquire+release on etcd against the
same lease, create-if-absent, delete and revoke by hand with etcd3gw, and
`dlock run` against `etcdctl lock`; acquire+release on a primary with a
strictly synchronous standby against the single server.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "plugins", "module_utils")]

import servers  # noqa: E402
from dlock.backends import open_backend  # noqa: E402


def timed_commands(contenders, rounds, env):
    """Median wall time of each command, interleaved round by round."""
    samples = dict((name, []) for name in contenders)
    for _round in range(rounds):
        for name, argv in contenders.items():
            start = time.perf_counter()
            subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            samples[name].append(time.perf_counter() - start)
    return dict((name, statistics.median(values)) for name, values in samples.items())


def timed_calls(contenders, rounds):
    """Median time of each call. Every round runs each contender once, in a
    new random order: with a fixed order each contender always ran right
    after the same other one (another connection's statement), and the
    PostgreSQL ratio moved between 1.19x and 1.75x with the number and order
    of the contenders alone."""
    samples = dict((name, []) for name in contenders)
    order = list(contenders)
    for _round in range(rounds):
        random.shuffle(order)
        for name in order:
            fn = contenders[name]
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return dict((name, statistics.median(values)) for name, values in samples.items())


def redis_round_trips(server, rounds):
    engine = open_backend(server.url)
    bare = server.client()

    def ours():
        assert engine.acquire("bench", "owner", 30).granted
        assert engine.release("bench", "owner")

    def raw():
        assert bare.set("bench-raw", "owner", nx=True, px=30000)
        bare.delete("bench-raw")
    ours(), raw()  # load scripts, open connections
    return timed_calls({"dlock acquire+release": ours, "redis-py SET NX PX + DEL": raw}, rounds)


def pg_round_trips(server, rounds):
    engine = open_backend(server.url())
    # The hand-written pair goes over the engine's own connection: the same
    # settings (autocommit, no prepared statements, keepalives) and the same
    # server process, so the ratio is the statements and the engine alone.
    # Over a second connection each call paid for waking the other's server
    # process on two cores, and the ratio moved with the call order.
    bare = engine.conn
    bare.execute("CREATE TABLE IF NOT EXISTS bench_raw (key text PRIMARY KEY, owner text, expires_at timestamptz)")

    def ours():
        assert engine.acquire("bench", "owner", 30).granted
        assert engine.release("bench", "owner")

    def raw():
        # The two statements a hand-written lease would send, with the key,
        # owner and TTL as parameters as any application passes them.
        assert bare.execute(
            "INSERT INTO bench_raw VALUES (%s, %s, now() + %s * interval '1 millisecond') ON CONFLICT (key) "
            "DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at "
            "WHERE bench_raw.expires_at <= now() OR bench_raw.owner IS NULL RETURNING 1",
            ("k", "owner", 30000)).fetchone()
        bare.execute("UPDATE bench_raw SET owner = NULL, expires_at = now() WHERE key = %s AND owner = %s",
                     ("k", "owner"))
    ours(), raw()
    return timed_calls({"dlock acquire+release": ours, "psycopg upsert + update": raw}, rounds)


def etcd_round_trips(server, rounds):
    """Ours: lease grant, create-if-absent transaction; release: read, owner-
    checked delete transaction, revoke. By hand with etcd3gw: lease grant,
    create-if-absent (client.create), delete, revoke, without the owner check."""
    from etcd3gw.client import Etcd3Client
    engine = open_backend(server.url)
    bare = Etcd3Client(host="127.0.0.1", port=server.client_ports[0], api_path="/v3/")

    def ours():
        assert engine.acquire("bench", "owner", 30).granted
        assert engine.release("bench", "owner")

    def raw():
        lease = bare.lease(30)
        assert bare.create("bench-raw", "owner", lease=lease)
        bare.delete("bench-raw")
        lease.revoke()
    ours(), raw()
    return timed_calls({"dlock acquire+release": ours, "etcd3gw lease+create+delete+revoke": raw}, rounds)


def pg_ha_round_trips(single, pair, rounds):
    """The same acquire+release on a single server and on a primary whose
    every commit waits for its synchronous standby (what Patroni's
    synchronous_mode_strict gives): the price of surviving a failover."""
    engines = {"single server": open_backend(single.url()),
               "primary + synchronous standby": open_backend(pair.primary.url())}

    def cycle(engine):
        def run():
            assert engine.acquire("bench", "owner", 30).granted
            assert engine.release("bench", "owner")
        return run
    contenders = dict((name, cycle(engine)) for name, engine in engines.items())
    for run in contenders.values():
        run()
    return timed_calls(contenders, rounds)


def runner_wall(url, driver, rounds, others=None):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "plugins", "module_utils"))
    py = sys.executable
    return timed_commands(dict({
        "dlock run -- true": [py, "-c", "from dlock.cli import main; raise SystemExit(main())", "run", "--job", "bench", "--backend", url, "--", "true"],
        "python -c 'import %s'" % driver: [py, "-c", "import " + driver],
        "python -I -c pass": [py, "-I", "-c", "pass"],
    }, **(others or {})), rounds, env)


def ratio_rows(medians, base):
    return dict((name, {"median_ms": round(v * 1000, 3), "ratio_to_%s" % base: round(v / medians[base], 3)})
                for name, v in medians.items())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    redis_server, pg_server = servers.RedisServer(), servers.PostgresServer()
    etcd_server, pg_pair = servers.EtcdServer(), servers.PostgresSyncPair()
    report = {"rounds": args.rounds, "python": sys.version.split()[0]}
    try:
        etcdctl = ["etcdctl", "--endpoints", "127.0.0.1:%d" % etcd_server.client_ports[0], "lock", "bench-etcdctl",
                   "true"]
        report["runner_etcd"] = ratio_rows(runner_wall(etcd_server.url, "etcd3gw", args.rounds,
                                                       {"etcdctl lock KEY true": etcdctl}), "python -c 'import etcd3gw'")
        report["runner_redis"] = ratio_rows(runner_wall(redis_server.url, "redis", args.rounds), "python -c 'import redis'")
        report["runner_postgresql"] = ratio_rows(runner_wall(pg_server.url(), "psycopg", args.rounds),
                                                 "python -c 'import psycopg'")
        report["round_trip_redis"] = ratio_rows(redis_round_trips(redis_server, args.rounds * 20),
                                                "redis-py SET NX PX + DEL")
        report["round_trip_postgresql"] = ratio_rows(pg_round_trips(pg_server, args.rounds * 20),
                                                     "psycopg upsert + update")
        report["round_trip_etcd"] = ratio_rows(etcd_round_trips(etcd_server, args.rounds * 20),
                                               "etcd3gw lease+create+delete+revoke")
        report["round_trip_postgresql_ha"] = ratio_rows(pg_ha_round_trips(pg_server, pg_pair, args.rounds * 20),
                                                        "single server")
    finally:
        redis_server.stop()
        pg_server.stop()
        etcd_server.stop()
        pg_pair.stop()
    for section, rows in report.items():
        if not isinstance(rows, dict):
            continue
        print(section)
        for name, row in rows.items():
            ratio = [v for k, v in row.items() if k.startswith("ratio")][0]
            print("  %-32s %9.3f ms   x%.3f" % (name, row["median_ms"], ratio))
    with open(os.path.join(HERE, "report.json"), "w") as handle:
        json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
