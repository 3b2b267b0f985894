"""dlock.fleet.dlock_pause through real `ansible`, against Redis and
PostgreSQL: a pause made, kept, replaced and ended as the task says, with
check mode and diff; a job and a group looked up in dlock_jobs_list; the
runs going on drained; bad values refused before anything is written."""

from __future__ import annotations

import calendar
import datetime
import json
import os
import re
import stat
import time
from pathlib import Path

import pytest
import yaml

from ansible_cli import ROOT, Ansible

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import (
    PAUSE_LOG_KEEP, group_scope, job_scope, open_backend, pause_scopes)
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.validate import PAUSE_LOG_KEY, shown

import servers

REASON = "CHG-118: ledger migration"
OTHER = "node9:4242:feedface"


def jobs_list(key):
    return {"dlock_jobs_list": [
        {"name": "billing", "key": key, "groups": ["ledger"], "command": ["true"], "schedule": "hourly"},
        {"name": "report", "key": key + "-report", "command": ["true"], "schedule": "hourly"},
        {"name": "gone", "state": "absent"}]}


def an_hour_ahead():
    """A UTC moment about an hour ahead, as --until and `until` write it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(time.time()) + 3600))


def test_a_job_is_paused_once_kept_and_resumed(ansible, engine, unique_key):
    until = an_hour_ahead()
    args = {"job": "billing", "reason": REASON, "until": until}
    rc, result, out = ansible.module("dlock_pause", args, "--diff", extra_vars=jobs_list(unique_key))
    assert rc == 0 and result["changed"] is True, out
    assert result["scope"] == job_scope(unique_key) and result["previous"] is None
    paused = result["paused"]
    assert (paused["reason"], paused["until_utc"]) == (REASON, until)
    assert abs(paused["until"] - calendar.timegm(time.strptime(until, "%Y-%m-%dT%H:%M:%SZ"))) <= 2
    assert "+paused until %s" % until in out and "-not paused" in out  # the diff
    refused = engine.acquire(unique_key, OTHER, 10, None, pause_scopes(unique_key))
    assert refused.status == "paused" and refused.pause.reason == REASON
    # The same task again: the same pause, nothing changed.
    rc, result, out = ansible.module("dlock_pause", args, extra_vars=jobs_list(unique_key))
    assert rc == 0 and result["changed"] is False and result["msg"].startswith("already paused"), out
    # Another reason replaces it.
    rc, result, out = ansible.module("dlock_pause", dict(args, reason="CHG-119"), extra_vars=jobs_list(unique_key))
    assert rc == 0 and result["changed"] is True and result["previous"]["reason"] == REASON, out
    rc, result, out = ansible.module("dlock_pause", {"job": "billing", "state": "resumed"}, "--diff",
                                     extra_vars=jobs_list(unique_key))
    assert rc == 0 and result["changed"] is True and result["paused"] is None, out
    assert "+not paused" in out
    assert engine.acquire(unique_key, OTHER, 10, None, pause_scopes(unique_key)).granted
    rc, result, out = ansible.module("dlock_pause", {"job": "billing", "state": "resumed"},
                                     extra_vars=jobs_list(unique_key))
    assert rc == 0 and result["changed"] is False and "was not paused" in result["msg"], out
    # The pause log (base.log_pause) holds what changed, newest first: the unchanged task wrote nothing.
    logged = [(entry["result"], entry.get("reason")) for entry in engine.read_history(PAUSE_LOG_KEY, PAUSE_LOG_KEEP)
              if entry.get("scope") == job_scope(unique_key)]
    assert logged == [("resumed", None), ("paused", "CHG-119"), ("paused", REASON)]


def test_check_mode_says_what_it_would_do_and_writes_nothing(ansible, engine, unique_key):
    group = "g-" + unique_key[-6:]
    extra = {"dlock_jobs_list": [{"name": "billing", "key": unique_key, "groups": [group]}]}
    rc, result, out = ansible.module("dlock_pause", {"group": group, "reason": REASON, "until": "2h"}, "--check",
                                     "--diff", extra_vars=extra)
    assert rc == 0 and result["changed"] is True and result["msg"].startswith("would pause group:"), out
    assert 7100 < result["paused"]["until"] - time.time() < 7300
    assert engine.read_pauses([group_scope(group)]) == []
    assert engine.acquire(unique_key, OTHER, 10, None, pause_scopes(unique_key, [group])).granted
    assert not [entry for entry in engine.read_history(PAUSE_LOG_KEY, PAUSE_LOG_KEEP)
                if entry.get("scope") == group_scope(group)]


def test_drain_kill_breaks_the_locks_of_the_group_s_runs(ansible, engine, unique_key):
    """The pause, then the lock of each run going on of a job in the group
    broken; a job outside the group keeps its run."""
    engine.acquire(unique_key, OTHER, 60)
    engine.acquire(unique_key + "-report", OTHER, 60)
    try:
        rc, result, out = ansible.module("dlock_pause", {"group": "ledger", "reason": REASON, "until": "1h",
                                                         "drain": "kill"}, extra_vars=jobs_list(unique_key))
        assert rc == 0 and result["changed"] is True, out
        assert [(row["key"], row["previous_owner"]) for row in result["drained"]] == [(unique_key, OTHER)]
        assert engine.query(unique_key).owner is None and engine.query(unique_key + "-report").owner == OTHER
        assert engine.renew(unique_key, OTHER, 60) is False  # the runner's next renewal: it kills its job
    finally:
        engine.resume(group_scope("ledger"))
        engine.release(unique_key + "-report", OTHER)


def test_a_play_on_the_nodes_pauses_once_and_mirrors_on_each(ansible, engine, unique_key):
    """On two hosts at once: one makes the pause in the backend (its `2h`
    one end for the fleet), each writes the same record to its mirror; the
    resume ends it once and removes both mirrors."""
    group = "g-" + unique_key[-6:]
    jobs = [{"name": "billing", "key": unique_key, "groups": [group]}]
    pause = {"dlock.fleet.dlock_pause": {"group": group, "reason": REASON, "until": "2h"}, "vars": {
        "dlock_jobs_list": jobs}}
    results, out = ansible.play_on_lockers([pause], "--diff")
    assert sorted(result["made_here"] for result in results.values()) == [False, True], out
    assert all(result["changed"] and result["mirror"]["changed"] for result in results.values()), out
    live = engine.read_pauses([group_scope(group)])
    assert [(pause.reason, results["h1"]["paused"]["until"]) for pause in live] == [(REASON, live[0].until)]
    mirrors = [ansible.pauses / host / ("group:%s.pause" % group) for host in ("h1", "h2")]
    assert json.loads(mirrors[0].read_text()) == json.loads(live[0].as_record()) == json.loads(mirrors[1].read_text())
    assert "/group:%s.pause" % group in out  # the mirror's diff

    # Again, in check mode: the same group, a new end (2h from now): would replace, writes nothing.
    results, out = ansible.play_on_lockers([pause], "--check")
    assert all(result["changed"] for result in results.values()), out
    assert engine.read_pauses([group_scope(group)])[0].until == live[0].until

    resume = {"dlock.fleet.dlock_pause": {"group": group, "state": "resumed"}, "vars": {"dlock_jobs_list": jobs}}
    results, out = ansible.play_on_lockers([resume])
    assert sorted(result["made_here"] for result in results.values()) == [False, True], out
    assert all(result["changed"] and result["paused"] is None for result in results.values()), out
    assert engine.read_pauses([group_scope(group)]) == [] and not any(path.exists() for path in mirrors)
    results, out = ansible.play_on_lockers([resume])
    assert not any(result["changed"] for result in results.values()), out


def test_the_pause_and_resume_runbooks_on_the_nodes(ansible, engine, unique_key):
    """playbooks/pause.yml and resume.yml as an operator runs them: on the job
    nodes (here the group lockers), made once, mirrored on each, ended."""
    group = "g-" + unique_key[-6:]
    extra = {"dlock_hosts": "lockers", "dlock_group": group, "dlock_reason": REASON, "dlock_until": "2h",
             "dlock_jobs_list": [{"name": "billing", "key": unique_key, "groups": [group]}]}
    paused = ansible.playbook(os.path.join(ROOT, "playbooks", "pause.yml"), extra)
    assert paused.returncode == 0 and paused.stdout.count("changed=1") == 2, paused.stdout
    assert "paused group:%s until" % group in paused.stdout
    assert [pause.reason for pause in engine.read_pauses([group_scope(group)])] == [REASON]
    mirrors = [ansible.pauses / host / ("group:%s.pause" % group) for host in ("h1", "h2")]
    assert all(path.exists() for path in mirrors)
    resumed = ansible.playbook(os.path.join(ROOT, "playbooks", "resume.yml"), extra)
    assert resumed.returncode == 0 and resumed.stdout.count("changed=1") == 2, resumed.stdout
    assert engine.read_pauses([group_scope(group)]) == [] and not any(path.exists() for path in mirrors)
    missing = ansible.playbook(os.path.join(ROOT, "playbooks", "pause.yml"), dict(extra, dlock_reason=""))
    assert missing.returncode != 0 and "reason" in missing.stdout and not engine.read_pauses([group_scope(group)])


def test_a_moment_pause_run_again_changes_nothing_on_any_node(ansible, engine, unique_key):
    pause = {"dlock.fleet.dlock_pause": {"key": unique_key, "reason": REASON, "until": an_hour_ahead()}}
    ansible.play_on_lockers([pause])
    results, out = ansible.play_on_lockers([pause])
    assert not any(result["changed"] for result in results.values()), out
    engine.resume(job_scope(unique_key))


def test_drain_kill_of_a_flock_fails_naming_it_with_the_pause_made(tmp_path, unique_key):
    """A file:// lock is a flock no other process can break: the task fails,
    naming the run it could not drain, and the pause stands."""
    url = "file://" + str(tmp_path / "locks")
    (tmp_path / "locks").mkdir()
    holder = open_backend(url)
    try:
        assert holder.acquire(unique_key, OTHER, 60).granted  # this process holds the flock
        ansible = Ansible(tmp_path, {"url": url})
        rc, result, out = ansible.module("dlock_pause", {"key": unique_key, "reason": REASON, "until": "1h",
                                                         "drain": "kill"})
        assert rc != 0 and "%s is paused, but its run going on was not drained" % unique_key in result["msg"], out
        assert [pause.reason for pause in holder.read_pauses([job_scope(unique_key)])] == [REASON]
        assert holder.query(unique_key).owner == OTHER
    finally:
        holder.close()


@pytest.fixture(scope="module")
def on_redis(redis_server, tmp_path_factory):
    """(an Ansible, an engine client) on Redis: what is refused before the
    backend is asked is the same on every backend."""
    backend = open_backend(redis_server.url)
    yield Ansible(tmp_path_factory.mktemp("pause"), {"url": redis_server.url, "op_timeout": 1}), backend
    backend.close()


@pytest.mark.parametrize("args, message", [
    ({"job": "biling", "reason": REASON, "until": "1h"}, "job: biling is not a job of dlock_jobs_list"),
    ({"job": "gone", "reason": REASON, "until": "1h"}, "job: gone is not a job of dlock_jobs_list"),
    ({"group": "legder", "reason": REASON, "until": "1h"}, "group: no job of dlock_jobs_list on this host is in "
                                                           "group legder"),
    ({"key": "k", "group": "ledger", "reason": REASON, "until": "1h"}, "one of job, key, group or all=true "
                                                                       "(given: key, group)"),
    ({"reason": REASON, "until": "1h"}, "one of job, key, group or all=true (none given)"),
    ({"key": "k", "reason": "line\nbreak", "until": "1h"}, "reason: 'line\\nbreak' holds a control character"),
    ({"key": "k", "reason": "   ", "until": "1h"}, "reason: must say why"),
    ({"key": "k", "reason": REASON, "until": "NaN"}, "until: 'NaN' is not a duration"),
    ({"key": "k", "reason": REASON, "until": "1e308"}, "until: '1e308' is not a duration"),
    ({"key": "k", "reason": REASON, "until": "31d"}, "until: '31d' is above the maximum of 30d"),
    ({"key": "k", "reason": REASON, "until": "2020-01-01T00:00:00Z"}, "is not in the future on the backend's clock"),
    ({"key": "k", "reason": REASON}, "state=paused needs reason"),
    ({"key": "k\x00", "reason": REASON, "until": "1h"}, "key: 'k\\x00' holds a control character"),
    ({"group": "a/b", "reason": REASON, "until": "1h"}, "group: 'a/b' is not a valid group name"),
    ({"key": "k", "state": "resumed", "until": "1h"}, "until and drain: only apply to state=paused"),
])
def test_bad_values_are_refused_and_nothing_is_paused(on_redis, unique_key, args, message):
    ansible, engine = on_redis
    rc, result, out = ansible.module("dlock_pause", args, extra_vars=jobs_list(unique_key))
    assert rc != 0 and "FAILED!" in out and message in result["msg"], out
    assert engine.read_pauses([job_scope("k"), job_scope(unique_key), group_scope("ledger")]) == []


# pauses_dir and mirror: refused before the backend is asked, so no pause is
# left there without its mirror (nor a mirror file written). @FIFO@ and @FILE@
# stand for a FIFO and a regular file of the test's own: a mirror directory
# that is not one (stat on the host, which opens neither, says so). A message
# quotes such a path as the validation core shows any value (shown: cut to
# 60 characters), so the expectation does too: the pytest directory's length
# varies.
@pytest.mark.parametrize("args, message", [
    ({"pauses_dir": "var/lib/dlock/pauses"}, "pauses_dir (or dlock_runner_pauses_dir): 'var/lib/dlock/pauses' must "
                                             "be an absolute path"),
    ({"pauses_dir": "/var/lib/dlock\npauses"}, "pauses_dir (or dlock_runner_pauses_dir): '/var/lib/dlock\\npauses' "
                                               "holds a control character"),
    ({"pauses_dir": ["/var/lib/dlock/pauses"]}, "pauses_dir (or dlock_runner_pauses_dir): ['/var/lib/dlock/pauses'] "
                                                "must be a string"),
    ({"pauses_dir": "@FIFO@"}, "pauses_dir (or dlock_runner_pauses_dir): '@FIFO@' is not a directory on this host"),
    ({"pauses_dir": "@FILE@"}, "pauses_dir (or dlock_runner_pauses_dir): '@FILE@' is not a directory on this host"),
    ({"pauses_dir": "@FILE@/pauses"}, "pauses_dir (or dlock_runner_pauses_dir): '@FILE@/pauses' cannot be looked "
                                      "at on this host: Not a directory"),
    ({"pauses_dir": ""}, "pauses_dir (or dlock_runner_pauses_dir): must not be empty"),
    ({"mirror": "maybe"}, "argument 'mirror' is of type str and we were unable to convert to bool: "
                          "The value 'maybe' is not a valid boolean"),
    ({"mirror": ["true"]}, "argument 'mirror' is of type list and we were unable to convert to bool"),
    ({"mirror": 2}, "argument 'mirror' is of type int and we were unable to convert to bool: The "
                    "value '2' is not a valid boolean"),
], ids=["pauses_dir relative", "pauses_dir newline", "pauses_dir list", "pauses_dir FIFO", "pauses_dir regular file",
        "pauses_dir under a regular file", "pauses_dir empty", "mirror maybe", "mirror list", "mirror 2"])
def test_bad_mirror_values_are_refused_and_nothing_is_written(on_redis, unique_key, args, message):
    ansible, engine = on_redis
    fifo, plain = ansible.dir / "not-a-dir.fifo", ansible.dir / "not-a-dir.txt"
    if not fifo.exists():
        os.mkfifo(str(fifo))
        plain.write_text("a file, not a directory\n")

    def placed(text):
        return text.replace("@FIFO@", str(fifo)).replace("@FILE@", str(plain)) if isinstance(text, str) else text

    args = dict((name, placed(value)) for name, value in dict(
        {"key": unique_key, "reason": REASON, "until": "1h"}, **args).items())
    message = re.sub(r"'(@(?:FIFO|FILE)@[^']*)'", lambda quoted: shown(placed(quoted.group(1))), message)
    rc, result, out = ansible.module("dlock_pause", args, extra_vars=jobs_list(unique_key))
    assert rc != 0 and "FAILED!" in out and message in result["msg"], out
    assert "Traceback" not in out, out
    assert engine.read_pauses([job_scope(unique_key)]) == []
    mirrors = [ansible.pauses / "localhost", ansible.dir / "var", Path.cwd() / "var"]
    assert not any(path.exists() and any(path.rglob("*%s*" % unique_key)) for path in mirrors), out
    assert stat.S_ISFIFO(fifo.stat().st_mode) and plain.read_text() == "a file, not a directory\n"


def test_a_jobs_list_of_the_wrong_shape_is_named(on_redis):
    ansible = on_redis[0]
    for jobs, message in (("billing", "dlock_jobs_list: 'billing' must be a list"),
                          (["billing"], "dlock_jobs_list[0]: 'billing' must be a mapping"),
                          ([{"name": "billing", "groups": "ledger"}], "dlock_jobs_list[0]: groups: 'ledger' must be "
                                                                      "a list of group names")):
        rc, result, out = ansible.module("dlock_pause", {"job": "billing", "reason": REASON, "until": "1h"},
                                         extra_vars={"dlock_jobs_list": jobs})
        assert rc != 0 and message in result["msg"], out


def test_the_module_s_examples_run_as_written(tmp_path):
    """The EXAMPLES of plugins/modules/dlock_pause.py, in order, in one
    playbook, on a Redis of its own (one pauses every lock); only an
    absolute `until` is moved to an hour ahead (the one written will pass),
    and stays what YAML makes of it unquoted, a timestamp."""
    from ansible_collections.dlock.fleet.plugins.modules import dlock_pause
    tasks = yaml.safe_load(dlock_pause.EXAMPLES)
    moments = 0
    for task in tasks:
        options = task["dlock.fleet.dlock_pause"]
        if isinstance(options.get("until"), datetime.datetime):
            options["until"] = datetime.datetime.fromtimestamp(int(time.time()) + 3600, datetime.timezone.utc)
            moments += 1
    assert moments == 1
    server = servers.RedisServer()
    engine = open_backend(server.url)
    try:
        ansible = Ansible(tmp_path, {"url": server.url})
        playbook = tmp_path / "examples.yml"
        playbook.write_text(yaml.safe_dump([{
            "hosts": "localhost", "gather_facts": False,
            "vars": {"dlock_jobs_list": [{"name": "nightly-report", "groups": ["reports"]},
                                         {"name": "invoices", "groups": ["billing"]}]},
            "tasks": tasks}]))
        run = ansible.playbook(str(playbook))
        assert run.returncode == 0, run.stdout + run.stderr
        assert "changed=4" in run.stdout, run.stdout
        live = dict((pause.scope, pause.reason) for pause in engine.read_pauses(
            [job_scope("nightly-report"), group_scope("billing"), "all"]))
        assert live == {"group:billing": "CHG-118: ledger migration", "all": "DC failover drill"}
        # localhost's mirror: the resumed job's pause removed, the last one not mirrored (mirror: false)
        assert sorted(path.name for path in (ansible.pauses / "localhost").iterdir()) == ["group:billing.pause"]
    finally:
        engine.close()
        server.stop()
