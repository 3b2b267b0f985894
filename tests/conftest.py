"""Shared test setup.

Makes the checkout importable as ansible_collections.dlock.fleet (a symlink
under build/), and provides real redis-server / PostgreSQL / etcd instances
on loopback (runner_proc.py starts the node runner as the node's wrapper does).
"""

import json
import os
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")

_link = os.path.join(BUILD, "ansible_collections", "dlock", "fleet")
if not os.path.exists(_link):
    os.makedirs(os.path.dirname(_link), exist_ok=True)
    os.symlink(ROOT, _link)
for path in (BUILD, os.path.join(ROOT, "tests")):
    if path not in sys.path:
        sys.path.insert(0, path)

import servers  # noqa: E402  (needs the path above)
from ansible_cli import BIN, ansible_env  # noqa: E402


@pytest.fixture(scope="session")
def redis_server():
    server = servers.RedisServer()
    yield server
    server.stop()


@pytest.fixture
def own_redis():
    """A private redis-server for tests that stop or restart it."""
    server = servers.RedisServer()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def pg_server():
    server = servers.PostgresServer()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def etcd_server():
    """One etcd member, shared by the session (no auth)."""
    server = servers.EtcdServer()
    yield server
    server.stop()


@pytest.fixture
def own_etcd():
    """A private single-member etcd for tests that restart it or enable auth."""
    server = servers.EtcdServer()
    yield server
    server.stop()


@pytest.fixture
def etcd_auth(own_etcd):
    """own_etcd with auth on: root, and a user 'dlock' whose role covers only /dlock/."""
    ctl = own_etcd.etcdctl
    ctl("user", "add", "root:root-secret")
    ctl("role", "add", "dlock-locks")
    ctl("role", "grant-permission", "dlock-locks", "readwrite", "--prefix=true", "/dlock/")
    ctl("user", "add", "dlock:Locker-Secret-1")
    ctl("user", "grant-role", "dlock", "dlock-locks")
    ctl("auth", "enable")
    return own_etcd


# The dlock_postgresql role's reading of the engine's lease schema and its
# grants, rendered by ansible-playbook from the role's own vars (role_path
# given as the role has it): the spec its provisioning helper gets.
PG_ROLE_SPEC = """
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.include_vars: {vars}
    - ansible.builtin.copy:
        content: "{{{{ {{'schema': __dlock_postgresql_schema, 'upgrades': __dlock_postgresql_schema_upgrades,
                     'grants': __dlock_postgresql_grants}} | to_json }}}}"
        dest: {out}
"""


@pytest.fixture(scope="session")
def pg_role_spec(tmp_path_factory):
    role = os.path.join(ROOT, "roles", "dlock_postgresql")
    where = tmp_path_factory.mktemp("pg-role-spec")
    playbook, out = where / "render.yml", where / "spec.json"
    playbook.write_text(PG_ROLE_SPEC.format(vars=os.path.join(role, "vars", "main.yml"), out=out))
    done = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", "ansible_python_interpreter=" + sys.executable, "-e", "role_path=" + role,
                           str(playbook)], env=ansible_env(), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def pg_sync_cluster():
    """A primary with one strictly synchronous standby (servers.PostgresSyncPair)."""
    pair = servers.PostgresSyncPair()
    yield pair
    pair.stop()


@pytest.fixture
def pg_sync(pg_sync_cluster):
    """The synchronous pair with its standby up and synchronous, whatever the
    previous test of the module did to it."""
    pg_sync_cluster.standby_up()
    return pg_sync_cluster


@pytest.fixture(params=["redis", "postgresql", "postgresql+advisory", "etcd"])
def backend_url(request):
    """Each shared-backend kind in turn."""
    if request.param == "redis":
        return request.getfixturevalue("redis_server").url
    if request.param == "etcd":
        return request.getfixturevalue("etcd_server").url
    return request.getfixturevalue("pg_server").url(scheme=request.param)


@pytest.fixture
def unique_key(request):
    """A lock key no other test uses (servers are shared by the session)."""
    import re
    import uuid
    return "t-%s-%s" % (re.sub(r"[^A-Za-z0-9]+", "-", request.node.name)[:60].strip("-"), uuid.uuid4().hex[:6])


@pytest.fixture(scope="session")
def render():
    """render(role, template, variables) -> text, by tests/render_helper.py."""
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "render_helper.py"),
                             os.path.join(ROOT, "build")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(role, template, variables):
        with open(os.path.join(ROOT, "roles", role, "vars", "main.yml")) as handle:
            role_variables = yaml.safe_load(handle)
        request = {"template": os.path.join(ROOT, "roles", role, "templates", template),
                   "role_variables": role_variables,
                   "variables": dict(ansible_managed="managed by a test", **variables)}
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline())
        assert "error" not in answer, answer["error"]
        return answer["text"]

    yield run
    proc.stdin.close()
    proc.wait(30)
