"""dlock.fleet.dlock_run_now through real ansible-playbook on two hosts at
once (h1, h2: local connections), each running the checkout's runner as its
`dlock` command, against Redis and PostgreSQL: one run of the task runs the
job once, on one of them; an id given makes it once across runs of the
playbook; a pause, check mode, a typo and a failing job each say so."""

from __future__ import annotations

import json
import os
import stat
import sys
import time

import pytest
import yaml

from ansible_cli import ROOT
from runner_proc import MODULE_UTILS

from ansible_collections.dlock.fleet.plugins.modules import dlock_run_now

REASON = "INC-4211: rebuild the report"


@pytest.fixture
def fleet(ansible, lease_url, unique_key, tmp_path):
    """The nodes' files: a job `billing` (its key the test's) that appends
    the host it ran on to a ledger, and a `dlock` command for the hosts (the
    checkout's runner with this backend, jobs and pauses directories)."""
    jobs, pauses = tmp_path / "jobs", tmp_path / "pauses-node"
    jobs.mkdir()
    pauses.mkdir()
    ledger = tmp_path / "ledger"
    script = "import sys; open(sys.argv[1], 'a').write('ran\\n'); sys.exit(int(sys.argv[2]))"
    write_job(jobs, unique_key, ledger, script, 0)
    command = tmp_path / "dlock"
    flags = ["--backend", lease_url, "--jobs-dir", str(jobs), "--pauses-dir", str(pauses)]
    command.write_text("#!%s\nimport sys\nsys.path.insert(0, %r)\nsys.argv = ['dlock', sys.argv[1]] + %r + sys.argv[2:]\n"
                       "from dlock.cli import main\nraise SystemExit(main())\n" % (sys.executable, MODULE_UTILS, flags))
    command.chmod(command.stat().st_mode | stat.S_IXUSR)
    return {"bin": str(command), "ledger": ledger, "jobs": jobs, "pauses": pauses, "script": script, "key": unique_key}


def write_job(jobs, key, ledger, script, status):
    (jobs / "billing.json").write_text(json.dumps({"command": [sys.executable, "-c", script, str(ledger), str(status)],
                                                   "key": key}))


def task(fleet, **options):
    return {"dlock.fleet.dlock_run_now": dict({"job": "billing", "dlock_bin": fleet["bin"]}, **options),
            "vars": {"dlock_jobs_list": [{"name": "billing", "key": fleet["key"]}]}}


def ran(fleet):
    return fleet["ledger"].read_text().count("ran") if fleet["ledger"].exists() else 0


def test_one_run_of_the_task_runs_the_job_once_on_one_host(ansible, fleet):
    results, out = ansible.play_on_lockers([task(fleet, reason=REASON)])
    assert sorted(result["ran"] for result in results.values()) == [False, True], out
    assert ran(fleet) == 1
    winner = [result for result in results.values() if result["ran"]][0]
    other = [result for result in results.values() if not result["ran"]][0]
    assert winner["changed"] and winner["result"] == "success" and winner["log"]["manual_reason"] == REASON
    assert winner["id"] == other["id"] and winner["run_id"] == "billing@manual:" + winner["id"]
    assert not other["changed"] and other["result"] in ("skipped_duplicate", "skipped_locked"), other
    # The playbook again: a new run of the task, a new id, one more run.
    ansible.play_on_lockers([task(fleet)])
    assert ran(fleet) == 2


def test_the_run_now_runbook_runs_it_once_on_one_node(ansible, fleet):
    """playbooks/run_now.yml as an operator runs it, on the job nodes (here
    the group lockers): once, on one of them; again with the same id, not."""
    extra = {"dlock_hosts": "lockers", "dlock_job": "billing", "dlock_reason": REASON, "dlock_id": "INC-4211",
             "dlock_runner_bin": fleet["bin"], "dlock_jobs_list": [{"name": "billing", "key": fleet["key"]}]}
    for _play in range(2):
        done = ansible.playbook(os.path.join(ROOT, "playbooks", "run_now.yml"), extra)
        assert done.returncode == 0, done.stdout
    assert ran(fleet) == 1
    refused = ansible.playbook(os.path.join(ROOT, "playbooks", "run_now.yml"), {"dlock_hosts": "lockers"})
    assert refused.returncode != 0 and "Name the job" in refused.stdout and ran(fleet) == 1


def test_an_id_given_runs_once_across_runs_of_the_playbook(ansible, fleet):
    for _play in range(2):
        results, out = ansible.play_on_lockers([task(fleet, id="CHG-118")])
    assert not any(result["ran"] or result["changed"] for result in results.values()), out
    assert all(result["result"] == "skipped_duplicate" for result in results.values()), out
    assert ran(fleet) == 1


def test_a_pause_skips_it_unless_forced(ansible, fleet, lease_url):
    from runner_proc import run_dlock
    paused = run_dlock("pause", "--key", fleet["key"], "--reason", "CHG-118", "--until", "1h", "--backend", lease_url,
                       "--pauses-dir", str(fleet["pauses"]))
    assert paused.returncode == 0, paused.stderr
    try:
        results, out = ansible.play_on_lockers([task(fleet)])
        assert all(not result["ran"] and result["result"] == "skipped_paused" for result in results.values()), out
        assert "CHG-118" in results["h1"]["msg"] and ran(fleet) == 0
        results, out = ansible.play_on_lockers([task(fleet, force=True)])
        assert all(result.get("failed") and "force: needs reason" in result["msg"] for result in results.values())
        results, out = ansible.play_on_lockers([task(fleet, force=True, reason=REASON)])
        assert sorted(result["ran"] for result in results.values()) == [False, True], out
        assert ran(fleet) == 1
    finally:
        run_dlock("resume", "--key", fleet["key"], "--backend", lease_url, "--pauses-dir", str(fleet["pauses"]))


def test_check_mode_runs_nothing(ansible, fleet):
    results, out = ansible.play_on_lockers([task(fleet)], "--check")
    assert all(result.get("skipped") and "check mode" in result["msg"] for result in results.values()), out
    assert ran(fleet) == 0


def test_a_job_that_fails_fails_the_host_that_ran_it(ansible, fleet):
    write_job(fleet["jobs"], fleet["key"], fleet["ledger"], fleet["script"], 3)
    results, out = ansible.play_on_lockers([task(fleet)])
    failed = [result for result in results.values() if result.get("failed")]
    assert len(failed) == 1 and failed[0]["ran"] and failed[0]["exit_code"] == 3, out
    assert "ran here and ended failed (exit 3)" in failed[0]["msg"] and ran(fleet) == 1


@pytest.mark.parametrize("lease_url", ["redis"], indirect=True)  # refused before any backend is asked
@pytest.mark.parametrize("options, message", [
    ({"job": "biling"}, "job: biling is not a job of dlock_jobs_list on this host"),
    ({"id": "a\nb"}, "id: 'a\\nb' holds a control character"),
    ({"id": "../x"}, "is not a valid run id"),
    ({"id": ["a"]}, "must be a string"),
    ({"reason": "   "}, "reason: must say why"),
    ({"force": "maybe"}, "force: 'maybe'"),
    ({"colour": "blue"}, "unknown option(s) 'colour'"),
])
def test_bad_values_are_refused_before_any_node_is_asked(ansible, fleet, options, message):
    results, out = ansible.play_on_lockers([task(fleet, **options)])
    assert all(result.get("failed") and message in result["msg"] for result in results.values()), out
    assert ran(fleet) == 0 and not os.path.exists(str(fleet["ledger"]))


@pytest.mark.parametrize("lease_url", ["redis"], indirect=True)
def test_the_module_s_examples_run_as_written(ansible, fleet):
    """The EXAMPLES of plugins/modules/dlock_run_now.py, in one play on both
    hosts, with their jobs on the nodes: each task runs its job once."""
    tasks = yaml.safe_load(dlock_run_now.EXAMPLES)
    names = [each["dlock.fleet.dlock_run_now"]["job"] for each in tasks]
    for name in names:
        script = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')"
        (fleet["jobs"] / (name + ".json")).write_text(json.dumps(
            {"command": [sys.executable, "-c", script, str(fleet["ledger"]), name], "key": fleet["key"] + "-" + name}))
    play = [{"hosts": "lockers", "gather_facts": False, "tasks": tasks,
             "vars": {"dlock_runner_bin": fleet["bin"], "dlock_jobs_list": [{"name": name} for name in names]}}]
    playbook = fleet["jobs"].parent / "examples.yml"
    playbook.write_text(yaml.safe_dump(play))
    run = ansible.playbook(str(playbook))
    assert run.returncode == 0, run.stdout + run.stderr
    assert sorted(fleet["ledger"].read_text().split()) == sorted(names)


@pytest.mark.parametrize("lease_url", ["redis"], indirect=True)
def test_a_long_job_runs_under_async(ansible, fleet):
    """The module's note: a job longer than a connection may stay open runs under `async`."""
    results, out = ansible.play_on_lockers([dict(task(fleet), **{"async": 60, "poll": 1})])
    assert sorted(result["ran"] for result in results.values()) == [False, True], out
    assert ran(fleet) == 1


def test_the_backfill_runbook_runs_each_past_slot_once_on_one_node(ansible, fleet):
    """playbooks/backfill.yml on the job nodes (the group lockers): the
    range's slots run once each, on one node; again, nothing runs, and
    nothing changes; a value the runner refuses fails the play, named."""
    script = "import sys; open(sys.argv[1], 'a').write('ran\\n')"
    (fleet["jobs"] / "billing.json").write_text(json.dumps({
        "command": [sys.executable, "-c", script, str(fleet["ledger"])], "key": fleet["key"], "once_per": "1d",
        "every_slot": True}))
    today = int(time.time() + 2) // 86400
    extra = {"dlock_hosts": "lockers", "dlock_job": "billing", "dlock_runner_bin": fleet["bin"],
             "dlock_from": day(today - 3), "dlock_to": day(today - 2), "dlock_reason": REASON}
    done = ansible.playbook(os.path.join(ROOT, "playbooks", "backfill.yml"), extra)
    assert done.returncode == 0 and "changed=1" in done.stdout, done.stdout
    assert "backfill billing: 2 slots: 2 success" in done.stdout and ran(fleet) == 2
    again = ansible.playbook(os.path.join(ROOT, "playbooks", "backfill.yml"), extra)
    assert again.returncode == 0 and "changed=0" in again.stdout and "2 done_before" in again.stdout, again.stdout
    assert ran(fleet) == 2
    hostile = ansible.playbook(os.path.join(ROOT, "playbooks", "backfill.yml"),
                               dict(extra, dlock_reason="INC-1\nforged: line"))
    assert hostile.returncode != 0 and "--reason" in hostile.stdout and ran(fleet) == 2, hostile.stdout
    refused = ansible.playbook(os.path.join(ROOT, "playbooks", "backfill.yml"), {"dlock_hosts": "lockers"})
    assert refused.returncode != 0 and "Name the job and the range" in refused.stdout


def day(number):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(number * 86400))
