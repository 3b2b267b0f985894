"""Catch-up (the job option catch_up, history.py, Runner._catch_up): the run
granted a slot after a gap in the fleet-wide history runs the gap's slots
within the window, the newest `max` (latest: one), oldest first, each a run
of its own whose grant claims the slot's marker; the others are missed. A
slot whose marker says it ran is never run again by a catch-up. On every
backend, against a ledger the job writes."""

import json
import sys
import time

import pytest
from runner_proc import MODULE_UTILS, run_dlock, start_dlock
from servers import url_of

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import Slot, open_backend
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.slots import marker_ttl


@pytest.fixture(params=["redis", "postgresql", "postgresql+advisory", "etcd", "file"])
def node(request, tmp_path, unique_key):
    return Node(url_of(request, request.param, tmp_path), unique_key, tmp_path)


class Node(object):
    """A node's files for the job `billing`, once a day, every slot due,
    which appends its DLOCK_RUN_ID to the ledger."""

    def __init__(self, url, key, tmp_path):
        self.url, self.key, self.dir = url, key, tmp_path
        self.ledger = tmp_path / "ledger"
        (tmp_path / "jobs").mkdir()

    def write_job(self, **options):
        script = "import os, sys; open(sys.argv[1], 'a').write(os.environ['DLOCK_RUN_ID'] + '\\n')"
        job = dict({"command": [sys.executable, "-c", script, str(self.ledger)], "key": self.key, "once_per": "1d",
                    "every_slot": True}, **options)
        (self.dir / "jobs" / "billing.json").write_text(json.dumps(job))

    def flags(self):
        return ("--backend", self.url, "--jobs-dir", str(self.dir / "jobs"), "--pauses-dir", str(self.dir / "pauses"))

    def run(self, *extra):
        """(exit code, the log lines of the run and its catch-ups)."""
        done = run_dlock("run", "--job", "billing", *(self.flags() + extra))
        return done.returncode, [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]

    def ran(self):
        return self.ledger.read_text().split() if self.ledger.exists() else []

    def seed(self, slot):
        backend = open_backend(self.url)
        try:
            assert backend.add_history(self.key, {"result": "success", "slot": slot}, 50)
        finally:
            backend.close()

    def history(self, entries=20):
        done = run_dlock("history", "billing", "--json", "-n", str(entries), *self.flags())
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


def day(slot):
    return "billing@%s" % time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(slot * 86400))


def today():
    return int(time.time() + 2) // 86400  # once_per 1d's lead is its max_clock_skew, 2s


def test_all_runs_each_missed_slot_once_oldest_first_and_never_again(node):
    node.write_job(catch_up={"policy": "all", "window": "7d"})
    slot = today()
    node.seed(slot - 4)
    code, logs = node.run()
    assert code == 0 and logs[0]["catching_up"] == 3 and "slots_missed" not in logs[0]
    assert node.ran() == [day(slot), day(slot - 3), day(slot - 2), day(slot - 1)]
    assert [(log["result"], log.get("catch_up"), log["slot"]) for log in logs[1:]] == [
        ("success", True, slot - 3), ("success", True, slot - 2), ("success", True, slot - 1)]
    fences = [log["fence"] for log in logs]
    assert fences == sorted(fences) and len(set(fences)) == 4
    entries = node.history()[:4]
    assert [(entry["slot"], entry.get("catch_up")) for entry in entries] == [
        (slot - 1, True), (slot - 2, True), (slot - 3, True), (slot, None)]
    table = run_dlock("history", "billing", "-n", "4", *node.flags()).stdout
    assert table.count("caught up") == 3, table
    # Another node's run in the slot: a duplicate, no catch-up again.
    code, logs = node.run()
    assert code == 74 and len(logs) == 1 and len(node.ran()) == 4
    # A node that would catch up a slot that ran (a history it could not
    # read, trimmed, or written by nobody): the slot's marker refuses it.
    backend = open_backend(node.url)
    try:
        caught = backend.acquire(node.key, "late-node:1:0", 30, Slot(slot - 2, marker_ttl(86400.0, 7 * 86400.0)))
        assert caught.status == "duplicate"
    finally:
        backend.close()


def test_latest_runs_the_newest_missed_slot_and_counts_the_others_missed(node, tmp_path):
    node.write_job(catch_up={"policy": "latest"})
    slot = today()
    node.seed(slot - 4)
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    code, logs = node.run("--metrics-dir", str(metrics))
    assert code == 0 and logs[0]["catching_up"] == 1 and logs[0]["slots_missed"] == 2
    assert node.ran() == [day(slot), day(slot - 1)]
    missed = sorted(entry["slot"] for entry in node.history() if entry["result"] == "missed")
    assert missed == [slot - 3, slot - 2]
    text = (metrics / "dlock_billing.prom").read_text()
    assert 'dlock_catch_up_runs_total{job="billing",kind="catch_up"} 1' in text
    assert 'dlock_catch_up_runs_total{job="billing",kind="backfill"} 0' in text
    assert 'dlock_slots_missed_total{job="billing"} 2' in text
    assert 'dlock_runs_total{job="billing",result="success"} 2' in text


def test_only_the_slots_that_ended_within_the_window_are_caught_up(node):
    """A window of 2 days, 3 slots missed: yesterday's and the day before's ended within it."""
    node.write_job(catch_up={"policy": "all", "window": "2d"})
    slot = today()
    node.seed(slot - 4)
    code, logs = node.run()
    assert code == 0 and logs[0]["catching_up"] == 2 and logs[0]["slots_missed"] == 1
    assert node.ran() == [day(slot), day(slot - 2), day(slot - 1)]


def test_a_pause_refuses_the_catch_up_too(node):
    """A pause made while the run goes on (here: before the catch-up's own grant)."""
    node.write_job(catch_up={"policy": "all", "window": "7d"}, environment={"PYTHONPATH": MODULE_UTILS},
                   command=[sys.executable, "-c", PAUSE_FROM_THE_JOB, node.key, node.url])
    slot = today()
    node.seed(slot - 2)
    try:
        code, logs = node.run()
        assert code == 0 and [log["result"] for log in logs] == ["success", "skipped_paused"]
        assert logs[1]["slot"] == slot - 1 and logs[1]["exit_code"] == 72
    finally:
        run_dlock("resume", "--key", node.key, *node.flags())


PAUSE_FROM_THE_JOB = ("import sys; from dlock.backends import open_backend; "
                      "b = open_backend(sys.argv[2]); b.pause('job:' + sys.argv[1], 'CHG-1', 60, 'test'); b.close()")


# -- issue 23's acceptance: a whole-fleet outage of 24 slots of a 5-second job ------------------
FIVE = 5
OUTAGE = 24
# The slot window of a 5s job opens its lead, max_clock_skew (2s with the
# default ttl), before its boundary (slots.slot_lead).
LEAD = 2.0
POLICIES = {"latest": ({"policy": "latest", "window": "5m"}, 1),
            "all": ({"policy": "all", "window": "5m", "max": 5}, 5),
            "skip": ({"policy": "skip"}, 0)}


def five(job, slot):
    return "%s@%s" % (job, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(slot * FIVE)))


def fresh_slot():
    """The 5s slot open now, once at least 2.5s of its window are left, so
    that three nodes started now all tick in it (not a synchronisation:
    what it avoids is a slot edge between the nodes' ticks)."""
    position = (time.time() + LEAD) % FIVE
    if position > FIVE / 2.0:
        time.sleep(FIVE - position + 0.1)
    return int((time.time() + LEAD) // FIVE)


@pytest.fixture(params=["redis", "postgresql", "postgresql+advisory", "etcd", "file"])
def fleet_url(request, tmp_path):
    return url_of(request, request.param, tmp_path)


def test_after_a_fleet_outage_of_24_slots_latest_runs_1_all_5_skip_0(fleet_url, tmp_path, unique_key):
    """Three nodes tick at once after the last run 25 slots ago, for three
    jobs, one per policy, on every backend: each slot of the outage is run
    at most once, the number caught up is exactly the policy's, the newest
    ones, each under its own fence, and the others are recorded missed."""
    url = fleet_url
    nodes = {}
    for name, (catch_up, _count) in POLICIES.items():
        (tmp_path / name).mkdir()
        nodes[name] = Node(url, "%s-%s" % (unique_key, name), tmp_path / name)
        nodes[name].write_job(once_per="5s", catch_up=catch_up)
    slot = fresh_slot()
    for node in nodes.values():
        node.seed(slot - OUTAGE - 1)
    runs = [start_dlock("run", "--job", "billing", *node.flags()) for node in nodes.values() for _tick in range(3)]
    for run in runs:
        _out, err = run.communicate(timeout=60)
        assert run.returncode in (0, 73, 74), err  # ran (or caught up), found the lock held or the slot done
    # A node that ticked only after the slot's edge (nine runners starting on
    # a loaded host: CI once) runs the new slot, as it should: the slots that
    # opened meanwhile may each have run once too; the catch-up is the same.
    opened = [five("billing", number) for number in range(slot + 1, int((time.time() + LEAD) // FIVE) + 1)]
    for name, (_catch_up, count) in POLICIES.items():
        ran = nodes[name].ran()
        caught_up = [five("billing", number) for number in range(slot - count, slot)]
        assert len(set(ran)) == len(ran), (name, ran)
        assert sorted(run for run in ran if run not in opened) == sorted([five("billing", slot)] + caught_up), \
            (name, ran)
        entries = nodes[name].history(50)
        missed = sorted(entry["slot"] for entry in entries if entry["result"] == "missed")
        assert missed == list(range(slot - OUTAGE, slot - count)), (name, missed)
        fences = [entry["fence"] for entry in entries if entry.get("fence") is not None]
        assert len(set(fences)) == len(fences) == len(ran), (name, fences)


def test_catch_up_without_every_slot_is_refused(node):
    node.write_job(catch_up={"policy": "all"}, every_slot=False)
    done = run_dlock("run", "--job", "billing", *node.flags())
    assert done.returncode == 78 and "catch_up: policy all needs every_slot" in done.stderr, done.stderr
    assert node.ran() == []


# -- dlock backfill ---------------------------------------------------------------------------
def backfill(node, first, last, *extra):
    done = run_dlock("backfill", "billing", "--from", first, "--to", last, *(extra + node.flags()))
    return done.returncode, done.stdout, done.stderr


def moment(slot):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(slot * 86400))


def test_backfill_runs_each_slot_once_and_resumes_where_it_stopped(node):
    node.write_job()
    slot = today()
    code, out, err = backfill(node, moment(slot - 5), moment(slot - 3), "--reason", "INC-4211: ledger outage")
    assert code == 0 and out.endswith("backfill billing: 3 slots: 3 success\n"), err
    assert node.ran() == [day(slot - 5), day(slot - 4), day(slot - 3)]
    assert all(json.loads(line)["backfill_reason"] == "INC-4211: ledger outage"
               for line in err.splitlines() if line.startswith("{"))
    assert [(entry["backfill"], entry["backfill_reason"]) for entry in node.history()] == [
        (True, "INC-4211: ledger outage")] * 3
    table = run_dlock("history", "billing", *node.flags()).stdout
    assert table.count("backfill: INC-4211: ledger outage") == 3, table
    code, out, err = backfill(node, moment(slot - 6), moment(slot - 2))
    assert code == 0 and out.endswith("5 slots: 3 done_before, 2 success\n"), out + err
    assert node.ran()[3:] == [day(slot - 6), day(slot - 2)]


def test_backfill_without_a_history_is_kept_once_by_the_markers(node):
    node.write_job(history=0)
    slot = today()
    assert backfill(node, moment(slot - 3), moment(slot - 2))[0] == 0
    code, out, err = backfill(node, moment(slot - 3), moment(slot - 2))
    assert code == 0 and out.endswith("2 slots: 2 skipped_duplicate\n"), out + err
    assert node.ran() == [day(slot - 3), day(slot - 2)]


@pytest.mark.parametrize("first, last, message", [
    (lambda s: moment(s - 3), lambda s: moment(s - 4), "is after --to"),
    (lambda s: moment(s - 2), lambda s: moment(s + 1), "is not before the current slot"),
    (lambda s: moment(s - 1500), lambda s: moment(s - 1), "1500 slots, above 1000 at once"),
    (lambda s: "yesterday", lambda s: moment(s - 1), "--from: 'yesterday' is not a moment such as 2026-11-27T05:00:00Z"),
    (lambda s: moment(s - 2), lambda s: moment(s - 1) + "\n", "--to: '%sZ\\n' is not a moment"),
    (lambda s: moment(s - 2), lambda s: "2026-02-30T00:00:00Z", "--to: '2026-02-30T00:00:00Z' is not a valid date"),
], ids=["reversed", "future", "too many", "words", "newline", "no such day"])
def test_a_bad_range_is_refused_and_nothing_runs(tmp_path, unique_key, first, last, message):
    node = Node("file://%s" % (tmp_path / "locks"), unique_key, tmp_path)
    node.write_job()
    slot = today()
    code, _out, err = backfill(node, first(slot), last(slot))
    expected = message % moment(slot - 1)[:-1] if "%s" in message else message
    assert code == 78 and expected in err, err
    assert node.ran() == []


def test_backfill_needs_a_schedule_that_fires_in_every_slot(tmp_path, unique_key):
    node = Node("file://%s" % (tmp_path / "locks"), unique_key, tmp_path)
    node.write_job(every_slot=False)
    code, _out, err = backfill(node, moment(today() - 2), moment(today() - 1))
    assert code == 78 and "needs once_per and a schedule that fires in every slot" in err
