"""--check of the whole rollout on hosts that have none of the packages yet
(the lab image bakes them in, so this lab purges them first): every role says
what it would install and skips what only exists after the install, and the
run changes nothing. A lab of its own (a backend and one node), removed at
the end: purged packages cannot come back on offline nodes."""

import os
import re

import pytest
from lab import Lab
from rollout import site, warnings

pytestmark = pytest.mark.lab

# Measured: 865 lines (Redis) and 926 (PostgreSQL) once the engine's source left the diff (12,393 lines for
# one backend and two nodes before).
DIFF_LINES_BOUND = 1200
PACKAGES = ["redis-server", "redis-tools", "postgresql", "postgresql-15", "chrony", "prometheus-node-exporter",
            "python3-redis", "python3-psycopg"]


@pytest.fixture(scope="module")
def bare_lab():
    if os.geteuid() != 0:
        pytest.skip("the lab needs root (network namespaces, mounts, systemd-nspawn)")
    fleet = Lab(prefix=os.environ.get("DLOCK_BARE_LAB_PREFIX", "dlkb"),
                subnet=os.environ.get("DLOCK_BARE_LAB_SUBNET", "10.77.5"))
    try:
        fleet.up(nodes=1, backend=True)
        for host in fleet.group("dlock_backend") + fleet.group("dlock_nodes"):
            fleet.ssh(host, "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q " + " ".join(PACKAGES),
                      check=True, timeout=300)
        yield fleet
    finally:
        fleet.down()


def state(lab):
    """Installed packages, files and units that site.yml may touch, per host."""
    return dict((host, lab.ssh(host, "dpkg-query -W -f '${Package} ${Status}\\n' | sort; "
                                     "find /etc /usr/local -type f -exec md5sum {} + 2>/dev/null | sort; "
                                     "systemctl list-unit-files --no-legend | sort; getent passwd | sort").stdout)
                for host in lab.group("dlock_backend") + lab.group("dlock_nodes"))


@pytest.mark.parametrize("backend_type", ["redis", "postgresql"])
def test_check_mode_on_hosts_without_the_packages(bare_lab, backend_type):
    before = state(bare_lab)
    for host in bare_lab.group("dlock_backend") + bare_lab.group("dlock_nodes"):
        assert bare_lab.ssh(host, "dpkg -s chrony").returncode != 0, "%s: chrony is still installed" % host
    job = {"name": "check-only", "command": ["true"], "schedule": "hourly", "once_per": "1h"}
    # The README's first command on a new fleet: --check --diff, read by an operator.
    done = site(bare_lab, backend_type, {"dlock_jobs_list": [job]}, "--check", "--diff", check=False)
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
