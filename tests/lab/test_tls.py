"""The backends' TLS option on the lab: site.yml with dlock_redis_tls /
dlock_postgresql_tls, a CA and a server certificate made here for the backend
node's address. The runners verify the server (CA and name), the plain port
is closed, and a client that trusts another CA is refused.

Each case leaves its backend on TLS: a site.yml run costs over a minute, and
every lab module that needs a given backend provisions it itself (test_fleet's
`provisioned`). site.yml refusing verify-full without a CA file is checked
without a lab (tests/integration/test_site_backend_checks.py)."""

import json
import os
import subprocess

import pytest
from rollout import shape, site

pytestmark = pytest.mark.lab

TLS_DIR = {"redis": "/etc/redis/tls", "postgresql": "/etc/postgresql/tls"}
SERVICE_USER = {"redis": "redis", "postgresql": "postgres"}
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


@pytest.mark.parametrize("backend_type", ["redis", "postgresql"])
def test_runners_reach_the_backend_over_verified_tls_only(lab, tmp_path, backend_type):
    backend = shape(lab, backend_type)[0]
    address = lab.addr(backend)
    make_certificates(str(tmp_path), address)
    names = ("ca.pem", "server.pem", "server.key", "other.pem")
    files = dict((name, (tmp_path / name).read_text()) for name in names)
    tls_dir, user = TLS_DIR[backend_type], SERVICE_USER[backend_type]
    put(lab, backend, tls_dir + "/ca.pem", files["ca.pem"], user, "0644")
    put(lab, backend, tls_dir + "/server.pem", files["server.pem"], user, "0644")
    put(lab, backend, tls_dir + "/server.key", files["server.key"], user, "0600")
    for node in lab.group("dlock_nodes"):
        put(lab, node, NODE_CA, files["ca.pem"], "root", "0644")
        put(lab, node, "/etc/dlock/other-ca.pem", files["other.pem"], "root", "0644")
    prefix = "dlock_%s_tls" % backend_type
    tls_vars = {prefix: True, prefix + "_cert_file": tls_dir + "/server.pem",
                prefix + "_key_file": tls_dir + "/server.key", prefix + "_ca_file": tls_dir + "/ca.pem",
                "dlock_backend_ca_file": NODE_CA, "dlock_jobs_list": []}
    site(lab, backend_type, tls_vars)
    again = site(lab, backend_type, tls_vars).stdout
    assert "changed=0" in again and "changed=1" not in again, again[-2500:]
    node = lab.group("dlock_nodes")[0]
    config = json.loads(lab.ssh(node, "cat /etc/dlock/dlock.json", check=True).stdout)
    expected = "rediss://" if backend_type == "redis" else "?sslmode=verify-full"
    assert expected in config["backend"] and config["ca_file"] == NODE_CA, config
    ok = lab.ssh(node, "dlock check-clock")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    ran = lab.ssh(node, "dlock run --job tls-probe -- true")
    assert ran.returncode == 0, ran.stderr
    # A client that trusts another CA is refused, with the right password.
    other = lab.ssh(node, "dlock check-clock --ca-file /etc/dlock/other-ca.pem")
    assert other.returncode == 75 and "certificate verify failed" in other.stderr, other.stderr
    # No plain-text way in: the same password over a plain connection is refused.
    plain_url = config["backend"].replace("rediss://", "redis://").replace("?sslmode=verify-full", "?sslmode=disable")
    plain = lab.ssh(node, "dlock check-clock --backend '%s'" % plain_url)
    assert plain.returncode == 75, plain.stdout + plain.stderr
