"""The job nodes of the Redis scenario: the runner against the ACL-limited
user. (Metrics, unit hardening, the password in use: the checks every
scenario shares, molecule/common/tests.)"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))

from fleet_checks import (  # noqa: E402
    JOB,
    backend_name,
    secret,
    ssh_with_stdin,
)

testinfra_hosts = ["ansible://dlock_nodes"]

# As the runners' ACL user: the password from the node's file, through the
# environment (never on the command line).
AS_RUNNER = 'REDISCLI_AUTH="$(cat /etc/dlock/backend.password)" redis-cli --no-auth-warning --user dlock -h %s '
# What the runners' user must not do.
DENIED = [
    "FLUSHALL",
    "CONFIG GET maxmemory-policy",
    "KEYS *",
    "GET otherapp:x",          # a command it has, on a key outside the prefix
    "SET otherapp:x 1",
    "HSET dlockx f 1",         # close to the prefix, still outside
    "EVAL 'return 1' 0",       # only EVALSHA of loaded scripts
    "INFO",
    "CLIENT LIST",
    "SCRIPT FLUSH",
    "ACL LIST",
    "SHUTDOWN",
]


def admin(host, command):
    """redis-cli on the backend node as the admin user (password over ssh's stdin)."""
    backend = host.get_host("ansible://%s" % backend_name(host), ansible_inventory=os.environ["MOLECULE_INVENTORY_FILE"])
    done = ssh_with_stdin(backend, 'REDISCLI_AUTH="$(cat)" redis-cli --no-auth-warning --user dlock-admin ' + command,
                          secret("redis-admin.password"))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_acl_user_is_limited_to_the_prefix_and_the_engine_commands(host):
    backend = backend_name(host)
    allowed = host.run(AS_RUNNER % backend + "GET dlock:{%s}:fence" % JOB)
    assert allowed.rc == 0 and allowed.stdout.strip().isdigit(), allowed.stdout + allowed.stderr
    for command in DENIED:
        out = host.run(AS_RUNNER % backend + command)
        assert "NOPERM" in out.stdout + out.stderr, (command, out.stdout, out.stderr)
    # A script cannot reach outside the prefix either.
    sha = host.check_output(AS_RUNNER % backend + "SCRIPT LOAD \"return redis.call('GET', 'otherapp:x')\"")
    out = host.run(AS_RUNNER % backend + "EVALSHA %s 0" % sha.strip())
    assert "can't access at least one of the keys" in out.stdout + out.stderr, out.stdout + out.stderr


def test_the_runner_needs_nothing_the_acl_refuses(host):
    """The real runner (run, status, release --force, check-clock, recovery
    from NOSCRIPT) leaves no entry in the ACL log: the ACL allows exactly enough."""
    admin(host, "ACL LOG RESET")
    admin(host, "SCRIPT FLUSH")  # the next grant must recover from NOSCRIPT (SCRIPT LOAD + EVALSHA)
    for command in ("dlock run --job %s" % JOB, "dlock status --json", "dlock check-clock",
                    "dlock release --job %s --force --reason 'molecule verify'" % JOB,
                    "dlock run --job %s --once-per 1h -- true" % JOB):
        out = host.run(command)
        assert out.rc in (0, 73, 74), (command, out.stderr)
    assert admin(host, "ACL LOG").strip() == "", "the ACL refused something the runner sent"


def test_a_job_without_once_per_runs_under_the_acl(host):
    """No slot marker key: the grant touches only keys the ACL allows."""
    out = host.run("dlock run --job nightly")
    assert out.rc == 0, out.stderr
