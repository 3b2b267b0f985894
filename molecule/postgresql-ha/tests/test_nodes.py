"""The job nodes of the PostgreSQL HA scenario: the runner against every
Patroni member (the URL lists them; only the read-write one is used).
(What the role cannot do: molecule/common/tests/test_pg_runners.py;
metrics, unit hardening, the password in use: the checks every scenario
shares, beside it.)"""

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
    members = ",".join("%s:5432" % each for each in group_addresses(host, "dlock_backend"))
    assert settings["backend"] == "postgresql://dlock@%s/dlock?target_session_attrs=read-write" % members
    assert secret("backend.password") not in config.content_string
    assert host.package("python3-psycopg").is_installed


def test_the_sample_job_runs(host):
    out = host.run("dlock run --job %s", JOB)
    assert out.rc in (0, 73, 74), out.stderr  # ran, or another node holds it / ran this slot
    out = host.run("dlock run --job nightly")
    assert out.rc == 0, out.stderr
