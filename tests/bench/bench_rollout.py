"""site.yml's rollout of many jobs on a 20-node lab, beside a plain cron+flock one.

Not part of the pass/fail suite. Boots a lab of --nodes job nodes and one
backend node (tests/lab/lab.py, prefix dlkz on 10.77.30.0/24 unless
DLOCK_BENCH_LAB_PREFIX/_SUBNET say otherwise) and prints its boot time and
its nodes' memory. For each size in --jobs (jobs in all, dealt round-robin
to the nodes: 1000 on 20 nodes is 50 a node), on freshly booted nodes each
time (the lab is taken down and booted again: nothing of the previous
rollout stays):

  anchor  tests/bench/anchor_cron_flock.yml: each node's jobs as
          ansible.builtin.cron entries wrapped in flock, what an operator
          writes without us; then the same playbook again (nothing to change)
  ours    playbooks/site.yml with a Redis backend: the backend, chrony, the
          runner, each node's jobs (dlock_jobs_list) and the metrics; then
          site.yml again (nothing to change)

The order of the two alternates from size to size. Both run with the same
--forks (by default one per node, as an operator with this fleet would set
it). For each run: wall time, the tasks and changed counts of PLAY RECAP,
the controller's CPU (ansible-playbook and its children: ssh) and the
nodes' CPU (their cgroups), in all and under their sshd (the playbook's
commands; the rest is what the nodes run meanwhile: timers, the refresh). Then the ratios the issue sets targets for
(issue 26): ours / anchor for the first rollout (at most 1.5x) and the
re-run (at most 1.2x), at the largest size; and our time per job: the
marginal cost of a job between sizes, (t(b) - t(a)) / (b - a), whose ratio
from the lower pair to the upper one ("growth") is 1 when the cost per job
is flat (target: within 20%).

  python tests/bench/bench_rollout.py [--nodes 20] [--jobs 10,100,1000] [--forks N] [--keep]
"""

import argparse
import json
import os
import re
import resource
import shutil
import sys
import tempfile
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "tests", "lab"), os.path.join(ROOT, "tests")]

from lab import Lab, cgroup_roots, node_memory_kib  # noqa: E402
from rollout import ansible_playbook, site  # noqa: E402

ANCHOR = os.path.join(HERE, "anchor_cron_flock.yml")
RECAP = re.compile(r"^\S+\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)", re.M)
TARGET_FIRST, TARGET_AGAIN, TARGET_GROWTH = 1.5, 1.2, 1.2
TIMEOUT = 3600  # one playbook run at most: the suite's 900 s is too short for site.yml on 20 busy nodes


def jobs_of(nodes, count):
    """{node: [job entry]}: `count` jobs dealt round-robin; each runs hourly
    at its own minute. An entry serves both playbooks: the anchor reads
    name, command and minute; dlock_jobs reads name, command and schedule
    (its filter refuses fields it does not know, so the minute goes apart)."""
    dealt = dict((node, []) for node in nodes)
    for number in range(count):
        minute = number % 60
        dealt[nodes[number % len(nodes)]].append({
            "name": "bench-%04d" % number, "command": ["/usr/bin/logger", "-t", "bench", "job %d" % number],
            "schedule": "*-*-* *:%02d:00" % minute, "minute": minute})
    return dealt


def write_inventory(directory, dealt):
    """An inventory of host_vars only (the lab's inventory names the hosts):
    each node's jobs, as dlock_jobs_list and as the anchor's bench_jobs."""
    host_vars = os.path.join(directory, "host_vars")
    os.makedirs(host_vars, exist_ok=True)
    for node, entries in dealt.items():
        with open(os.path.join(host_vars, node + ".yml"), "w") as handle:
            yaml.safe_dump({"bench_jobs": entries,
                            "dlock_jobs_list": [dict((k, v) for k, v in e.items() if k != "minute") for e in entries]},
                           handle)
    with open(os.path.join(directory, "hosts.yml"), "w") as handle:
        yaml.safe_dump({"all": {"hosts": dict((node, {}) for node in dealt)}}, handle)
    return directory


def node_cpu_seconds(lab):
    """(all, commands): the CPU time of every process of the lab's nodes so
    far, and of the part that ran under their sshd (the playbook's commands
    and modules; the nodes run no pam_systemd, so a login stays in
    ssh.service): cpu.stat of each node's cgroup and of that service's, in
    the cgroup2 hierarchy (lab.cgroup_roots: the unified one of a hybrid
    host, or the only one). The rest is the nodes' own work meanwhile: the
    jobs' timers firing, the metrics refresh, systemd, journald."""
    cgroup2 = [root for root in cgroup_roots() if os.path.exists(os.path.join(root, "cgroup.controllers"))][0]
    total = commands = 0
    for name in lab.group("dlock_nodes") + lab.group("dlock_backend"):
        with open(os.path.join(cgroup2, name, "cpu.stat")) as handle:
            total += int(handle.readline().split()[1])
        try:
            with open(os.path.join(cgroup2, name, "payload", "system.slice", "ssh.service", "cpu.stat")) as handle:
                commands += int(handle.readline().split()[1])
        except FileNotFoundError:  # sshd not started yet
            pass
    return total / 1e6, commands / 1e6


def measured(lab, run):
    """run() -> a CompletedProcess of ansible-playbook; returns its figures."""
    usage, nodes_before, start = resource.getrusage(resource.RUSAGE_CHILDREN), node_cpu_seconds(lab), time.monotonic()
    done = run()
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError("ansible-playbook failed:\n%s" % (done.stdout or "")[-4000:])
    recap = [tuple(int(x) for x in row) for row in RECAP.findall(done.stdout)]
    nodes_after = node_cpu_seconds(lab)
    return {"wall": round(wall, 1), "tasks": sum(r[0] + r[4] for r in recap), "ran": sum(r[0] for r in recap),
            "changed": sum(r[1] for r in recap),
            "controller_cpu": round(after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime, 1),
            "nodes_cpu": round(nodes_after[0] - nodes_before[0], 1),
            "nodes_cpu_commands": round(nodes_after[1] - nodes_before[1], 1)}


def fresh(lab, nodes):
    """The lab taken down and booted again: nodes with nothing installed."""
    lab.down()
    started = time.monotonic()
    names = lab.up(nodes=nodes, backends=1)
    memory = [node_memory_kib(name) or 0 for name in names]
    return round(time.monotonic() - started, 1), round(max(memory) / 1024.0, 1), round(sum(memory) / 1024.0, 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--jobs", default="10,100,1000", help="jobs in all, ascending (default 10,100,1000)")
    parser.add_argument("--forks", type=int, default=None, help="ansible's forks (default: one per node)")
    parser.add_argument("--keep", action="store_true", help="leave the lab up at the end")
    args = parser.parse_args()
    sizes = [int(size) for size in args.jobs.split(",")]
    lab = Lab(os.environ.get("DLOCK_BENCH_LAB_PREFIX", "dlkz"), os.environ.get("DLOCK_BENCH_LAB_SUBNET", "10.77.30"))
    os.environ["ANSIBLE_FORKS"] = str(args.forks or args.nodes + 1)  # both playbooks' ansible-playbook reads it
    scratch = tempfile.mkdtemp(prefix="dlock-bench-rollout-")
    rows = {}
    try:
        for index, size in enumerate(sizes):
            order = ("anchor", "ours") if index % 2 == 0 else ("ours", "anchor")
            for kind in order:
                boot, node_mib, lab_mib = fresh(lab, args.nodes)
                print("lab %s: %d nodes booted in %.1fs; memory (Pss) %.0f MiB in all, at most %.1f MiB a node"
                      % (lab.prefix, args.nodes + 1, boot, lab_mib, node_mib), flush=True)
                inventory = write_inventory(os.path.join(scratch, "%s-%d" % (kind, size)),
                                            jobs_of(lab.group("dlock_nodes"), size))
                if kind == "anchor":
                    def run():
                        return ansible_playbook(lab, ANCHOR, {}, "-i", inventory, check=False, timeout=TIMEOUT)
                else:
                    def run():
                        return site(lab, "redis", {}, "-i", inventory, check=False, timeout=TIMEOUT)
                first, again = measured(lab, run), measured(lab, run)
                if again["changed"]:
                    raise RuntimeError("%s at %d jobs: the re-run changed %d" % (kind, size, again["changed"]))
                rows[(kind, size)] = {"first": first, "again": again}
                print("%-6s %5d jobs: first %s\n%19s again %s" % (kind, size, json.dumps(first), "", json.dumps(again)),
                      flush=True)
    finally:
        if not args.keep:
            lab.down()
        shutil.rmtree(scratch, ignore_errors=True)
    report(rows, sizes)


def cpu(row):
    """CPU seconds: the controller's / the nodes' in all / the nodes' under sshd (the playbook's commands)."""
    return "%.0f / %.0f / %.0f" % (row["controller_cpu"], row["nodes_cpu"], row["nodes_cpu_commands"])


def report(rows, sizes):
    print("\n%-7s %-6s %9s %7s %8s  %-22s %-22s %7s %8s" % (
        "jobs", "run", "anchor s", "ours s", "ratio", "anchor CPU ctl/nodes/cmd", "ours CPU ctl/nodes/cmd", "tasks",
        "changed"))
    for size in sizes:
        for run in ("first", "again"):
            anchor, ours = rows[("anchor", size)][run], rows[("ours", size)][run]
            print("%-7d %-6s %9.1f %7.1f %7.2fx  %-22s %-22s %7d %8d" % (
                size, run, anchor["wall"], ours["wall"], ours["wall"] / anchor["wall"], cpu(anchor), cpu(ours),
                ours["tasks"], ours["changed"]))
    largest = sizes[-1]
    first = rows[("ours", largest)]["first"]["wall"] / rows[("anchor", largest)]["first"]["wall"]
    again = rows[("ours", largest)]["again"]["wall"] / rows[("anchor", largest)]["again"]["wall"]
    print("\nat %d jobs: first rollout %.2fx the anchor (target <= %g: %s); re-run %.2fx (target <= %g: %s)" % (
        largest, first, TARGET_FIRST, "met" if first <= TARGET_FIRST else "NOT met",
        again, TARGET_AGAIN, "met" if again <= TARGET_AGAIN else "NOT met"))
    if len(sizes) >= 3:
        for kind in ("anchor", "ours"):
            walls = [rows[(kind, size)]["first"]["wall"] for size in sizes[-3:]]
            low = (walls[1] - walls[0]) / (sizes[-2] - sizes[-3])
            high = (walls[2] - walls[1]) / (sizes[-1] - sizes[-2])
            growth = high / low if low > 0 else float("nan")
            print("%-6s s per job, first rollout: %.3f (%d-%d jobs), %.3f (%d-%d); growth %.2f%s" % (
                kind, low, sizes[-3], sizes[-2], high, sizes[-2], sizes[-1], growth,
                "" if kind == "anchor" else " (target within %d%%: %s)" % (
                    round((TARGET_GROWTH - 1) * 100), "met" if abs(growth - 1) <= TARGET_GROWTH - 1 else "NOT met")))


if __name__ == "__main__":
    main()
