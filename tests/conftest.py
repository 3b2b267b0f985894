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
