"""Shared fixture for tests that need a running lab (see lab.py)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lab import Lab  # noqa: E402

# Tests use their own prefix and subnet, so a developer's `lab.py up` (dlk,
# 10.77.0) survives a test run. Both can be overridden from the environment.
TEST_PREFIX = os.environ.get("DLOCK_LAB_PREFIX", "dlkt")
TEST_SUBNET = os.environ.get("DLOCK_LAB_SUBNET", "10.77.1")


@pytest.fixture(scope="session")
def lab():
    """A booted 3-node lab shared by the whole session, removed at its end.

    Tests may add nodes (lab.up(nodes=3, backend=True)) and inject faults, but
    must leave every node running and connected when they finish.
    """
    if os.geteuid() != 0:
        pytest.skip("the lab needs root (network namespaces, mounts, systemd-nspawn)")
    fleet = Lab(prefix=TEST_PREFIX, subnet=TEST_SUBNET)
    try:
        fleet.up(nodes=3)
        yield fleet
    finally:
        fleet.down()
