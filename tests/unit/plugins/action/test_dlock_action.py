"""The dlock action plugin: inventory defaults, one owner per run, controller or target,
secrets kept out of results, and the per-run hold files (real renewers: tests/integration)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from unittest.mock import MagicMock

import pytest

from ansible import constants as C
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

from ansible_collections.dlock.fleet.plugins.action import dlock as action
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import BackendError, ConfigError

URL = "redis://10.0.0.5:6379/0"
OTHER = "node2:200:bbbb"


@pytest.fixture(autouse=True)
def run_dir(tmp_path, monkeypatch):
    """ansible-playbook's per-run local temp dir."""
    monkeypatch.setattr(C, "DEFAULT_LOCAL_TMP", str(tmp_path))
    return tmp_path


def make_action(args, check_mode=False, diff=False):
    task = MagicMock()
    task.args = args
    task.async_val = 0
    task.check_mode = check_mode
    task.diff = diff
    task.action = "dlock.fleet.dlock"
    connection = MagicMock()
    connection._shell.tmpdir = None
    return action.ActionModule(task, connection, MagicMock(), DataLoader(), Templar(loader=DataLoader()), None)


def run_task(args, task_vars=None, **kwargs):
    return make_action(args, **kwargs).run(task_vars=task_vars or {})


# -- inventory defaults -----------------------------------------------------------------
def test_backend_defaults_come_from_dlock_backend():
    merged = action.merge_backend({"key": "k", "op_timeout": 5},
                                  {"url": URL, "password": "pw", "ca_file": "/ca.pem", "op_timeout": 1})
    assert merged == {"key": "k", "backend_url": URL, "backend_password": "pw", "ca_file": "/ca.pem", "op_timeout": 5}
    assert action.merge_backend({}, URL) == {"backend_url": URL}
    assert action.merge_backend({"key": "k"}, None) == {"key": "k"}


def test_a_password_file_on_the_task_replaces_the_inventory_password():
    merged = action.merge_backend({"backend_password_file": "/pw"}, {"url": URL, "password": "pw"})
    assert merged == {"backend_url": URL, "backend_password_file": "/pw"}


@pytest.mark.parametrize("value,words", [
    ({"url": URL, "passwd": "x"}, "dlock_backend: unknown key(s) passwd"),
    (["redis://a"], "dlock_backend: must be a mapping"),
])
def test_bad_dlock_backend_is_refused(value, words):
    with pytest.raises(ConfigError) as err:
        action.merge_backend({}, value)
    assert words in str(err.value)


# -- owner ------------------------------------------------------------------------------
def test_one_owner_token_per_run(run_dir):
    first = action.run_owner(str(run_dir))
    assert re.match(r"^ansible@[^:]+:%d:[0-9a-f]{24}$" % os.getppid(), first)
    assert action.run_owner(str(run_dir)) == first
    assert sorted(os.listdir(str(run_dir))) == ["dlock-owner"]


def test_acquire_in_one_task_and_release_in_another(fake_backend):
    acquired = run_task({"key": "k", "backend_url": URL})
    assert acquired["acquired"] is True
    released = run_task({"key": "k", "backend_url": URL, "state": "released"})
    assert released["changed"] is True and released["owner"] == acquired["owner"]


# -- controller mode ----------------------------------------------------------------------
def test_runs_on_the_controller_with_inventory_defaults(fake_backend):
    result = run_task({"key": "k", "state": "query"},
                      task_vars={"dlock_backend": {"url": URL, "password": "s3cret", "op_timeout": "1s"}})
    assert result["msg"] == "k is free (fence 0)"
    assert fake_backend.opened_with == [dict(url=URL, password="s3cret", op_timeout=1.0, ca_file=None)]
    assert "s3cret" not in json.dumps(result)


def test_secrets_never_reach_the_result(fake_backend, monkeypatch, tmp_path):
    secret = tmp_path / "password"
    secret.write_text("file-s3cret\n")

    def leaky_query(key):
        raise BackendError("server said: bad password file-s3cret")
    monkeypatch.setattr(fake_backend, "query", leaky_query)
    result = run_task({"key": "k", "state": "query", "backend_password_file": str(secret)},
                      task_vars={"dlock_backend": {"url": URL}})
    assert result["failed"] is True
    assert "unreachable or failing" in result["msg"]
    assert "file-s3cret" not in json.dumps(result)
    assert fake_backend.opened_with[0]["password"] == "file-s3cret"


def test_bad_options_fail_the_task_without_raising(fake_backend):
    result = run_task({"key": "k", "backend_url": URL, "colour": "red"})
    assert result["failed"] is True and "colour" in result["msg"]
    result = run_task({"key": "k", "backend_url": URL, "state": "released", "force": True})
    assert result["failed"] is True and "reason" in result["msg"]
    assert not fake_backend.calls


def test_busy_lock_fails_with_the_holder_in_the_result(fake_backend):
    fake_backend.hold_by("k", OTHER)
    result = run_task({"key": "k", "backend_url": URL})
    assert result["failed"] is True and OTHER in result["msg"]
    assert result["holder"]["owner"] == OTHER and result["acquired"] is False


def test_check_mode_hold_says_what_would_happen(fake_backend, run_dir):
    result = run_task({"key": "k", "backend_url": URL, "hold": True}, check_mode=True)
    assert result["msg"] == "would acquire k; would hold it for the rest of the run"
    assert fake_backend.query("k").owner is None
    assert not [f for f in os.listdir(str(run_dir)) if f.endswith(".json")]


def test_hold_needs_a_renewal_interval_longer_than_op_timeout(fake_backend):
    result = run_task({"key": "k", "backend_url": URL, "hold": True, "ttl": 3, "op_timeout": 2})
    assert result["failed"] is True and "op_timeout must be at most ttl/3" in result["msg"]
    assert not fake_backend.calls


# -- target mode ------------------------------------------------------------------------
def test_run_on_target_executes_the_module_with_the_run_owner(fake_backend, monkeypatch):
    plugin = make_action({"key": "k", "run_on": "target", "backend_password_file": "/etc/dlock/pw"})
    plugin._execute_module = MagicMock(return_value={"changed": True, "acquired": True})
    result = plugin.run(task_vars={"dlock_backend": {"url": URL, "password": "inv-s3cret"}})
    assert result["acquired"] is True
    kwargs = plugin._execute_module.call_args.kwargs
    assert kwargs["module_name"] == "dlock.fleet.dlock"
    assert kwargs["module_args"] == {"key": "k", "run_on": "target", "backend_url": URL,
                                     "backend_password_file": "/etc/dlock/pw",
                                     "owner": action.run_owner(C.DEFAULT_LOCAL_TMP)}
    assert not fake_backend.calls


def test_run_on_target_refuses_hold_and_passwords_in_urls():
    plugin = make_action({"key": "k", "run_on": "target", "hold": True, "backend_url": URL})
    plugin._execute_module = MagicMock()
    assert "controller only" in plugin.run(task_vars={})["msg"]
    plugin = make_action({"key": "k", "run_on": "target", "backend_url": "redis://:pw123@h/0"})
    plugin._execute_module = MagicMock()
    result = plugin.run(task_vars={})
    assert "contains a password" in result["msg"] and "pw123" not in json.dumps(result)
    assert not plugin._execute_module.called


# -- hold files -------------------------------------------------------------------------
def fake_renewer(run_dir, key):
    """A process that looks like a renewer (dlock.hold in its command line) and its state file."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "dlock.hold", key])
    give_up = time.monotonic() + 10
    while not action._is_renewer(proc.pid):  # until its exec() shows in /proc
        assert time.monotonic() < give_up
        time.sleep(0.01)
    hold = action.RunHold(str(run_dir), key)
    with open(hold.state_file, "w") as handle:
        json.dump({"pid": proc.pid, "status": "holding", "key": key}, handle)
    return proc, hold


def test_release_stops_this_runs_renewer_first(fake_backend, run_dir):
    proc, hold = fake_renewer(run_dir, "k")
    try:
        assert hold.running()["pid"] == proc.pid
        run_task({"key": "k", "backend_url": URL})
        result = run_task({"key": "k", "backend_url": URL, "state": "released"})
        assert result["changed"] is True
        assert proc.wait(5) == -15  # SIGTERM
        assert hold.running() is None
    finally:
        proc.kill()
        proc.wait()


def test_a_lost_hold_is_reported_once(fake_backend, run_dir):
    hold = action.RunHold(str(run_dir), "k")
    with open(hold.state_file, "w") as handle:
        json.dump({"pid": 1, "status": "lost", "error": "the lease is no longer ours (expired or broken)"}, handle)
    first = run_task({"key": "k", "backend_url": URL, "state": "released"})
    assert first["warnings"] == ["the hold of k ended before this task: the lease is no longer ours (expired or broken)"]
    assert "warnings" not in run_task({"key": "k", "backend_url": URL, "state": "released"})
