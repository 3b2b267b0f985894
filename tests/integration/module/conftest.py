"""Fixtures of the module's integration tests: the lease backends, an Ansible
runner with an inventory pointing at the backend, and an engine client."""

from __future__ import annotations

import pytest

from ansible_cli import Ansible

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import open_backend


@pytest.fixture(params=["redis", "postgresql"])
def lease_url(request):
    """The backends whose leases outlive a task: Redis, PostgreSQL lease table."""
    if request.param == "redis":
        return request.getfixturevalue("redis_server").url
    return request.getfixturevalue("pg_server").url()


@pytest.fixture
def ansible(tmp_path, lease_url):
    return Ansible(tmp_path, {"url": lease_url, "op_timeout": 1})


@pytest.fixture
def engine(lease_url):
    """A client of the backend under test, to play another holder and to look."""
    backend = open_backend(lease_url)
    yield backend
    backend.close()
