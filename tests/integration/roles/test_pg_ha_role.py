"""dlock_postgresql's HA mode without Patroni: local host aliases stand for
the members (their ansible_host is the address the role uses), the role's
preflight runs, then Patroni's configuration is rendered and read back as
YAML, and the runners' URL is built as the role builds it (the real cluster:
molecule/postgresql-ha)."""

import glob
import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from ansible_cli import BIN, ROOT, ansible_env

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate

PASSWORDS = {"dlock_postgresql_password": "Runner-Pw-5ecret-01", "dlock_postgresql_ha_etcd_password": "Etcd-Pw-5ecret-002",
             "dlock_postgresql_ha_replication_password": "Repl-Pw-5ecret-003",
             "dlock_postgresql_ha_rewind_password": "Rewind-Pw-5ecret-04",
             "dlock_postgresql_ha_restapi_password": "Api-Pw-5ecret-0005"}
ENDPOINTS = ["http://10.0.0.1:2379", "http://10.0.0.2:2379", "http://10.0.0.3:2379"]

PLAY = """
- hosts: dlock_backend
  gather_facts: true
  gather_subset: [min]
  tasks:
    - ansible.builtin.import_role:
        name: dlock.fleet.dlock_postgresql
        tasks_from: preflight.yml
    - ansible.builtin.copy:
        content: "{{{{ lookup('ansible.builtin.template', '{root}/roles/dlock_postgresql/templates/patroni.yml.j2') }}}}"
        dest: "{out}/{{{{ inventory_hostname }}}}.yml"
        mode: "0600"
    - ansible.builtin.copy:
        content: "{{{{ __dlock_postgresql_ha_url }}}}"
        dest: "{out}/{{{{ inventory_hostname }}}}.url"
        mode: "0600"
"""


def run(tmp_path, members, extra=None, limit=None):
    """The play on `members` (name: address); returns (rc, output, {name: config})."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = dict((name, dict(local, ansible_host=address)) for name, address in members.items())
    nodes = {"n1": dict(local, ansible_host="10.0.1.11"), "n2": dict(local, ansible_host="10.0.1.12")}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"children": {
        "dlock_backend": {"hosts": hosts}, "dlock_nodes": {"hosts": nodes}}}}))
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "play.yml").write_text(PLAY.format(root=ROOT, out=out))
    variables = dict(PASSWORDS, dlock_postgresql_ha=True, dlock_postgresql_ha_etcd_endpoints=ENDPOINTS,
                     dlock_postgresql_listen_addresses=["localhost", "{{ ansible_host }}"])
    variables.update(extra or {})
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    argv = [os.path.join(BIN, "ansible-playbook"), "-i", str(tmp_path / "inventory.yml"), "-e",
            "@" + str(tmp_path / "vars.json"), str(tmp_path / "play.yml")]
    argv += ["--limit", limit] if limit else []
    proc = subprocess.run(argv, env=ansible_env(), capture_output=True, text=True, timeout=180, check=False)
    output = proc.stdout + proc.stderr
    assert not any(password in output for password in PASSWORDS.values())
    rendered = dict((p.name[:-len(".yml")], yaml.safe_load(p.read_text())) for p in out.glob("*.yml"))
    for path in out.glob("*.url"):
        rendered[path.name[:-len(".yml")]]["url"] = path.read_text()
    return proc.returncode, output, rendered


THREE = {"p1": "10.0.0.1", "p2": "10.0.0.2", "p3": "10.0.0.3"}


def test_three_members_get_one_cluster_with_strict_synchronous_replication(tmp_path):
    rc, output, rendered = run(tmp_path, THREE)
    assert rc == 0, output
    assert sorted(rendered) == ["p1", "p2", "p3"]
    for name, address in THREE.items():
        config = rendered[name]
        assert (config["scope"], config["namespace"], config["name"]) == ("dlock", "/patroni", name)
        assert config["restapi"]["listen"] == config["restapi"]["connect_address"] == address + ":8008"
        assert config["restapi"]["allowlist_include_members"] is True
        assert config["restapi"]["authentication"] == {"username": "patroni",
                                                       "password": PASSWORDS["dlock_postgresql_ha_restapi_password"]}
        assert config["etcd3"] == {"hosts": ["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"], "protocol": "http",
                                   "username": "patroni", "password": PASSWORDS["dlock_postgresql_ha_etcd_password"]}
        assert config["bootstrap"]["dcs"] == {"ttl": 15, "loop_wait": 5, "retry_timeout": 5, "synchronous_mode": "quorum",
                                              "synchronous_mode_strict": True, "synchronous_node_count": 1}
        pg = config["postgresql"]
        assert pg["listen"] == "localhost,%s:5432" % address and pg["connect_address"] == address + ":5432"
        assert pg["data_dir"] == "/var/lib/postgresql/15/patroni" and pg["bin_dir"] == "/usr/lib/postgresql/15/bin"
        assert pg["authentication"]["superuser"] == {"username": "postgres"}  # peer on the socket: no password
        assert pg["use_unix_socket"] is True and pg["use_pg_rewind"] is True
        assert pg["parameters"]["password_encryption"] == "scram-sha-256"
        assert pg["parameters"]["tcp_keepalives_idle"] == 5
        hba = [line.split() for line in pg["pg_hba"]]
        assert hba[:2] == [["local", "all", "postgres", "peer"], ["local", "replication", "replicator", "scram-sha-256"]]
        members = ["%s/32" % a for a in sorted(THREE.values())]
        assert sorted(r[3] for r in hba if r[1:3] == ["replication", "replicator"] and r[0] == "host") == members
        assert sorted(r[3] for r in hba if r[1:3] == ["postgres", "rewind"]) == members
        assert sorted(r[3] for r in hba if r[1:3] == ["dlock", "dlock"]) == ["10.0.1.11/32", "10.0.1.12/32"]
        assert all(r[-1] in ("peer", "scram-sha-256") for r in hba) and len(hba) == 2 + 2 * 3 + 2
        # The runners' URL: every member, only a read-write one used; the engine's check takes it.
        url = "postgresql://dlock@10.0.0.1:5432,10.0.0.2:5432,10.0.0.3:5432/dlock?target_session_attrs=read-write"
        assert config["url"] == url
        checked = validate.backend_url(url)
        assert checked.hosts == [("10.0.0.1", 5432), ("10.0.0.2", 5432), ("10.0.0.3", 5432)]
        assert (checked.path, checked.query) == ("dlock", {"target_session_attrs": "read-write"})


def test_etcd_over_tls_needs_its_ca(tmp_path):
    https = [url.replace("http://", "https://") for url in ENDPOINTS]
    rc, output, rendered = run(tmp_path, THREE, {"dlock_postgresql_ha_etcd_endpoints": https})
    assert rc == 2 and rendered == {}, output
    assert "dlock_postgresql_ha_etcd_ca_file: must be set for https:// etcd endpoints" in output
    ca = tmp_path / "with-ca"
    ca.mkdir()
    rc, output, rendered = run(ca, THREE, {"dlock_postgresql_ha_etcd_endpoints": https,
                                           "dlock_postgresql_ha_etcd_ca_file": "/etc/etcd/tls/ca.pem"})
    assert rc == 0, output
    assert (rendered["p1"]["etcd3"]["protocol"], rendered["p1"]["etcd3"]["cacert"]) == ("https", "/etc/etcd/tls/ca.pem")


@pytest.mark.parametrize("extra, message", [
    ({"dlock_postgresql_ha_rewind_password": ""}, "dlock_postgresql_ha_rewind_password: must be set with dlock_postgresql_ha"),
    ({"dlock_postgresql_ha_etcd_endpoints": []}, "dlock_postgresql_ha_etcd_endpoints: must name the etcd members"),
    ({"dlock_postgresql_url_scheme": "postgresql+advisory"}, "postgresql+advisory does not survive a failover"),
    ({"dlock_postgresql_ha_rewind_user": "dlock"}, "must be three distinct roles"),
    ({"dlock_postgresql_ha_ttl": 14}, "is less than dlock_postgresql_ha_loop_wait + 2 * dlock_postgresql_ha_retry_timeout"),
    ({"dlock_postgresql_listen_addresses": ["localhost"]}, "dlock_postgresql_listen_addresses: must hold dlock_postgresql_ha_address"),
])
def test_bad_settings_are_refused(tmp_path, extra, message):
    rc, output, rendered = run(tmp_path, THREE, extra)
    assert rc == 2 and rendered == {}, output
    assert message in output, output


@pytest.mark.parametrize("size", [1, 6])
def test_other_sizes_are_refused(tmp_path, size):
    members = dict(("p%d" % i, "10.0.0.%d" % i) for i in range(1, size + 1))
    rc, output, rendered = run(tmp_path, members)
    assert rc == 2 and rendered == {}, output
    assert "must be one of 2 to 5 members of group dlock_backend (it has %d)" % size in output, output


def test_a_member_left_out_of_the_play_is_refused(tmp_path):
    rc, output, rendered = run(tmp_path, THREE, limit="p1,p2")
    assert rc == 2 and rendered == {}, output
    assert "the members p3 of group dlock_backend are not in this play" in output, output


def test_the_docs_name_the_patroni_release_the_role_installs():
    """One pin (vars/main.yml), which the lab image bakes too (tests/lab/lab.py
    reads it there); what the role's reference (docs/roles.md, which the README
    links) and the option's description say must follow it, and no page of
    the README or docs/ names another release as the one installed."""
    with open(os.path.join(ROOT, "roles", "dlock_postgresql", "vars", "main.yml")) as handle:
        version = yaml.safe_load(handle)["__dlock_postgresql_patroni"]["version"]
    with open(os.path.join(ROOT, "roles", "dlock_postgresql", "meta", "argument_specs.yml")) as handle:
        specs = handle.read()
    with open(os.path.join(ROOT, "docs", "roles.md")) as handle:
        reference = handle.read()
    assert "Patroni %s" % version in specs and "Patroni %s" % version in reference
    pages = [os.path.join(ROOT, "README.md")] + glob.glob(os.path.join(ROOT, "docs", "*.md"))
    named = set()
    for page in pages:
        with open(page) as handle:
            named |= set(re.findall(r"Patroni (\d+\.\d+\.\d+)", handle.read()))
    # 3.0.3: the release that fixed the leader key's overwrite after a partition (docs/roles.md says why).
    assert named <= {version, "3.0.3"}, named
