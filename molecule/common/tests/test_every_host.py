"""Every host of every scenario: the services run, chrony reports a state and
never adjusts a backend's clock (pytest-testinfra).

The scenarios' shared checks, by path: the base config
(.config/molecule/config.yml) lists this module in the testinfra verifier's
additional_files_or_dirs, and tests/lab/scenario.py runs them the same way."""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # fleet_checks, pg_checks

from fleet_checks import JOB, is_node  # noqa: E402

testinfra_hosts = ["ansible://all"]


def test_services_run(host):
    assert host.service("chrony.service").is_enabled and host.service("chrony.service").is_running
    # The boot gate only where there is a source to wait for: the job nodes. The
    # backend serves its own clock; a gate there would hold its boot 180 s.
    assert host.service("chrony-wait.service").is_enabled == is_node(host)
    if is_node(host):
        for unit in ("prometheus-node-exporter.service", "dlock-%s.timer" % JOB,
                     "prometheus-node-exporter-dlock.timer"):
            assert host.service(unit).is_enabled, unit
            assert host.service(unit).is_running, unit


def test_chrony_tracking_reports_a_state(host):
    out = host.run("chronyc tracking")
    assert out.rc == 0, out.stderr
    assert re.search(r"^Leap status\s+: Normal$", out.stdout, re.M), out.stdout
    if is_node(host):
        # A job node polls every backend member (dlock_chrony, issue 24: no
        # single time source) and follows whichever chrony finds best.
        members = host.ansible.get_variables()["groups"]["dlock_backend"]
        followed = re.search(r"^Reference ID\s+: \S+ \((\S+)\)$", out.stdout, re.M)
        assert followed and followed.group(1) in members, out.stdout


def test_chrony_container_mode_never_adjusts_the_clock(host):
    """Container mode (chronyd -x); the job nodes step only at start, the
    backend hosts (Redis and PostgreSQL count leases on their clock) never:
    no makestep at all, and a bounded slew rate."""
    assert "-x" in host.check_output("ps -o args= -C chronyd").split()
    conf = host.file("/etc/chrony/chrony.conf").content_string
    assert conf.startswith("# Ansible managed")
    directives = [line.split()[0] for line in conf.splitlines() if line.strip() and not line.startswith("#")]
    if is_node(host):
        assert "makestep 1.0 3" in conf and "maxslewrate" not in directives
    else:
        assert "makestep" not in directives and "maxslewrate 5000" in conf, conf
