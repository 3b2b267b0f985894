"""Faults of a PostgreSQL lock backend with Patroni on a real fleet (issue 13).

site.yml with dlock_backend_type postgresql and dlock_postgresql_ha makes a
Patroni cluster (PostgreSQL 15, quorum commit: any one of the two standbys
acknowledges, synchronous_mode_strict) on three backend
nodes, with its store (an etcd cluster) on the same nodes, and points the
job nodes at all its members (target_session_attrs=read-write). The ledger job runs as in the
etcd fault tests (faults.py), while:

- the primary's node crashes (PostgreSQL, Patroni and that etcd member
  killed at once), then boots and rejoins;
- the primary is partitioned from the other members and the nodes, then
  healed (it must stop granting: its synchronous standby is out of reach);
- three leader changes in a row, switchover, switchover, failover, each
  while a run holds the lock;
- one standby's PostgreSQL paused (SIGSTOP) for 30 s: the other standby
  acknowledges, and no grant fails (issue 24);
- both standbys stop: no synchronous standby, so no grant may count (strict
  mode: a commit waits for a standby that is not there, the engine cancels
  it at op_timeout and reports the backend error); grants resume when one
  standby is back.

In every test: no two runs overlap, no slot runs twice, fencing tokens
strictly increase in grant order across every leader change, and no gap is
longer than the TTL plus Patroni's failover time (gap_bound says why).

Runs on conftest's patroni_lab, a lab of its own, with one site.yml
rollout: the molecule/postgresql-ha scenario's, whose idempotence (at -vvv
--diff) and verify set are checked on it before the faults.
"""

import json
import math
import time

import faults
import ledger
import pytest
import scenario
from lab import FAULT_DROPIN
from rollout import jobs

pytestmark = pytest.mark.lab

TTL = 6.0
# As for etcd: renewed every 1.5s, a call may take 3s (libpq tries the
# members in turn; one that does not answer costs its connect timeout), the
# job is killed 0.5s after its SIGTERM. PostgreSQL counts the lease on its
# wall clock, so the rule also keeps 2 x max_clock_skew (a step of the
# server's clock within the skew the check allows): 1.5 + 3 + 0.5 + 0.12
# (clock margin) + 2 x 0.4 = 5.92 < 6. The lab's nodes share the host's clock.
JOB_SPEC = faults.job_spec(TTL, renew_every="1.5s", op_timeout="3s", kill_grace="500ms", max_clock_skew="400ms")
PATRONI = "/etc/patroni/config.yml"
NO_RESTART = "/run/systemd/system/patroni.service.d/" + FAULT_DROPIN


def gap_bound(ttl, loop_wait):
    """The longest the fleet may go without a run across one leader change.

    The run in flight may end without releasing (its runner lost the lease
    or could not reach a primary): its lease row, synchronously committed,
    holds until TTL after its last renewal, counted on the new primary's
    clock. A failover takes Patroni up to its leader key's ttl (the old
    leader's key must expire) plus one loop (loop_wait) for a standby to
    notice and promote, plus a second or two to promote; a switchover is
    quicker. The fleet then needs a timer to fire and a runner to start and
    take the lock (RUNNER_START)."""
    return (math.ceil(TTL) + ttl + loop_wait + 2.0 + faults.PERIOD + faults.RANDOMIZED_DELAY + faults.ACCURACY
            + faults.RUNNER_START)


# A standby a commit may wait for: the role's quorum mode names both
# standbys Quorum Standby; Patroni's classic synchronous mode, Sync Standby.
SYNC_ROLES = ("Quorum Standby", "Sync Standby")


class PatroniFleet(faults.LedgerFleet):
    """The lab with the Patroni cluster's members and the jobs' controls."""

    def members_state(self, via=None):
        """{member: (role, state)} as patronictl lists them (read from etcd)."""
        for member in [via] if via else self.members:
            done = self.lab.ssh(member, "patronictl -c %s list -f json" % PATRONI, timeout=30)
            if done.returncode == 0:
                return dict((row["Member"], (row["Role"], row["State"])) for row in json.loads(done.stdout or "[]"))
        return {}

    def wait_whole(self, via=None, timeout=120):
        """Until every member runs, one leads and one is its synchronous
        standby; returns the leader."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.members_state(via)
            leaders = [m for m, (role, run) in state.items() if role == "Leader" and run == "running"]
            sync = [m for m, (role, run) in state.items() if role in SYNC_ROLES and run in ("running", "streaming")]
            up = [m for m, (role, run) in state.items() if run in ("running", "streaming")]
            if len(leaders) == 1 and sync and len(up) == len(self.members):
                return leaders[0]
            assert time.monotonic() < deadline, "the Patroni cluster is not whole after %ds: %r" % (timeout, state)
            time.sleep(0.5)

    def roles(self):
        """(leader, [sync standbys], [other replicas]) of a whole cluster."""
        leader = self.wait_whole()
        state = self.members_state()
        return (leader, [m for m, (role, _run) in state.items() if role in SYNC_ROLES],
                [m for m, (role, _run) in state.items() if role == "Replica"])

    def patronictl(self, command):
        self.lab.ssh(self.members[0], "patronictl -c %s %s" % (PATRONI, command), check=True, timeout=120)

    def dcs_setting(self, name):
        """A cluster-wide Patroni setting, as the leader stores it in etcd."""
        done = self.lab.ssh(self.members[0], "patronictl -c %s show-config" % PATRONI, check=True)
        for line in done.stdout.splitlines():
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
        raise AssertionError("%s is not in Patroni's settings: %s" % (name, done.stdout))


# This lab's one Patroni rollout is the postgresql-ha scenario's (scenario.py):
# its idempotence and verify set are checked first; the ledger job then comes
# with the jobs role alone (seconds), and the faults.
SCENARIO = "postgresql-ha"


@pytest.fixture(scope="module")
def converged(patroni_lab):
    done = scenario.converge(patroni_lab, SCENARIO)
    assert "failed=0" in done.stdout
    return patroni_lab


@pytest.fixture(scope="module")
def fleet(converged):
    faults.install_ledger_job(converged)
    jobs(converged, [JOB_SPEC])
    patroni = PatroniFleet(converged)
    patroni.stop_jobs()  # the jobs role started the timers: each test starts them itself
    assert patroni.dcs_setting("synchronous_mode_strict") == "true"
    return patroni


def test_the_scenario_changes_nothing_again_and_passes_its_verify_set(converged, capsys):
    scenario.idempotent_and_verified(converged, SCENARIO, capsys)


def bound(fleet):
    return gap_bound(int(fleet.dcs_setting("ttl")), int(fleet.dcs_setting("loop_wait")))


def test_primary_crashed(fleet, capsys):
    """The primary's node killed at once (PostgreSQL, Patroni, its etcd
    member), kept down until the fleet ran on the new primary, then booted:
    it rejoins as a standby."""
    def inject(fault):
        fault["member"] = fleet.wait_whole()
        fault["at"] = time.time()
        fleet.lab.crash(fault["member"])
    faults.run_fault(fleet, capsys, "patroni: primary crashed", inject, fleet.lab.start, bound(fleet))


def test_primary_partitioned(fleet, capsys):
    """The primary's link cut from the other members and the nodes (its
    Patroni loses etcd and demotes it; a standby is promoted), then healed."""
    def inject(fault):
        fault["member"] = fleet.wait_whole()
        fault["at"] = time.time()
        fleet.lab.partition(fault["member"])
    faults.run_fault(fleet, capsys, "patroni: primary partitioned", inject, fleet.lab.heal, bound(fleet))


def test_three_leader_changes_in_a_row(fleet, capsys):
    """Switchover, switchover, failover, each while a run holds the lock
    and each as soon as the cluster is whole again after the last. Prints
    the longest gap across each change (from its command until the cluster
    is whole again): issue 24's 5 s for a switchover is a measurement here,
    not an assertion. A switchover under load can outlast this lab's 6 s
    lease (renewed every 1.5 s, killed 1.3 s before its end), and a holder
    that loses its lease holds the fleet up until the lease ends (CI: 5.88 s
    once, with the runner's lock_lost; 0.6-1.7 s on a quiet host)."""
    changes = []  # (kind, its command's start, the cluster whole again)

    def inject(fault):
        for step, kind in enumerate(("switchover", "switchover", "failover")):
            leader, sync, _others = fleet.roles()
            fault.setdefault("member", leader)
            fault.setdefault("at", time.time())
            if step:
                fleet.wait_runs(time.time(), 1, "before the %s" % kind, timeout=60, running=True)
            began = time.time()
            if kind == "switchover":
                fleet.patronictl("switchover --leader %s --candidate %s --force" % (leader, sync[0]))
            else:
                fleet.patronictl("failover --candidate %s --force" % sync[0])
            deadline = time.monotonic() + 120
            while fleet.wait_whole() == leader:
                assert time.monotonic() < deadline, "the %s left %s leading" % (kind, leader)
                time.sleep(0.5)
            changes.append((kind, began, time.time()))
    gaps = faults.run_fault(fleet, capsys, "patroni: switchover, switchover, failover", inject, lambda member: None,
                            bound(fleet))
    with capsys.disabled():
        print("longest gap across each leader change: %s" % ", ".join(
            "%s %.2fs" % (kind, ledger.longest_gap_across(gaps, began, whole)) for kind, began, whole in changes))
    assert [kind for kind, _began, _whole in changes] == ["switchover", "switchover", "failover"]


# How long the paused standby stays paused (issue 24's target: 30 s).
PAUSED_FOR = 30.0
# A member's PostgreSQL processes by their command lines: the postmaster
# (Debian's binary) and its children ("postgres: ..."), not Patroni.
POSTGRES = r"^(/usr/lib/postgresql/\S+/bin/postgres |postgres: )"


def test_a_paused_standby_stops_no_grant(fleet, capsys):
    """Issue 24: one standby's PostgreSQL SIGSTOPped for PAUSED_FOR seconds
    (its Patroni still runs and calls it a member, as when its disk hangs).
    With a quorum of two standbys the other acknowledges every commit: no
    grant, renewal or release fails, and no run loses its lease."""
    pause = {}

    def inject(fault):
        _leader, standbys, _others = fleet.roles()
        fault["member"] = standbys[0]
        fault["at"] = pause["at"] = time.time()
        fleet.lab.pause(standbys[0], POSTGRES)

    def repair(member):
        # The fault's length, not a wait for something to happen: the runs
        # that must go on meanwhile are what run_fault waited for.
        time.sleep(max(0.0, pause["at"] + PAUSED_FOR - time.time()))
        fleet.lab.resume(member, POSTGRES)
        pause["ended"] = time.time()
    faults.run_fault(fleet, capsys, "patroni: a standby paused %gs" % PAUSED_FOR, inject, repair, bound(fleet))
    results = fleet.results(pause["at"])
    assert "backend_error" not in results and "lock_lost" not in results, results
    assert pause["ended"] - pause["at"] >= PAUSED_FOR


def test_no_grant_without_a_synchronous_standby(fleet, capsys):
    """Both standbys stopped: strict synchronous mode leaves no standby to
    confirm a commit, so no grant may count, and the fleet must not run the
    job at all; one standby back, and grants resume."""
    leader = fleet.wait_whole()
    standbys = [m for m in fleet.members if m != leader]
    since = fleet.start_jobs()
    try:
        fleet.wait_runs(since, 2, "before the standbys stop", timeout=60, running=True)
        for member in standbys:
            fleet.lab.ssh(member, "systemctl stop patroni", check=True, timeout=120)
        stopped = time.time()
        # A run that holds the lock now cannot renew (a renewal is a commit):
        # its runner kills it before its lease ends. Then nothing may start.
        quiet_from = stopped + TTL + faults.RUNNER_START
        # Absence is watched over a window (4 TTLs): the ledger is read every
        # second and must show no run that started in it.
        deadline = time.monotonic() + 4 * TTL
        while time.monotonic() < deadline:
            runs = fleet.runs(since)
            started = [r for r in runs if r["start"] >= quiet_from]
            assert not started, "runs started with no synchronous standby: %r" % started
            time.sleep(1.0)
        errors = fleet.results(stopped).get("backend_error", (0, None))
        assert errors[0] > 0, "no runner reported the backend error: %r" % fleet.results(stopped)
        fleet.lab.ssh(standbys[0], "systemctl start patroni", check=True, timeout=120)
        back = time.time()
        fleet.wait_runs(back, 2, "after a standby is back", timeout=120)
    finally:
        for member in standbys:
            fleet.lab.ssh(member, "systemctl start patroni", timeout=120)
        fleet.stop_jobs()
    fleet.wait_whole()
    granted = fleet.runs(since)
    ledger.check(granted)  # and through it all: no overlap, no slot twice, fences in order
    results = fleet.results(since)
    assert set(results) <= faults.RESULTS, results
    with capsys.disabled():
        print("\npatroni: no synchronous standby for %.0fs: %d runs, none started in between; results %s"
              % (back - stopped, len(granted), dict((r, n) for r, (n, _e) in sorted(results.items()))))


def test_slots_outside_the_faults_ran(fleet, capsys):
    """Issue 24: across this module's fault tests, at least 90% of the slots
    outside the faults' windows that could run (no granted run held the lock
    when their timers fired, and a runner asked in time: ledger.slot_share)
    ran (faults.check_slot_share)."""
    faults.check_slot_share(fleet, capsys)
