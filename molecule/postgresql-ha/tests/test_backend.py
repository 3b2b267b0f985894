"""The Patroni members: one cluster of the three backend nodes with one
leader and a synchronous standby, strict synchronous replication in its
etcd-stored settings, Debian's own cluster out of the way, Patroni's etcd
user limited to its prefix, the REST API's changes limited to the members
with a password, pg_hba for the fleet and the members only, and the
runners' role with least privilege on every member (pytest-testinfra)."""

import base64
import json
import os
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))

from fleet_checks import address, group_addresses, secret, ssh_with_stdin  # noqa: E402

from pg_checks import sql  # noqa: E402

testinfra_hosts = ["ansible://dlock_backend"]

CONFIG = "/etc/patroni/config.yml"
DATA = "/var/lib/postgresql/15/patroni"


def patronictl(host, command):
    """patronictl with the member's configuration (it reads the cluster from etcd as Patroni's user)."""
    return host.check_output("patronictl -c %s %s" % (CONFIG, command))


def members(host):
    """{name: (role, state)} as patronictl list shows them."""
    return dict((row["Member"], (row["Role"], row["State"])) for row in json.loads(patronictl(host, "list -f json")))


def api(host, path, method="GET", auth=None):
    """A REST API request from the controller: (status, body)."""
    headers = {"Authorization": auth} if auth else {}
    request = urllib.request.Request("http://%s:8008%s" % (address(host), path), method=method, headers=headers,
                                     data=b"{}" if method != "GET" else None)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def pinned_patroni():
    """The Patroni release dlock_postgresql installs (its vars/main.yml)."""
    import yaml
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                           "roles", "dlock_postgresql", "vars", "main.yml")) as handle:
        return yaml.safe_load(handle)["__dlock_postgresql_patroni"]


def test_every_member_runs_the_pinned_patroni_from_its_venv(host):
    """Not Debian 12's 3.0.2 (its old leader can take the leader key back
    after a partition heals): the pinned release, from its venv, is what
    runs, and what the REST API reports."""
    pin = pinned_patroni()
    unit = host.file("/etc/systemd/system/patroni.service").content_string
    assert "\nExecStart=%s/bin/patroni %s\n" % (pin["venv"], CONFIG) in unit
    main_pid = host.check_output("systemctl show -p MainPID --value patroni")
    assert host.file("/proc/%s/cmdline" % main_pid).content_string.split("\0")[1] == pin["venv"] + "/bin/patroni"
    assert host.check_output("%s/bin/patroni --version" % pin["venv"]) == "patroni " + pin["version"]
    status, body = api(host, "/patroni")
    assert status == 200 and json.loads(body)["patroni"]["version"] == pin["version"]


def test_patroni_runs_and_debians_own_cluster_does_not(host):
    assert host.service("patroni").is_running and host.service("patroni").is_enabled
    assert not host.service("postgresql@15-main").is_running
    assert host.file("/etc/postgresql/15/main/start.conf").content_string.strip().splitlines()[-1] == "disabled"
    config = host.file(CONFIG)
    assert (config.user, config.group, config.mode) == ("postgres", "postgres", 0o600)
    assert config.content_string.startswith("# Ansible managed")
    data = host.file(DATA)
    assert (data.user, data.mode) == ("postgres", 0o700)
    assert sql(host, "SHOW data_directory", "postgres") == DATA
    listening = host.check_output("ss -Hltn")
    assert "%s:8008" % address(host) in listening and "0.0.0.0:8008" not in listening and "*:8008" not in listening


def test_one_leader_and_a_quorum_of_standbys(host):
    seen = members(host)
    assert sorted(seen) == sorted(host.ansible.get_variables()["groups"]["dlock_backend"]), seen
    roles = sorted(role for role, _state in seen.values())
    assert roles == ["Leader", "Quorum Standby", "Quorum Standby"], seen
    assert all(state in ("running", "streaming") for _role, state in seen.values()), seen
    # The REST API says the same, and this member knows its own part.
    status, body = api(host, "/cluster")
    assert status == 200, body
    cluster = json.loads(body)
    assert sorted(m["role"] for m in cluster["members"]) == ["leader", "quorum_standby", "quorum_standby"], cluster
    mine = seen[host.backend.get_hostname()][0]
    in_recovery = sql(host, "SELECT pg_is_in_recovery()", "postgres")
    assert in_recovery == ("f" if mine == "Leader" else "t"), (mine, in_recovery)


def test_every_commit_waits_for_one_standby_of_the_quorum(host):
    """The settings Patroni keeps in etcd, and what the leader does with them:
    a commit waits for any one of the two standbys (issue 24: one paused
    standby stops nothing)."""
    status, body = api(host, "/config")
    assert status == 200, body
    settings = json.loads(body)
    assert settings["synchronous_mode"] == "quorum" and settings["synchronous_mode_strict"] is True, settings
    assert (settings["ttl"], settings["loop_wait"], settings["retry_timeout"]) == (15, 5, 5), settings
    seen = members(host)
    if seen[host.backend.get_hostname()][0] == "Leader":
        standbys = sorted(name for name, (role, _state) in seen.items() if role == "Quorum Standby")
        names = sql(host, "SHOW synchronous_standby_names", "postgres")
        assert names.startswith("ANY 1 (") and all('"%s"' % name in names for name in standbys), names
        assert sql(host, "SHOW synchronous_commit", "postgres") == "on"
        assert sql(host, "SELECT string_agg(application_name || ':' || sync_state, ',' ORDER BY application_name) "
                         "FROM pg_stat_replication", "postgres") == ",".join("%s:quorum" % name for name in standbys)


def etcdctl(host, user, password, command):
    """etcdctl on the member against its own address; the password over ssh's
    stdin to etcdctl's prompt (never on a command line)."""
    done = ssh_with_stdin(host, "etcdctl --endpoints=http://%s:2379 -w json --user %s %s" % (address(host), user, command),
                          password)
    if done.stdout.startswith("Password:"):  # etcdctl prompts on stdout
        done.stdout = done.stdout.split("\n", 1)[1]
    return done


def test_patronis_etcd_user_reaches_only_its_prefix(host):
    password = secret("dlock-patroni-etcd.password")
    key = "/patroni/molecule-%s" % host.backend.get_hostname()
    assert etcdctl(host, "patroni", password, "put %s 1" % key).returncode == 0
    assert etcdctl(host, "patroni", password, "del %s" % key).returncode == 0
    leader = etcdctl(host, "patroni", password, "get /patroni/dlock/leader")
    assert leader.returncode == 0 and json.loads(leader.stdout).get("kvs"), leader.stderr  # Patroni's own key
    for command in ("put /dlock/x 1", "get /dlock/x", "put /other 1", "get --prefix /", "put /patroni 1",
                    "user list", "role list", "auth disable"):
        done = etcdctl(host, "patroni", password, command)
        assert done.returncode != 0 and "permission denied" in done.stderr, (command, done.stderr)
    role = etcdctl(host, "root", secret("backend-admin.password"), "role get patroni")
    assert role.returncode == 0, role.stderr
    perms = json.loads(role.stdout)["perm"]
    assert [(p.get("permType", 0), p.get("key"), p.get("range_end")) for p in perms] == [
        (2, "L3BhdHJvbmkv", "L3BhdHJvbmkw")], perms  # READWRITE on [/patroni/, /patroni0)


POST = """
import sys, urllib.request, urllib.error
headers = {} if sys.argv[2] == "-" else {"Authorization": sys.argv[2]}
request = urllib.request.Request(sys.argv[1], data=b"{}", method="POST", headers=headers)
try:
    print(urllib.request.urlopen(request, timeout=10).status)
except urllib.error.HTTPError as error:  # the refusal is the answer
    print(error.code)
"""


def test_rest_api_changes_need_a_member_and_the_password(host):
    # Reads answer anyone.
    assert api(host, "/health")[0] == 200
    # A change from the controller (not a member) is refused before any password check.
    status, _body = api(host, "/restart", "POST")
    assert status == 403, status
    # From the member itself: refused without the password, or with another.
    for auth in ("", "Basic " + base64.b64encode(b"patroni:not-the-password").decode()):
        answer = host.check_output("python3 -c %s %s %s", POST, "http://%s:8008/restart" % address(host), auth or "-")
        assert answer == "401", (auth, answer)


def test_pg_hba_lets_only_the_fleet_and_the_members_in(host):
    rules = [line.split() for line in host.file(DATA + "/pg_hba.conf").content_string.splitlines()
             if line.strip() and not line.startswith("#")]

    def addresses(group):
        return sorted(each + "/32" for each in group_addresses(host, group))

    assert rules[:2] == [["local", "all", "postgres", "peer"], ["local", "replication", "replicator", "scram-sha-256"]]
    assert sorted(r[3] for r in rules if r[:3] == ["host", "replication", "replicator"]) == addresses("dlock_backend")
    assert sorted(r[3] for r in rules if r[:3] == ["host", "postgres", "rewind"]) == addresses("dlock_backend")
    assert sorted(r[3] for r in rules if r[:3] == ["host", "dlock", "dlock"]) == addresses("dlock_nodes")
    assert len(rules) == 2 + 2 * 3 + 3 and all(r[-1] in ("peer", "scram-sha-256") for r in rules), rules
