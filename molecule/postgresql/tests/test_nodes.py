"""The job nodes of the PostgreSQL scenario: the runner with the
least-privilege role. (What that role cannot do: molecule/common/tests/
test_pg_runners.py; metrics, unit hardening, the password in use: the
checks every scenario shares, beside it.)"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))

from fleet_checks import (  # noqa: E402
    backend_name,
    wait_for,
)

testinfra_hosts = ["ansible://dlock_nodes"]


def test_advisory_force_release_by_the_same_role(host):
    """dlock release --force of an advisory lock ends the holder's session
    (pg_terminate_backend): allowed because every runner logs in as the same role."""
    url = "postgresql+advisory://dlock@%s:5432/dlock" % backend_name(host)
    host.run("systemd-run --unit dlock-advisory-hold --collect dlock run --job advisory-hold "
             "--backend %s --ttl 30s -- sleep 60", url)
    wait_for(lambda: '"held": true' in host.run("dlock status --key advisory-hold --backend %s --json", url).stdout,
             attempts=40)
    out = host.run("dlock release --key advisory-hold --backend %s --force --reason 'molecule verify'", url)
    host.run("systemctl stop dlock-advisory-hold.service")
    assert out.rc == 0 and "was held by %s" % host.backend.get_hostname() in out.stdout, out.stdout + out.stderr
