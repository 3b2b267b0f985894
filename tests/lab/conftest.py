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
# the fault tests want the three members the etcd scenario's rollout makes,
# the membership tests leave five.
ETCD_LAB_ORDER = ("test_etcd_faults.py", "test_etcd_members.py")


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


# The session's labs, as their fixtures boot them: each is checked whole after
# every test module (no_fault_left).
LABS = []


@pytest.fixture(scope="module", autouse=True)
def no_fault_left():
    """After each test module: every node of every session lab running,
    connected, reachable, not delayed, with no process stopped and no fault
    drop-in left (lab.Lab.faults_left). A test that leaves a fault behind
    fails here, in its own module, not in the next one."""
    yield
    left = dict((fleet.prefix, fleet.faults_left()) for fleet in LABS)
    assert not any(left.values()), "faults left in place: %r" % left


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
        LABS.append(fleet)
        yield fleet
    finally:
        if fleet in LABS:
            LABS.remove(fleet)
        fleet.down()


def cluster_lab(what, prefix, subnet):
    """A lab of three backend nodes and three job nodes for one session, named
    PREFIX on SUBNET unless DLOCK_WHAT_LAB_PREFIX / _SUBNET say otherwise;
    removed at the end, unless DLOCK_WHAT_LAB_KEEP is set (to look at it
    after a failure; a next run reuses it)."""
    needs_root()
    variable = "DLOCK_%s_LAB_" % what.upper()
    fleet = Lab(prefix=os.environ.get(variable + "PREFIX", prefix), subnet=os.environ.get(variable + "SUBNET", subnet))
    try:
        fleet.up(nodes=3, backends=3)
        LABS.append(fleet)
        yield fleet
    finally:
        if fleet in LABS:
            LABS.remove(fleet)
        if not os.environ.get(variable + "KEEP"):
            fleet.down()


@pytest.fixture(scope="session")
def etcd_lab():
    """The etcd lab (dlke on 10.77.8; DLOCK_ETCD_LAB_PREFIX, _SUBNET, _KEEP):
    the etcd scenario rolled out once, its verify set, the fault tests, then
    the membership tests, which grow it to five members."""
    yield from cluster_lab("etcd", "dlke", "10.77.8")


@pytest.fixture(scope="session")
def patroni_lab():
    """The Patroni lab (dlkh on 10.77.10; DLOCK_PATRONI_LAB_PREFIX, _SUBNET,
    _KEEP): the postgresql-ha scenario rolled out once, its verify set, then
    the Patroni fault tests."""
    yield from cluster_lab("patroni", "dlkh", "10.77.10")
