"""Shared test setup.

Makes the checkout importable as ansible_collections.dlock.fleet (a symlink
under build/), and provides real redis-server / PostgreSQL instances on
loopback (runner_proc.py starts the node runner as the node's wrapper does).
"""

import os
import sys

import pytest

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


@pytest.fixture(params=["redis", "postgresql", "postgresql+advisory"])
def backend_url(request):
    """Each shared-backend kind in turn."""
    if request.param == "redis":
        return request.getfixturevalue("redis_server").url
    return request.getfixturevalue("pg_server").url(scheme=request.param)


@pytest.fixture
def unique_key(request):
    """A lock key no other test uses (servers are shared by the session)."""
    import re
    import uuid
    return "t-%s-%s" % (re.sub(r"[^A-Za-z0-9]+", "-", request.node.name)[:60].strip("-"), uuid.uuid4().hex[:6])
