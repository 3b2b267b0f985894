"""The job nodes of the PostgreSQL scenario: the runner with the
least-privilege role. (What that role cannot do: molecule/common/tests/
test_pg_runners.py; metrics, unit hardening, the password in use: the
checks every scenario shares, beside it.)"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))

from fleet_checks import wait_for  # noqa: E402
from pg_checks import advisory_url, runner_url  # noqa: E402

testinfra_hosts = ["ansible://dlock_nodes"]


def test_advisory_force_release_by_the_same_role(host):
    """dlock release --force of an advisory lock ends the holder's session
    (pg_terminate_backend): allowed because every runner logs in as the same role."""
    url = advisory_url(host)
    host.run("systemd-run --unit dlock-advisory-hold --collect dlock run --job advisory-hold "
             "--backend %s --ttl 30s -- sleep 60", url)
    wait_for(lambda: '"held": true' in host.run("dlock status --key advisory-hold --backend %s --json", url).stdout,
             attempts=40)
    out = host.run("dlock release --key advisory-hold --backend %s --force --reason 'molecule verify'", url)
    host.run("systemctl stop dlock-advisory-hold.service")
    assert out.rc == 0 and "was held by %s" % host.backend.get_hostname() in out.stdout, out.stdout + out.stderr


def test_only_verified_tls_gets_in(host):
    """The runner verifies the server, its CA and its name (sslmode=verify-full
    and the CA site.yml gave it): a client that trusts another CA is refused,
    and so is the same password over a plain connection (pg_hba.conf has
    hostssl rules only)."""
    url = runner_url(host)
    assert url.endswith("?sslmode=verify-full"), url
    ok = host.run("dlock check-clock")
    assert ok.rc == 0, ok.stdout + ok.stderr
    other = host.run("dlock check-clock --ca-file /etc/dlock/other-ca.pem")
    assert other.rc == 75 and "certificate verify failed" in other.stderr, other.stderr
    plain = host.run("dlock check-clock --backend %s", url.replace("sslmode=verify-full", "sslmode=disable"))
    assert plain.rc == 75 and "no encryption" in plain.stderr, plain.stdout + plain.stderr
