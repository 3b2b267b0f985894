"""Blackout windows (the job option blackout, blackout.py): a slot whose
boundary is in a window is refused inside the backend's grant step, once
the backend's clock says it is the slot open, and claims nothing; it is
recorded skipped_blackout once, never missed and never caught up. On every
backend: the grant itself, then `dlock run`, catch-up and backfill."""

import pytest
from runner_proc import run_dlock
from servers import url_of
from test_catch_up import Node, backfill, day, moment, today

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import (
    Slot, job_scope, open_backend, pause_scopes)
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.slots import marker_ttl

DAY = 86400.0
WINDOW = "CHG-7 freeze"


@pytest.fixture(params=["redis", "postgresql", "postgresql+advisory", "etcd", "file"])
def url(request, tmp_path):
    return url_of(request, request.param, tmp_path)


@pytest.fixture
def backend(url):
    opened = open_backend(url)
    yield opened
    opened.close()


def day_slot(number, blacked_out):
    """A once-a-day slot estimated as `number`, the slots in `blacked_out` in a window."""
    return Slot(number, marker_ttl(DAY), DAY, lead=2.0,
                blackout_of=lambda asked: WINDOW if asked in blacked_out else None)


def grant(backend, key, owner, slot):
    return backend.acquire(key, owner, 30, slot, pause_scopes(key))


def test_a_blacked_out_slot_is_refused_and_claims_nothing(backend, unique_key):
    current = today()
    refused = grant(backend, unique_key, "node-a:1:0", day_slot(current, {current}))
    assert (refused.status, refused.window, refused.fence) == ("blackout", WINDOW, None)
    assert backend.query(unique_key).owner is None
    # Neither the lock nor the slot's marker was taken: the same slot, out of the window, is granted.
    slot = day_slot(current, set())
    assert grant(backend, unique_key, "node-b:1:0", slot).granted and slot.number == current
    backend.release(unique_key, "node-b:1:0")


@pytest.mark.parametrize("off_by", [-1, 1], ids=["estimate behind", "estimate ahead"])
def test_the_backend_judges_the_slot_its_clock_says_is_open(backend, unique_key, off_by):
    """A node whose estimate is the slot before or after the backend's is
    judged by the backend's slot: refused when that one is blacked out,
    granted when only the estimate was."""
    current = today()
    slot = day_slot(current + off_by, {current})
    refused = grant(backend, unique_key, "node-a:1:0", slot)
    assert (refused.status, slot.number) == ("blackout", current)
    slot = day_slot(current + off_by, {current + off_by})
    assert grant(backend, unique_key, "node-b:1:0", slot).granted and slot.number == current
    backend.release(unique_key, "node-b:1:0")


def test_a_pause_is_the_answer_before_a_blackout(backend, unique_key):
    backend.pause(job_scope(unique_key), "disk full", 600, "ops")
    try:
        refused = grant(backend, unique_key, "node-a:1:0", day_slot(today(), {today()}))
        assert refused.status == "paused" and refused.pause.reason == "disk full"
    finally:
        backend.resume(job_scope(unique_key))


def test_a_past_slot_in_a_window_is_refused_as_given(backend, unique_key):
    """A catch-up's or a backfill's slot (a number with no width): no clock to ask."""
    past = today() - 3
    slot = Slot(past, marker_ttl(DAY), blackout_of=lambda asked: WINDOW if asked == past else None)
    assert grant(backend, unique_key, "node-a:1:0", slot).status == "blackout"
    assert grant(backend, unique_key, "node-a:2:0", Slot(past, marker_ttl(DAY))).granted
    backend.release(unique_key, "node-a:2:0")


# -- the runner ------------------------------------------------------------------------------
@pytest.fixture
def node(url, tmp_path, unique_key):
    return Node(url, unique_key, tmp_path)


def window_of(slot):
    """A range around the boundary of day slot `slot`."""
    return {"from": moment(slot), "to": moment(slot + 1)}


def test_a_run_in_a_window_exits_72_is_recorded_once_and_counted(node, tmp_path):
    node.write_job(blackout=[{"calendar": "Sat 00:00", "duration": "1h"}, window_of(today())])
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    for _node_run in range(2):
        code, logs = node.run("--metrics-dir", str(metrics))
        assert (code, logs[0]["result"]) == (72, "skipped_blackout"), logs
        assert logs[0]["blackout"] == "%s to %s" % (moment(today()), moment(today() + 1))
    assert node.ran() == []
    entries = node.history()
    assert [(entry["result"], entry["slot"]) for entry in entries] == [("skipped_blackout", today())]
    assert entries[0]["run_id"] == day(today()) and entries[0]["exit_code"] == 72
    assert "blackout: %s to %s" % (moment(today()), moment(today() + 1)) in run_dlock(
        "history", "billing", *node.flags()).stdout
    text = (metrics / "dlock_billing.prom").read_text()
    assert 'dlock_skipped_total{job="billing",reason="blackout"} 2' in text
    assert 'dlock_runs_total{job="billing",result="skipped_blackout"} 2' in text


def test_catch_up_skips_the_slots_in_a_window_and_records_them_not_missed(node):
    slot = today()
    node.write_job(catch_up={"policy": "all", "window": "7d"}, blackout=[window_of(slot - 2)])
    node.seed(slot - 4)
    code, logs = node.run()
    assert code == 0 and logs[0]["catching_up"] == 2 and "slots_missed" not in logs[0], logs
    assert node.ran() == [day(slot), day(slot - 3), day(slot - 1)]
    results = dict((entry["slot"], entry["result"]) for entry in node.history())
    assert results == {slot: "success", slot - 1: "success", slot - 2: "skipped_blackout", slot - 3: "success",
                       slot - 4: "success"}


def test_backfill_refuses_the_slots_in_a_window_at_their_grant(node):
    slot = today()
    node.write_job(blackout=[window_of(slot - 4)])
    code, out, err = backfill(node, moment(slot - 5), moment(slot - 3), "--reason", "INC-7")
    assert code == 0 and out.endswith("3 slots: 1 skipped_blackout, 2 success\n"), out + err
    assert node.ran() == [day(slot - 5), day(slot - 3)]


def test_a_blackout_without_once_per_is_refused_before_anything_runs(node):
    node.write_job(blackout=[window_of(today())], once_per=None, every_slot=False)
    done = run_dlock("run", "--job", "billing", *node.flags())
    assert done.returncode == 78 and "blackout: a window blacks out slots" in done.stderr, done.stderr
    assert node.ran() == []


@pytest.mark.parametrize("reason", ["INC-7\nforged: line", "INC-7\u2028forged", "", "   "],
                         ids=["newline", "line separator", "empty", "blank"])
def test_a_hostile_backfill_reason_is_refused_and_nothing_runs(tmp_path, unique_key, reason):
    node = Node("file://%s" % (tmp_path / "locks"), unique_key, tmp_path)
    node.write_job()
    code, _out, err = backfill(node, moment(today() - 2), moment(today() - 1), "--reason", reason)
    assert code == 78 and "--reason" in err, err
    assert node.ran() == []
