"""dlock_etcd's account helper on a real etcd (3.4, one member on loopback):
the runners' user and an extra user (Patroni's) each get a role limited to
their own prefix, idempotently, and check mode changes nothing (the whole
cluster: molecule/etcd and molecule/postgresql-ha)."""

import json
import os
import subprocess
import sys

import pytest
from ansible_cli import ROOT

HELPER = os.path.join(ROOT, "roles", "dlock_etcd", "files", "dlock_etcd_provision.py")
ROOT_PASSWORD = "Root-Pw-5ecret-0001"
RUNNERS = "Runner-Pw-5ecret-02"
PATRONI = "Patroni-Pw-5ecret-3"


def provision(server, check=False):
    spec = {"endpoint": "http://127.0.0.1:%d" % server.client_ports[0], "ca_file": "",
            "peer_urls": ["http://127.0.0.1:%d" % server.peer_ports[0]], "root_password": ROOT_PASSWORD,
            "user": "dlock", "password": RUNNERS, "prefix": "/dlock",
            "extra_users": [{"name": "patroni", "password": PATRONI, "prefix": "/patroni"}], "wait": 30, "check": check}
    done = subprocess.run([sys.executable, HELPER], input=json.dumps(spec), capture_output=True, text=True,
                          timeout=120, check=False)
    assert ROOT_PASSWORD not in done.stdout + done.stderr and PATRONI not in done.stdout + done.stderr
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def provisioned(own_etcd):
    first = provision(own_etcd)
    assert first["changed"] and "add user patroni" in first["actions"], first
    return own_etcd


def ctl(server, user, password, *args):
    return subprocess.run(["etcdctl", "--endpoints", "127.0.0.1:%d" % server.client_ports[0], "--user",
                           "%s:%s" % (user, password)] + list(args), env=dict(os.environ, ETCDCTL_API="3"),
                          capture_output=True, text=True, timeout=30, check=False)


def test_each_user_reaches_only_its_own_prefix(provisioned):
    for user, password, mine, other in (("patroni", PATRONI, "/patroni/x", "/dlock/x"),
                                        ("dlock", RUNNERS, "/dlock/x", "/patroni/x")):
        assert ctl(provisioned, user, password, "put", mine, "1").returncode == 0, user
        for args in (["put", other, "1"], ["get", other], ["get", "--prefix", "/"], ["user", "list"]):
            denied = ctl(provisioned, user, password, *args)
            assert denied.returncode != 0 and "permission denied" in denied.stderr, (user, args, denied.stderr)


def test_a_second_run_and_check_mode_change_nothing(provisioned):
    assert provision(provisioned) == {"changed": False, "actions": []}
    assert ctl(provisioned, "root", ROOT_PASSWORD, "role", "revoke-permission", "patroni", "/patroni/",
               "--prefix=true").returncode == 0
    would = provision(provisioned, check=True)
    assert would["changed"] and "grant readwrite on /patroni/* to role patroni" in would["actions"], would
    assert provision(provisioned, check=True) == would  # nothing was changed
    assert provision(provisioned)["changed"]
    assert ctl(provisioned, "patroni", PATRONI, "put", "/patroni/y", "1").returncode == 0
