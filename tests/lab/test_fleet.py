"""The point of the collection, on a real fleet: site.yml provisions the
backend (Redis, then PostgreSQL) and 3 nodes carry the same timer with a
randomized delay; over 12+ slots every slot ran exactly once, no two runs
overlapped, and fencing tokens strictly increase. Plus the roles' bad input:
refused in preflight, nothing written on any node.

Each backend's rollout is its molecule scenario's (molecule/redis,
molecule/postgresql: their variables and jobs, scenario.py), rolled out
once: a -vvv --diff run then changes nothing, and the scenario's verify set
runs against it; no molecule session converges the same fleet again."""

import calendar
import json
import os
import re
import time

import pytest
import scenario
from rollout import (ansible_playbook, check_operator_commands, clock_inventory, jobs, node_config, operator_commands,
                     read_password, site, writes_nothing)

pytestmark = pytest.mark.lab

# A run takes the slot whose window holds its grant (slots.slot_number): the
# window opens max_clock_skew before the boundary, so the timer's randomized
# delay and the runner's start have the rest of the slot. 10 s slots, a 2 s
# delay, 0.1 s of accuracy and a 0.5 s skew (early and late) leave a runner
# 6.9 s to start (a CI run under load once took 2.1 s).
# The fleet ledger's slots, and how many of them it must hold. The suite's:
# 10 s slots, at least 12 (more when the idempotence run they run through
# takes longer), with room for a runner that starts slowly on a loaded
# machine (3 s slots missed one there: three runners took 1.9 s to start).
# Issue 23's acceptance, a 3-node run of 100 slots matched one to one
# against the fleet-wide history, is the same test with
# DLOCK_LAB_LEDGER_SLOT=3 DLOCK_LAB_LEDGER_SLOTS=100 (docs/testing.md).
SLOT = int(os.environ.get("DLOCK_LAB_LEDGER_SLOT", "10"))  # seconds
SLOTS = int(os.environ.get("DLOCK_LAB_LEDGER_SLOTS", "12"))
RANDOMIZED_DELAY = 1 if SLOT < 5 else 2  # seconds: several nodes win slots, each well inside its window


# The tests below come in the order of the backend they need (Redis first,
# then PostgreSQL): `provisioned` rolls out site.yml (over a minute) only when
# the backend type changes, so this order costs two rollouts, not four.
@pytest.fixture(scope="module")
def provisioned(lab):
    """The molecule scenario of that backend type converged on this lab
    (scenario.converged: again only when the lab's last rollout was another);
    returns what the nodes use: the backend URL, its password and their
    fence epoch (the runner's preflight refuses a lower one)."""
    def converged(backend_type):
        scenario.converged(lab, backend_type)
        config = node_config(lab)
        return {"url": config["backend"], "password": read_password(lab), "fence_epoch": config.get("fence_epoch", 0)}
    return converged


LEDGER_JOB = {
    "name": "fleet-ledger", "command": ["/usr/bin/python3", "/usr/local/lib/dlock-lab-ledger.py"], "schedule": "*:*:0/%d" % SLOT,
    "randomized_delay": "%ds" % RANDOMIZED_DELAY, "accuracy": "100ms", "once_per": "%ds" % SLOT, "ttl": "6s",
    # Its slots run while a scenario's idempotence run and verify set load the
    # nodes and the backend: ttl/10 (0.4 s of a 4 s ttl) for a request, a TLS connection to
    # PostgreSQL included, left a run with backend_error (a skip, not a second
    # run). 1 s, and a ttl that keeps the safety rule with it (5.3 s < 6 s).
    "op_timeout": "1s", "max_clock_skew": "500ms",
    # Every slot of the window in the fleet-wide history, to match it against the ledger.
    "history": 1000,
}


@pytest.fixture(scope="module")
def slot_ledger(lab):
    """The fleet-ledger job (ledger_job.py on every job node, a slot every
    SLOT seconds): {"since": when it started} once started. A scenario's test
    starts it before its idempotence run, so that its slots run while that
    run loads the nodes, in time the suite spends anyway; the ledger test
    right after it ends it and reads it, before the verify set, which
    restarts the backend (a run then would fail, rightly) and counts its
    keys. Removed at the module's end if a test left it running."""
    started = {}
    yield started
    if started:
        jobs(lab, [{"name": LEDGER_JOB["name"], "state": "absent"}])


def start_ledger(lab, started):
    for node in lab.group("dlock_nodes"):
        lab.ssh(node, "install -m 0644 /dev/stdin /usr/local/lib/dlock-lab-ledger.py", check=True,
                input=open(__file__.replace("test_fleet.py", "ledger_job.py")).read())
    started["since"] = int(time.time())
    jobs(lab, [LEDGER_JOB])  # site.yml rolled out this backend before; a job is then the jobs role alone


@pytest.fixture(scope="module")
def backend(provisioned):
    """A working backend given as a plain dlock_backend (the operator's own)."""
    return provisioned("redis")


def snapshot(lab):
    """What the roles manage on every node: paths with checksums."""
    listing = {}
    for node in lab.group("dlock_nodes"):
        out = lab.ssh(node, "find /etc/dlock /etc/systemd/system /usr/local/bin/dlock -name '*dlock*' "
                            "-type f -exec md5sum {} + 2>/dev/null | sort", check=False)
        listing[node] = out.stdout
    return listing


def test_redis_scenario_changes_nothing_again(lab, provisioned, slot_ledger):
    provisioned("redis")
    start_ledger(lab, slot_ledger)  # its slots run through the idempotence run (slot_ledger)
    scenario.changes_nothing_again(lab, "redis")


@pytest.mark.slow
def test_every_redis_slot_runs_exactly_once_across_the_fleet(lab, provisioned, slot_ledger):
    provisioned("redis")
    every_slot_ran_exactly_once(lab, slot_ledger, SLOTS)


def test_redis_scenario_passes_its_verify_set(lab, provisioned, capsys):
    provisioned("redis")
    scenario.passes_its_verify_set(lab, "redis", capsys)


def operators_first_commands(lab, backend_type):
    """Right after the scenario's site.yml, with the inventories it was given
    and no dlock_backend written by hand: a module task, the status and
    break_lock runbooks and examples/adhoc.sh reach the backend through
    site.yml's record (rollout.operator_commands)."""
    outputs = operator_commands(lab, clock_inventory(lab), scenario.inventory(lab, backend_type))
    check_operator_commands(outputs, read_password(lab))


def test_the_operators_first_commands_find_the_redis_site_yml_provisioned(lab, provisioned):
    provisioned("redis")
    operators_first_commands(lab, "redis")


PAUSE_PLAY = """
- hosts: dlock_nodes
  gather_facts: false
  tasks:
    - name: Pause or resume the sample job on every node
      dlock.fleet.dlock_pause:
        key: sample
        state: "{{ pause_state }}"
        reason: "{{ 'lab: pause acceptance' if pause_state == 'paused' else omit }}"
        until: "{{ '10m' if pause_state == 'paused' else omit }}"
      when: pause_state != 'run-now'
    - name: Run the sample job now, once, on one of the nodes
      dlock.fleet.dlock_run_now:
        job: sample
        reason: "lab: run-now acceptance"
      when: pause_state == 'run-now'
"""
PAUSE_MIRROR = "/var/lib/dlock/pauses/job:sample.pause"


def pause_on_the_nodes(lab, state):
    """dlock.fleet.dlock_pause on the job nodes, as an operator runs it right
    after site.yml: the backend from site.yml's record. Its output."""
    playbook = os.path.join(lab.state_dir, "pause.yml")
    with open(playbook, "w") as handle:
        handle.write(PAUSE_PLAY)
    done = ansible_playbook(lab, playbook, {"pause_state": state}, "-i", clock_inventory(lab),
                            "-i", scenario.inventory(lab, "redis"))
    return done.stdout


def sample_runs(lab):
    """{node: the runner's log line} of one run of the sample job started by hand on each job node."""
    records = {}
    for node in lab.group("dlock_nodes"):
        since = time.time() - 1
        lab.ssh(node, "systemctl start dlock-sample.service", check=True)  # returns when the run has ended
        records[node] = run_records(lab, node, "sample", since)[-1]
    return records


def run_without_mirror(lab, node):
    """The log line of a run of the sample job on NODE that reads no mirror:
    what the backend alone says."""
    done = lab.ssh(node, "dlock run --job sample --pauses-dir /run/dlock-no-mirror")
    return json.loads([line for line in done.stderr.splitlines() if line.startswith("{")][-1])


def test_a_pause_made_on_the_nodes_outlives_the_backend_losing_it(lab, provisioned):
    """Issue 23's acceptance on the Redis fleet: dlock_pause on every job
    node pauses the sample job once and mirrors it on each; every node's run
    is refused, and the backend refuses it too. The backend then loses the
    pause (its key deleted, as a restore from a backup older than the pause
    would): the backend alone would grant, yet every node still refuses,
    from its mirror, and exports the loss. The module's resume ends it
    everywhere, and the job runs again."""
    provisioned("redis")
    nodes = lab.group("dlock_nodes")
    out = pause_on_the_nodes(lab, "paused")
    assert re.findall(r"changed=(\d+)", out) == ["1"] * len(nodes), out[-3000:]
    mirrors = set(lab.ssh(node, "cat " + PAUSE_MIRROR, check=True).stdout for node in nodes)
    assert len(mirrors) == 1 and json.loads(mirrors.pop())["reason"] == "lab: pause acceptance"
    for node, record in sample_runs(lab).items():
        assert (record["result"], record["pause_source"]) == ("skipped_paused", "node"), (node, record)
    record = run_without_mirror(lab, nodes[0])
    assert (record["result"], record["pause_source"]) == ("skipped_paused", "backend"), record

    backend_node = lab.group("dlock_backend")[0]
    admin = open(os.path.join(scenario.ephemeral_directory(lab, "redis"), "redis-admin.password")).read().split(
        " salt=")[0].strip()
    deleted = lab.ssh(backend_node, 'REDISCLI_AUTH="$(cat)" redis-cli --no-auth-warning --user dlock-admin '
                                    "DEL 'dlock:{sample}:pause'", check=True, input=admin)
    assert deleted.stdout.strip() == "1", deleted.stdout
    assert run_without_mirror(lab, nodes[0])["result"] != "skipped_paused"
    for node, record in sample_runs(lab).items():
        assert (record["result"], record["pause_source"]) == ("skipped_paused", "node"), (node, record)
        metrics = lab.ssh(node, "dlock metrics --output -", check=True).stdout
        assert re.search(r'^dlock_pause_mirror_only\{job="sample",key="sample"\} 1$', metrics, re.M), metrics

    out = pause_on_the_nodes(lab, "resumed")
    assert re.findall(r"changed=(\d+)", out) == ["1"] * len(nodes), out[-3000:]
    for node, record in sample_runs(lab).items():
        assert record["result"] in ("success", "skipped_duplicate", "skipped_locked"), (node, record)
        assert lab.ssh(node, "test -e " + PAUSE_MIRROR).returncode == 1, node

    # dlock_run_now on every node at once: the job runs on one of them (changed), the others skip.
    out = pause_on_the_nodes(lab, "run-now")
    assert sorted(re.findall(r"changed=(\d+)", out)) == ["0"] * (len(nodes) - 1) + ["1"], out[-3000:]
    assert "failed=0" in out and "failed=1" not in out, out[-3000:]

    # The fleet-wide history, read on another node than the one that ran:
    # the run-now's run, once, with the name of the node that ran it; each
    # paused slot once, whichever nodes were refused (from their mirrors).
    ran_on = [host for host, changed in re.findall(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)", out, re.M)
              if changed == "1"]
    reader = next(node for node in nodes if node not in ran_on)
    entries = json.loads(lab.ssh(reader, "dlock history sample -n 100 --json", check=True).stdout)
    manual = [entry for entry in entries if entry.get("manual_id")]
    assert len(manual) == 1 and manual[0]["result"] == "success", manual
    assert manual[0]["host"] == lab.ssh(ran_on[0], "hostname", check=True).stdout.strip(), (manual, ran_on)
    paused = [entry["slot"] for entry in entries if entry["result"] == "skipped_paused"]
    assert paused and len(paused) == len(set(paused)), entries


# site.yml on a backend of the operator's own (dlock_backend, no provisioning):
# a schedule only systemd-analyze on the node can judge, and an entry the
# dlock_jobs filter refuses on the controller. Each of the filter's refusals
# is named by its unit tests (tests/unit/plugins/filter/test_dlock_jobs_filter.py)
# and takes the same path as this one; the next test shows one more, with the
# backend provisioned, stopping every host.
BAD_JOBS = [
    ("malformed schedule", [{"name": "bad-sched", "command": ["true"], "schedule": "every tuesday-ish"}],
     "is not a valid systemd OnCalendar expression"),
    ("string command without shell", [{"name": "str-cmd", "command": "rm -rf /tmp/x", "schedule": "hourly"}],
     "set shell: true"),
]


@pytest.mark.parametrize("name,jobs,message", BAD_JOBS, ids=[c[0] for c in BAD_JOBS])
def test_bad_jobs_fail_preflight_and_write_nothing(lab, backend, name, jobs, message):
    before = snapshot(lab)
    done = ansible_playbook(lab, "playbooks/site.yml", {"dlock_backend": backend, "dlock_jobs_list": jobs}, check=False)
    assert done.returncode != 0
    assert message in done.stdout, done.stdout[-3000:]
    assert snapshot(lab) == before


def test_a_typo_in_one_job_stops_site_yml_before_any_host_changes(lab, provisioned):
    """site.yml's first play runs every role's checks on every host: one bad
    job entry stops the rollout, naming the entry and the job, before the
    backend (whose settings changed in the same run) or any node changes."""
    provisioned("redis")
    entries = [{"name": "fine", "command": ["true"], "schedule": "hourly"},
               {"name": "typo", "command": ["true"], "schedule": "hourly", "ttl": "10s", "renew_every": "9s"}]
    with writes_nothing(lab):
        done = site(lab, "redis", {"dlock_jobs_list": entries, "dlock_redis_maxmemory": "96mb"},
                    "-i", scenario.inventory(lab, "redis"), check=False)
    assert done.returncode != 0
    assert "dlock_jobs_list[1] (typo): renew_every (9s)" in done.stdout, done.stdout[-3000:]
    recap = dict(re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", done.stdout, re.M))
    hosts = lab.group("dlock_nodes") + lab.group("dlock_backend")
    assert sorted(recap) == sorted(hosts) and set(recap.values()) == {"0"}, done.stdout[-3000:]
    assert "PLAY [Provision the lock backend]" not in done.stdout, done.stdout[-3000:]


def test_missing_backend_fails_preflight_and_writes_nothing(lab):
    before = snapshot(lab)
    done = ansible_playbook(lab, "playbooks/site.yml",
                            {"dlock_jobs_list": [{"name": "ok", "command": ["true"], "schedule": "hourly"}]}, check=False)
    assert done.returncode != 0 and "no backend" in done.stdout
    assert snapshot(lab) == before


METRICS_PLAY = """
- hosts: dlock_nodes
  become: true
  roles:
    - dlock.fleet.dlock_metrics
"""
LOCK_STATE = "/var/lib/prometheus/node-exporter/dlock-lock-state.prom"
REFRESH_UNITS = "/etc/systemd/system/prometheus-node-exporter-dlock.timer /etc/systemd/system/prometheus-node-exporter-dlock.service"


def test_metrics_refresh_off_takes_its_units_and_last_state_away(lab, provisioned):
    provisioned("redis")  # site.yml with the metrics role: the refresh timer has written the lock state
    nodes = lab.group("dlock_nodes")
    playbook = os.path.join(lab.state_dir, "metrics.yml")
    with open(playbook, "w") as handle:
        handle.write(METRICS_PLAY)
    try:
        for node in nodes:
            assert lab.ssh(node, "test -s %s" % LOCK_STATE).returncode == 0
        first = ansible_playbook(lab, playbook, {"dlock_metrics_refresh": False})
        again = ansible_playbook(lab, playbook, {"dlock_metrics_refresh": False})
        assert re.search(r"changed=[1-9]", first.stdout)
        assert re.findall(r"changed=(\d+)", again.stdout) == ["0"] * len(nodes), again.stdout[-2000:]
        for node in nodes:
            gone = lab.ssh(node, "ls %s %s; systemctl is-active prometheus-node-exporter-dlock.timer"
                           % (LOCK_STATE, REFRESH_UNITS))
            assert "No such file" in gone.stderr and gone.stdout.strip() == "inactive", gone
            assert gone.stderr.count("No such file") == 3, gone.stderr
    finally:
        # Back on, at the scenario's interval (the play's inventory has none of
        # its group_vars): the refresh writes the state again.
        interval = scenario.group_vars("redis")["dlock_nodes"]["dlock_metrics_refresh_interval"]
        ansible_playbook(lab, playbook, {"dlock_metrics_refresh_interval": interval})
    for node in nodes:
        assert lab.ssh(node, "test -s %s" % LOCK_STATE).returncode == 0


CONTAIN_DIR = "/var/lib/dlock-lab-contain"
CONTAIN_LEDGER = CONTAIN_DIR + "/ledger"
BEAT = "/usr/bin/python3 /usr/local/lib/dlock-lab-jobfixture.py pidbeat " + CONTAIN_LEDGER
# The README's sh -c form, three writers: the foreground command, a
# background grandchild, and one that double-forks out of the job's session.
CONTAIN_SCRIPT = "{b} & (setsid {b} &); {b}".format(b=BEAT)


def _contain_ledger(lab, node):
    out = lab.ssh(node, "cat %s 2>/dev/null" % CONTAIN_LEDGER).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _alive(lab, node, pids):
    """The pids that still run on the node (a zombie runs nothing)."""
    out = lab.ssh(node, "for p in %s; do s=$(cut -d')' -f2 /proc/$p/stat 2>/dev/null | cut -d' ' -f2); "
                        "case $s in ''|Z|X) ;; *) echo $p;; esac; done" % " ".join(map(str, pids))).stdout
    return {int(p) for p in out.split()}


@pytest.fixture(scope="class")
def contain_job(lab, provisioned):
    """The containment job, rolled out once for both cases of the class below
    and removed after them (the jobs role, on the fleet site.yml rolled out
    with Redis): (node, unit)."""
    provisioned("redis")
    fixture = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "integration", "jobfixture.py")
    for each in lab.group("dlock_nodes"):  # the job (and its ReadWritePaths) goes to every node
        lab.ssh(each, "install -m 0644 /dev/stdin /usr/local/lib/dlock-lab-jobfixture.py && install -d -m 0755 %s"
                % CONTAIN_DIR, check=True, input=open(fixture).read())
    job = {"name": "contain", "command": ["/bin/sh", "-c", CONTAIN_SCRIPT], "schedule": "yearly",
           # A key of its own: a lease left by an earlier run of this test would refuse the first case.
           "key": "contain-%d" % (time.time() * 1000), "ttl": "30s", "read_write_paths": [CONTAIN_DIR]}
    jobs(lab, [job])
    try:
        yield lab.group("dlock_nodes")[0], "dlock-contain.service"
    finally:
        jobs(lab, [{"name": "contain", "state": "absent"}])
        for each in lab.group("dlock_nodes"):
            lab.ssh(each, "systemctl reset-failed dlock-contain.service; rm -rf %s" % CONTAIN_DIR)


class TestContainmentUnderAUnit(object):
    """Both cases share one rollout of the job."""

    @pytest.mark.parametrize("killed", ["runner", "runner and guard"])
    def test_a_killed_runner_leaves_nothing_of_its_job_under_its_unit(self, lab, contain_job, killed):
        """Containment under a dlock_jobs unit. SIGKILL of the runner (the unit's
        main process): the guard, and systemd as the unit stops, end the job's
        whole tree, setsid and double fork included. SIGKILL of the runner and
        its guard at once: nothing of ours is left to do it, and the unit's
        KillMode=control-group must (with KillMode=process all three writers
        ran on: checked)."""
        node, unit = contain_job
        try:
            lab.ssh(node, "rm -f %s; systemctl reset-failed %s; systemctl start --no-block %s" % (CONTAIN_LEDGER, unit, unit),
                    check=True)
            deadline = time.time() + 30
            while len({r["pid"] for r in _contain_ledger(lab, node)}) < 3:
                assert time.time() < deadline, lab.ssh(node, "systemctl status %s; journalctl -u %s -n 20 --no-pager"
                                                       % (unit, unit)).stdout
                time.sleep(0.2)
            pids = {r["pid"] for r in _contain_ledger(lab, node)}
            assert _alive(lab, node, pids) == pids
            runner = int(lab.ssh(node, "systemctl show -p MainPID --value %s" % unit, check=True).stdout)
            victims = [runner]
            if killed == "runner and guard":
                victims += [int(p) for p in lab.ssh(node, "pgrep -P %d" % runner, check=True).stdout.split()]
                assert len(victims) == 2, victims  # the runner's one child is the guard
            lab.ssh(node, "kill -KILL %s" % " ".join(map(str, victims)), check=True)
            deadline = time.time() + 15
            while _alive(lab, node, pids):
                assert time.time() < deadline, "still running after %s was SIGKILLed: %s" % (killed, _alive(lab, node, pids))
                time.sleep(0.2)
            gone_at = time.time()
            settled = _contain_ledger(lab, node)
            # Not a synchronisation: a window of 15 beats of a 20 ms writer, in
            # which a writer the pid check missed would have added lines.
            time.sleep(0.3)
            assert _contain_ledger(lab, node) == settled
            assert {r["pid"] for r in settled} == pids
            assert max(r["t"] for r in settled) < gone_at
            assert lab.ssh(node, "systemctl is-active %s" % unit).stdout.strip() in ("failed", "inactive")
        finally:
            # The killed runner's lease lives on for its ttl: break it for the next case.
            lab.ssh(node, "dlock release --job contain --force --reason 'containment test'")


def ledger(lab, since):
    """Every node's LEDGER lines (ledger_job.py) from its journal since SINCE."""
    runs = []
    for node in lab.group("dlock_nodes"):
        log = lab.ssh(node, "journalctl -u dlock-fleet-ledger --since @%d -o cat --no-pager" % since,
                      check=True).stdout
        runs += [json.loads(line[len("LEDGER "):]) for line in log.splitlines() if line.startswith("LEDGER ")]
    return sorted(runs, key=lambda r: r["start"])


def runner_lines(lab, since, slot_starts):
    """The runners' log lines of these slots on every node (for a failure's message)."""
    wanted = ["fleet-ledger@" + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) for t in slot_starts]
    # Lines logged in the slot's first seconds too (a run that died before its log line).
    wanted += [time.strftime(" %H:%M:%S.", time.gmtime(t + d)) for t in slot_starts for d in (0, 1, 2)]
    found = []
    for node in lab.group("dlock_nodes"):
        log = lab.ssh(node, "journalctl -u dlock-fleet-ledger --since @%d -o short-precise --no-pager" % since,
                      check=False).stdout
        found += ["%s: %s" % (node, line) for line in log.splitlines() if any(w in line for w in wanted)]
    return "\n".join(found) or "(no runner line names them: the timers did not fire, or the runs died early)"


def every_slot_ran_exactly_once(lab, started, at_least):
    """The ledger (started by the scenario's test, else here) over `at_least` + 2
    slots at least (longer when the idempotence run took longer), then its
    job removed: every slot ran exactly once, on more than one node, no two
    runs overlapped and the fences grew."""
    if not started:
        start_ledger(lab, started)
    since = started["since"]
    try:
        time.sleep(max(0, since + SLOT * (at_least + 2) - time.time()))  # the window the runs are counted in
        # The job's first run comes after its rollout, which a loaded machine
        # makes slow: then wait on the ledger itself, a few slots at most.
        deadline = time.time() + 5 * SLOT
        while len(ledger(lab, since)) < at_least + 1 and time.time() < deadline:
            time.sleep(SLOT)
        read_at = time.time()
        history = json.loads(lab.ssh(lab.group("dlock_nodes")[-1], "dlock history %s -n 1000 --json"
                                     % LEDGER_JOB["name"], check=True).stdout)
    finally:
        jobs(lab, [{"name": LEDGER_JOB["name"], "state": "absent"}])
        started.clear()
    runs = ledger(lab, since)
    slots = [r["run_id"] for r in runs]
    assert len(runs) >= at_least, "only %d runs in %ds" % (len(runs), time.time() - since)
    assert len(set(slots)) == len(slots), "a slot ran twice: %s" % sorted(s for s in slots if slots.count(s) > 1)
    # Consecutive runs are consecutive slots: no slot was skipped.
    starts = [calendar.timegm(time.strptime(s.split("@")[1], "%Y-%m-%dT%H:%M:%SZ")) for s in slots]
    missing = sorted(set(range(int(starts[0]), int(starts[-1]), SLOT)) - set(starts))
    assert not missing, "no node ran these slots: %s\n%s" % (
        [time.strftime("%H:%M:%S", time.gmtime(m)) for m in missing], runner_lines(lab, since, missing))
    for before, after in zip(runs, runs[1:]):
        assert before["end"] <= after["start"], "runs overlapped: %r %r" % (before, after)
        assert after["fence"] > before["fence"]
    assert len({r["host"] for r in runs}) > 1, "one node won every slot: randomized delay not exercised"
    # The fleet-wide history, read on one node, says the same, run for run:
    # each run that had ended (and written its entry) before it was read is
    # there with its fence, slot and node, and it holds no run, and no
    # missed slot, that the ledger does not.
    recorded = dict((entry["fence"], (entry["run_id"], entry["host"])) for entry in history
                    if entry["result"] == "success" and entry.get("started_at", 0) >= since)
    ended = dict((run["fence"], (run["run_id"], run["host"])) for run in runs if run["end"] < read_at - 2)
    assert len(ended) >= at_least - 2 and all(recorded.get(fence) == ran for fence, ran in ended.items()), (ended, recorded)
    assert set(recorded) <= set(run["fence"] for run in runs), (recorded, runs)
    assert not [entry for entry in history if entry["result"] == "missed" and entry.get("finished_at", 0) >= since]
    # The other nodes skipped each slot (exit 74) rather than failing.
    for node in lab.group("dlock_nodes"):
        others = [record for record in run_records(lab, node, LEDGER_JOB["name"], since)
                  if record["result"] not in ("success", "skipped_duplicate", "skipped_locked")]
        assert not others, "%s: %s" % (node, "\n".join(json.dumps(record) for record in others))


def run_records(lab, node, job, since):
    """The runner's log lines of JOB on NODE since SINCE (JSON, one per run)."""
    log = lab.ssh(node, "journalctl -u dlock-%s --since @%d -o cat --no-pager" % (job, since), check=True).stdout
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


DRAIN_PROBE = {"name": "drain-probe", "command": ["/bin/sleep", "8"], "schedule": "yearly"}


def _job_state(lab, node, job):
    return lab.ssh(node, "systemctl show --property=ActiveState --value dlock-%s.service" % job, check=True).stdout.strip()


def _timers(lab, node, state):
    """The dlock-*.timer units of NODE in STATE."""
    return lab.ssh(node, "systemctl list-units --plain --no-legend --state=%s 'dlock-*.timer' | cut -d' ' -f1" % state,
                   check=True).stdout.split()


def test_a_backend_switch_drains_every_node_first(lab, provisioned):
    """The switch from Redis to PostgreSQL as docs/backends.md says: drain
    (the dlock.fleet.drain playbook), then site.yml with the new backend. The
    drain stops every job timer on every node and waits for a run that is
    going on, which ends by itself; the switch is the PostgreSQL scenario's
    own rollout (no rollout of its own), with the fence epoch one higher
    (rollout.fence_epoch), which starts the timers again. The same job's
    fences go on rising across the switch: a resource that keeps the highest
    fence seen accepts the new backend's runs at once."""
    provisioned("redis")
    node = lab.group("dlock_nodes")[0]
    jobs(lab, [DRAIN_PROBE])
    since = time.time()
    lab.ssh(node, "systemctl start --no-block dlock-drain-probe.service", check=True)
    deadline = time.time() + 30
    while _job_state(lab, node, "drain-probe") != "activating":  # its run has begun (Type=oneshot)
        assert time.time() < deadline, _job_state(lab, node, "drain-probe")
        time.sleep(0.2)
    drained = ansible_playbook(lab, "playbooks/drain.yml", {})
    assert _job_state(lab, node, "drain-probe") == "inactive", "the drain ended before the run it had to wait for"
    [on_redis] = run_records(lab, node, DRAIN_PROBE["name"], since)
    assert on_redis["result"] == "success", on_redis  # waited for, not killed
    assert re.search(r"changed=[1-9]", drained.stdout), drained.stdout[-2000:]
    for each in lab.group("dlock_nodes"):
        assert _timers(lab, each, "active") == [], "%s: timers still running after the drain" % each
    again = ansible_playbook(lab, "playbooks/drain.yml", {})
    assert re.findall(r"changed=(\d+)", again.stdout) == ["0"] * len(lab.group("dlock_nodes")), again.stdout[-2000:]
    provisioned("postgresql")  # the switch
    for each in lab.group("dlock_nodes"):
        assert "dlock-sample.timer" in _timers(lab, each, "active"), each
    since = time.time()
    lab.ssh(node, "systemctl start dlock-drain-probe.service", check=True)  # returns when the run has ended
    [on_postgresql] = run_records(lab, node, DRAIN_PROBE["name"], since)
    assert on_postgresql["result"] == "success", on_postgresql
    assert on_postgresql["fence"] > on_redis["fence"], (on_redis["fence"], on_postgresql["fence"])
    jobs(lab, [{"name": DRAIN_PROBE["name"], "state": "absent"}])


def test_postgresql_scenario_changes_nothing_again(lab, provisioned, slot_ledger):
    provisioned("postgresql")
    start_ledger(lab, slot_ledger)  # its slots run through the idempotence run (slot_ledger)
    scenario.changes_nothing_again(lab, "postgresql")


@pytest.mark.slow
def test_every_postgresql_slot_runs_exactly_once_across_the_fleet(lab, provisioned, slot_ledger):
    provisioned("postgresql")
    every_slot_ran_exactly_once(lab, slot_ledger, SLOTS)


def test_postgresql_scenario_passes_its_verify_set(lab, provisioned, capsys):
    provisioned("postgresql")
    scenario.passes_its_verify_set(lab, "postgresql", capsys)


def test_the_operators_first_commands_find_the_postgresql_site_yml_provisioned(lab, provisioned):
    """The scenario adds the controller to dlock_postgresql_clients, as the
    README's Operations section says: pg_hba lets the job nodes in, and the
    controller only when told."""
    provisioned("postgresql")
    operators_first_commands(lab, "postgresql")


def test_missing_postgresql_cluster_is_named_and_nothing_written(lab, provisioned):
    provisioned("postgresql")
    host = lab.group("dlock_backend")[0]
    with writes_nothing(lab):
        done = site(lab, "postgresql", {"dlock_jobs_list": [], "dlock_postgresql_cluster": "nosuch"}, check=False)
    assert done.returncode != 0
    assert "there is no cluster 15/nosuch on %s" % host in done.stdout, done.stdout[-3000:]


def test_check_mode_with_the_postgresql_server_stopped(lab, provisioned):
    """--check cannot ask a stopped server what it would change: it says it
    would start it, and neither starts it nor fails."""
    provisioned("postgresql")
    host = lab.group("dlock_backend")[0]
    unit = "postgresql@15-main"
    with writes_nothing(lab):
        lab.ssh(host, "systemctl stop %s" % unit, check=True)
        try:
            done = site(lab, "postgresql", {"dlock_jobs_list": []}, "--check", check=False)
            assert done.returncode == 0, done.stdout[-4000:]
            assert re.search(r"changed: \[%s\]" % re.escape(host), done.stdout), done.stdout[-4000:]
            assert lab.ssh(host, "systemctl is-active %s" % unit).stdout.strip() == "inactive"
        finally:
            lab.ssh(host, "systemctl start %s" % unit, check=True)


def test_a_backend_node_that_crashed_is_back_in_service_at_once(lab, provisioned):
    """The backend node is the lab's time root (no upstream source): no boot
    gate it could never pass (chrony-wait would hold its boot 180 s, then
    leave it degraded). The job nodes, which have a source, keep the gate."""
    provisioned("postgresql")  # the scenario's rollout still (the two runs before it wrote nothing)
    backend = lab.group("dlock_backend")[0]
    node = lab.group("dlock_nodes")[0]
    assert lab.ssh(backend, "systemctl is-enabled chrony-wait").stdout.strip() == "disabled"
    assert lab.ssh(node, "systemctl is-enabled chrony-wait").stdout.strip() == "enabled"
    lab.crash(backend)
    lab.start(backend)  # waits until the boot is over (systemctl is-system-running --wait)
    state = lab.ssh(backend, "systemctl is-system-running; systemctl --failed --no-legend --plain; "
                             "systemctl is-active chrony")
    assert state.stdout.split() == ["running", "active"], state.stdout  # a failed unit would be listed
