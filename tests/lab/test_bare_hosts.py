"""--check of the whole rollout on a lab of its own (a backend and one node),
in two stages, each for both backend types:

1. fresh hosts: the lab as it boots has nothing of site.yml (the image bakes
   in the roles' packages, services disabled). A -vvv --diff run reports what
   it would change, leaks no backend password, warns about nothing and
   changes nothing.
2. bare hosts: the lab's packages purged. Every role says what it would
   install and skips what only exists after the install; the --diff output
   stays a bounded review of settings; the run changes nothing.

The purge is the line between them, drawn by fixtures: `booted_lab` boots
the lab, `fresh_lab` hands it to the fresh-hosts tests and refuses (fails)
once it is purged, `bare_lab` purges it on first use. The fresh-hosts tests
come first in this module; run in another order they fail, they never pass
on purged hosts. The lab is removed at the end: purged packages cannot come
back on offline nodes.

The fresh-hosts check is here, in the lab-bare session, rather than on the
session lab of lab-single (the suite's critical path): the same roles on two
hosts instead of four, before the purge."""

import os
import re

import pytest
from lab import Lab
from rollout import read_password, site, warnings, writes_nothing

pytestmark = pytest.mark.lab

BACKEND_TYPES = ["redis", "postgresql"]
# Measured: 865 lines (Redis) and 926 (PostgreSQL) once the engine's source left the diff (12,393 lines for
# one backend and two nodes before).
DIFF_LINES_BOUND = 1200
PACKAGES = ["redis-server", "redis-tools", "postgresql", "postgresql-15", "chrony", "prometheus-node-exporter",
            "python3-psycopg"]
CHECK_JOB = {"name": "check-only", "command": ["true"], "schedule": "hourly", "once_per": "1h"}


def hosts(lab):
    return lab.group("dlock_backend") + lab.group("dlock_nodes")


@pytest.fixture(scope="module")
def booted_lab():
    """The lab booted from the image, removed at the end of the module."""
    if os.geteuid() != 0:
        pytest.skip("the lab needs root (network namespaces, mounts, systemd-nspawn)")
    fleet = Lab(prefix=os.environ.get("DLOCK_BARE_LAB_PREFIX", "dlkb"),
                subnet=os.environ.get("DLOCK_BARE_LAB_SUBNET", "10.77.5"))
    try:
        fleet.up(nodes=1, backend=True)
        yield fleet
    finally:
        fleet.down()


@pytest.fixture
def fresh_lab(booted_lab):
    """The booted lab while its hosts are fresh: the image's packages, nothing
    of site.yml. Once `bare_lab` has purged them this fails, naming why."""
    for host in hosts(booted_lab):
        if booted_lab.ssh(host, "dpkg -s chrony").returncode != 0:
            pytest.fail("%s: chrony is purged: the fresh-hosts checks must run before bare_lab purges the "
                        "lab's packages (they come first in test_bare_hosts.py; keep that order)" % host,
                        pytrace=False)
        if booted_lab.ssh(host, "test -e /etc/dlock/dlock.json").returncode == 0:
            pytest.fail("%s: not fresh: /etc/dlock/dlock.json exists (a site.yml rolled out here)" % host,
                        pytrace=False)
    return booted_lab


@pytest.fixture(scope="module")
def bare_lab(booted_lab):
    """The lab with the roles' packages purged (on first use; no way back)."""
    for host in hosts(booted_lab):
        booted_lab.ssh(host, "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q " + " ".join(PACKAGES),
                       check=True, timeout=300)
    return booted_lab


def state(lab):
    """Installed packages, files and units that site.yml may touch, per host."""
    return dict((host, lab.ssh(host, "dpkg-query -W -f '${Package} ${Status}\\n' | sort; "
                                     "find /etc /usr/local -type f -exec md5sum {} + 2>/dev/null | sort; "
                                     "systemctl list-unit-files --no-legend | sort; getent passwd | sort").stdout)
                for host in hosts(lab))


# First: the fresh hosts (fresh_lab refuses once bare_lab has purged them).
@pytest.mark.parametrize("backend_type", BACKEND_TYPES)
def test_check_mode_on_fresh_hosts_changes_nothing(fresh_lab, backend_type):
    """--check of the whole rollout on hosts that have none of it: it reports
    what it would change, and writes, enables and creates nothing."""
    with writes_nothing(fresh_lab):
        done = site(fresh_lab, backend_type, {"dlock_jobs_list": [CHECK_JOB]}, "--check", "-vvv", "--diff",
                    check=False)
    assert done.returncode == 0, done.stdout[-4000:]
    assert re.search(r"changed=[1-9]", done.stdout), "check mode reported nothing to do on fresh hosts"
    # Every diff is whole on fresh hosts: the strongest place to look for a leak.
    assert "ESTABLISH SSH CONNECTION" in done.stdout, "not a -vvv run"
    leaked = read_password(fresh_lab) in done.stdout + done.stderr  # generated on the controller, even in check mode
    assert not leaked, "the backend password is in the -vvv --diff output"
    # Nothing the real run would create (a user, a unit, a directory) is warned about as missing.
    assert not warnings(done), warnings(done)


# Then: the same hosts, purged.
@pytest.mark.parametrize("backend_type", BACKEND_TYPES)
def test_check_mode_on_hosts_without_the_packages(bare_lab, backend_type):
    before = state(bare_lab)
    for host in hosts(bare_lab):
        assert bare_lab.ssh(host, "dpkg -s chrony").returncode != 0, "%s: chrony is still installed" % host
    # The README's first command on a new fleet: --check --diff, read by an operator.
    done = site(bare_lab, backend_type, {"dlock_jobs_list": [CHECK_JOB]}, "--check", "--diff", check=False)
    assert done.returncode == 0, done.stdout[-6000:]
    assert re.search(r"changed=[1-9]", done.stdout)
    # Settings to review, not the collection's code: no Python source in the diff (the engine's was 11,104
    # of 12,393 lines), and the whole output within a bound.
    source = re.findall(r"^\+\s*(?:def|class|import|from) \w.*$", done.stdout, re.M)
    assert not source, source[:5]
    lines = done.stdout.count("\n")
    print("\n--check --diff of a first %s rollout on 1 backend + 1 node: %d lines" % (backend_type, lines))
    assert lines <= DIFF_LINES_BOUND, done.stdout[:3000]
    # Nothing the real run would create (a user, a unit, a directory) is warned about as missing.
    assert not warnings(done), warnings(done)
    server = {"redis": "Redis", "postgresql": "PostgreSQL"}[backend_type]
    for what in (server, "chrony", "node_exporter"):
        assert "Check mode: %s is not installed yet" % what in done.stdout
    assert state(bare_lab) == before
