"""Slot accuracy on a 20-node lab, and the handoff between nodes beside `etcdctl lock`.

Not part of the pass/fail suite. Boots a lab of --nodes job nodes and one
backend node (prefix dlky on 10.77.31.0/24 unless DLOCK_BENCH_LAB_PREFIX
/_SUBNET say otherwise) and rolls out site.yml with a Redis backend and one
job, `slots`: every --period seconds on every node, once per period, its
command `date` and its run id into the journal, the job's first instruction.
The nodes share the host's kernel clock, so every node's lines merge into one
timeline.

- slot accuracy: --slots slots with the role's timer as an operator sets
  it for a frequent job (AccuracySec=100ms, RandomizedDelaySec=0), then as
  many with RandomizedDelaySec=1s (a drop-in on every node), on each of
  --slot-backends in turn (redis: the Redis of site.yml; etcd: the bench's
  own etcd member, below, which each node's dlock.json is pointed at; a run
  on etcd costs a node less CPU than one on Redis, bench_run_cost.py): how late the
  winning job starts after its slot's boundary, p50/p99/max (target, issue
  26: p99 at most 1 s without a randomized delay; a slot with no run counts
  as a whole period late), the slots with no run,
  and how many nodes lose each slot (their runners' skipped_duplicate and
  skipped_locked lines). "early": runs that started before their slot's
  boundary: a runner that reached the backend more than a period less the
  slot's lead (max_clock_skew) after its timer fired (20 Python starts at
  once on 2 cores) claimed the next slot, and its own slot counts as missed.
- handoff: an etcd member on the backend node (plain, for this bench only);
  --waiters job nodes each run a loop of --grants commands under one lock at
  once, each command writing its start and end time: `dlock run
  --on-contention wait` on that etcd, and `etcdctl lock` on the same etcd,
  in turn (--rounds rounds, alternating). From every node's times merged,
  the handoff is the next command's start less the previous one's end
  (target: ours at most etcdctl's). Two commands overlapping would be a
  failure of mutual exclusion: the bench stops. Each command holds the lock
  --hold seconds, and the loop writes when it launches each one: a handoff
  counts as "queued" when the next command was launched before the previous
  one's job began, so that it had that job's whole run to start up and take
  its place in line. Only then is it the handoff the target speaks of: the
  others also time a process starting (a Python runner takes 100-300 ms to
  start on the loaded lab, etcdctl about 10), and are shown apart.

  python tests/bench/bench_lab_fleet.py [--nodes 20] [--period 5] [--slots 24] [--slot-backends redis,etcd]
                                        [--waiters 8] [--grants 10] [--rounds 2] [--keep]
"""

import argparse
import concurrent.futures
import datetime
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "tests", "lab"), os.path.join(ROOT, "tests"),
                os.path.join(ROOT, "plugins", "module_utils")]  # the engine, as the nodes import it

import ledger  # noqa: E402
from dlock.slots import run_id as slot_run_id  # noqa: E402
from lab import Lab, node_memory_kib  # noqa: E402
from rollout import site  # noqa: E402

JOB = "slots"
UNIT = "dlock-%s" % JOB
MARK = "SLOTSTART"
ETCD_PORT = 2379
TARGET_SLOT_P99 = 1.0


def percentile(values, share):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))] if ordered else float("nan")


def boundary_seconds(run_id):
    """JOB@2026-11-27T05:00:05Z -> the boundary's epoch seconds."""
    stamp = run_id.split("@", 1)[1]
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()


def slot_phase(lab, since, until, period):
    """What the journals say of the slots whose boundary is in [since, until)."""
    expected = int(round((until - since) / period))
    starts, losers = {}, {}
    # From a period before the first boundary: a run of that slot that started
    # before it (claimed early, in the window's lead) is seen, not counted missed.
    for _node, _at, message in ledger.journal(lab, UNIT + ".service", since - period):
        if message.startswith(MARK + " "):
            _mark, started, run_id = message.split()
            starts.setdefault(run_id, []).append(float(started))
        elif message.startswith("{"):
            record = json.loads(message)
            # A refused runner has no run id (no fence, no grant): its line
            # names the slot it asked for, as its own clock reckoned it.
            if record.get("result") in ("skipped_duplicate", "skipped_locked") and record.get("slot") is not None:
                lost_id = slot_run_id(record["job"], record["slot"], period, 0)
                losers[lost_id] = losers.get(lost_id, 0) + 1
    slots = dict((run_id, times) for run_id, times in starts.items() if since <= boundary_seconds(run_id) < until)
    twice = [run_id for run_id, times in slots.items() if len(times) > 1]
    if twice:
        raise RuntimeError("slots run more than once: %s" % twice)
    # A slot with no run counts as late by a whole period: it is in the
    # percentiles, not left out of them.
    late = [times[0] - boundary_seconds(run_id) for run_id, times in slots.items()]
    # A slot's window opens max_clock_skew before its boundary, on the
    # backend's clock (docs/design.md, Once per slot): a run before its
    # boundary is one whose runner reached the backend late in the previous
    # window, after the next one opened, so its own slot has no run.
    early = sum(1 for value in late if value < 0)
    missed = expected - len(slots)
    run_at = set(int(round((boundary_seconds(run_id) - since) / period)) for run_id in slots)
    missed_slots = [number for number in range(expected) if number not in run_at]
    late += [float(period)] * missed
    lost = [losers.get(run_id, 0) for run_id in slots]
    return {"slots_run": len(slots), "missed": missed, "missed_slots": missed_slots, "early": early,
            "late_p50": round(percentile(late, 0.5), 3), "late_p99": round(percentile(late, 0.99), 3),
            "late_max": round(max(late), 3) if late else None,
            "losers_per_slot": round(statistics.mean(lost), 1) if lost else None}


def run_slots(lab, nodes, period, count, delay):
    """Timers on with RandomizedDelaySec=DELAY seconds for COUNT periods; returns the figures."""
    dropin = "/etc/systemd/system/%s.timer.d" % UNIT
    command = ("mkdir -p {d} && printf '[Timer]\\nRandomizedDelaySec=%s\\n' > {d}/bench.conf && systemctl daemon-reload "
               "&& systemctl restart {u}.timer").format(d=dropin, u=UNIT) % ("%gs" % delay)
    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
        list(pool.map(lambda node: lab.ssh(node, command, check=True), nodes))
    since = (int(time.time() / period) + 1) * period  # the next boundary: every timer is armed by then
    until = since + count * period
    time.sleep(until - time.time() + period + delay + 3)  # the last slot's runs end, and their lines are written
    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
        list(pool.map(lambda node: lab.ssh(node, "systemctl stop %s.timer" % UNIT, check=True), nodes))
    return slot_phase(lab, since, until, period)


def handoff_round(lab, nodes, kind, grants, etcd_url, hold):
    """Each node a loop of GRANTS commands under one lock, all at once;
    returns the handoffs (seconds) between consecutive commands, as
    (queued, not queued) (module docstring)."""
    body = "echo S $(date +%%s.%%N) >> /tmp/handoff; sleep %g; echo E $(date +%%s.%%N) >> /tmp/handoff" % hold
    if kind == "dlock":
        one = ("dlock run --config /etc/dlock/bench-etcd.json --job handoff --on-contention wait --ttl 30s "
               "--wait-timeout 10m -- sh -c '%s'" % body)
    else:
        one = "ETCDCTL_API=3 etcdctl --endpoints=%s lock handoff-etcdctl -- sh -c '%s'" % (etcd_url, body)
    script = ("rm -f /tmp/handoff; for i in $(seq %d); do echo B $(date +%%s.%%N) >> /tmp/handoff; "
              "%s >/dev/null || exit 1; done; cat /tmp/handoff" % (grants, one))

    def loop(node):
        return lab.ssh(node, script, check=True, timeout=900).stdout.split("\n")
    commands = []  # (launched, job start, job end)
    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
        for lines in pool.map(loop, nodes):
            times = [float(line.split()[1]) for line in lines if line.strip()]
            commands += list(zip(times[0::3], times[1::3], times[2::3]))
    commands.sort(key=lambda command: command[1])
    if len(commands) != grants * len(nodes):
        raise RuntimeError("%s: %d commands ran, not %d" % (kind, len(commands), grants * len(nodes)))
    queued, not_queued = [], []
    for before, after in zip(commands, commands[1:]):
        handoff = after[1] - before[2]
        if handoff < 0:
            raise RuntimeError("%s: two commands overlapped (%.3fs): mutual exclusion failed" % (kind, handoff))
        (queued if after[0] < before[1] else not_queued).append(handoff)
    return queued, not_queued


def start_etcd(lab, backend):
    address = lab.addr(backend)
    lab.ssh(backend, "systemctl stop bench-etcd 2>/dev/null; rm -rf /var/tmp/bench-etcd; systemd-run --unit bench-etcd "
            "etcd --name bench --data-dir /var/tmp/bench-etcd --listen-client-urls http://0.0.0.0:%d "
            "--advertise-client-urls http://%s:%d --listen-peer-urls http://127.0.0.1:2390 "
            "--initial-advertise-peer-urls http://127.0.0.1:2390 --initial-cluster bench=http://127.0.0.1:2390"
            % (ETCD_PORT, address, ETCD_PORT), check=True)
    url = "http://%s:%d" % (address, ETCD_PORT)
    deadline = time.monotonic() + 60
    while lab.ssh(backend, "ETCDCTL_API=3 etcdctl --endpoints=%s endpoint health" % url).returncode != 0:
        if time.monotonic() > deadline:
            raise RuntimeError("the bench's etcd did not start on %s" % backend)
        time.sleep(0.5)
    return url


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--period", type=int, default=5)
    parser.add_argument("--slots", type=int, default=24, help="slots a phase; 0: no slot phases (the handoff only)")
    parser.add_argument("--slot-backends", default="redis,etcd", help="the slot phases' backends, in turn")
    parser.add_argument("--waiters", type=int, default=8)
    parser.add_argument("--grants", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hold", type=float, default=0.3, help="seconds each command holds the lock")
    parser.add_argument("--keep", action="store_true", help="leave the lab up at the end")
    args = parser.parse_args()
    lab = Lab(os.environ.get("DLOCK_BENCH_LAB_PREFIX", "dlky"), os.environ.get("DLOCK_BENCH_LAB_SUBNET", "10.77.31"))
    os.environ["ANSIBLE_FORKS"] = str(args.nodes + 1)
    started = time.monotonic()
    names = lab.up(nodes=args.nodes, backends=1)
    memory = [node_memory_kib(name) or 0 for name in names]
    print("lab %s: %d nodes booted in %.1fs; memory (Pss) %.0f MiB in all, at most %.1f MiB a node"
          % (lab.prefix, len(names), time.monotonic() - started, sum(memory) / 1024.0, max(memory) / 1024.0))
    job = {"name": JOB, "command": ["/bin/sh", "-c", 'echo "%s $(date +%%s.%%N) $DLOCK_RUN_ID"' % MARK],
           "schedule": "*:*:0/%d" % args.period, "once_per": "%ds" % args.period, "ttl": "%ds" % args.period}
    try:
        started = time.monotonic()
        site(lab, "redis", {"dlock_jobs_list": [job], "dlock_jobs_accuracy": "100ms"}, timeout=3600)
        nodes = lab.group("dlock_nodes")
        print("site.yml on %d nodes in %.0fs" % (len(names), time.monotonic() - started))
        memory = [node_memory_kib(name) or 0 for name in nodes]
        print("job nodes after site.yml: memory (Pss) at most %.1f MiB a node" % (max(memory) / 1024.0))
        etcd_url = start_etcd(lab, lab.group("dlock_backend")[0])
        if args.slots:
            slot_accuracy(lab, nodes, args)
        handoff(lab, nodes, args, etcd_url)
    finally:
        if not args.keep:
            lab.down()


def slot_accuracy(lab, nodes, args):
    """The slot phases: without and with a randomized delay."""
    print("\nslot accuracy, %d nodes, a slot every %ds, %d slots each:" % (len(nodes), args.period, args.slots))
    print("%-8s %-18s %9s %7s %7s %9s %9s %9s %9s" % (
        "backend", "RandomizedDelaySec", "slots run", "missed", "early", "late p50", "late p99", "late max", "losers"))
    for backend, delay in [(name, delay) for name in args.slot_backends.split(",") for delay in (0, 1)]:
        if delay == 0:
            use_backend(lab, nodes, backend)
        row = run_slots(lab, nodes, args.period, args.slots, delay)
        print("%-8s %-18s %9d %7d %7d %9.3f %9.3f %9.3f %9.1f%s" % (
            backend, "%gs" % delay, row["slots_run"], row["missed"], row["early"], row["late_p50"], row["late_p99"],
            row["late_max"],
            row["losers_per_slot"],
            "  target p99 <= %gs: %s" % (TARGET_SLOT_P99, "met" if row["late_p99"] <= TARGET_SLOT_P99 else "NOT met")
            if delay == 0 else ""))
        if row["missed_slots"]:
            print("%31s the phase's slots with no run (0: its first): %s" % (
                "", " ".join(str(number) for number in row["missed_slots"])))


def use_backend(lab, nodes, backend):
    """Point every node's dlock.json at BACKEND: "redis" (site.yml's, as it
    wrote it) or "etcd" (the bench's member, which has no users: its URL,
    with no password file, and the job's unit without the Redis password's
    credential, in a drop-in)."""
    dropin = "/etc/systemd/system/%s.service.d/bench-etcd.conf" % UNIT
    if backend == "redis":
        command = ("test ! -e /etc/dlock/dlock.json.site || mv /etc/dlock/dlock.json.site /etc/dlock/dlock.json; "
                   "rm -f %s && systemctl daemon-reload" % dropin)
    else:
        url = "etcd://%s:%d/dlock" % (lab.addr(lab.group("dlock_backend")[0]), ETCD_PORT)
        command = ("test -e /etc/dlock/dlock.json.site || cp -p /etc/dlock/dlock.json /etc/dlock/dlock.json.site; "
                   "python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c.pop(\"password_file\", None); "
                   "c[\"backend\"] = sys.argv[2]; json.dump(c, open(sys.argv[1], \"w\"))' /etc/dlock/dlock.json %s; "
                   "mkdir -p %s && printf '[Service]\\nLoadCredential=\\n' > %s && systemctl daemon-reload"
                   % (url, os.path.dirname(dropin), dropin))
    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
        list(pool.map(lambda node: lab.ssh(node, command, check=True), nodes))


def handoff(lab, nodes, args, url):
    """The handoff rounds, dlock and etcdctl interleaved, on the bench's own etcd."""
    backend = lab.group("dlock_backend")[0]
    waiters = nodes[:args.waiters]
    for node in waiters:
        lab.ssh(node, "install -m 0644 /dev/stdin /etc/dlock/bench-etcd.json", check=True,
                input=json.dumps({"backend": "etcd://%s:%d" % (lab.addr(backend), ETCD_PORT)}))
    handoffs = {("dlock", "queued"): [], ("etcdctl", "queued"): [], ("dlock", "not queued"): [],
                ("etcdctl", "not queued"): []}
    for round_number in range(args.rounds):
        for kind in (("dlock", "etcdctl") if round_number % 2 == 0 else ("etcdctl", "dlock")):
            queued, not_queued = handoff_round(lab, waiters, kind, args.grants, url, args.hold)
            handoffs[(kind, "queued")] += queued
            handoffs[(kind, "not queued")] += not_queued
    print("\nhandoff, %d waiters on %d nodes, %d grants each holding %gs, %d rounds (ms):" % (
        len(waiters), len(waiters), args.grants, args.hold, args.rounds))
    print("%-9s %-11s %7s %7s %7s %7s" % ("", "next was", "count", "p50", "p99", "max"))
    for (kind, how), values in handoffs.items():
        if values:
            print("%-9s %-11s %7d %7.1f %7.1f %7.1f" % (kind, how, len(values), 1000 * percentile(values, 0.5),
                                                        1000 * percentile(values, 0.99), 1000 * max(values)))
    ratio = percentile(handoffs[("dlock", "queued")], 0.5) / percentile(handoffs[("etcdctl", "queued")], 0.5)
    print("dlock / etcdctl, queued, p50: %.2fx (target <= 1: %s)" % (ratio, "met" if ratio <= 1 else "NOT met"))


if __name__ == "__main__":
    main()
