"""The job nodes of the PostgreSQL HA scenario: the runner against every
Patroni member (the URL lists them; only the read-write one is used), the
least-privilege role and what it cannot do, metrics, unit hardening, the
password in use."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared"))

# The shared tests, imported to be collected here.
from fleet_checks import (  # noqa: E402,F401  pylint: disable=unused-import
    JOB,
    group_addresses,
    secret,
    test_force_release_ends_the_holders_run,
    test_job_unit_exposure,
    test_password_is_in_use,
    test_runner_commands_work_with_the_backend,
    test_textfile_metrics_served_over_http_and_clean,
)
from pg_checks import (  # noqa: E402,F401  pylint: disable=unused-import
    test_fleet_connections_carry_the_keepalive_settings,
    test_the_role_cannot_do_anything_else,
    test_the_role_cannot_reach_other_databases,
    test_the_role_uses_the_lease_tables,
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
