"""Faults of an etcd lock backend on a real fleet (issue 13).

site.yml with dlock_backend_type etcd makes an etcd cluster of three backend
nodes (dlock_etcd) and points three job nodes at all its members. Every job
node's timer starts the ledger job (ledger_job.py) every 2s with a 6s TTL
and once_per 2s: a run works 4.5s, so there is nearly always a holder
renewing, and the other nodes' grants are refused every 2s, while each test
loses one member:

- the leader, killed with SIGKILL (and kept down until jobs ran without it);
- the leader, partitioned from the other members and the nodes, then healed;
- a member that is not the leader, crashed (the whole node), then booted.

The fault hits while a run holds the lock. After the repair the cluster must
be whole again, and the ledger of the whole test must show: no two runs
overlapping, no slot run twice, fencing tokens strictly increasing in grant
order, runs that started while the member was lost, and no gap between runs
longer than the TTL plus etcd's failover time (gap_bound says why).

A lab of its own (prefix dlke on 10.77.8, or DLOCK_ETCD_LAB_PREFIX /
DLOCK_ETCD_LAB_SUBNET), removed at the end (unless DLOCK_ETCD_LAB_KEEP is
set: to look at it after a failure; a next run reuses it); one site.yml
rollout for all the tests; each test leaves every member running and
connected.
"""

import json
import math
import os
import time

import ledger
import pytest
from lab import Lab
from rollout import password_file, read_password, site

pytestmark = pytest.mark.lab

JOB = "faults"
UNIT = "dlock-%s" % JOB  # the jobs role's dlock-NAME.service and .timer
LEDGER_SCRIPT = "/usr/local/lib/dlock-lab-ledger.py"
TTL = 6.0
WORK = 4.5  # each run's work: past its first two renewals
PERIOD = 2.0  # the timer fires every 2s on every node
RANDOMIZED_DELAY = 0.3
ACCURACY = 0.1
# A runner's start-up (Python, the driver), its clock reading and its grant,
# before its job writes the first line: 0.2-0.6s on a quiet lab, more on a
# machine that runs other labs beside it.
RUNNER_START = 2.0
JOB_SPEC = {
    "name": JOB, "command": ["/usr/bin/python3", LEDGER_SCRIPT], "schedule": "*:*:0/%d" % PERIOD,
    "randomized_delay": "%gs" % RANDOMIZED_DELAY, "accuracy": "%gs" % ACCURACY, "once_per": "%gs" % PERIOD,
    # A short lease, renewed every 1.5s; one backend call may take 3s: each
    # member gets a third of it when the others do not answer, and a
    # runner's first call includes its login, which etcd checks with bcrypt
    # (0.05s on a quiet machine, 0.6s on one that runs other labs beside).
    # A job is killed 0.5s after its SIGTERM: 1.5 + 3 + 0.5 + 0.12 (clock
    # margin) < 6.
    "ttl": "%gs" % TTL, "renew_every": "1.5s", "op_timeout": "3s", "kill_grace": "500ms",
    # etcd's clock is read from the HTTP Date header (whole seconds): the check
    # allows for that itself. With the randomized delay it stays below half
    # of once_per, as slots require.
    "max_clock_skew": "500ms",
    "environment": {"LEDGER_WORK_SECONDS": "%g" % WORK},
}
# What a run may end with here: the job ran, its runner lost the lease and
# killed it in time, or a runner did not get the lock (held, slot already
# run, or the backend could not answer: fail closed).
RESULTS = {"success", "lock_lost", "skipped_locked", "skipped_duplicate", "backend_error"}
RUNS_WHILE_LOST = 2  # successful runs that must start (and end) while the member is lost
NO_RESTART = "/run/systemd/system/etcd.service.d/faults.conf"


def gap_bound(election_timeout):
    """The longest the fleet may go without a run while one member is lost.

    A run in flight may end without releasing (its runner lost the lease, or
    its release found no leader): its lease then ends TTL after its last
    renewal, and etcd adds, with the election timeout E that dlock_etcd set:
    - 2 E for a new leader: a follower campaigns after its randomized
      election timeout, between E and 2 E (a lost follower costs none);
    - 1 E more on that lease: a new leader extends every lease by E as it
      takes over (etcd 3.4's lessor Promote; with no lease checkpoints the
      remaining TTL is not kept, so the lease may start a whole TTL then);
    - 0.5s: the leader looks for expired leases every 500ms.
    The fleet then needs a timer to fire (the period, its randomized delay
    and accuracy) and that runner to start and take the lock (RUNNER_START).
    """
    return math.ceil(TTL) + 3 * election_timeout + 0.5 + PERIOD + RANDOMIZED_DELAY + ACCURACY + RUNNER_START


class EtcdFleet(object):
    """The lab with the cluster's members and the jobs' controls."""

    def __init__(self, lab, admin_password):
        self.lab = lab
        self.members = lab.group("dlock_backend")
        self.nodes = lab.group("dlock_nodes")
        self.admin_password = admin_password
        self.endpoints = ",".join("http://%s:2379" % lab.addr(m) for m in self.members)

    def etcdctl(self, via, command):
        """etcdctl on member VIA against every member, as etcd's root (the
        password on etcdctl's prompt, over ssh's stdin). Returns stdout
        without the prompt; members that do not answer are left out."""
        done = self.lab.ssh(via, "etcdctl --endpoints=%s --user root --command-timeout=2s -w json %s"
                            % (self.endpoints, command), input=self.admin_password + "\n", timeout=30)
        return done.stdout.split("Password:", 1)[-1].strip()

    def status(self, via):
        """{member: {"id", "leader", "term"}} of the members that answered."""
        out = self.etcdctl(via, "endpoint status")
        by_address = dict((self.lab.addr(m), m) for m in self.members)
        found = {}
        for entry in json.loads(out or "[]"):
            address = entry["Endpoint"].split("//")[1].rsplit(":", 1)[0]
            found[by_address[address]] = {"id": entry["Status"]["header"]["member_id"],
                                          "leader": entry["Status"]["leader"], "term": entry["Status"]["raftTerm"]}
        return found

    def leader(self, via=None):
        """The member that leads, as the members that answer agree (None if they do not)."""
        status = self.status(via or self.members[0])
        leaders = set(s["leader"] for s in status.values())
        if len(leaders) != 1:
            return None
        return next((m for m, s in status.items() if s["id"] in leaders), None)

    def wait_whole(self, via, timeout=90):
        """Until every member answers and all follow one leader; returns it."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status(via)
            if len(status) == len(self.members) and len(set(s["leader"] for s in status.values())) == 1:
                leader = self.leader(via)
                if leader is not None:
                    return leader
            assert time.monotonic() < deadline, "the cluster is not whole after %ds: %r" % (timeout, status)
            time.sleep(0.5)

    def on_nodes(self, command):
        for node in self.nodes:
            self.lab.ssh(node, command, check=True)

    def start_jobs(self):
        """Start the job's timers; returns the time from which the ledger counts."""
        since = time.time()
        self.on_nodes("systemctl start %s.timer" % UNIT)
        return since

    def stop_jobs(self, timeout=30):
        """Stop the timers and wait for the runs in progress to end."""
        self.on_nodes("systemctl stop %s.timer; timeout %d sh -c 'while [ \"$(systemctl show -p ActiveState --value "
                      "%s.service)\" != inactive ] && ! systemctl -q is-failed %s.service; do sleep 0.2; done'"
                      % (UNIT, timeout, UNIT, UNIT))

    def runs(self, since):
        return ledger.runs(ledger.journal(self.lab, UNIT + ".service", since))

    def wait_runs(self, since, count, what, timeout, running=False):
        """Until COUNT runs that started after SINCE have succeeded (and,
        with running, one holds the lock right now); returns the runs."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.runs(since)
            done = [r for r in found if r["start"] >= since and r["result"] == "success"]
            if running and any(r["start"] >= since and r["end"] is None for r in found) and len(done) >= count:
                return found
            if not running and len(done) >= count:
                return found
            assert time.monotonic() < deadline, "%s: %d of %d successful runs within %ds: %r; the runners said: %s" \
                % (what, len(done), count, timeout, found, self.results(since))
            time.sleep(0.5)

    def results(self, since):
        """{result: (count, the last error)} of every runner on every node since SINCE."""
        found = {}
        for _node, _at, message in sorted(ledger.journal(self.lab, UNIT + ".service", since), key=lambda line: line[1]):
            if message.startswith("{"):
                record = json.loads(message)
                count, error = found.get(record["result"], (0, None))
                found[record["result"]] = (count + 1, record.get("error") or error)
        return found


@pytest.fixture(scope="module")
def fleet():
    if os.geteuid() != 0:
        pytest.skip("the lab needs root (network namespaces, mounts, systemd-nspawn)")
    lab = Lab(prefix=os.environ.get("DLOCK_ETCD_LAB_PREFIX", "dlke"),
              subnet=os.environ.get("DLOCK_ETCD_LAB_SUBNET", "10.77.8"))
    try:
        lab.up(nodes=3, backends=3)
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ledger_job.py")) as handle:
            script = handle.read()
        for node in lab.group("dlock_nodes"):
            lab.ssh(node, "install -m 0644 /dev/stdin %s" % LEDGER_SCRIPT, check=True, input=script)
        done = site(lab, "etcd", {"dlock_jobs_list": [JOB_SPEC],
                                  "dlock_backend_admin_password_file": password_file(lab, admin=True)})
        assert "failed=0" in done.stdout
        admin = read_password(lab, admin=True)
        assert read_password(lab) != admin
        etcd = EtcdFleet(lab, admin)
        etcd.stop_jobs()  # site.yml started the timers: each test starts them itself
        yield etcd
    finally:
        if not os.environ.get("DLOCK_ETCD_LAB_KEEP"):
            lab.down()


def election_timeout(fleet):
    """The election timeout (seconds) the members run with, as dlock_etcd wrote it."""
    out = fleet.lab.ssh(fleet.members[0], "cat /etc/default/etcd", check=True).stdout
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line and not line.startswith("#"))
    return int(values["ETCD_ELECTION_TIMEOUT"]) / 1000.0


def run_fault(fleet, capsys, name, inject, repair):
    """Jobs running; when a run holds the lock, inject the fault (it names
    the member it takes out in fault["member"] and the time in fault["at"]
    before it acts); wait for RUNS_WHILE_LOST successful runs that started
    after it took effect; repair; wait for the cluster to be whole again
    and for more runs; then check the ledger."""
    bound = gap_bound(election_timeout(fleet))
    fault = {}
    since = fleet.start_jobs()
    try:
        fleet.wait_runs(since, 2, "%s: before the fault" % name, timeout=60, running=True)
        inject(fault)
        fleet.wait_runs(time.time(), RUNS_WHILE_LOST, "%s: while %s is lost" % (name, fault["member"]),
                        timeout=RUNS_WHILE_LOST * (bound + WORK) + 10)
        repair(fault["member"])
        fault["repaired"] = True
        repaired_at = time.time()
        fleet.wait_whole(fleet.members[0])
        fleet.wait_runs(repaired_at, 2, "%s: after the repair" % name, timeout=2 * (bound + WORK) + 10)
    finally:
        if "member" in fault and "repaired" not in fault:
            repair(fault["member"])
        fleet.stop_jobs()
    granted = fleet.runs(since)
    gaps = ledger.check(granted)
    results = fleet.results(since)
    assert set(results) <= RESULTS, results
    longest = max(gaps, key=lambda g: g[0])
    first = next((g for g in gaps if g[2]["start"] >= fault["at"]), None)  # into the first run after the fault
    with capsys.disabled():  # shown in every run, for the report
        print("\netcd fault %s: %d runs (%d lock_lost), longest gap %.2fs (bound %.2fs), gap into the first run "
              "after the fault %s, results %s, gaps over 1s: %s"
              % (name, len(granted), sum(r["result"] == "lock_lost" for r in granted), longest[0], bound,
                 "%.2fs" % first[0] if first else "-", dict((r, n) for r, (n, _e) in sorted(results.items())),
                 " ".join("%.2f" % g[0] for g in gaps if g[0] > 1.0) or "none"))
    assert longest[0] <= bound, \
        "a gap of %.2fs between %r and %r is over %.2fs" % (longest[0], longest[1], longest[2], bound)


def test_leader_killed(fleet, capsys):
    """SIGKILL of the leader's etcd, kept down (as a dead machine) until the
    fleet ran without it, then started again."""
    def inject(fault):
        fault["member"] = leader = fleet.wait_whole(fleet.members[0])
        fault["at"] = time.time()
        # Debian's unit restarts etcd at once (Restart=on-abnormal): a runtime
        # drop-in keeps this member lost until the repair.
        fleet.lab.ssh(leader, "mkdir -p /run/systemd/system/etcd.service.d && printf '[Service]\\nRestart=no\\n' "
                              "> %s && systemctl daemon-reload && systemctl kill --signal=SIGKILL etcd && "
                              "timeout 10 sh -c 'while systemctl -q is-active etcd; do sleep 0.1; done'" % NO_RESTART,
                      check=True)

    def repair(leader):
        fleet.lab.ssh(leader, "rm -f %s && systemctl daemon-reload && systemctl reset-failed etcd; "
                              "systemctl start etcd" % NO_RESTART, check=True)
    run_fault(fleet, capsys, "leader SIGKILL", inject, repair)


def test_leader_partitioned(fleet, capsys):
    """The leader's link cut (from the other members and the nodes), then healed."""
    def inject(fault):
        fault["member"] = fleet.wait_whole(fleet.members[0])
        fault["at"] = time.time()
        fleet.lab.partition(fault["member"])
    run_fault(fleet, capsys, "leader partitioned", inject, fleet.lab.heal)


def test_follower_crashed(fleet, capsys):
    """A member that does not lead: its node killed at once, then booted."""
    def inject(fault):
        leader = fleet.wait_whole(fleet.members[0])
        fault["member"] = [m for m in fleet.members if m != leader][0]
        fault["at"] = time.time()
        fleet.lab.crash(fault["member"])
    run_fault(fleet, capsys, "follower crashed", inject, fleet.lab.start)


# -- the checks can fail ---------------------------------------------------------

def _run(owner, start, end, fence, slot, result="success"):
    return {"owner": owner, "host": "n1", "start": start, "end": end, "fence": fence, "run_id": "faults@%s" % slot,
            "result": result}


CLEAN = [_run("a", 0.0, 2.5, 10, 0), _run("b", 3.0, 5.5, 14, 3), _run("c", 6.0, 8.0, 20, 6)]
BROKEN = [
    ("overlap", [_run("a", 0.0, 2.5, 10, 0), _run("b", 2.4, 5.0, 14, 2)], "runs overlap"),
    ("overlap inside a long run", [_run("a", 0.0, 9.0, 10, 0), _run("b", 3.0, 4.0, 14, 3),
                                   _run("c", 5.0, 6.0, 15, 5)], "runs overlap"),
    ("slot twice", [_run("a", 0.0, 2.5, 10, 0), _run("b", 3.0, 5.0, 14, 0)], "ran 2 times"),
    ("fence not increasing", [_run("a", 0.0, 2.5, 14, 0), _run("b", 3.0, 5.0, 14, 3)], "did not increase"),
    ("fence going back", [_run("a", 0.0, 2.5, 14, 0), _run("b", 3.0, 5.0, 10, 3)], "did not increase"),
    ("no end", [_run("a", 0.0, None, 10, 0), _run("b", 3.0, 5.0, 14, 3)], "has no end"),
]


def test_the_ledger_check_passes_a_clean_ledger():
    gaps = ledger.check(CLEAN)
    assert [round(g[0], 3) for g in gaps] == [0.5, 0.5]


@pytest.mark.parametrize("name,granted,message", BROKEN, ids=[b[0] for b in BROKEN])
def test_the_ledger_check_fails_a_broken_ledger(name, granted, message):
    with pytest.raises(AssertionError, match=message):
        ledger.check(granted)


def test_killed_runs_end_at_their_runner_line():
    """A job killed before its end line ends when its runner logged (after
    the job's process group was gone); a runner line alone opens the run at
    the runner's start."""
    lines = [
        ("n1", 100.0, "LEDGER_START " + json.dumps({"owner": "o1", "run_id": "faults@x", "fence": 7, "start": 100.0})),
        ("n1", 103.4, json.dumps({"owner": "o1", "fence": 7, "run_id": "faults@x", "result": "lock_lost",
                                  "duration_ms": 3600})),
        ("n2", 104.0, json.dumps({"owner": "o2", "fence": 9, "run_id": "faults@y", "result": "lock_lost",
                                  "duration_ms": 1000})),
        ("n3", 104.5, json.dumps({"owner": "o3", "fence": None, "result": "skipped_locked", "duration_ms": 50})),
    ]
    found = dict((r["owner"], r) for r in ledger.runs(lines))
    assert sorted(found) == ["o1", "o2"]
    assert (found["o1"]["start"], found["o1"]["end"], found["o1"]["ended"]) == (100.0, 103.4, "runner")
    assert (found["o2"]["start"], found["o2"]["end"]) == (103.0, 104.0)
    with pytest.raises(AssertionError, match="runs overlap"):
        ledger.check(found.values())
