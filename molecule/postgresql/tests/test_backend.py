"""The PostgreSQL backend node: settings, pg_hba, the least-privilege role,
and a dead advisory-lock session noticed in seconds."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))

import subprocess  # noqa: E402
import time  # noqa: E402

from pg_checks import advisory_url, sql  # noqa: E402

testinfra_hosts = ["ansible://dlock_backend"]
CONF = "/etc/postgresql/15/main"


def test_postgresql_runs_with_the_dlock_settings(host):
    assert host.service("postgresql@15-main").is_running and host.service("postgresql").is_enabled
    assert host.file(CONF + "/conf.d/dlock.conf").content_string.startswith("# Ansible managed")
    # (The TCP settings read 0 on this socket connection: see test_nodes.py.)
    want = {"client_connection_check_interval": "2s", "password_encryption": "scram-sha-256",
            "listen_addresses": "localhost," + host.ansible.get_variables()["ansible_host"]}
    for name, value in want.items():
        assert sql(host, "SHOW %s" % name) == value, name


def test_pg_hba_lets_only_the_fleet_and_the_controller_in(host):
    """The job nodes, and the controller (the lab host, x.x.x.1), which the
    scenario adds to dlock_postgresql_clients for the module and the runbooks,
    over TLS only."""
    hba = host.file(CONF + "/pg_hba.conf")
    assert (hba.user, hba.mode) == ("postgres", 0o640)
    rules = [line.split() for line in hba.content_string.splitlines() if line.strip() and not line.startswith("#")]
    nodes = host.ansible.get_variables()["groups"]["dlock_nodes"]
    controller = ".".join(host.ansible.get_variables()["ansible_host"].split(".")[:3] + ["1"])
    addresses = sorted([host.get_host("ansible://" + n, ansible_inventory=os.environ["MOLECULE_INVENTORY_FILE"])
                        .ansible.get_variables()["ansible_host"] + "/32" for n in nodes] + [controller + "/32"])
    assert rules[0] == ["local", "all", "postgres", "peer"]
    assert sorted(r[3] for r in rules[1:]) == addresses
    # TLS only (the scenario sets dlock_postgresql_tls): hostssl, never host.
    assert all(r[:3] == ["hostssl", "dlock", "dlock"] and r[4] == "scram-sha-256" for r in rules[1:])


def test_a_dead_advisory_session_is_noticed_in_seconds(host):
    """A node holding an advisory lock is cut off the network: keepalives end its
    session within seconds, which frees the lock for the others."""
    groups = host.ansible.get_variables()["groups"]
    inventory = os.environ["MOLECULE_INVENTORY_FILE"]
    holder_name, other_name = groups["dlock_nodes"][-1], groups["dlock_nodes"][0]
    holder = host.get_host("ansible://" + holder_name, ansible_inventory=inventory)
    other = host.get_host("ansible://" + other_name, ansible_inventory=inventory)
    holder_addr = holder.ansible.get_variables()["ansible_host"]
    url = advisory_url(holder)
    lab = [sys.executable, os.path.join(os.environ["MOLECULE_PROJECT_DIRECTORY"], "tests", "lab", "lab.py")]
    sessions = ("SELECT count(*) FROM pg_stat_activity WHERE usename = 'dlock' AND client_addr = '%s' "
                "AND pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted)" % holder_addr)
    holder.run("systemd-run --unit dlock-advisory-probe --collect dlock run --job advisory-probe "
               "--backend %s --ttl 30s -- sleep 90", url)
    try:
        deadline = time.monotonic() + 20
        while sql(host, sessions) != "1":
            assert time.monotonic() < deadline, "the probe never took the advisory lock"
            time.sleep(0.5)
        subprocess.run(lab + ["partition", holder_name], check=True)
        cut = time.monotonic()
        while sql(host, sessions) != "0":
            assert time.monotonic() - cut < 40, "the dead session still holds the lock after 40s"
            time.sleep(0.5)
        noticed = time.monotonic() - cut
        print("\nadvisory session of a partitioned node ended after %.1fs" % noticed)
        taken = other.run("dlock run --job advisory-probe --backend %s --ttl 30s -- true", url)
        assert taken.rc == 0, taken.stderr
    finally:
        subprocess.run(lab + ["heal", holder_name], check=True)
        holder.run("systemctl stop dlock-advisory-probe.service")
    assert noticed < 25  # idle 5s + 3 probes x 2s, or tcp_user_timeout 10s, plus polling
