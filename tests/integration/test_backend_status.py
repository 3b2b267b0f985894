"""Which backend member answered, and the cluster's health as a node sees it
(Backend.describe, `dlock status`, `dlock metrics`, the run's log line), on
real servers: a 3-member etcd cluster losing its members one by one, a
PostgreSQL primary whose synchronous standby goes (seen by a superuser and by
a role without pg_read_all_stats), Redis and the file backend."""

import json
import os
import re
import subprocess
import uuid

import pytest
import yaml
from runner_proc import last_log, run_dlock, wait_for
from test_lock_state_metrics import promtool_clean, value
from pg_access import PASSWORD, provision

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import open_backend

import servers


RULES = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "dlock_metrics", "files", "dlock.rules.yml")


def alert_selects(text, alert, tmp_path):
    """How many series the expression of the shipped rule `alert` selects
    from these real `dlock metrics` samples, as node_exporter would serve
    them (an instance label added): promtool's promql_expr_test. Ties the
    rules to the names and labels the engine really writes."""
    with open(RULES) as handle:
        expr = [rule["expr"] for group in yaml.safe_load(handle)["groups"] for rule in group["rules"]
                if rule.get("alert") == alert][0]
    series = []
    for line in text.splitlines():
        match = re.match(r"^(dlock_backend_\w+)(?:\{(.*)\})? (\S+)$", line)
        if match:
            labels = (match.group(2) + "," if match.group(2) else "") + 'instance="n1"'
            series.append({"series": "%s{%s}" % (match.group(1), labels), "values": "%sx5" % match.group(3)})
    for count in range(4):
        test = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
            "interval": "1m", "input_series": series, "promql_expr_test": [{
                "expr": "count(%s) or vector(0)" % expr, "eval_time": "2m",
                "exp_samples": [{"labels": "{}", "value": count}]}]}]}
        path = tmp_path / "probe.test.yml"
        path.write_text(yaml.safe_dump(test))
        if subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, check=False).returncode == 0:
            return count
    raise AssertionError("promtool could not evaluate %s on:\n%s" % (alert, text))


@pytest.fixture
def etcd3():
    """A private 3-member cluster: the tests stop members."""
    server = servers.EtcdServer(members=3)
    yield server
    server.stop()


def etcd_members(server):
    """name -> member id (hex), as etcdctl lists them."""
    listed = json.loads(server.etcdctl("member", "list", "-w", "json"))["members"]
    return dict((member["name"], "%x" % member["ID"]) for member in listed)


def etcd_leader(server):
    """The leader's name, as etcdctl's endpoint status of the live members says."""
    ids = dict((ident, name) for name, ident in etcd_members(server).items())
    statuses = json.loads(server.etcdctl("endpoint", "status", "-w", "json"))
    leaders = set("%x" % status["Status"]["leader"] for status in statuses)
    assert len(leaders) == 1, statuses
    return ids[leaders.pop()]


def endpoint(server, index):
    return "127.0.0.1:%d" % server.client_ports[index]


def test_etcd_names_the_member_that_answered_and_sees_the_quorum_go(etcd3, unique_key, tmp_path):
    ids = etcd_members(etcd3)
    backend = open_backend(etcd3.url, op_timeout=1.0)
    try:
        assert backend.describe()["member"] is None  # nothing answered yet
        assert backend.acquire(unique_key, "a", 30).granted
        assert backend.describe()["member"] == {"endpoint": endpoint(etcd3, 0), "id": ids["m0"]}
        info = backend.describe(cluster=True)
        leader = etcd_leader(etcd3)
        assert info["member"] == {"endpoint": endpoint(etcd3, 0), "id": ids["m0"], "name": "m0",
                                  "role": "leader" if leader == "m0" else "follower"}
        cluster = info["cluster"]
        assert (cluster["members"], cluster["healthy"], cluster["leader"]) == (3, 3, leader)
        assert [row["name"] for row in cluster["endpoints"]] == ["m0", "m1", "m2"]

        # The first member of the URL goes: the next one answers, and is named.
        etcd3.stop_member(0)
        etcd3.wait_healthy()
        assert backend.renew(unique_key, "a", 30) is True
        assert backend.describe()["member"] == {"endpoint": endpoint(etcd3, 1), "id": ids["m1"], "name": "m1"}
        cluster = backend.describe(cluster=True)["cluster"]
        assert (cluster["members"], cluster["healthy"], cluster["leader"]) == (3, 2, etcd_leader(etcd3))
        assert "error" in cluster["endpoints"][0] and "error" not in cluster["endpoints"][1]

        # A second one goes: the last member is alone, without a leader. One
        # read judged whole: a member that timed out on a loaded host shows
        # no leader too, and the next read may find the last member still
        # following the leader it lost (CI).
        etcd3.stop_member(1)
        seen = {}

        def alone_without_leader():
            seen["cluster"] = cluster = backend.describe(cluster=True)["cluster"]
            return ((cluster["members"], cluster["healthy"], cluster["leader_id"]) == (3, 0, None)
                    and cluster["endpoints"][2].get("error") == "etcdserver: no leader")
        wait_for(alone_without_leader, 15, "the last member to say it has no leader")
        assert seen["cluster"]["leader"] is None
    finally:
        backend.close()

    # Reads need a quorum, so status and metrics fail (75), and still say why.
    status = run_dlock("status", "--key", unique_key, "--backend", etcd3.url)
    assert status.returncode == 75, status.stderr
    assert "backend: etcd, answered by m2 %s" % endpoint(etcd3, 2) in status.stderr
    assert "3 members, 0 of the URL's 3 healthy, leader NONE (no quorum)" in status.stderr
    (tmp_path / "job.json").write_text(json.dumps({"command": ["true"], "key": unique_key}))
    metrics = run_dlock("metrics", "--backend", etcd3.url, "--jobs-dir", str(tmp_path), "--output", "-")
    assert metrics.returncode == 75, metrics.stderr
    text = metrics.stdout
    assert value(text, "dlock_lock_state_refresh_success") == 0
    assert value(text, "dlock_backend_cluster_members") == 3
    assert value(text, "dlock_backend_cluster_members_healthy") == 0
    assert value(text, "dlock_backend_cluster_leader") == 0
    promtool_clean(text)
    assert alert_selects(text, "DlockBackendQuorumLost", tmp_path) == 1


def test_the_run_log_names_the_etcd_member_that_granted(etcd3, unique_key, tmp_path):
    ids = etcd_members(etcd3)
    args = ("run", "--job", "member", "--key", unique_key, "--backend", etcd3.url, "--", "true")
    first = run_dlock(*args)
    assert first.returncode == 0, first.stderr
    log = last_log(first.stderr)
    assert (log["result"], log["member"], log["member_id"]) == ("success", endpoint(etcd3, 0), ids["m0"])
    etcd3.stop_member(0)
    etcd3.wait_healthy()
    second = run_dlock(*args)
    assert second.returncode == 0, second.stderr
    log = last_log(second.stderr)
    assert (log["result"], log["member"], log["member_id"]) == ("success", endpoint(etcd3, 1), ids["m1"])

    status = run_dlock("status", "--key", unique_key, "--backend", etcd3.url, "--json")
    assert status.returncode == 0, status.stderr
    row = json.loads(status.stdout)[0]
    assert row["key"] == unique_key and row["last"]["result"] == "success"
    assert row["backend"]["member"]["name"] == "m1" and row["backend"]["cluster"]["healthy"] == 2
    metrics = run_dlock("metrics", "--backend", etcd3.url, "--jobs-dir", str(tmp_path), "--output", "-")
    assert metrics.returncode == 0, metrics.stderr
    assert value(metrics.stdout, r'dlock_backend_info\{backend="etcd",member="%s",member_name="m1",'
                                 r'member_role="(?:leader|follower)"\}' % re.escape(endpoint(etcd3, 1))) == 1
    assert value(metrics.stdout, "dlock_backend_cluster_members_healthy") == 2
    assert value(metrics.stdout, "dlock_backend_cluster_leader") == 1
    promtool_clean(metrics.stdout)
    assert alert_selects(metrics.stdout, "DlockBackendQuorumLost", tmp_path) == 0  # one of three down


def test_a_user_limited_to_the_prefix_sees_the_cluster(etcd_auth, unique_key):
    url = "etcd://dlock@127.0.0.1:%d/dlock" % etcd_auth.client_ports[0]
    backend = open_backend(url, password="Locker-Secret-1")
    try:
        backend.query(unique_key)
        info = backend.describe(cluster=True)
    finally:
        backend.close()
    assert info["member"]["name"] == "m0" and info["member"]["role"] == "leader"
    assert (info["cluster"]["members"], info["cluster"]["healthy"], info["cluster"]["leader"]) == (1, 1, "m0")


def replication(url, password=None):
    """describe(cluster=True) of the primary at url, after a query."""
    backend = open_backend(url, password=password, op_timeout=1.0)
    try:
        backend.query("replication-probe")
        return backend.describe(cluster=True)
    finally:
        backend.close()


def test_postgresql_shows_the_synchronous_standby_as_far_as_the_role_may(pg_sync, pg_role_spec, tmp_path):
    """As a superuser, and as the least-privilege role dlock_postgresql makes
    (no membership: no pg_read_all_stats)."""
    primary = "127.0.0.1:%d" % pg_sync.primary.port
    name = "dlock_st_" + uuid.uuid4().hex[:8]
    provision(pg_sync.primary, name, pg_role_spec)
    least_url = "postgresql://%s@%s/%s" % (name, primary, name)
    password = tmp_path / "password"
    password.write_text(PASSWORD + "\n")
    (tmp_path / "jobs").mkdir()

    def metrics(url, *flags):
        done = run_dlock("metrics", "--backend", url, "--jobs-dir", str(tmp_path / "jobs"), "--output", "-", *flags)
        assert done.returncode == 0, done.stderr
        promtool_clean(done.stdout)
        return done.stdout

    superuser = replication(pg_sync.primary.url())
    assert superuser["member"] == {"endpoint": primary, "role": "primary"}
    assert superuser["cluster"] == {"primary": True, "synchronous_standby_names": "*", "sync_replication": True,
                                    "standbys_connected": 1, "sync_standbys": 1}
    # The role sees the standby's connection, not its sync_state.
    least = replication(least_url, PASSWORD)["cluster"]
    assert (least["sync_replication"], least["standbys_connected"], least["sync_standbys"]) == (True, 1, None)
    text = metrics(least_url, "--password-file", str(password))
    assert value(text, "dlock_backend_standbys_connected") == 1 and "dlock_backend_sync_standbys" not in text
    assert alert_selects(text, "DlockBackendSyncStandbyLost", tmp_path) == 0
    text = metrics(pg_sync.primary.url())
    assert value(text, "dlock_backend_sync_standbys") == 1
    assert alert_selects(text, "DlockBackendSyncStandbyLost", tmp_path) == 0

    pg_sync.standby_down()
    assert replication(pg_sync.primary.url())["cluster"]["sync_standbys"] == 0
    least = replication(least_url, PASSWORD)["cluster"]
    assert (least["sync_replication"], least["standbys_connected"], least["sync_standbys"]) == (True, 0, None)
    text = metrics(pg_sync.primary.url())
    assert value(text, r'dlock_backend_info\{backend="postgresql",member="%s",member_role="primary"\}'
                 % re.escape(primary)) == 1
    assert value(text, "dlock_backend_sync_replication_enabled") == 1
    assert value(text, "dlock_backend_standbys_connected") == 0
    assert value(text, "dlock_backend_sync_standbys") == 0
    assert alert_selects(text, "DlockBackendSyncStandbyLost", tmp_path) == 1
    text = metrics(least_url, "--password-file", str(password))
    assert alert_selects(text, "DlockBackendSyncStandbyLost", tmp_path) == 1
    status = run_dlock("status", "--key", "replication-probe", "--backend", least_url, "--password-file", str(password))
    assert status.returncode == 0, status.stderr
    assert "backend: postgresql, answered by %s (primary)" % primary in status.stdout
    assert "synchronous replication on (*), 0 standby connection(s), not visible which are synchronous" \
        in status.stdout


@pytest.mark.parametrize("scheme", ["postgresql", "postgresql+advisory"])
def test_a_multi_host_url_names_the_primary_that_granted(pg_sync, unique_key, scheme):
    standby = "127.0.0.1:%d" % pg_sync.standby.port
    primary = "127.0.0.1:%d" % pg_sync.primary.port
    url = "%s://postgres@127.0.0.1:1,%s,%s/dlock" % (scheme, standby, primary)
    done = run_dlock("run", "--job", "member", "--key", unique_key, "--backend", url, "--", "true")
    assert done.returncode == 0, done.stderr
    log = last_log(done.stderr)
    assert (log["result"], log["member"]) == ("success", primary)
    assert "member_id" not in log


def test_redis_and_file_name_their_one_server(redis_server, unique_key, tmp_path):
    for url, member in ((redis_server.url, "127.0.0.1:%d" % redis_server.port),
                        ("file://%s" % tmp_path, str(tmp_path))):
        done = run_dlock("run", "--job", "member", "--key", unique_key, "--backend", url, "--", "true")
        assert done.returncode == 0, done.stderr
        assert last_log(done.stderr)["member"] == member
        status = run_dlock("status", "--key", unique_key, "--backend", url, "--json")
        assert status.returncode == 0, status.stderr
        backend = json.loads(status.stdout)[0]["backend"]
        assert backend["member"] == {"endpoint": member} and backend["cluster"] is None
