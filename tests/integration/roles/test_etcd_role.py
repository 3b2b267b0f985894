"""dlock_etcd's cluster checks and bootstrap settings, without etcd: local host
aliases stand for the members (their ansible_host is the address the role
uses), the role's preflight runs, then its settings template is rendered
(bad single variables: test_role_hostile.py; the real cluster:
molecule/etcd)."""

import base64
import json
import os
import subprocess
import sys

import pytest
import yaml
from ansible_cli import BIN, ROOT, ansible_env

ROOT_PASSWORD = "Root-Pw-5ecret-0001"
PASSWORD = "User-Pw-5ecret-0002"

PLAY = """
- hosts: dlock_backend
  gather_facts: true
  gather_subset: [min]
  tasks:
    - ansible.builtin.import_role:
        name: dlock.fleet.dlock_etcd
        tasks_from: preflight.yml
    - ansible.builtin.copy:
        content: "{{{{ lookup('ansible.builtin.template', '{root}/roles/dlock_etcd/templates/etcd.env.j2') }}}}"
        dest: "{out}/{{{{ inventory_hostname }}}}.env"
        mode: "0600"
"""


def run(tmp_path, members, hostvars=None, limit=None, extra=None):
    """The play on `members` (name: address); returns (rc, output, {name: rendered settings})."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = dict((name, dict(local, ansible_host=address, **(hostvars or {}).get(name, {})))
                 for name, address in members.items())
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"children": {"dlock_backend": {"hosts": hosts}}}}))
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "play.yml").write_text(PLAY.format(root=ROOT, out=out))
    variables = dict(dlock_etcd_root_password=ROOT_PASSWORD, dlock_etcd_password=PASSWORD, **(extra or {}))
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    argv = [os.path.join(BIN, "ansible-playbook"), "-i", str(tmp_path / "inventory.yml"), "-e",
            "@" + str(tmp_path / "vars.json"), str(tmp_path / "play.yml")] + (["--limit", limit] if limit else [])
    proc = subprocess.run(argv, env=ansible_env(), capture_output=True, text=True, timeout=180, check=False)
    output = proc.stdout + proc.stderr
    assert ROOT_PASSWORD not in output and PASSWORD not in output
    rendered = dict((p.name[:-len(".env")], p.read_text()) for p in out.iterdir())
    return proc.returncode, output, rendered


def settings(text):
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


THREE = {"e1": "10.0.0.1", "e2": "10.0.0.2", "e3": "10.0.0.3"}


def test_three_members_bootstrap_from_the_inventory(tmp_path):
    rc, output, rendered = run(tmp_path, THREE)
    assert rc == 0, output
    assert sorted(rendered) == ["e1", "e2", "e3"]
    for name, address in THREE.items():
        values = settings(rendered[name])
        assert values["ETCD_NAME"] == name
        assert values["ETCD_LISTEN_PEER_URLS"] == values["ETCD_INITIAL_ADVERTISE_PEER_URLS"] == "http://%s:2380" % address
        assert values["ETCD_LISTEN_CLIENT_URLS"] == values["ETCD_ADVERTISE_CLIENT_URLS"] == "http://%s:2379" % address
        assert values["ETCD_LISTEN_METRICS_URLS"] == "http://%s:2381" % address  # plain HTTP, TLS or not
        assert values["ETCD_INITIAL_CLUSTER"] == "e1=http://10.0.0.1:2380,e2=http://10.0.0.2:2380,e3=http://10.0.0.3:2380"
        assert values["ETCD_INITIAL_CLUSTER_STATE"] == "new"
        assert values["ETCD_DATA_DIR"] == "/var/lib/etcd/dlock"
        assert (values["ETCD_AUTO_COMPACTION_MODE"], values["ETCD_AUTO_COMPACTION_RETENTION"]) == ("revision", "10000")
        assert values["ETCD_QUOTA_BACKEND_BYTES"] == str(2 * 1024 ** 3)
        assert (values["ETCD_HEARTBEAT_INTERVAL"], values["ETCD_ELECTION_TIMEOUT"]) == ("100", "1000")
        assert [key for key in values if "UNSAFE" in key or "PASSWORD" in key] == []
        assert not any(key.startswith("ETCD_PEER_") or key == "ETCD_CERT_FILE" for key in values)


def test_tls_settings(tmp_path):
    files = dict(dlock_etcd_tls=True, dlock_etcd_tls_cert_file="/etc/etcd/c.pem", dlock_etcd_tls_key_file="/etc/etcd/k.pem",
                 dlock_etcd_tls_ca_file="/etc/etcd/ca.pem", dlock_etcd_peer_tls=True,
                 dlock_etcd_peer_tls_cert_file="/etc/etcd/p.pem", dlock_etcd_peer_tls_key_file="/etc/etcd/pk.pem",
                 dlock_etcd_peer_tls_ca_file="/etc/etcd/pca.pem", dlock_etcd_metrics_port=9379)
    rc, output, rendered = run(tmp_path, {"e1": "fd00::1"}, extra=files)
    assert rc == 0, output
    values = settings(rendered["e1"])
    assert values["ETCD_LISTEN_CLIENT_URLS"] == "https://[fd00::1]:2379"
    assert values["ETCD_LISTEN_METRICS_URLS"] == "http://[fd00::1]:9379"
    assert values["ETCD_INITIAL_CLUSTER"] == "e1=https://[fd00::1]:2380"
    assert values["ETCD_CERT_FILE"] == "/etc/etcd/c.pem"
    # No client-port CA: etcd 3.4 would then refuse every client without a certificate.
    assert "ETCD_TRUSTED_CA_FILE" not in values and "ETCD_CLIENT_CERT_AUTH" not in values
    assert (values["ETCD_PEER_CERT_FILE"], values["ETCD_PEER_CLIENT_CERT_AUTH"]) == ("/etc/etcd/p.pem", "true")


def test_metrics_port_0_serves_no_metrics(tmp_path):
    rc, output, rendered = run(tmp_path, {"e1": "10.0.0.1"}, extra={"dlock_etcd_metrics_port": 0})
    assert rc == 0, output
    assert "ETCD_LISTEN_METRICS_URLS" not in settings(rendered["e1"]) and "ETCD_NAME" in settings(rendered["e1"])


@pytest.mark.parametrize("size", [2, 4, 6])
def test_other_sizes_are_refused_for_quorum(tmp_path, size):
    members = dict(("e%d" % i, "10.0.0.%d" % i) for i in range(1, size + 1))
    rc, output, rendered = run(tmp_path, members)
    assert rc == 2 and rendered == {}, output
    assert "must be one of 1, 3 or 5 members of group dlock_backend (it has %d)" % size in output, output
    assert "the quorum" in output


def test_an_even_size_passes_only_while_a_member_joins(tmp_path):
    """Growing 3 to 5 goes through 4: etcd adds one member at a time, each
    joined before the next is added."""
    four = dict(THREE, e4="10.0.0.4")
    rc, output, rendered = run(tmp_path, four, hostvars={"e4": {"dlock_etcd_initial_cluster_state": "existing"}})
    assert rc == 0, output
    assert settings(rendered["e4"])["ETCD_INITIAL_CLUSTER_STATE"] == "existing"
    assert settings(rendered["e1"])["ETCD_INITIAL_CLUSTER_STATE"] == "new"
    assert len(settings(rendered["e4"])["ETCD_INITIAL_CLUSTER"].split(",")) == 4


def test_a_member_left_out_of_the_play_is_refused(tmp_path):
    rc, output, rendered = run(tmp_path, THREE, limit="e1,e2")
    assert rc == 2 and rendered == {}, output
    assert "the members e3 of group dlock_backend are not in this play" in output, output


def test_shared_addresses_are_refused(tmp_path):
    rc, output, rendered = run(tmp_path, dict(THREE, e3="10.0.0.1"))
    assert rc == 2 and rendered == {}, output
    assert "two members of group dlock_backend share a name or an address" in output, output


def test_a_member_with_data_keeps_its_bootstrap_settings(tmp_path):
    """The initial cluster of a member that has data is the one it started
    with: adding a member changes (and restarts) no running member."""
    old = "ETCD_INITIAL_CLUSTER=e1=http://10.0.0.1:2380,e2=http://10.0.0.2:2380,old=http://10.0.0.9:2380\n" \
          "ETCD_INITIAL_CLUSTER_STATE=new\n"
    slurped = {"__dlock_etcd_settings": {"content": base64.b64encode(old.encode()).decode()}}
    rc, output, rendered = run(tmp_path, THREE, hostvars={"e1": slurped})
    assert rc == 0, output
    assert settings(rendered["e1"])["ETCD_INITIAL_CLUSTER"].endswith(",old=http://10.0.0.9:2380")
    assert settings(rendered["e2"])["ETCD_INITIAL_CLUSTER"].endswith(",e3=http://10.0.0.3:2380")
