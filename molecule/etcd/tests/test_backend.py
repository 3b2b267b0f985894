"""The etcd members: one healthy cluster of the three backend nodes, with a
leader; authentication enforced; the runners' user limited to /dlock/; data
on disk and the documented settings (pytest-testinfra)."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))

from fleet_checks import address, group_addresses, secret, ssh_with_stdin  # noqa: E402

testinfra_hosts = ["ansible://dlock_backend"]

SETTINGS = "/etc/default/etcd"
TLS_DIR = "/etc/etcd/tls"  # molecule/common/tls_prepare.yml


def etcdctl(host, user, command, password=None):
    """etcdctl on the member against its own address; the password, if any,
    over ssh's stdin to etcdctl's prompt (never on a command line)."""
    prefix = "etcdctl --endpoints=https://%s:2379 --cacert %s/ca.pem -w json " % (address(host), TLS_DIR)
    if user:
        prefix += "--user %s " % user
    done = ssh_with_stdin(host, prefix + command, password or "")
    if done.stdout.startswith("Password:"):  # etcdctl prompts on stdout
        done.stdout = done.stdout.split("\n", 1)[1]
    return done


def backends(host):
    """The backend nodes' names, in inventory order (the etcd members)."""
    return host.ansible.get_variables()["groups"]["dlock_backend"]


def as_root(host, command):
    done = etcdctl(host, "root", command, secret("backend-admin.password"))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def as_runner(host, command):
    return etcdctl(host, "dlock", command, secret("backend.password"))


def test_etcd_runs_with_the_documented_settings(host):
    assert host.service("etcd").is_running and host.service("etcd").is_enabled
    conf = host.file(SETTINGS)
    assert (conf.user, conf.mode) == ("root", 0o644) and conf.content_string.startswith("# Ansible managed")
    values = dict(line.split("=", 1) for line in conf.content_string.splitlines() if line and line[0] != "#")
    assert values["ETCD_NAME"] == host.backend.get_hostname()
    assert values["ETCD_DATA_DIR"] == "/var/lib/etcd/dlock"
    assert values["ETCD_INITIAL_CLUSTER"] == ",".join(
        "%s=https://%s:2380" % member for member in zip(backends(host), group_addresses(host, "dlock_backend")))
    # What the running etcd was given (its environment: Debian's unit passes no flags).
    pid = host.check_output("systemctl show -p MainPID --value etcd")
    environ = host.check_output("tr '\\0' '\\n' < /proc/%s/environ" % pid)
    for setting in ("ETCD_AUTO_COMPACTION_MODE=revision", "ETCD_AUTO_COMPACTION_RETENTION=10000",
                    "ETCD_QUOTA_BACKEND_BYTES=2147483648", "ETCD_HEARTBEAT_INTERVAL=100",
                    "ETCD_ELECTION_TIMEOUT=1000", "ETCD_DATA_DIR=/var/lib/etcd/dlock",
                    "ETCD_LISTEN_METRICS_URLS=http://%s:2381" % address(host)):
        assert setting in environ.splitlines(), setting
    assert "UNSAFE" not in environ.upper()
    assert "unsafe" not in host.check_output("ps -o args= -C etcd")
    data = host.file("/var/lib/etcd/dlock")
    assert (data.user, data.mode) == ("etcd", 0o700) and host.file("/var/lib/etcd/dlock/member/wal").is_directory
    listening = host.check_output("ss -Hltn")
    assert "%s:2379" % address(host) in listening and "0.0.0.0:2379" not in listening and "*:2379" not in listening


def test_one_cluster_of_three_with_one_leader(host):
    members = as_root(host, "member list")["members"]
    assert sorted(m["name"] for m in members) == sorted(backends(host)) and len(members) == 3, members
    statuses = as_root(host, "endpoint status --cluster")
    assert len(statuses) == 3
    leaders = set(s["Status"]["leader"] for s in statuses)
    ids = set(s["Status"]["header"]["member_id"] for s in statuses)
    assert len(leaders) == 1 and leaders <= ids, statuses  # all agree on one leader, a member
    health = as_root(host, "endpoint health --cluster")
    assert len(health) == 3 and all(h["health"] for h in health), health


def test_no_request_without_authentication(host):
    for command in ("get /dlock/x", "put /dlock/x 1", "get --prefix /"):
        done = etcdctl(host, None, command)
        assert done.returncode != 0 and "user name is empty" in done.stderr, (command, done.stderr)
    wrong = etcdctl(host, "dlock", "get /dlock/x", "wrong-password-0123456789")
    assert wrong.returncode != 0 and "authentication failed" in wrong.stderr, wrong.stderr


def test_the_runners_user_reaches_only_its_prefix(host):
    key = "/dlock/molecule-%s" % host.backend.get_hostname()
    done = as_runner(host, "put %s 1" % key)
    assert done.returncode == 0, done.stderr
    assert as_runner(host, "del %s" % key).returncode == 0
    for command in ("put /other/x 1", "get /other/x", "put /dlockx 1", "put /dlock 1", "get --prefix /",
                    "user list", "role list", "auth disable"):
        done = as_runner(host, command)
        assert done.returncode != 0 and "permission denied" in done.stderr, (command, done.stderr)


def test_the_runners_role_holds_one_permission(host):
    role = as_root(host, "role get dlock")
    assert [(p.get("permType", 0), p.get("key"), p.get("range_end")) for p in role["perm"]] == [
        (2, "L2Rsb2NrLw==", "L2Rsb2NrMA==")], role  # READWRITE on [/dlock/, /dlock0): --prefix /dlock/
    user = as_root(host, "user get dlock")
    assert user["roles"] == ["dlock"], user


PROBE = """
import json, ssl, sys, urllib.request
url, cafile = sys.argv[1], (None if sys.argv[2] == "-" else sys.argv[2])
context = ssl.create_default_context(cafile=cafile)  # system CAs when none is given
try:
    with urllib.request.urlopen(url, timeout=5, context=context) as answer:
        print(json.dumps({"status": answer.status, "body": answer.read().decode()}))
except Exception as error:  # what refused it is the answer
    print(json.dumps({"error": type(error).__name__, "detail": str(error)}))
"""


def probe(host, url, cafile=""):
    """An HTTP(S) GET from the member itself (python3: the nodes have no curl)."""
    return json.loads(host.check_output("python3 -c %s %s %s", PROBE, url, cafile or "-"))


def test_client_and_peer_ports_speak_only_verified_tls(host):
    """No plain HTTP on either port; a client must check the server against
    the CA, and the peer port wants a client certificate the CA signed."""
    me = address(host)
    for port in (2379, 2380):
        plain = probe(host, "http://%s:%d/version" % (me, port))
        assert plain.get("error") or "etcdserver" not in plain["body"], (port, plain)  # Go answers 400 to HTTP on a TLS port
        unverified = probe(host, "https://%s:%d/version" % (me, port))
        assert "CERTIFICATE_VERIFY_FAILED" in unverified.get("detail", ""), (port, unverified)
    verified = probe(host, "https://%s:2379/version" % me, TLS_DIR + "/ca.pem")
    assert verified.get("status") == 200 and "etcdserver" in verified["body"], verified
    no_client_cert = probe(host, "https://%s:2380/members" % me, TLS_DIR + "/ca.pem")
    assert no_client_cert.get("error"), no_client_cert  # peers must present a certificate
    key = host.file(TLS_DIR + "/server.key")
    assert (key.user, key.mode) == ("etcd", 0o600)


def test_the_metrics_port_serves_etcds_metrics_and_health_and_no_key(host):
    """dlock_etcd_metrics_port (2381): etcd's own metrics in plain HTTP, for a
    Prometheus without a certificate or a password. Among them the two disk
    latencies the rules' DlockEtcdSlowWalFsync reads, already counting (every
    write is fsynced, and the role has written); /health; and nothing of the
    API: no key, no version, no auth."""
    me = address(host)
    metrics = probe(host, "http://%s:2381/metrics" % me)
    assert metrics.get("status") == 200, metrics
    samples = dict(line.rsplit(" ", 1) for line in metrics["body"].splitlines() if line and line[0] != "#")
    assert float(samples["etcd_disk_wal_fsync_duration_seconds_count"]) > 0
    assert 'etcd_disk_wal_fsync_duration_seconds_bucket{le="0.128"}' in samples
    assert samples["etcd_server_has_leader"] == "1"
    health = probe(host, "http://%s:2381/health" % me)
    assert health.get("status") == 200 and json.loads(health["body"])["health"] == "true", health
    for path in ("/v3/kv/range", "/version", "/v3/auth/status"):
        refused = probe(host, "http://%s:2381%s" % (me, path))
        assert refused.get("error") == "HTTPError" and "404" in refused["detail"], (path, refused)
