"""The harness the lab's fault tests share (test_etcd_faults.py,
test_pg_faults.py): a ledger job on every job node, its timers, the ledger
read back from the journals, and one fault run with its checks.

Every job node's timer starts the ledger job (ledger_job.py) every PERIOD
with once_per PERIOD and a short lease: a run works WORK seconds, past its
first renewals, so there is nearly always a holder renewing while the other
nodes' grants are refused. A test injects one fault while a run holds the
lock, waits for runs while the fault lasts, repairs it, waits for the
backend to be whole and for more runs, and then the ledger of the whole
test must show: no two runs overlapping, no slot run twice, fencing tokens
strictly increasing in grant order, and no gap between runs longer than the
bound the test gives (the TTL plus the engine's failover time; each test
module says why its bound is what it is).
"""

import os
import time

import ledger
import pytest

JOB = "faults"
UNIT = "dlock-%s" % JOB  # the jobs role's dlock-NAME.service and .timer
LEDGER_SCRIPT = "/usr/local/lib/dlock-lab-ledger.py"
WORK = 4.5  # each run's work: past its first two renewals
PERIOD = 2.0  # the timer fires every 2s on every node
RANDOMIZED_DELAY = 0.3
ACCURACY = 0.1
# How late after its due time systemd may start a timer's service on a busy
# lab host: by boundary + RANDOMIZED_DELAY + ACCURACY + this, every node's
# timer has fired for its slot (ledger.slot_share).
TIMER_LATENESS = 0.5
# A runner's start-up (Python, the driver), its clock reading and its grant,
# before its job writes the first line: 0.2-0.6s on a quiet lab, more on a
# machine that runs other labs beside it.
RUNNER_START = 2.0
# What a run may end with here: the job ran, its runner lost the lease and
# killed it in time, or a runner did not get the lock (held, slot already
# run, or the backend could not answer: fail closed).
RESULTS = {"success", "lock_lost", "skipped_locked", "skipped_duplicate", "backend_error"}
RUNS_WHILE_LOST = 2  # successful runs that must start (and end) while the member is lost


def job_spec(ttl, **settings):
    """The ledger job for dlock_jobs_list: every PERIOD on every node, once
    per PERIOD, a lease of TTL seconds; SETTINGS (renew_every, op_timeout,
    kill_grace, max_clock_skew) are the backend's own."""
    spec = {
        "name": JOB, "command": ["/usr/bin/python3", LEDGER_SCRIPT], "schedule": "*:*:0/%d" % PERIOD,
        "randomized_delay": "%gs" % RANDOMIZED_DELAY, "accuracy": "%gs" % ACCURACY, "once_per": "%gs" % PERIOD,
        "ttl": "%gs" % ttl, "environment": {"LEDGER_WORK_SECONDS": "%g" % WORK},
    }
    spec.update(settings)
    return spec


def install_ledger_job(lab):
    """ledger_job.py onto every job node (the job's command runs it)."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ledger_job.py")) as handle:
        script = handle.read()
    for node in lab.group("dlock_nodes"):
        lab.ssh(node, "install -m 0644 /dev/stdin %s" % LEDGER_SCRIPT, check=True, input=script)


class LedgerFleet(object):
    """The lab's backend members and job nodes, and the jobs' controls. A
    backend's subclass says when its cluster is whole (wait_whole)."""

    def __init__(self, lab):
        self.lab = lab
        self.members = lab.group("dlock_backend")
        self.nodes = lab.group("dlock_nodes")
        self.slots = []  # (fault, slots that ran, slots that could) of each run_fault outside its window

    def wait_whole(self, via, timeout=90):
        """Until every member serves again; returns the one that leads."""
        raise NotImplementedError

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
            # Every second: each read is a journalctl on every job node, and a run
            # lasts WORK seconds, so a finer poll sees nothing sooner.
            time.sleep(1.0)

    def results(self, since):
        """{result: (count, the last error)} of every runner on every node since SINCE."""
        return ledger.results(ledger.journal(self.lab, UNIT + ".service", since))


def run_fault(fleet, capsys, name, inject, repair, bound):
    """Jobs running; when a run holds the lock, inject the fault (it names
    the member it takes out in fault["member"] and the time in fault["at"]
    before it acts); wait for RUNS_WHILE_LOST successful runs that started
    after it took effect; repair; wait for the cluster to be whole again
    and for more runs; then check the ledger, with no gap over BOUND
    seconds, and return its gaps (ledger.check's). The slots outside the
    fault's window (from its injection until the cluster is whole again)
    that could run and did are added to fleet.slots
    (test_slots_outside_the_faults_ran checks their share)."""
    fault = {}
    since = fleet.start_jobs()
    timers_on = time.time()  # every node's timer runs: the slots from here on are counted
    try:
        fleet.wait_runs(since, 2, "%s: before the fault" % name, timeout=60, running=True)
        inject(fault)
        fleet.wait_runs(time.time(), RUNS_WHILE_LOST, "%s: while %s is lost" % (name, fault["member"]),
                        timeout=RUNS_WHILE_LOST * (bound + WORK) + 10)
        repair(fault["member"])
        fault["repaired"] = True
        repaired_at = time.time()
        fleet.wait_whole(fleet.members[0])
        whole_at = time.time()
        fleet.wait_runs(repaired_at, 2, "%s: after the repair" % name, timeout=2 * (bound + WORK) + 10)
    finally:
        if "member" in fault and "repaired" not in fault:
            repair(fault["member"])
        stopped_at = time.time()
        fleet.stop_jobs()
    lines = ledger.journal(fleet.lab, UNIT + ".service", since)
    granted, tried = ledger.runs(lines), ledger.attempts(lines)
    gaps = ledger.check(granted)
    results = ledger.results(lines)
    assert set(results) <= RESULTS, results
    longest = max(gaps, key=lambda g: g[0])
    first = next((g for g in gaps if g[2]["start"] >= fault["at"]), None)  # into the first run after the fault
    firing = RANDOMIZED_DELAY + ACCURACY + TIMER_LATENESS
    during = ledger.slot_share(granted, tried, PERIOD, fault["at"], whole_at, firing)
    before, after = (ledger.slot_share(granted, tried, PERIOD, timers_on, fault["at"], firing),
                     ledger.slot_share(granted, tried, PERIOD, whole_at, stopped_at, firing))
    outside = tuple(part_before + part_after for part_before, part_after in zip(before, after))
    fleet.slots.append((name, len(outside[0]), len(outside[1]), len(outside[2])))
    with capsys.disabled():  # shown in every run, for the report
        print("\n%s: %d runs (%d lock_lost), longest gap %.2fs (bound %.2fs), gap into the first run "
              "after the fault %s, slots that could run and ran: %s during the fault (%.1fs), %s outside it "
              "(%d more lost to runners too slow for them), results %s, gaps over 1s: %s"
              % (name, len(granted), sum(r["result"] == "lock_lost" for r in granted), longest[0], bound,
                 "%.2fs" % first[0] if first else "-", share(*map(len, during[:2])), whole_at - fault["at"],
                 share(*map(len, outside[:2])), len(outside[2]),
                 dict((r, n) for r, (n, _e) in sorted(results.items())),
                 " ".join("%.2f" % g[0] for g in gaps if g[0] > 1.0) or "none"))
        for result in ("lock_lost", "backend_error"):  # why the last of each ended so
            if result in results:
                print("  last %s: %s" % (result, results[result][1]))
        missed = [(slot, "could run") for slot in set(outside[1]) - set(outside[0])] + \
            [(slot, "runners too slow") for slot in outside[2]]
        for slot, why in sorted(missed):  # what each node's timer did in it
            print("  slot %s outside the fault did not run (%s); its attempts: %s" % (
                time.strftime("%H:%M:%S", time.gmtime(slot)), why, ", ".join(
                    "%s fired +%.2fs logged +%.2fs %s" % (a["host"], a["fired"] - slot, a["logged"] - slot,
                                                          a["result"])
                    for a in tried if slot <= a["fired"] < slot + PERIOD) or "none"))
    assert longest[0] <= bound, \
        "a gap of %.2fs between %r and %r is over %.2fs" % (longest[0], longest[1], longest[2], bound)
    return gaps


def share(ran, could):
    """'R of C (P%)': RAN slots of the COULD that could run."""
    return "%d of %d (%s)" % (ran, could, "%.0f%%" % (100.0 * ran / could) if could else "-")


# Issue 24: across a module's fault tests, the share of the slots outside
# the faults' windows that could run (the lock free when their timers
# fired, and their runners fast enough to ask in them: ledger.slot_share)
# and ran.
MIN_SLOT_SHARE = 0.9


def check_slot_share(fleet, capsys):
    """The share over every run_fault of FLEET (a module's fault tests): at
    least MIN_SLOT_SHARE. Skipped when none of them ran (a -k selection)."""
    if not fleet.slots:
        pytest.skip("no fault test of this module ran")
    ran, could, late = (sum(s[part] for s in fleet.slots) for part in (1, 2, 3))
    with capsys.disabled():
        print("\nslots outside the faults' windows that could run and ran: %s; %s; %d more lost to runners that "
              "asked after the slot had closed (this host's load, not the backend)"
              % (share(ran, could), ", ".join("%s %s" % (s[0], share(s[1], s[2])) for s in fleet.slots), late))
    assert could and ran >= MIN_SLOT_SHARE * could, \
        "only %s of the slots outside the faults ran (at least %.0f%%)" % (share(ran, could), 100 * MIN_SLOT_SHARE)
