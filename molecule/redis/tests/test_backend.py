"""The Redis backend node: lock-safe settings, ACL, no login as the default
user, lock data kept across a restart."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))

import time  # noqa: E402

from fleet_checks import JOB, secret, ssh_with_stdin  # noqa: E402

testinfra_hosts = ["ansible://dlock_backend"]


def admin(host, command):
    """redis-cli on the backend as the admin user; the password goes over ssh's stdin."""
    done = ssh_with_stdin(host, 'REDISCLI_AUTH="$(cat)" redis-cli --no-auth-warning --user dlock-admin ' + command,
                          secret("redis-admin.password"))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_redis_runs_with_the_lock_settings(host):
    assert host.service("redis-server").is_running and host.service("redis-server").is_enabled
    conf = host.file("/etc/redis/dlock.conf")
    assert (conf.user, conf.group, conf.mode) == ("root", "redis", 0o640) and conf.content_string.startswith("# Ansible managed")
    assert "include /etc/redis/dlock.conf" in host.file("/etc/redis/redis.conf").content_string
    lines = admin(host, "CONFIG GET '*'").split("\n")
    effective = dict(zip(lines[0::2], lines[1::2]))
    assert effective["maxmemory-policy"] == "noeviction"
    assert effective["appendonly"] == "yes" and effective["appendfsync"] == "always"
    assert effective["protected-mode"] == "yes"
    assert admin(host, "ROLE").split("\n")[0] == "master"  # never a replica (replicaof no one)
    assert effective["bind"] == "127.0.0.1 " + host.ansible.get_variables()["ansible_host"]
    listening = host.check_output("ss -Hltn sport = :6379")
    assert "0.0.0.0:6379" not in listening and "*:6379" not in listening


def test_nobody_can_log_in_as_the_default_user(host):
    default = [line for line in admin(host, "ACL LIST").splitlines() if line.startswith("user default ")]
    assert default and "#" not in default[0] and "nopass" not in default[0], default  # no password at all
    out = host.run("redis-cli -h 127.0.0.1 PING")
    assert "NOAUTH" in out.stdout + out.stderr
    for password in ("", "default", "x"):
        out = host.run("redis-cli -h 127.0.0.1 AUTH default %s", password)
        assert "WRONGPASS" in out.stdout + out.stderr


def test_lock_writes_and_fences_survive_a_restart(host):
    """Script effects reach the AOF as MULTI/EXEC; a restart must replay them
    all (with the default user off, Redis 7.0 drops them: redis/redis#14541)."""
    node = host.get_host("ansible://" + host.ansible.get_variables()["groups"]["dlock_nodes"][0],
                         ansible_inventory=os.environ["MOLECULE_INVENTORY_FILE"])
    assert node.run("dlock run --job %s --once-per 1h -- true", JOB).rc in (0, 73, 74)  # a grant exists
    before = admin(host, "GET 'dlock:{%s}:fence'" % JOB).strip()
    assert before.isdigit() and int(before) >= 1, before
    # This job's keys (its fence, slot marker, last run): other jobs' slot
    # markers may expire during the restart (seconds, for a 5 s job's).
    keys_before = sorted(admin(host, "KEYS 'dlock:{%s}:*'" % JOB).split())
    assert "dlock:{%s}:fence" % JOB in keys_before, keys_before
    assert host.run("systemctl restart redis-server").rc == 0
    for _attempt in range(50):  # until it answers again
        if "PONG" in ssh_with_stdin(host, 'REDISCLI_AUTH="$(cat)" redis-cli --no-auth-warning --user dlock-admin PING',
                                    secret("redis-admin.password")).stdout:
            break
        time.sleep(0.2)
    assert admin(host, "GET 'dlock:{%s}:fence'" % JOB).strip() == before
    assert sorted(admin(host, "KEYS 'dlock:{%s}:*'" % JOB).split()) == keys_before
    log = host.file("/var/log/redis/redis-server.log").content_string
    assert "AOF-loading-client" not in log, "Redis refused part of its AOF at load"


def test_runner_password_is_stored_hashed(host):
    import hashlib
    digest = hashlib.sha256(secret("backend.password").encode()).hexdigest()
    acl = admin(host, "ACL GETUSER dlock")
    assert digest in acl and digest in host.file("/etc/redis/dlock.conf").content_string
