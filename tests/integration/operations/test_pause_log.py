"""The fleet's pause log (base.log_pause): `dlock pause` and `dlock resume`
record each pause made and ended in the backend, and the run that finds a
gap after the whole fleet was down takes the slots a pause covered for
skipped, never missed nor caught up, on every backend."""

import pytest
from runner_proc import run_dlock
from servers import url_of
from test_catch_up import Node, day, today

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import (
    PAUSE_LOG_KEEP, job_scope, open_backend)
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.validate import PAUSE_LOG_KEY

DAY = 86400


@pytest.fixture(params=["redis", "postgresql", "postgresql+advisory", "etcd", "file"])
def node(request, tmp_path, unique_key):
    return Node(url_of(request, request.param, tmp_path), unique_key, tmp_path)


def pause_log(node, scope):
    backend = open_backend(node.url)
    try:
        return [entry for entry in backend.read_history(PAUSE_LOG_KEY, PAUSE_LOG_KEEP) if entry.get("scope") == scope]
    finally:
        backend.close()


def test_a_pause_and_its_resume_are_in_the_pause_log(node):
    paused = run_dlock("pause", "--key", node.key, "--reason", "CHG-9: ledger freeze", "--until", "1h", *node.flags())
    assert paused.returncode == 0, paused.stderr
    resumed = run_dlock("resume", "--key", node.key, *node.flags())
    assert resumed.returncode == 0, resumed.stderr
    ended, made = pause_log(node, job_scope(node.key))
    assert (made["result"], made["reason"], ended["result"]) == ("paused", "CHG-9: ledger freeze", "resumed")
    assert 3599 <= made["until"] - made["at"] <= 3601 and made["at"] <= ended["at"] <= made["until"]


def test_slots_a_pause_covered_while_the_fleet_was_down_are_skipped_not_caught_up(node):
    """The last run 5 days ago; a pause (logged, then ended by a resume)
    covered the boundaries of the slots 3 and 2 days ago while no node ran:
    the run today catches up only 4 days ago and yesterday."""
    node.write_job(catch_up={"policy": "all", "window": "7d"})
    slot = today()
    node.seed(slot - 5)
    backend = open_backend(node.url)
    try:
        scope = job_scope(node.key)
        backend.add_history(PAUSE_LOG_KEY, {"result": "paused", "scope": scope, "at": (slot - 3) * DAY - 60,
                                            "until": (slot + 30) * DAY, "reason": "CHG-9: ledger freeze"}, 1000)
        backend.add_history(PAUSE_LOG_KEY, {"result": "resumed", "scope": scope, "at": (slot - 1) * DAY - 60}, 1000)
        # Another job's pause of the same days changes nothing here.
        backend.add_history(PAUSE_LOG_KEY, {"result": "paused", "scope": job_scope(node.key + "-other"),
                                            "at": (slot - 5) * DAY, "until": slot * DAY}, 1000)
    finally:
        backend.close()
    code, logs = node.run()
    assert code == 0 and logs[0]["catching_up"] == 2 and "slots_missed" not in logs[0], logs
    assert node.ran() == [day(slot), day(slot - 4), day(slot - 1)]
    skipped = dict((entry["slot"], entry) for entry in node.history() if entry["result"] == "skipped_paused")
    assert sorted(skipped) == [slot - 3, slot - 2]
    assert skipped[slot - 3]["pause_reason"] == "CHG-9: ledger freeze"
    assert skipped[slot - 3]["pause_source"] == "pause log"


def test_no_job_may_use_the_pause_logs_key(node):
    node.write_job()
    done = run_dlock("run", "--job", "billing", "--key", PAUSE_LOG_KEY, *node.flags())
    assert done.returncode == 78 and "is the key of the backend's pause log" in done.stderr, done.stderr
