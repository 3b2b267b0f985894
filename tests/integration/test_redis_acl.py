"""The engine under the ACL that the dlock_redis role gives the runners.

The user is built from the role's own variables (roles/dlock_redis/vars/main.yml:
the key pattern and the command list), so a command the engine starts to send,
or a key it starts to touch, fails here before it fails on a fleet.
"""

import os
import time

import pytest
import yaml
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import Slot, open_backend, pause_scopes
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.redis_resp import ReplyError

ROLE_VARS = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "dlock_redis", "vars", "main.yml")
PASSWORD = "acl-test-password-0123"


@pytest.fixture
def acl_redis(own_redis):
    with open(ROLE_VARS) as handle:
        role = yaml.safe_load(handle)
    admin = own_redis.client()
    rules = ["reset", "on", ">" + PASSWORD, "~" + role["__dlock_redis_key_pattern"], "resetchannels",
             "&" + role["__dlock_redis_channel_pattern"], "-@all"]
    rules += ["+" + command for command in role["__dlock_redis_acl_commands"]]
    admin.execute_command("ACL", "SETUSER", "dlock", *rules)
    admin.execute_command("ACL", "LOG", "RESET")
    url = "redis://dlock@127.0.0.1:%d/0" % own_redis.port
    backend = open_backend(url, password=PASSWORD)
    yield backend, admin
    backend.close()


def test_every_engine_call_passes_the_role_acl(acl_redis, unique_key):
    backend, admin = acl_redis
    admin.script_flush()  # the first grant recovers from NOSCRIPT: SCRIPT LOAD + EVALSHA
    assert backend.acquire(unique_key, "owner-a", 5).granted  # no once_per: two keys only
    assert backend.acquire(unique_key, "owner-b", 5).status == "locked"
    assert backend.renew(unique_key, "owner-a", 5)
    assert backend.query(unique_key).owner == "owner-a"
    assert backend.release(unique_key, "owner-a", last={"result": "success"})
    slot = Slot(int(time.time()) // 60, marker_ttl=120)
    assert backend.acquire(unique_key, "owner-a", 5, slot).granted  # with once_per: the slot marker too
    assert backend.release(unique_key, "owner-a")
    assert backend.acquire(unique_key, "owner-b", 5, slot).status == "duplicate"
    assert backend.acquire(unique_key, "owner-c", 5).granted
    assert backend.force_release(unique_key).owner == "owner-c"
    assert backend.server_time() > 0
    # Waiting in line: the ticket, the wake channel, the wake-ups on release and force release.
    url = "redis://dlock@127.0.0.1:%d/0" % admin.connection_pool.connection_kwargs["port"]
    waiter = open_backend(url, password=PASSWORD)
    assert backend.acquire(unique_key, "owner-a", 5).granted
    waiter.join_queue(unique_key, "owner-w", 3)
    assert waiter._pubsub is not None, "the subscription to the wake channel was refused"
    assert waiter.acquire(unique_key, "owner-w", 5).status == "locked"
    assert backend.release(unique_key, "owner-a")
    waiter.wait_change(unique_key, 5)
    assert waiter.acquire(unique_key, "owner-w", 5).granted
    waiter.join_queue(unique_key, "owner-x", 3)  # another waiter, as the first one takes the lock
    assert waiter.leave_queue(unique_key, "owner-x")
    assert backend.force_release(unique_key).owner == "owner-w"
    waiter.close()
    # Pausing (dlock pause and resume, with the runners' user) and a grant a pause refuses.
    key = unique_key + "-paused"
    scopes = pause_scopes(key)
    for scope in scopes:
        assert backend.pause(scope, "maintenance", 60, "ops").scope == scope
    assert [pause.scope for pause in backend.read_pauses(scopes)] == list(scopes)
    assert backend.acquire(key, "owner-a", 5, None, scopes).status == "paused"
    assert [backend.resume(scope).scope for scope in scopes] == list(scopes)
    assert backend.acquire(key, "owner-a", 5, None, scopes).granted
    # The history: an entry, one once per slot, the trim, and reading it (dlock history).
    assert backend.add_history(key, {"result": "success"}, 2)
    assert backend.add_history(key, {"result": "skipped_paused"}, 2, "skipped_paused@1", 60)
    assert not backend.add_history(key, {"result": "skipped_paused"}, 2, "skipped_paused@1", 60)
    assert [entry["result"] for entry in backend.read_history(key, 5)] == ["skipped_paused", "success"]
    assert backend.slot_claimed(unique_key, slot.number) and not backend.slot_claimed(unique_key, slot.number + 1)
    assert admin.execute_command("ACL", "LOG") == [], "the ACL refused a call the engine made"


def test_the_acl_refuses_what_the_engine_never_needs(acl_redis):
    backend, _admin = acl_redis
    for command in (["FLUSHALL"], ["KEYS", "*"], ["CONFIG", "GET", "maxmemory"], ["GET", "otherapp:x"],
                    ["EVAL", "return 1", "0"]):
        with pytest.raises(ReplyError, match="^NOPERM"):
            backend.client.call(*command)


@pytest.mark.parametrize("script, keys", [
    ("return redis.call('FLUSHALL')", []),
    ("return redis.call('KEYS', '*')", []),
    ("return redis.call('SET', KEYS[1], 'x')", ["otherapp:x"]),
])
def test_loaded_scripts_are_held_to_the_same_acl(acl_redis, script, keys):
    """SCRIPT LOAD + EVALSHA are allowed (the engine needs them), but every
    command a script calls is checked against the user's ACL."""
    backend, admin = acl_redis
    sha = backend.client.call("SCRIPT", "LOAD", script)
    with pytest.raises(ReplyError, match="(?i)can't run this command|no permissions"):
        backend.client.call("EVALSHA", sha, len(keys), *keys)
    assert admin.exists("otherapp:x") == 0
