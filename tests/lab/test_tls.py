"""Redis's TLS option on the lab: site.yml with dlock_redis_tls, a CA and a
server certificate made here for the backend node's address. The runners
verify the server (CA and name), the plain port is closed, and a client that
trusts another CA is refused. (PostgreSQL's TLS is molecule/postgresql's:
lab-single rolls that scenario out once, and its verify set checks the same,
molecule/postgresql/tests/test_nodes.py.)

It leaves the backend on TLS: a site.yml run costs over a minute, and every
lab module that needs a given backend provisions it itself (test_fleet's
`provisioned`). site.yml refusing verify-full without a CA file is checked
without a lab (tests/integration/roles/test_site_backend_checks.py)."""

import json
import os
import subprocess

import pytest
from rollout import shape, site

pytestmark = pytest.mark.lab

TLS_DIR = "/etc/redis/tls"
NODE_CA = "/etc/dlock/backend-ca.pem"


def make_certificates(directory, address):
    """A CA, and a server certificate for ADDRESS (an IP SAN) signed by it."""
    def openssl(*args):
        subprocess.run(["openssl"] + list(args), cwd=directory, check=True, capture_output=True)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=dlock lab CA",
            "-keyout", "ca.key", "-out", "ca.pem")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=%s" % address, "-keyout", "server.key",
            "-out", "server.csr")
    with open(os.path.join(directory, "san.ext"), "w") as handle:
        handle.write("subjectAltName = IP:%s\n" % address)
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", "san.ext", "-out", "server.pem")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=another CA",
            "-keyout", "other.key", "-out", "other.pem")


def put(lab, host, path, content, owner, mode):
    lab.ssh(host, "install -D -o %s -g %s -m %s /dev/stdin %s" % (owner, owner, mode, path), check=True,
            input=content)


def test_runners_reach_redis_over_verified_tls_only(lab, tmp_path):
    backend = shape(lab, "redis")[0]
    address = lab.addr(backend)
    make_certificates(str(tmp_path), address)
    names = ("ca.pem", "server.pem", "server.key", "other.pem")
    files = dict((name, (tmp_path / name).read_text()) for name in names)
    put(lab, backend, TLS_DIR + "/ca.pem", files["ca.pem"], "redis", "0644")
    put(lab, backend, TLS_DIR + "/server.pem", files["server.pem"], "redis", "0644")
    put(lab, backend, TLS_DIR + "/server.key", files["server.key"], "redis", "0600")
    for node in lab.group("dlock_nodes"):
        put(lab, node, NODE_CA, files["ca.pem"], "root", "0644")
        put(lab, node, "/etc/dlock/other-ca.pem", files["other.pem"], "root", "0644")
    tls_vars = {"dlock_redis_tls": True, "dlock_redis_tls_cert_file": TLS_DIR + "/server.pem",
                "dlock_redis_tls_key_file": TLS_DIR + "/server.key", "dlock_redis_tls_ca_file": TLS_DIR + "/ca.pem",
                "dlock_backend_ca_file": NODE_CA, "dlock_jobs_list": []}
    site(lab, "redis", tls_vars)
    again = site(lab, "redis", tls_vars).stdout
    assert "changed=0" in again and "changed=1" not in again, again[-2500:]
    node = lab.group("dlock_nodes")[0]
    config = json.loads(lab.ssh(node, "cat /etc/dlock/dlock.json", check=True).stdout)
    assert config["backend"].startswith("rediss://") and config["ca_file"] == NODE_CA, config
    ok = lab.ssh(node, "dlock check-clock")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    ran = lab.ssh(node, "dlock run --job tls-probe -- true")
    assert ran.returncode == 0, ran.stderr
    # A client that trusts another CA is refused, with the right password.
    other = lab.ssh(node, "dlock check-clock --ca-file /etc/dlock/other-ca.pem")
    assert other.returncode == 75 and "certificate verify failed" in other.stderr, other.stderr
    # No plain-text way in: the same password over a plain connection is refused.
    plain_url = config["backend"].replace("rediss://", "redis://")
    plain = lab.ssh(node, "dlock check-clock --backend '%s'" % plain_url)
    assert plain.returncode == 75, plain.stdout + plain.stderr
