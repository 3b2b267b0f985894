"""The fleet-wide history (history.py, Backend.add_history/read_history,
`dlock history`): every granted run's entry, newest first, the newest
`history` kept; a slot's skip recorded once whichever nodes were refused,
also when their mirrors refuse before the backend is asked; a history that
cannot be written changes nothing of the run and is counted, and the node's
next entry says so. On every backend."""

import json
import os
import sys
import time

import pytest
from runner_proc import last_log, run_dlock
from servers import url_of

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import report
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import Slot, open_backend

REASON = "CHG-118: ledger freeze"


@pytest.fixture(params=["redis", "postgresql", "postgresql+advisory", "etcd", "file"])
def node(request, tmp_path, unique_key):
    return Node(url_of(request, request.param, tmp_path), unique_key, tmp_path)


class Node(object):
    """A node's files for the job `billing` (its lock key the test's own),
    which exits with the code in the file `code` (0 when there is none)."""

    def __init__(self, url, key, tmp_path):
        self.url, self.key, self.dir = url, key, tmp_path
        for name in ("jobs", "pauses", "metrics"):
            (tmp_path / name).mkdir()
        self.write_job()

    def write_job(self, **options):
        script = "import os, sys; p = sys.argv[1]; sys.exit(int(open(p).read()) if os.path.exists(p) else 0)"
        job = dict({"command": [sys.executable, "-c", script, str(self.dir / "code")], "key": self.key}, **options)
        (self.dir / "jobs" / "billing.json").write_text(json.dumps(job))

    def flags(self):
        return ("--backend", self.url, "--jobs-dir", str(self.dir / "jobs"), "--pauses-dir", str(self.dir / "pauses"))

    def run(self, code=0):
        (self.dir / "code").write_text(str(code))
        done = run_dlock("run", "--job", "billing", "--metrics-dir", str(self.dir / "metrics"), *self.flags())
        return done.returncode, last_log(done.stderr)

    def history(self, *args):
        done = run_dlock("history", "billing", *(args + self.flags()))
        assert done.returncode == 0, done.stderr
        return done

    def entries(self, limit=1000):
        return json.loads(self.history("-n", str(limit), "--json").stdout)

    def counted(self, outcome):
        text = (self.dir / "metrics" / "dlock_billing.prom").read_text()
        return report._counters(text)["dlock_history_writes_total"][outcome]


def test_every_run_is_in_the_history_newest_first(node):
    assert node.run(0)[0] == 0
    code, log = node.run(3)
    assert code == 3 and log["history"] == "written"
    newest, oldest = node.entries()
    assert (newest["result"], newest["exit_code"], oldest["result"], oldest["exit_code"]) == ("failed", 3, "success", 0)
    assert newest["fence"] > oldest["fence"] and newest["owner"] == log["owner"] and newest["run_id"] == log["run_id"]
    assert newest["started_at"] <= newest["finished_at"] and newest["host"] == log["host"]
    table = node.history().stdout.splitlines()
    assert table[0].split()[:3] == ["FINISHED", "(UTC)", "RESULT"] and "failed" in table[1] and "success" in table[2]
    assert node.counted("written") == 2


def test_the_backend_keeps_the_newest_entries_only(node):
    node.write_job(history=3)
    fences = [node.run()[1]["fence"] for _run in range(5)]
    assert [entry["fence"] for entry in node.entries()] == fences[:1:-1]
    assert [entry["fence"] for entry in node.entries(limit=2)] == fences[:2:-1]


def test_no_history_is_written_with_history_0(node):
    node.write_job(history=0)
    code, log = node.run()
    assert code == 0 and "history" not in log
    assert node.entries() == [] and "no history of billing" in node.history().stdout


def test_a_paused_slot_is_recorded_once_whichever_nodes_are_refused(node, tmp_path):
    """Three runs in one slot, refused by the backend's pause (the
    mirror left out: --pauses-dir of an empty directory per run would be
    the same) and then by the node's mirror: one skipped_paused entry."""
    node.write_job(once_per="1h")
    done = run_dlock("pause", "--job", "billing", "--reason", REASON, "--until", "10m", *node.flags())
    assert done.returncode == 0, done.stderr
    outcomes = []
    for _node in range(3):
        code, log = node.run()
        assert code == 72 and log["pause_source"] == "node"
        outcomes.append(log["history"])
    os.remove(str(node.dir / "pauses" / ("job:%s.pause" % node.key)))  # the backend's refusal now
    code, log = node.run()
    assert code == 72 and log["pause_source"] == "backend"
    outcomes.append(log["history"])
    assert outcomes == ["written", "already_recorded", "already_recorded", "already_recorded"]
    (entry,) = node.entries()
    assert (entry["result"], entry["paused"], entry["pause_reason"]) == ("skipped_paused", "job:" + node.key, REASON)
    assert entry["run_id"].startswith("billing@") and entry["once"] == "skipped_paused@%d" % log["slot"]
    assert node.counted("already_recorded") == 3


def test_a_skip_without_a_slot_is_not_history(node):
    """Without once_per every node's tick but one is skipped: no entry."""
    run_dlock("pause", "--job", "billing", "--reason", REASON, "--until", "10m", *node.flags())
    code, log = node.run()
    assert code == 72 and "history" not in log and node.entries() == []


def test_a_history_that_cannot_be_written_changes_nothing_of_the_run_and_is_counted(tmp_path, unique_key):
    """file://: a FIFO where the key's history belongs makes its write fail
    (never a wait on it); the run's result stands, the failure is in the
    log line and the metrics, and the node's next entry says one is missing."""
    node = Node("file://%s" % (tmp_path / "locks"), unique_key, tmp_path)
    (tmp_path / "locks").mkdir()
    fifo = str(tmp_path / "locks" / (unique_key + ".history"))
    os.mkfifo(fifo)
    code, log = node.run(3)
    assert code == 3 and log["result"] == "failed" and log["release"] == "released"
    assert log["history"] == "failed" and "is not a regular file" in log["history_error"]
    assert node.counted("failed") == 1
    assert report.read_gauges(str(tmp_path / "metrics"), "billing")["dlock_history_unrecorded"] == 1
    os.remove(fifo)
    code, log = node.run(0)
    assert code == 0 and log["history"] == "written"
    (entry,) = node.entries()
    assert entry["unrecorded_before"] == 1 and entry["result"] == "success"
    assert report.read_gauges(str(tmp_path / "metrics"), "billing")["dlock_history_unrecorded"] == 0
    assert "1 entries of this node missing before it" in node.history().stdout


def test_once_is_decided_by_the_backend_between_two_clients(node):
    """The backend's own step: of two clients writing one once id, one writes."""
    first, second = (open_backend(node.url) for _client in range(2))
    try:
        answers = [first.add_history(node.key, {"result": "skipped_locked"}, 5, "skipped_locked@7", 60),
                   second.add_history(node.key, {"result": "skipped_locked"}, 5, "skipped_locked@7", 60),
                   second.add_history(node.key, {"result": "skipped_locked"}, 5, "skipped_locked@8", 60)]
        assert answers == [True, False, True]
        assert [entry["once"] for entry in first.read_history(node.key, 10)] == ["skipped_locked@8",
                                                                                 "skipped_locked@7"]
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("value, message", [
    ("0", "-n: 0 is out of range (1-1000)"),
    ("1001", "-n: 1001 is out of range (1-1000)"),
    ("NaN", "-n: 'NaN' must be a whole number"),
    ("1e308", "-n: '1e308' must be a whole number"),
    ("-1", "-n: '-1' must be a whole number"),
    ("2\n", "must be a whole number"),
])
def test_a_bad_count_is_refused_with_its_name(tmp_path, unique_key, value, message):
    node = Node("file://%s" % (tmp_path / "locks"), unique_key, tmp_path)
    done = run_dlock("history", "billing", "-n", value, *node.flags())
    assert done.returncode == 78 and message in done.stderr, done.stderr


def test_an_unknown_job_is_refused(tmp_path, unique_key):
    node = Node("file://%s" % (tmp_path / "locks"), unique_key, tmp_path)
    done = run_dlock("history", "no-such-job", *node.flags())
    assert done.returncode == 78 and "no-such-job" in done.stderr


# -- missed slots (history.RunHistory.judge_missed) -------------------------------------------
def today():
    """The slot of a once_per 1d job now (its lead, max_clock_skew, is 2s: a
    run within 2s of midnight UTC may claim tomorrow's; the tests write the
    history around the slot the run logs)."""
    return int(time.time() + 2) // 86400


def seed(node, *entries, key=None):
    backend = open_backend(node.url)
    try:
        for entry, once in entries:
            assert backend.add_history(key or node.key, entry, 50, once, 60)
    finally:
        backend.close()


def missed(node):
    return sorted(entry["slot"] for entry in node.entries() if entry["result"] == "missed")


def test_slots_between_the_newest_in_the_history_and_the_run_s_are_missed_once(node, tmp_path):
    node.write_job(once_per="1d", every_slot=True)
    slot = today()
    seed(node, ({"result": "success", "slot": slot - 4}, None))
    code, log = node.run()
    assert code == 0 and log["slot"] == slot and log["slots_missed"] == 3
    assert missed(node) == [slot - 3, slot - 2, slot - 1]
    assert [entry["result"] for entry in node.entries()][:4] == ["success", "missed", "missed", "missed"]
    assert report._counters((tmp_path / "metrics" / "dlock_billing.prom").read_text())[
        "dlock_slots_missed_total"][None] == 3
    # Another node's run in the slot is a duplicate: it judges nothing, and nothing is counted twice.
    code, log = node.run()
    assert code == 74 and "slots_missed" not in log and missed(node) == [slot - 3, slot - 2, slot - 1]


def test_a_skipped_slot_is_not_missed_and_a_new_history_judges_nothing(node):
    node.write_job(once_per="1d", every_slot=True)
    slot = today()
    code, log = node.run()  # nothing in the history before it: nothing to judge from
    assert code == 0 and "slots_missed" not in log
    node.write_job(once_per="1d", every_slot=True, key=node.key + "-b")  # a job of its own: its slot not run
    seed(node, ({"result": "success", "slot": slot - 3}, None),
         ({"result": "skipped_paused", "slot": slot - 2}, "skipped_paused@%d" % (slot - 2)),
         ({"result": "skipped_locked", "slot": slot - 1}, "skipped_locked@%d" % (slot - 1)), key=node.key + "-b")
    code, log = node.run()
    assert code == 0 and "slots_missed" not in log


def test_a_job_whose_schedule_skips_slots_counts_none_missed(node):
    """Without every_slot (a schedule with unequal gaps, once_per below its period)."""
    node.write_job(once_per="1d")
    seed(node, ({"result": "success", "slot": today() - 4}, None))
    code, log = node.run()
    assert code == 0 and "slots_missed" not in log and missed(node) == []


def test_a_slot_claimed_whose_entry_is_not_there_yet_is_not_missed(node):
    """A run writes its entry after its release: the run that freed the lock
    for this one may not have yet. Its slot's marker, still live, says it
    was claimed: of the gap, only the slot with neither is missed."""
    node.write_job(once_per="1d", every_slot=True)
    slot = today()
    seed(node, ({"result": "success", "slot": slot - 3}, None))
    backend = open_backend(node.url)
    try:
        assert backend.acquire(node.key, "other-node:1:0", 30, Slot(slot - 1, 3600)).granted
        assert backend.release(node.key, "other-node:1:0")
    finally:
        backend.close()
    code, log = node.run()
    assert code == 0 and log["slots_missed"] == 1 and missed(node) == [slot - 2]
