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
