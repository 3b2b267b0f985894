"""Hostile input to the dlock module and its action plugin, through a real
ansible-playbook run at -vvv (one play, one task per case) and real ad-hoc
calls, against a real Redis where another owner holds the lock.

Each case asserts: the task failed, its message names the field, no
traceback, no secret anywhere in the -vvv output, and the other owner's lock
is still held with the same owner and fence (nothing was taken or broken)."""

from __future__ import annotations

import json
import math
import os
import subprocess

import pytest
import yaml
from ansible_cli import BIN, ansible_env

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import open_backend

SECRET = "Module-Hostile-Secret-42"
OTHER = "other-node:7:0123456789abcdef01234567"
KEY = "hostile-module-held"
FIFO_PATH = [""]  # set by the fixture: the FIFO the cases name

# (id, module arguments (KEY and the backend added unless given), fragment of msg)
CASES = [
    ("key newline", {"key": "a\nb"}, "key: 'a\\nb' holds a control character"),
    ("key empty", {"key": ""}, "key: must not be empty"),
    ("key too long", {"key": "k" * 201}, "is longer than 200 characters"),
    ("key space", {"key": "a b"}, "is not a valid lock key"),
    ("key NUL", {"key": "a\x00b"}, "holds a control character"),
    ("key line separator", {"key": "x\u2028y"}, "holds a control character"),
    ("ttl float NaN", {"ttl": float("nan")}, "ttl: nan is not a finite duration"),
    ("ttl float inf", {"ttl": float("inf")}, "ttl: inf is not a finite duration"),
    ("ttl text NaN", {"ttl": "NaN"}, "ttl: 'NaN' is not a duration"),
    ("ttl text 1e308", {"ttl": "1e308"}, "ttl: '1e308' is not a duration"),
    ("ttl float 1e308", {"ttl": 1e308}, "is above the maximum of 30d"),
    ("ttl negative", {"ttl": -1}, "ttl: -1 is negative"),
    ("ttl zero", {"ttl": 0}, "ttl: 0 is below the minimum of 1s"),
    ("ttl 31d", {"ttl": "31d"}, "ttl: '31d' is above the maximum of 30d"),
    ("ttl bool", {"ttl": True}, "ttl: True is not a duration"),
    ("ttl list", {"ttl": [1]}, "ttl: [1] is not a duration"),
    ("ttl trailing newline", {"ttl": "5m\n"}, "is not a duration"),
    ("ttl mapping", {"ttl": {"a": 1}}, "is not a duration"),
    ("wait NaN", {"wait": float("nan")}, "wait: nan is not a finite duration"),
    ("wait negative", {"wait": -1}, "wait: -1 is negative"),
    ("wait text 1e308", {"wait": "1e308"}, "is not a duration"),
    ("wait words", {"wait": "a while"}, "is not a duration"),
    ("wait bool", {"wait": True}, "wait: True is not a duration"),
    ("op_timeout zero", {"op_timeout": 0}, "op_timeout: 0 must be greater than 0"),
    ("op_timeout NaN", {"op_timeout": float("nan")}, "op_timeout: nan is not a finite duration"),
    ("op_timeout inf text", {"op_timeout": "inf"}, "op_timeout: 'inf' is not a duration"),
    ("fence_epoch string", {"fence_epoch": "one"}, "fence_epoch: 'one' must be a whole number"),
    ("fence_epoch bool", {"fence_epoch": True}, "fence_epoch: True must be a whole number"),
    ("fence_epoch NaN", {"fence_epoch": float("nan")}, "fence_epoch: nan must be a whole number"),
    ("fence_epoch 1e308", {"fence_epoch": 1e308}, "fence_epoch: 1e+308 must be a whole number"),
    ("fence_epoch negative", {"fence_epoch": -1}, "fence_epoch: -1 is out of range (0-8191)"),
    ("fence_epoch 2**13", {"fence_epoch": 2 ** 13}, "fence_epoch: 8192 is out of range (0-8191)"),
    ("fence_epoch newline", {"fence_epoch": "1\n"}, "fence_epoch: '1\\n' must be a whole number"),
    ("fence_epoch NUL", {"fence_epoch": "1\x00"}, "fence_epoch: '1\\x00' must be a whole number"),
    ("fence_epoch 1.5", {"fence_epoch": 1.5}, "fence_epoch: 1.5 must be a whole number"),
    ("url password", {"backend_url": "redis://u:%s@127.0.0.1:6379/0" % SECRET}, "backend_url: contains a password"),
    ("url password bad port", {"backend_url": "redis://u:%s@127.0.0.1:99999/0" % SECRET},
     "backend_url: contains a password"),
    ("url password with a slash", {"backend_url": "redis://u:%s/0@127.0.0.1:6379/0" % SECRET},
     "backend_url: contains a password"),
    ("url password with ? # @", {"backend_url": "etcd://u:%s?#@x@127.0.0.1:2379/dlock" % SECRET},
     "backend_url: contains a password"),
    ("url password query", {"backend_url": "redis://127.0.0.1:6379/0?password=%s" % SECRET},
     "backend_url: contains a password"),
    ("url pg password query", {"backend_url": "postgresql://u@127.0.0.1/db?password=%s" % SECRET},
     "backend_url: contains a password"),
    ("url port 0", {"backend_url": "redis://127.0.0.1:0/0"}, "out of range (1-65535)"),
    ("url port 99999", {"backend_url": "redis://127.0.0.1:99999/0"}, "out of range (1-65535)"),
    ("url bad ipv6", {"backend_url": "redis://[::1:6379/0"}, "bad IPv6 form"),
    ("url db text", {"backend_url": "redis://127.0.0.1:6379/x"}, "the database must be a number"),
    ("url host space", {"backend_url": "redis://a b:6379/0"}, "holds a control character or space"),
    ("url redis query", {"backend_url": "redis://127.0.0.1:6379/0?socket_timeout=0"}, "take no query parameters"),
    ("url scheme", {"backend_url": "mysql://127.0.0.1/db"}, "unsupported scheme 'mysql'"),
    ("reason newline", {"state": "released", "force": True, "reason": "stale\nfake log line"},
     "reason: 'stale\\nfake log line' holds a control character"),
    ("owner newline", {"state": "released", "owner": "me\nyou"}, "owner: 'me\\nyou' holds a control character"),
    ("state unknown", {"state": "bogus"}, "value of state must be one of"),
    ("force on acquire", {"force": True, "reason": "x"}, "force: only applies to state=released"),
    ("hold on query", {"state": "query", "hold": True}, "hold: only applies to state=acquired"),
    ("history on acquire", {"history": 5}, "history: only applies to state=query"),
    ("history negative", {"state": "query", "history": -1}, "history: -1 is out of range (0-1000)"),
    ("history 1001", {"state": "query", "history": 1001}, "history: 1001 is out of range (0-1000)"),
    ("history NaN", {"state": "query", "history": float("nan")}, "history: nan must be a whole number"),
    ("history text 1e308", {"state": "query", "history": "1e308"}, "history: '1e308' must be a whole number"),
    ("history bool", {"state": "query", "history": True}, "history: True must be a whole number"),
    ("history list", {"state": "query", "history": [5]}, "history: [5] must be a whole number"),
    ("history newline", {"state": "query", "history": "5\n"}, "history: '5\\n' must be a whole number"),
    ("password file fifo", {"backend_password_file": "@FIFO@"}, "is not a regular file"),
    ("password file device", {"backend_password_file": "/dev/zero"}, "is not a regular file"),
    ("password file directory", {"backend_password_file": "/tmp"}, "is not a regular file"),
    ("ca file newline", {"ca_file": "/etc/ca\n.pem"}, "ca_file: '/etc/ca\\n.pem' holds a control character"),
    ("ca file fifo", {"ca_file": "@FIFO@"}, "ca_file @FIFO@: is not a regular file"),
    ("ca file traversal", {"ca_file": "/etc/ssl/../ca.pem"}, "is not normalised"),
    ("password control", {"backend_password": SECRET + "\n"}, "backend_password: holds a control character"),
    ("target url password", {"run_on": "target", "backend_url": "redis://u:%s@127.0.0.1:1/0" % SECRET},
     "backend_url: contains a password"),
    ("inventory url password", {"@inventory@": {"url": "redis://u:%s@127.0.0.1:99999/0" % SECRET}},
     "backend_url: contains a password"),
    ("inventory password fifo", {"@inventory@": {"url": "@URL@", "password_file": "@FIFO@"}},
     "is not a regular file"),
    ("inventory op_timeout NaN", {"@inventory@": {"url": "@URL@", "op_timeout": "NaN"}},
     "op_timeout: 'NaN' is not a duration"),
    ("inventory fence_epoch 1.5", {"@inventory@": {"url": "@URL@", "fence_epoch": 1.5}},
     "fence_epoch: 1.5 must be a whole number"),
]


def _hide_secrets(value, secrets):
    """Values holding the secret come from a vars file, as real secrets do
    (vault, inventory): ansible-core shows the task's source on a failure."""
    if isinstance(value, dict):
        return dict((k, _hide_secrets(v, secrets)) for k, v in value.items())
    if isinstance(value, str) and SECRET in value:
        name = "hostile_secret_%d" % len(secrets)
        secrets[name] = value
        return "{{ %s }}" % name
    return value


def _task(index, args, url, fifo, secrets):
    args = _hide_secrets(dict(args), secrets)
    inventory = args.pop("@inventory@", None)
    module_args = {"key": KEY}
    if inventory is None:
        module_args["backend_url"] = url
    module_args.update(args)
    for name, value in list(module_args.items()):
        if value == "@FIFO@":
            module_args[name] = fifo
    task = {"name": "case %d" % index, "dlock.fleet.dlock": module_args, "register": "r%d" % index,
            "ignore_errors": True}
    if inventory is not None:
        task["vars"] = {"dlock_backend": dict((k, fifo if v == "@FIFO@" else url if v == "@URL@" else v)
                                              for k, v in inventory.items())}
    return task


@pytest.fixture(scope="module")
def outcome(redis_server, tmp_path_factory):
    """One ansible-playbook -vvv run of every case: (results by case, output)."""
    tmp = tmp_path_factory.mktemp("hostile-module")
    fifo = str(tmp / "fifo")
    os.mkfifo(fifo)
    FIFO_PATH[:] = [fifo]
    engine = open_backend(redis_server.url)
    engine.force_release(KEY)
    before = engine.acquire(KEY, OTHER, 600)
    assert before.granted
    results = str(tmp / "results.json")
    secrets = {}
    tasks = [_task(i, args, redis_server.url, fifo, secrets) for i, (_id, args, _frag) in enumerate(CASES)]
    secrets_file = tmp / "secrets.yml"
    secrets_file.write_text(yaml.safe_dump(secrets))
    tasks.append({"name": "Write the results", "ansible.builtin.copy": {
        "dest": results, "mode": "0600",
        "content": "{{ {%s} | to_json }}" % ", ".join("'%d': r%d" % (i, i) for i in range(len(CASES)))}})
    playbook = tmp / "hostile.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    inventory = tmp / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": os.path.join(BIN, "python")}}}}))
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(inventory), "-vvv", "-e", "@" + str(secrets_file),
                           str(playbook)],
                          env=ansible_env(), capture_output=True, text=True, timeout=300, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out  # every case failed with ignore_errors, and the results were written
    with open(results) as handle:
        by_case = json.load(handle)
    after = engine.query(KEY)
    engine.release(KEY, OTHER)
    engine.close()
    return by_case, out, (before.fence, after)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c[0] for c in CASES])
def test_hostile_module_argument_fails_with_the_field_named(outcome, index):
    by_case, out, _lock = outcome
    case_id, _args, fragment = CASES[index]
    result = by_case[str(index)]
    fragment = fragment.replace("@FIFO@", FIFO_PATH[0])
    assert result.get("failed") is True, (case_id, result)
    assert fragment in result["msg"], (case_id, result["msg"])
    assert "Traceback" not in json.dumps(result)
    assert SECRET not in json.dumps(result)


def test_no_secret_or_traceback_in_the_whole_vvv_output(outcome):
    _by_case, out, _lock = outcome
    assert "case %d" % (len(CASES) - 1) in out  # the output is the whole run
    assert SECRET not in out
    assert "Traceback" not in out


def test_the_other_owners_lock_is_untouched(outcome):
    _by_case, _out, (fence, after) = outcome
    assert (after.owner, after.fence) == (OTHER, fence)
    assert after.ttl_remaining is not None and not math.isnan(after.ttl_remaining)


@pytest.mark.parametrize("args, fragment", [
    ("key=hostile-adhoc ttl=NaN", "ttl: 'NaN' is not a duration"),
    ("key=hostile-adhoc ttl=1e308", "ttl: '1e308' is not a duration"),
    ("key=hostile-adhoc backend_url=redis://u:%s@127.0.0.1:0/0" % SECRET, "backend_url: contains a password"),
    ("key='a b'", "is not a valid lock key"),
    ("key=hostile-adhoc state=released force=true reason=''", "reason: say why"),
])
def test_hostile_ad_hoc_calls(redis_server, tmp_path, args, fragment):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": os.path.join(BIN, "python"),
        "dlock_backend": {"url": redis_server.url}}}}}))
    proc = subprocess.run([os.path.join(BIN, "ansible"), "localhost", "-i", str(inventory), "-vvv",
                           "-m", "dlock.fleet.dlock", "-a", args], env=ansible_env(), capture_output=True,
                          text=True, timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert fragment in out
    assert SECRET not in out and "Traceback" not in out
    assert open_backend(redis_server.url).query("hostile-adhoc").owner is None
