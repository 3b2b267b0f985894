"""The ledger checks that every fault test relies on (ledger.py) fail when
a guarantee is broken: each broken ledger here must be refused. No lab."""

import json

import ledger
import pytest


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


def test_the_slot_share_counts_the_slots_the_fleet_could_run():
    """Slots of 2s from 0 to 20: a run of slot 0 holds the lock to 4.5s, so
    slot 2's timers (fired by 2.4s) find it held; slot 4's fire by 4.4s,
    before its end, so 4 is refused too. Slot 6 runs, and holds through
    8 and 10. Slot 12 finds the lock free and does not run: missed. Slot
    14's run starts late (its runner at 15.9s, its job at 16.5s) and holds
    through 16's firing: 16 could not run. 18 runs. A slot that ends past
    the span (20) is not counted.
    """
    granted = [_run("a", 0.3, 4.5, 1, "1970-01-01T00:00:00Z"), _run("b", 6.2, 10.7, 2, "1970-01-01T00:00:06Z"),
               dict(_run("c", 16.5, 18.0, 3, "1970-01-01T00:00:14Z"), runner_start=15.9),
               _run("d", 18.2, 22.0, 4, "1970-01-01T00:00:18Z")]
    ran, could, late = ledger.slot_share(granted, [], 2.0, 0.0, 20.0, 0.4)
    assert ran == [0, 6, 14, 18]
    assert could == [0, 6, 12, 14, 18]
    assert late == []
    ran, could, late = ledger.slot_share(granted, [], 2.0, 0.5, 16.0, 0.4)  # from the first whole slot in the span
    assert (ran, could) == ([6, 14], [6, 12, 14])
    # Run b's runner released and logged at 12.6s, after slot 12's timers
    # had fired: 12 found the lock held, and is not missed.
    granted[1]["logged"] = 12.6
    assert ledger.slot_share(granted, [], 2.0, 0.0, 20.0, 0.4) == ([0, 6, 14, 18], [0, 6, 14, 18], [])


def _tried(host, fired, logged, result, slot=None):
    return {"host": host, "fired": fired, "logged": logged, "result": result, "slot": slot}


def test_a_slot_is_judged_by_the_attempts_its_timers_made():
    """Run b (slot 6) holds until its runner logged at 12.3s. Slot 12's
    timers fired at 12.05s and 12.1s, and both runners were refused while b
    held: 12 could not run, although nothing held at 12.4s, when the last
    timer had fired. b's own node fired only when b ended (at 12.35s, its
    start job waited for b) and asked too late for 12: not 12's attempt.
    Had an attempt in time failed on the backend, been granted another
    slot, or been refused after b had gone, 12 could run and was missed."""
    granted = [_run("a", 0.3, 4.5, 1, "1970-01-01T00:00:00Z"), dict(_run("b", 6.2, 10.7, 2, "1970-01-01T00:00:06Z"),
                                                                    logged=12.3),
               _run("d", 14.2, 18.0, 4, "1970-01-01T00:00:14Z")]
    refused = [_tried("n2", 12.05, 12.2, "skipped_locked"), _tried("n3", 12.1, 12.25, "skipped_locked"),
               _tried("n1", 12.45, 18.1, "success")]
    assert ledger.slot_share(granted, refused, 2.0, 0.0, 16.0, 0.4) == ([0, 6, 14], [0, 6, 14], [])
    for missed in (_tried("n3", 12.1, 13.5, "backend_error"), _tried("n3", 12.31, 12.5, "skipped_locked")):
        assert ledger.slot_share(granted, refused[:1] + [missed], 2.0, 0.0, 16.0, 0.4) == \
            ([0, 6, 14], [0, 6, 12, 14], [])


def test_a_slot_whose_runners_asked_after_it_closed_is_lost_to_them():
    """Slot 12's timers fired in time, after b's end, but every runner
    reached the backend after 12 had closed: the backend's clock gave the
    first slot 14 (the run d of n1) and the others a duplicate of 14. 12 was
    lost on the nodes (their runners' start), not by the backend; one
    attempt refused otherwise (a backend error) makes it a slot that could run."""
    granted = [_run("b", 6.2, 10.7, 2, "1970-01-01T00:00:06Z"), _run("d", 14.2, 18.0, 4, "1970-01-01T00:00:14Z")]
    slow = [_tried("n1", 12.1, 18.1, "success", 14), _tried("n2", 12.2, 14.3, "skipped_duplicate"),
            _tried("n3", 12.3, 14.4, "skipped_duplicate")]
    assert ledger.slot_share(granted, slow, 2.0, 6.0, 16.0, 0.4) == ([6, 14], [6, 14], [12])
    failed = slow[:2] + [_tried("n3", 12.3, 15.0, "backend_error")]
    assert ledger.slot_share(granted, failed, 2.0, 6.0, 16.0, 0.4) == ([6, 14], [6, 12, 14], [])


def test_each_runner_record_belongs_to_the_last_start_of_its_node():
    lines = [
        ("n1", 10.02, "Starting dlock-faults.service - dlock job faults..."),
        ("n2", 10.3, "Starting dlock-faults.service - dlock job faults..."),
        ("n1", 11.5, json.dumps({"owner": "o1", "fence": None, "result": "skipped_locked", "duration_ms": 900})),
        ("n2", 11.9, json.dumps({"owner": "o2", "fence": None, "result": "backend_error", "duration_ms": 1200})),
        ("n3", 12.0, json.dumps({"owner": "o3", "fence": None, "result": "skipped_locked", "duration_ms": 500})),
    ]
    assert ledger.attempts(lines) == [_tried("n1", 10.02, 11.5, "skipped_locked"),
                                      _tried("n2", 10.3, 11.9, "backend_error"),
                                      _tried("n3", 11.5, 12.0, "skipped_locked")]


def test_a_run_without_a_slot_counts_for_none():
    assert ledger.slot_of({"run_id": "faults#12"}) is None
    assert ledger.slot_of({"run_id": "faults@1970-01-01T00:01:00Z"}) == 60


def test_the_runners_results_are_counted_with_why_the_last_one_ended_so():
    lines = [
        ("n1", 10.0, json.dumps({"result": "backend_error", "error": "first", "duration_ms": 5})),
        ("n2", 11.0, json.dumps({"result": "success", "duration_ms": 5})),
        ("n1", 12.0, "LEDGER_START {}"),
        ("n3", 13.0, json.dumps({"result": "backend_error", "error": "last", "duration_ms": 5})),
        ("n2", 14.0, json.dumps({"result": "lock_lost", "reason": "could not renew", "renew_error": "timed out",
                                 "renewals": 2})),
    ]
    assert ledger.results(lines) == {
        "backend_error": (2, "n3: error: last"), "success": (1, None),
        "lock_lost": (1, "n2: reason: could not renew; renew_error: timed out; renewals: 2")}


def test_the_gap_across_a_moment_is_the_longest_that_overlaps_it():
    runs = [{"start": 0.0, "end": 4.0}, {"start": 6.0, "end": 10.0}, {"start": 13.0, "end": 17.0}]
    gaps = [(after["start"] - before["end"], before, after) for before, after in zip(runs, runs[1:])]
    assert ledger.longest_gap_across(gaps, 5.0, 5.5) == 2.0
    assert ledger.longest_gap_across(gaps, 3.0, 12.0) == 3.0
    assert ledger.longest_gap_across(gaps, 7.0, 9.0) == 0.0  # a run held the lock throughout


def test_a_killed_job_ends_when_its_runner_saw_it_end_not_when_the_runner_logged():
    """The runner logs after its release and history writes, seconds later on
    a slow backend: a job killed before it wrote its end ends where the
    runner's job_ended_ms says, and a run granted meanwhile does not overlap it."""
    killed = {"owner": "n2:1", "fence": 178, "run_id": "faults@2026-11-29T16:12:12Z", "start": 100.0}
    lines = [
        ("n2", 100.0, "LEDGER_START " + json.dumps(killed)),
        ("n2", 108.0, json.dumps({"owner": "n2:1", "fence": 178, "run_id": killed["run_id"], "result": "lock_lost",
                                  "duration_ms": 9000, "job_ended_ms": 4500})),
    ]
    run, = ledger.runs(lines)
    assert run["ended"] == "runner" and run["end"] == 103.5 and run["logged"] == 108.0
    older = {"owner": "n2:1", "fence": 178, "run_id": killed["run_id"], "result": "lock_lost", "duration_ms": 9000}
    without = [lines[0], ("n2", 108.0, json.dumps(older))]
    assert ledger.runs(without)[0]["end"] == 108.0  # an older runner: when it logged, the bound it can give
