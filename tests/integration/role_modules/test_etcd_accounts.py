"""The dlock_etcd_access module (dlock_etcd's account setup) on a real etcd
(3.4, one member on loopback), run by real `ansible`: the runners' user and
an extra user (Patroni's) each get a role limited to their own prefix,
idempotently, check mode changes nothing, and no password shows in the
output (the whole cluster: molecule/etcd and molecule/postgresql-ha)."""

import os
import subprocess

import pytest
from ansible_cli import run_module

ROOT_PASSWORD = "Root-Pw-5ecret-0001"
RUNNERS = "Runner-Pw-5ecret-02"
PATRONI = "Patroni-Pw-5ecret-3"
PASSWORDS = (ROOT_PASSWORD, RUNNERS, PATRONI)


def arguments(server, **changed):
    args = {"endpoint": "http://127.0.0.1:%d" % server.client_ports[0],
            "peer_urls": ["http://127.0.0.1:%d" % server.peer_ports[0]], "root_password": ROOT_PASSWORD,
            "user": "dlock", "password": RUNNERS, "prefix": "/dlock",
            "extra_users": [{"name": "patroni", "password": PATRONI, "prefix": "/patroni"}], "wait": 30}
    args.update(changed)
    return args


def provision(server, *options, **changed):
    """The module's result; -vvv shows its arguments (invocation), passwords masked."""
    rc, result, output = run_module("dlock_etcd_access", arguments(server, **changed), "-vvv", *options)
    assert not [password for password in PASSWORDS if password in output], output
    assert rc == 0, output
    assert result["invocation"]["module_args"]["root_password"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"
    return dict((key, result[key]) for key in ("changed", "actions"))


@pytest.fixture
def provisioned(own_etcd):
    first = provision(own_etcd)
    assert first["changed"] and "add user patroni" in first["actions"], first
    assert first["actions"][-1] == "enable authentication", first
    return own_etcd


def ctl(server, user, password, *args):
    return subprocess.run(["etcdctl", "--endpoints", "127.0.0.1:%d" % server.client_ports[0], "--user",
                           "%s:%s" % (user, password)] + list(args), env=dict(os.environ, ETCDCTL_API="3"),
                          capture_output=True, text=True, timeout=30, check=False)


def test_check_mode_on_a_new_cluster_changes_nothing(own_etcd):
    would = provision(own_etcd, "--check")
    assert would["changed"] and would["actions"][-1] == "enable authentication", would
    assert provision(own_etcd, "--check") == would  # authentication still off, no user added
    assert own_etcd.etcdctl("user", "list").split() == []


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
    would = provision(provisioned, "--check")
    assert would["changed"] and "grant readwrite on /patroni/* to role patroni" in would["actions"], would
    assert provision(provisioned, "--check") == would  # nothing was changed
    assert provision(provisioned)["changed"]
    assert ctl(provisioned, "patroni", PATRONI, "put", "/patroni/y", "1").returncode == 0


def test_a_changed_password_is_set_and_only_then(provisioned):
    changed = "Runner-Pw-5ecret-99"
    rc, result, output = run_module("dlock_etcd_access", arguments(provisioned, password=changed), "--check")
    assert rc == 0 and result["actions"] == ["set the password of user dlock"], output
    assert ctl(provisioned, "dlock", RUNNERS, "put", "/dlock/x", "1").returncode == 0  # check mode kept it
    rc, result, output = run_module("dlock_etcd_access", arguments(provisioned, password=changed))
    assert rc == 0 and result["changed"] and changed not in output, output
    assert ctl(provisioned, "dlock", changed, "put", "/dlock/x", "1").returncode == 0
    rc, result, output = run_module("dlock_etcd_access", arguments(provisioned, password=changed))
    assert rc == 0 and not result["changed"], output


@pytest.mark.parametrize("changed, message", [
    ({"root_password": "Root-Pw-wrong-00001"},
     "dlock_etcd: Failure: etcd has authentication on, and root's password is not dlock_etcd_root_password: "
     "give the password root has (the role cannot change it without it)"),
    ({"peer_urls": ["http://127.0.0.1:1", "http://127.0.0.1:2"]},
     "dlock_etcd: Failure: the cluster's members (peer URLs ['http://127.0.0.1:{peer}']) are not the inventory's "
     "(['http://127.0.0.1:1', 'http://127.0.0.1:2']): add or remove members with etcdctl as the role's README "
     "describes, then run the role again"),
])
def test_refusals_say_why_and_change_nothing(provisioned, changed, message):
    rc, result, output = run_module("dlock_etcd_access", arguments(provisioned, **changed))
    assert rc != 0 and result["msg"] == message.format(peer=provisioned.peer_ports[0]), output
    assert not result.get("changed") and not [password for password in PASSWORDS if password in output], output
    assert provision(provisioned) == {"changed": False, "actions": []}


def test_a_member_that_does_not_answer_is_waited_for_then_named(provisioned):
    rc, result, output = run_module("dlock_etcd_access", arguments(provisioned, endpoint="http://127.0.0.1:1", wait=1))
    assert rc != 0, output
    assert result["msg"].startswith("dlock_etcd: Failure: etcd at http://127.0.0.1:1 is not healthy after 1s ("), output
    assert result["msg"].endswith("are the other members up, and can they reach each other on the peer port?"), output
