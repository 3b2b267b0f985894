"""Shared fixture for tests that need a running lab (see lab.py)."""

import os
import sys

import pytest
from ansible_cli import ROOT, build_collection, install_collection

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lab import Lab  # noqa: E402

# Tests use their own prefix and subnet, so a developer's `lab.py up` (dlk,
# 10.77.0) survives a test run. Both can be overridden from the environment.
TEST_PREFIX = os.environ.get("DLOCK_LAB_PREFIX", "dlkt")
TEST_SUBNET = os.environ.get("DLOCK_LAB_SUBNET", "10.77.1")

# The etcd lab's modules run in this order, whatever their names sort as:
# the etcd fault tests want the three members site.yml makes (and roll it
# out), the Patroni fault tests put PostgreSQL on that cluster, and the
# membership tests leave it with five.
ETCD_LAB_ORDER = ("test_etcd_faults.py", "test_pg_faults.py", "test_etcd_members.py")


def pytest_collection_modifyitems(items):
    def rank(item):
        return ETCD_LAB_ORDER.index(item.path.name)
    places = [i for i, item in enumerate(items) if item.path.name in ETCD_LAB_ORDER]
    # sorted() is stable: each module's own tests keep their order.
    for place, item in zip(places, sorted((items[i] for i in places), key=rank)):
        items[place] = item


@pytest.fixture(scope="session", autouse=True)
def installed_collection(tmp_path_factory):
    """The lab runs the roles and playbooks from the built tarball, installed
    into an empty collections path as a user would (rollout.py reads
    DLOCK_COLLECTIONS_PATH), never from the checkout."""
    base = tmp_path_factory.mktemp("collection")
    path = install_collection(build_collection(ROOT, base / "dist"), base / "collections")
    saved = os.environ.get("DLOCK_COLLECTIONS_PATH")
    os.environ["DLOCK_COLLECTIONS_PATH"] = path
    yield path
    if saved is None:
        del os.environ["DLOCK_COLLECTIONS_PATH"]
    else:
        os.environ["DLOCK_COLLECTIONS_PATH"] = saved


def needs_root():
    if os.geteuid() != 0:
        pytest.skip("the lab needs root (network namespaces, mounts, systemd-nspawn)")


@pytest.fixture(scope="session")
def lab():
    """A booted 3-node lab shared by the whole session, removed at its end.

    Tests may add nodes (lab.up(nodes=3, backend=True)) and inject faults, but
    must leave every node running and connected when they finish.
    """
    needs_root()
    fleet = Lab(prefix=TEST_PREFIX, subnet=TEST_SUBNET)
    try:
        fleet.up(nodes=3)
        yield fleet
    finally:
        fleet.down()


@pytest.fixture(scope="session")
def etcd_lab():
    """A lab of its own for the etcd fault and membership tests (three
    backend nodes, three job nodes; prefix dlke on 10.77.8, or
    DLOCK_ETCD_LAB_PREFIX / DLOCK_ETCD_LAB_SUBNET): the fault tests roll out
    site.yml on it once, the membership tests then change the cluster's
    members, so the suite boots and rolls out one etcd fleet, not two.
    Removed at the end of the session, unless DLOCK_ETCD_LAB_KEEP is set (to
    look at it after a failure; a next run reuses it)."""
    needs_root()
    fleet = Lab(prefix=os.environ.get("DLOCK_ETCD_LAB_PREFIX", "dlke"),
                subnet=os.environ.get("DLOCK_ETCD_LAB_SUBNET", "10.77.8"))
    try:
        fleet.up(nodes=3, backends=3)
        yield fleet
    finally:
        if not os.environ.get("DLOCK_ETCD_LAB_KEEP"):
            fleet.down()
