"""site.yml records the backend it provisioned, and the controller's tools
use that record with nothing written by hand (issue 21).

Only site.yml's own task runs here, on the controller: the backend play is
entered at "Create the directory of the record" (--start-at-task), with
the URL the backend role would have set (dlock_redis_url) given as a host
variable of the backend host b1, a local connection. chrony and the metrics
are off and --limit b1 leaves the node plays without hosts. The URL is a
real password-protected redis-server's, so the dlock module, the status and
break_lock runbooks and examples/adhoc.sh then run against it, with an
inventory that names no backend: only the record tells them where it is.
"""

import json
import os
import re
import stat
import subprocess
import sys

import pytest
import servers
import yaml
from ansible_cli import BIN, ROOT, ansible_env

pytestmark = pytest.mark.slow  # eight site.yml runs and five of the tools: over a minute

PASSWORD = "Rec0rdTestPassw0rd"
START = "Create the directory of the record"
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}


@pytest.fixture(scope="module")
def redis_with_password():
    server = servers.RedisServer(password=PASSWORD)
    yield server
    server.stop()


def inventory(tmp_path, url):
    """The operator's inventory: the groups, the backend's URL as the role
    sets it on b1, and no dlock_backend anywhere."""
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {
        "dlock_backend": {"hosts": {"b1": dict(LOCAL, dlock_redis_url=url)}},
        "dlock_nodes": {"hosts": {"n1": dict(LOCAL)}}}}}))
    return str(path)


def site(tmp_path, url, extra=None, *options):
    variables = tmp_path / "vars.yml"
    variables.write_text(yaml.safe_dump(dict({"dlock_backend_type": "redis", "dlock_site_chrony": False,
                                              "dlock_site_metrics": False}, **(extra or {}))))
    argv = [os.path.join(BIN, "ansible-playbook"), "-i", inventory(tmp_path, url), "--limit", "b1",
            "--start-at-task", START, "-e", "@" + str(variables), os.path.join(ROOT, "playbooks", "site.yml")]
    proc = subprocess.run(argv + list(options), env=ansible_env(), capture_output=True, text=True, timeout=180,
                          check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return out


def write_result(out):
    """ok / changed for the task that writes the record (after its diff, if any)."""
    match = re.search(r"TASK \[Write the record\].*?^(ok|changed|skipping|fatal): \[b1", out, re.S | re.M)
    assert match, out
    return match.group(1)


def record(tmp_path):
    return tmp_path / "credentials" / "dlock-backend.json"


def test_site_yml_records_the_backend_without_a_secret_once(tmp_path, redis_with_password):
    url = redis_with_password.url
    out = site(tmp_path, url)
    assert write_result(out) == "changed", out
    path = record(tmp_path)
    password_file = str(tmp_path / "credentials" / "dlock-backend.password")
    assert json.loads(path.read_text()) == {"url": url, "password_file": password_file}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    before = path.stat().st_mtime_ns
    again = site(tmp_path, url, None, "--diff")
    assert write_result(again) == "ok", again
    assert path.stat().st_mtime_ns == before


def test_check_mode_shows_the_change_and_writes_nothing(tmp_path, redis_with_password):
    out = site(tmp_path, redis_with_password.url, None, "--check", "--diff")
    assert write_result(out) == "changed", out
    assert not (tmp_path / "credentials").exists()
    assert "[WARNING]" not in out, out  # a directory the real run would make is no cause for one
    site(tmp_path, redis_with_password.url)
    written = record(tmp_path).read_text()
    out = site(tmp_path, "redis://127.0.0.1:1/0", None, "--check", "--diff")
    assert write_result(out) == "changed" and '+    "url": "redis://127.0.0.1:1/0"' in out, out
    assert record(tmp_path).read_text() == written


def test_a_password_given_as_a_variable_is_written_nowhere(tmp_path, redis_with_password):
    out = site(tmp_path, redis_with_password.url, {"dlock_backend_password": PASSWORD}, "--diff", "-vvv")
    assert json.loads(record(tmp_path).read_text()) == {"url": redis_with_password.url}
    assert sorted(p.name for p in (tmp_path / "credentials").iterdir()) == ["dlock-backend.json"]
    assert PASSWORD not in out


@pytest.mark.parametrize("extra, ca_file", [
    ({"dlock_backend_ca_file": "/etc/dlock/ca.pem"}, "/etc/dlock/ca.pem"),
    ({"dlock_backend_ca_file": "/etc/dlock/ca.pem", "dlock_backend_controller_ca_file": "/home/ops/ca.pem"},
     "/home/ops/ca.pem"),
], ids=["the nodes' CA path", "the controller's own"])
def test_the_record_names_the_ca_file_the_controller_uses(tmp_path, redis_with_password, extra, ca_file):
    site(tmp_path, redis_with_password.url, extra)
    assert json.loads(record(tmp_path).read_text())["ca_file"] == ca_file


def test_the_record_gives_the_controller_the_nodes_fence_epoch(tmp_path, redis_with_password):
    site(tmp_path, redis_with_password.url, {"dlock_fence_epoch": 2})
    assert json.loads(record(tmp_path).read_text())["fence_epoch"] == 2
    (tmp_path / "credentials" / "dlock-backend.password").write_text(PASSWORD)
    proc = subprocess.run([os.path.join(BIN, "ansible"), "localhost", "-i", inventory(tmp_path, redis_with_password.url),
                           "-m", "dlock.fleet.dlock", "-a", "key=rec-epoch-key ttl=5m state=query"],
                          env=ansible_env(), capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Never granted on this backend: the epoch's floor, above every fence of epoch 1.
    assert '"fence": %d' % (2 * 2 ** 40) in proc.stdout, proc.stdout


def test_the_controllers_tools_use_the_record(tmp_path, redis_with_password):
    """What an operator runs right after site.yml, with the inventory it
    used: a module task, the status and break_lock runbooks, adhoc.sh."""
    url = redis_with_password.url
    site(tmp_path, url)
    password_file = tmp_path / "credentials" / "dlock-backend.password"
    password_file.write_text(PASSWORD)  # as site.yml's password lookup generates it
    inv = inventory(tmp_path, url)
    env = ansible_env({"PATH": BIN + os.pathsep + os.environ.get("PATH", "")})

    def run(argv):
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180, check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        assert PASSWORD not in out
        return out

    client = redis_with_password.client()
    held = run([os.path.join(BIN, "ansible"), "localhost", "-i", inv, "-m", "dlock.fleet.dlock",
                "-a", "key=rec-key ttl=5m"])
    assert '"acquired": true' in held, held
    status = run([os.path.join(BIN, "ansible-playbook"), "-i", inv, "dlock.fleet.status", "-e", "dlock_keys=rec-key"])
    assert "rec-key is held by ansible@" in status, status
    broken = run([os.path.join(BIN, "ansible-playbook"), "-i", inv, "dlock.fleet.break_lock", "--check",
                  "-e", "dlock_key=rec-key", "-e", "dlock_reason=test"])
    assert "would break the lock: rec-key is held by ansible@" in broken, broken
    assert client.keys("dlock:*"), "check mode broke the lock"
    adhoc = run(["sh", os.path.join(ROOT, "examples", "adhoc.sh"), inv, "rec-key"])
    assert adhoc.count("broke the lock of rec-key") == 1, adhoc  # the --check call says "would"
