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
from ansible_collections.dlock.fleet.plugins.plugin_utils import dlock_backend_options as backend_options
from ansible_collections.dlock.fleet.plugins.plugin_utils import dlock_hold_process as hold_process
from ansible_collections.dlock.fleet.plugins.plugin_utils.dlock_run_owner import run_owner

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
    merged = backend_options.merge_backend({"key": "k", "op_timeout": 5},
                                           {"url": URL, "password": "pw", "ca_file": "/ca.pem", "op_timeout": 1})
    assert merged == {"key": "k", "backend_url": URL, "backend_password": "pw", "ca_file": "/ca.pem", "op_timeout": 5}
    assert backend_options.merge_backend({}, URL) == {"backend_url": URL}
    assert backend_options.merge_backend({"key": "k"}, None) == {"key": "k"}


def test_a_password_file_on_the_task_replaces_the_inventory_password():
    merged = backend_options.merge_backend({"backend_password_file": "/pw"}, {"url": URL, "password": "pw"})
    assert merged == {"backend_url": URL, "backend_password_file": "/pw"}


@pytest.mark.parametrize("value,words", [
    ({"url": URL, "passwd": "x"}, "dlock_backend: unknown key(s) 'passwd'"),
    (["redis://a"], "dlock_backend: must be a mapping"),
    # Keys YAML makes of numbers and of nothing, beside a string one; a line break.
    ({"url": URL, 1: "x", None: "y", "pass\nword": "z"}, "dlock_backend: unknown key(s) 'pass\\nword', 1, None "),
])
def test_bad_dlock_backend_is_refused(value, words):
    with pytest.raises(ConfigError) as err:
        backend_options.merge_backend({}, value)
    assert words in str(err.value)


# -- owner ------------------------------------------------------------------------------
def test_one_owner_token_per_run(run_dir):
    first = run_owner(str(run_dir))
    assert re.match(r"^ansible@[^:]+:%d:[0-9a-f]{24}$" % os.getppid(), first)
    assert run_owner(str(run_dir)) == first
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
    assert fake_backend.opened_with == [dict(url=URL, password="s3cret", op_timeout=1.0, ca_file=None, fence_epoch=0)]
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
                                     "owner": run_owner(C.DEFAULT_LOCAL_TMP)}
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
    while not hold_process.is_renewer(proc.pid):  # until its exec() shows in /proc
        assert time.monotonic() < give_up
        time.sleep(0.01)
    hold = hold_process.RunHold(str(run_dir), key)
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
    hold = hold_process.RunHold(str(run_dir), "k")
    with open(hold.state_file, "w") as handle:
        json.dump({"pid": 1, "status": "lost", "error": "the lease is no longer ours (expired or broken)"}, handle)
    first = run_task({"key": "k", "backend_url": URL, "state": "released"})
    assert first["warnings"] == ["the hold of k ended before this task: the lease is no longer ours (expired or broken)"]
    assert "warnings" not in run_task({"key": "k", "backend_url": URL, "state": "released"})


# -- site.yml's backend record --------------------------------------------------------
def record_vars(inventory_dir, **extra):
    """task_vars of a controller task in an inventory whose backend host b1 lives in INVENTORY_DIR."""
    return dict({"groups": {"dlock_backend": ["b1"]}, "hostvars": {"b1": {"inventory_dir": str(inventory_dir)}}},
                **extra)


def write_record(inventory_dir, content):
    """site.yml's record (a dict as JSON, or TEXT as it is) in INVENTORY_DIR/credentials; its path."""
    path = inventory_dir / "credentials" / "dlock-backend.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


@pytest.fixture
def inventory_dir(tmp_path):
    path = tmp_path / "inventory"
    path.mkdir()
    return path


def test_the_record_is_found_beside_the_first_backend_hosts_inventory(inventory_dir):
    path, why = backend_options.record_path(record_vars(inventory_dir))
    assert (path, why) == (str(inventory_dir / "credentials" / "dlock-backend.json"), None)
    path, why = backend_options.record_path({"groups": {"all": ["n1"]}, "hostvars": {}})
    assert path is None and "no dlock_backend group" in why
    path, why = backend_options.record_path({"groups": {"dlock_backend": ["b1"]}, "hostvars": {"b1": {"inventory_dir": None}}})
    assert path is None and "b1, the first host of dlock_backend, comes from no inventory file" in why


def test_a_task_without_a_backend_uses_site_yml_s_record(fake_backend, inventory_dir):
    secret = inventory_dir / "credentials" / "dlock-backend.password"
    write_record(inventory_dir, {"url": URL, "password_file": str(secret)})
    secret.write_text("rec-s3cret")
    result = run_task({"key": "k", "state": "query"}, task_vars=record_vars(inventory_dir))
    assert result["msg"] == "k is free (fence 0)", result
    assert fake_backend.opened_with == [dict(url=URL, password="rec-s3cret", op_timeout=2.0, ca_file=None,
                                             fence_epoch=0)]
    assert "rec-s3cret" not in json.dumps(result)


def test_the_fence_epoch_comes_from_the_task_dlock_backend_or_the_record(fake_backend, inventory_dir):
    secret = inventory_dir / "credentials" / "dlock-backend.password"
    write_record(inventory_dir, {"url": URL, "password_file": str(secret), "fence_epoch": 3})
    secret.write_text("rec-s3cret")
    assert not run_task({"key": "k", "state": "query"}, task_vars=record_vars(inventory_dir)).get("failed")
    assert not run_task({"key": "k", "state": "query", "fence_epoch": "4"},
                        task_vars=record_vars(inventory_dir)).get("failed")
    assert not run_task({"key": "k", "state": "query"},
                        task_vars={"dlock_backend": {"url": URL, "fence_epoch": 5}}).get("failed")
    assert [opened["fence_epoch"] for opened in fake_backend.opened_with] == [3, 4, 5]


@pytest.mark.parametrize("value", ["one", True, float("nan"), 1e308, -1, 2 ** 13, "1\n", "1\x00", 1.5, [1]])
def test_a_bad_fence_epoch_fails_the_task_before_any_backend(fake_backend, value):
    result = run_task({"key": "k", "state": "query", "backend_url": URL, "fence_epoch": value})
    assert result["failed"] is True and result["msg"].startswith("fence_epoch: "), result
    assert not fake_backend.opened_with


def test_a_backend_on_the_task_or_in_dlock_backend_wins_over_the_record(fake_backend, inventory_dir):
    write_record(inventory_dir, "not even JSON")  # never read
    other = "redis://10.0.0.9:6379/0"
    assert run_task({"key": "k", "state": "query", "backend_url": other},
                    task_vars=record_vars(inventory_dir))["msg"] == "k is free (fence 0)"
    assert run_task({"key": "k", "state": "query"},
                    task_vars=record_vars(inventory_dir, dlock_backend={"url": other}))["msg"] == "k is free (fence 0)"
    assert [opened["url"] for opened in fake_backend.opened_with] == [other, other]


def test_without_a_record_the_error_says_where_it_looked_and_what_to_set(fake_backend, inventory_dir):
    result = run_task({"key": "k", "state": "query"}, task_vars=record_vars(inventory_dir))
    assert result["failed"] is True
    assert "backend_url: required" in result["msg"]
    assert "no record of site.yml's backend at %s/credentials/dlock-backend.json" % inventory_dir in result["msg"]
    assert "Set dlock_backend (url:" in result["msg"]
    result = run_task({"key": "k", "state": "query"}, task_vars={})
    assert "the inventory has no dlock_backend group" in result["msg"]
    assert not fake_backend.calls


def test_a_password_given_as_a_variable_is_asked_for_not_guessed(fake_backend, inventory_dir):
    """site.yml writes a vaulted dlock_backend_password nowhere: its record
    has no password file, and the task says what to set."""
    write_record(inventory_dir, {"url": URL})
    result = run_task({"key": "k", "state": "query"}, task_vars=record_vars(inventory_dir))
    assert result["failed"] is True and "names no password file" in result["msg"]
    assert "dlock_backend.password" in result["msg"]
    assert not fake_backend.opened_with
    result = run_task({"key": "k", "state": "query"},
                      task_vars=record_vars(inventory_dir, dlock_backend={"password": "vault-s3cret"}))
    assert result["msg"] == "k is free (fence 0)"
    assert fake_backend.opened_with[0]["url"] == URL and fake_backend.opened_with[0]["password"] == "vault-s3cret"
    assert "vault-s3cret" not in json.dumps(result)


def test_a_record_ca_file_missing_on_the_controller_names_the_variable(fake_backend, inventory_dir):
    write_record(inventory_dir, {"url": URL, "password_file": "/nonexistent/pw", "ca_file": "/nonexistent/ca.pem"})
    result = run_task({"key": "k", "state": "query"}, task_vars=record_vars(inventory_dir))
    assert result["failed"] is True and "ca_file /nonexistent/ca.pem: is not a file on the controller" in result["msg"]
    assert "dlock_backend_controller_ca_file" in result["msg"]


def test_a_task_on_a_target_never_uses_the_controllers_record(fake_backend, inventory_dir):
    write_record(inventory_dir, {"url": URL, "password_file": "/controller/pw"})
    plugin = make_action({"key": "k", "run_on": "target"})
    plugin._execute_module = MagicMock()
    result = plugin.run(task_vars=record_vars(inventory_dir))
    assert result["failed"] is True and "backend_url: required" in result["msg"]
    assert not plugin._execute_module.called


HOSTILE_RECORDS = [
    ("not JSON", "url: redis://h/0", "not valid JSON"),
    ("a NUL", '{"url": "redis://h/0\x00"}', "not valid JSON"),
    ("an escaped NUL", '{"url": "redis://h/0\\u0000"}', "url: "),
    ("a string", '"%s"' % URL, "must hold a JSON object"),
    ("a list", json.dumps([URL]), "must hold a JSON object"),
    ("null", "null", "must hold a JSON object"),
    ("empty", "", "not valid JSON"),
    ("an unknown key", json.dumps({"url": URL, "password": "rec-s3cret"}), "unknown field 'password'"),
    ("no url", json.dumps({"password_file": "/pw"}), "has no url"),
    ("a url that is a number", json.dumps({"url": 6379}), "url: "),
    ("a url with a password", json.dumps({"url": "redis://:rec-s3cret@h/0"}), "the URL contains a password"),
    ("a relative password file", json.dumps({"url": URL, "password_file": "pw"}), "password_file: 'pw' must be an absolute path"),
    ("a password file that is a list", json.dumps({"url": URL, "password_file": ["/pw"]}), "password_file: ['/pw'] must be a string"),
    ("a ca file with a newline", json.dumps({"url": URL, "ca_file": "/ca\n.pem"}), "ca_file: '/ca\\n.pem' holds a control character"),
    ("a duplicate key", '{"url": "%s", "url": "%s"}' % (URL, URL), "the key 'url' appears twice"),
    ("deep nesting", "[" * 60000, "nest deeper than"),
    ("NaN", '{"url": NaN}', "not valid JSON"),
    ("an epoch that is a string", json.dumps({"url": URL, "fence_epoch": "one"}), "fence_epoch: 'one' must be a whole number"),
    ("an epoch that is true", json.dumps({"url": URL, "fence_epoch": True}), "fence_epoch: True must be a whole number"),
    ("an epoch of 1e308", '{"url": "%s", "fence_epoch": 1e308}' % URL, "fence_epoch: 1e+308 must be a whole number"),
    ("a negative epoch", json.dumps({"url": URL, "fence_epoch": -1}), "fence_epoch: -1 is out of range (0-8191)"),
    ("an epoch of 2**13", json.dumps({"url": URL, "fence_epoch": 2 ** 13}), "is out of range (0-8191)"),
    ("an epoch of 1.5", json.dumps({"url": URL, "fence_epoch": 1.5}), "fence_epoch: 1.5 must be a whole number"),
    ("an epoch with a newline", json.dumps({"url": URL, "fence_epoch": "1\n"}), "fence_epoch: '1\\n' must be a whole number"),
]


@pytest.mark.parametrize("content, words", [c[1:] for c in HOSTILE_RECORDS], ids=[c[0] for c in HOSTILE_RECORDS])
def test_a_bad_record_is_refused_naming_the_file(fake_backend, inventory_dir, content, words):
    path = write_record(inventory_dir, content)
    result = run_task({"key": "k", "state": "query"}, task_vars=record_vars(inventory_dir))
    assert result["failed"] is True, result
    assert result["msg"].startswith("site.yml's backend record %s" % path), result["msg"]
    assert words in result["msg"], result["msg"]
    assert "rec-s3cret" not in json.dumps(result)
    assert not fake_backend.opened_with


@pytest.mark.parametrize("kind", ["fifo", "directory", "not utf-8", "too large"])
def test_a_record_that_is_no_readable_file_is_refused_without_blocking(fake_backend, inventory_dir, kind):
    path = inventory_dir / "credentials" / "dlock-backend.json"
    path.parent.mkdir()
    if kind == "fifo":
        os.mkfifo(str(path))  # no writer: a plain open() would wait for ever
    elif kind == "directory":
        path.mkdir()
    elif kind == "not utf-8":
        path.write_bytes(b'{"url": "\xff"}')
    else:
        path.write_text(json.dumps({"url": URL, "ca_file": "/" + "a" * (70 * 1024)}))
    result = run_task({"key": "k", "state": "query"}, task_vars=record_vars(inventory_dir))
    assert result["failed"] is True and result["msg"].startswith("site.yml's backend record %s" % path), result
    assert not fake_backend.opened_with
