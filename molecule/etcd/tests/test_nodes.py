"""The job nodes of the etcd scenario: the runner against all three members
as the prefix-limited user, over verified TLS only. (Metrics, unit
hardening, the password in use: the checks every scenario shares,
molecule/common/tests.)"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))

from fleet_checks import (  # noqa: E402
    JOB,
    group_addresses,
    secret,
)

testinfra_hosts = ["ansible://dlock_nodes"]


def test_the_runner_names_every_member(host):
    config = host.file("/etc/dlock/dlock.json")
    settings = json.loads(config.content_string)
    members = ",".join("%s:2379" % member for member in group_addresses(host, "dlock_backend"))
    assert settings["backend"] == "etcd+https://dlock@%s/dlock" % members
    assert settings["ca_file"] == "/etc/dlock/backend-ca.pem"
    assert secret("backend.password") not in config.content_string
    # The runs below speak to etcd with the standard library alone: the
    # node has no etcd client library (the lab's image bakes none).
    assert not host.package("python3-etcd3gw").is_installed


def test_the_sample_job_runs(host):
    out = host.run("dlock run --job %s", JOB)
    assert out.rc in (0, 73, 74), out.stderr  # ran, or another node holds it / ran this slot
    out = host.run("dlock run --job nightly")
    assert out.rc == 0, out.stderr


def test_a_runner_that_trusts_another_ca_is_refused(host):
    other = host.run("dlock check-clock --ca-file /etc/dlock/other-ca.pem")
    assert other.rc == 75 and "certificate verify failed" in other.stderr, other.stderr
    plain = host.run("dlock check-clock --backend etcd://dlock@%s:2379/dlock", group_addresses(host, "dlock_backend")[0])
    assert plain.rc == 75, plain.stdout + plain.stderr  # nothing answers plain HTTP
