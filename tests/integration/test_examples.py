"""The examples, run for real: each one does what it says.

- The module's EXAMPLES (plugins/modules/dlock.py), task by task as written
  (only the backend's address and the password file's path are the test's),
  against a private redis-server and the test PostgreSQL. "Skip the rest of
  the play when another run holds the lock": two concurrent ansible-playbook
  runs, the protected task runs exactly once.
- examples/: the lock playbooks against Redis, the ad-hoc shell snippet, the
  site inventory (the groups site.yml uses) and the roles playbook (syntax).

Synchronisation is by files the runs write and wait for, never by sleeping.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from ansible_cli import BIN, ROOT, ansible_env

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import open_backend
from ansible_collections.dlock.fleet.plugins.modules import dlock as module

OTHER = "node9:4242:0123456789abcdef01234567"
EXAMPLES = os.path.join(ROOT, "examples")
TASKS = dict((task["name"], task) for task in yaml.safe_load(module.EXAMPLES))
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}


def example(name, **replace):
    """A task of the module's EXAMPLES, with some of its dlock options replaced."""
    task = copy.deepcopy(TASKS[name])
    for option, value in replace.items():
        assert option in task["dlock.fleet.dlock"], (name, option)
        task["dlock.fleet.dlock"][option] = value
    return task


def dump(variable, path):
    """A task writing a registered result to a file, for the test to read."""
    return {"name": "Keep %s for the test" % variable,
            "ansible.builtin.copy": {"content": "{{ %s | to_json }}" % variable, "dest": str(path),
                                     "mode": "0600"}}


def query(key, register):
    return {"name": "Look at %s" % key, "dlock.fleet.dlock": {"key": key, "state": "query"}, "register": register}


def wait_until(predicate, timeout=60, step=0.05):
    """Poll for a condition that another process makes true (bounded)."""
    give_up = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < give_up, "timed out"
        time.sleep(step)


class Runs(object):
    """ansible-playbook runs of generated or shipped playbooks, local hosts, one backend."""

    def __init__(self, tmp_path, backend_url, hosts=("localhost",)):
        self.dir = tmp_path
        self.inventory = tmp_path / "inventory.yml"
        self.inventory.write_text(yaml.safe_dump({"all": {
            "hosts": dict((host, dict(LOCAL)) for host in hosts),
            "vars": {"dlock_backend": {"url": backend_url, "op_timeout": 1}}}}))
        self.count = 0

    def play(self, tasks, hosts="localhost"):
        self.count += 1
        path = self.dir / ("play%d.yml" % self.count)
        path.write_text(yaml.safe_dump([{"name": "Example", "hosts": hosts, "gather_facts": False,
                                         "tasks": tasks}], sort_keys=False))
        return str(path)

    def argv(self, playbook, *options):
        return [os.path.join(BIN, "ansible-playbook"), "-i", str(self.inventory), playbook] + list(options)

    def run(self, playbook, *options):
        return subprocess.run(self.argv(playbook, *options), env=ansible_env(), capture_output=True, text=True,
                              timeout=180, check=False)

    def start(self, playbook, *options):
        return subprocess.Popen(self.argv(playbook, *options), env=ansible_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)


def ok(proc):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def read_json(path):
    with open(str(path)) as handle:
        return json.load(handle)


@pytest.fixture
def redis_url(own_redis):
    return own_redis.url


@pytest.fixture
def engine(redis_url):
    backend = open_backend(redis_url)
    yield backend
    backend.close()


# -- the module's EXAMPLES --------------------------------------------------------------------
def test_examples_query_and_break_a_stale_lock(tmp_path, redis_url, engine):
    other = engine.acquire("nightly-report", OTHER, 600)
    runs = Runs(tmp_path, redis_url)
    broke = example("Break a stale lock, saying why", backend_url=redis_url)
    broke["register"] = "broken"
    tasks = [example("Show who holds the nightly-report lock", backend_url=redis_url),
             dump("lock", tmp_path / "lock.json"), broke, dump("broken", tmp_path / "broken.json")]
    out = ok(runs.run(runs.play(tasks), "--diff"))
    lock = read_json(tmp_path / "lock.json")
    assert lock["holder"]["held"] is True and lock["holder"]["owner"] == OTHER
    assert lock["holder"]["fence"] == other.fence and lock["acquired"] is False
    msg = read_json(tmp_path / "broken.json")["msg"]
    assert msg.startswith("broke the lock of nightly-report held by %s" % OTHER) and "reason: holder crashed" in msg
    assert "-owner: %s" % OTHER in out  # the diff
    assert engine.query("nightly-report").owner is None


def test_examples_the_last_runs_and_a_check_on_them(tmp_path, redis_url, engine):
    """As written: the history query, and the assert that fails on a failed run, naming it."""
    for result, run_id in (("success", "nightly-report@2026-11-28T02:00:00Z"),
                           ("success", "nightly-report@2026-11-29T02:00:00Z")):
        engine.add_history("nightly-report", {"result": result, "run_id": run_id, "host": "node1"}, 50)
    runs = Runs(tmp_path, redis_url)
    tasks = [TASKS["The last ten runs of nightly-report on every node, newest first"],
             dump("report_runs", tmp_path / "runs.json"), TASKS["Fail when one of them failed"]]
    playbook = runs.play(tasks)
    ok(runs.run(playbook))
    assert [entry["run_id"] for entry in read_json(tmp_path / "runs.json")["history"]] == [
        "nightly-report@2026-11-29T02:00:00Z", "nightly-report@2026-11-28T02:00:00Z"]
    engine.add_history("nightly-report", {"result": "failed", "run_id": "nightly-report@2026-11-30T02:00:00Z"}, 50)
    failed = runs.run(playbook)
    assert failed.returncode == 2 and "nightly-report@2026-11-30T02:00:00Z" in failed.stdout, failed.stdout


def grant_attempts(server):
    """Lua calls the server has run: every grant attempt is one."""
    return server.client().info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)


def test_examples_lock_around_a_migration(tmp_path, own_redis, engine):
    runs = Runs(tmp_path, own_redis.url, hosts=("h1", "h2"))
    take = example("Take the lock for a schema migration, waiting up to 10 minutes for another run")
    take["register"] = "taken"
    release = example("Release it when the migration is done (same playbook run, same owner)")
    tasks = [take, query("schema-migration", "during"), dump("during", tmp_path / "during.json"),
             dump("taken", tmp_path / "taken.json"), release]
    # Another holder, released once the run has tried and is waiting for it.
    engine.acquire("schema-migration", OTHER, 600)
    before = grant_attempts(own_redis)
    proc = runs.start(runs.play(tasks, hosts="all"))
    wait_until(lambda: grant_attempts(own_redis) > before or proc.poll() is not None)
    assert proc.poll() is None, proc.communicate()[0]
    engine.release("schema-migration", OTHER)
    out = proc.communicate(timeout=180)[0]
    assert proc.returncode == 0, out
    during, taken = read_json(tmp_path / "during.json"), read_json(tmp_path / "taken.json")
    assert taken["acquired"] is True and taken["waited"] > 0, taken
    assert during["acquired"] is True and during["holder"]["ttl_remaining"] > 14 * 60, during
    assert engine.query("schema-migration").owner is None  # released by the later task


def test_examples_hold_for_the_rest_of_the_run(tmp_path, redis_url, engine):
    runs = Runs(tmp_path, redis_url)
    tasks = [example("Hold a lock for the rest of this playbook run"), query("deploy-web", "during"),
             dump("during", tmp_path / "during.json")]
    ok(runs.run(runs.play(tasks)))
    during = read_json(tmp_path / "during.json")
    assert during["acquired"] is True and during["holder"]["held"] is True
    # No task released it: the renewer does when ansible-playbook ends.
    wait_until(lambda: engine.query("deploy-web").owner is None, timeout=5)


def test_examples_skip_when_held_two_concurrent_runs_protected_task_once(tmp_path, redis_url, engine):
    runs = Runs(tmp_path, redis_url)
    ledger, go = tmp_path / "ledger", tmp_path / "go"
    protected = [
        {"name": "The protected task", "ansible.builtin.shell": "echo \"{{ run_name }}\" >> %s" % ledger,
         "changed_when": True},
        {"name": "Stay in the protected part until the test says go",
         "ansible.builtin.wait_for": {"path": str(go), "timeout": 120}},
    ]
    tasks = [TASKS["Take the lock for the rest of the run, unless another run holds it"],
             TASKS["Skip the rest of the play when another run holds the lock"]] + protected
    playbook = runs.play(tasks)
    first = runs.start(playbook, "-e", "run_name=A")
    wait_until(lambda: ledger.exists() and first.poll() is None)
    second = runs.start(playbook, "-e", "run_name=B")
    out_b = second.communicate(timeout=180)[0]
    go.write_text("go")
    out_a = first.communicate(timeout=180)[0]
    assert first.returncode == 0, out_a
    assert second.returncode == 0, out_b  # skipping is not a failure
    assert ledger.read_text().split() == ["A"], (out_a, out_b)
    assert "The protected task" not in out_b and "TASK [Take the lock" in out_b
    # Not a skip that always happens: alone, a run does the protected task.
    wait_until(lambda: engine.query("deploy-web").owner is None, timeout=5)
    ok(runs.run(playbook, "-e", "run_name=C"))
    assert ledger.read_text().split() == ["A", "C"]


def test_examples_skip_when_held_still_fails_when_the_backend_is_down(tmp_path):
    runs = Runs(tmp_path, "redis://127.0.0.1:9/0")  # the discard port: nothing listens
    tasks = [TASKS["Take the lock for the rest of the run, unless another run holds it"],
             TASKS["Skip the rest of the play when another run holds the lock"],
             {"name": "The protected task", "ansible.builtin.file": {"path": str(tmp_path / "ran"),
                                                                     "state": "touch", "mode": "0600"}}]
    proc = runs.run(runs.play(tasks))
    assert proc.returncode != 0, proc.stdout
    assert not (tmp_path / "ran").exists()


def test_examples_lock_on_the_target_with_a_password_file(tmp_path, pg_server):
    pg_server.sql("GRANT ALL ON ALL TABLES IN SCHEMA public TO locker", db="dlock")
    password_file = tmp_path / "backend.password"
    password_file.write_text(pg_server.password + "\n")
    url = pg_server.url(user="locker")
    runs = Runs(tmp_path, pg_server.url())
    task = example("Run the lock operation on the target, with a password file there",
                   backend_url=url, backend_password_file=str(password_file))
    task["register"] = "backup_lock"
    ok(runs.run(runs.play([task, dump("backup_lock", tmp_path / "lock.json")])))
    lock = read_json(tmp_path / "lock.json")
    assert lock["acquired"] is True and lock["holder"]["key"] == "backup-localhost"
    engine = open_backend(pg_server.url())
    try:
        holder = engine.query("backup-localhost")
        assert holder.owner == lock["owner"] and holder.fence == lock["fence"]
        engine.release("backup-localhost", holder.owner)
    finally:
        engine.close()


def test_every_module_example_is_run_here():
    source = open(__file__).read()
    for name in TASKS:
        assert repr(name) in source or json.dumps(name) in source, "not run by a test: %s" % name


# -- examples/ ----------------------------------------------------------------------------------
def test_example_lock_section_and_hold(tmp_path, redis_url, engine):
    runs = Runs(tmp_path, redis_url)
    out = ok(runs.run(os.path.join(EXAMPLES, "lock_section.yml")))
    assert "migrating with fencing token 1" in out
    assert engine.query("schema-migration").owner is None
    out = ok(runs.run(os.path.join(EXAMPLES, "hold.yml")))
    assert "deploying under fencing token 1" in out
    wait_until(lambda: engine.query("deploy-web").owner is None, timeout=5)


def test_example_skip_when_held(tmp_path, redis_url, engine):
    runs = Runs(tmp_path, redis_url)
    engine.acquire("deploy-web", OTHER, 600)
    out = ok(runs.run(os.path.join(EXAMPLES, "skip_when_held.yml")))
    assert "deploy-web is held by %s" % OTHER in out and "deploying under" not in out
    engine.release("deploy-web", OTHER)
    out = ok(runs.run(os.path.join(EXAMPLES, "skip_when_held.yml")))
    assert "deploying under fencing token 2" in out


def test_example_adhoc_snippet(tmp_path, redis_url, engine):
    Runs(tmp_path, redis_url)
    engine.acquire("nightly-report", OTHER, 600)
    env = ansible_env({"PATH": BIN + os.pathsep + os.environ.get("PATH", "")})
    proc = subprocess.run(["sh", os.path.join(EXAMPLES, "adhoc.sh"), str(tmp_path / "inventory.yml"),
                           "nightly-report"], env=env, capture_output=True, text=True, timeout=180, check=False)
    out = ok(proc)
    assert "nightly-report is held by %s" % OTHER in out
    assert out.count("broke the lock of nightly-report held by %s" % OTHER) == 1  # --check says "would"
    assert "nightly-report is free" in out or "not held" in out or '"held": false' in out, out
    assert engine.query("nightly-report").owner is None


def test_example_site_inventory_has_the_groups_site_yml_uses(tmp_path):
    inventory = os.path.join(EXAMPLES, "site", "inventory.yml")
    out = subprocess.run([os.path.join(BIN, "ansible-inventory"), "-i", inventory, "--list"], env=ansible_env(),
                         capture_output=True, text=True, timeout=60, check=False)
    data = json.loads(ok(out))
    assert data["dlock_backend"]["hosts"] and len(data["dlock_nodes"]["hosts"]) == 3
    hostvars = data["_meta"]["hostvars"]["worker1"]
    assert hostvars["dlock_backend_type"] == "redis" and hostvars["dlock_jobs_list"][0]["name"] == "nightly-report"
    check = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", inventory, "dlock.fleet.site",
                            "--syntax-check"], env=ansible_env(), capture_output=True, text=True, timeout=60,
                           check=False)
    ok(check)


def test_example_roles_in_playbook_parses(tmp_path):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"workers": {"hosts": {"w1": dict(LOCAL)}}}))
    check = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(inventory),
                            os.path.join(EXAMPLES, "roles_in_playbook.yml"), "--syntax-check"], env=ansible_env(),
                           capture_output=True, text=True, timeout=60, check=False)
    ok(check)
