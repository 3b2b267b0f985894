"""The dlock module and its lock operation (module_utils/dlock_task), on an in-memory backend."""

from __future__ import annotations

import json

import pytest

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

try:
    from ansible.module_utils.testing import patch_module_args
except ImportError:  # ansible-core 2.18, the oldest supported (scripts/matrix.sh)
    import contextlib

    from ansible.module_utils import basic
    from ansible.module_utils.common.text.converters import to_bytes

    @contextlib.contextmanager
    def patch_module_args(args):
        saved = basic._ANSIBLE_ARGS
        basic._ANSIBLE_ARGS = to_bytes(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
        try:
            yield
        finally:
            basic._ANSIBLE_ARGS = saved

from ansible_collections.dlock.fleet.plugins.module_utils import dlock_task
from ansible_collections.dlock.fleet.plugins.module_utils.dlock import waiting
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import AuthError, BackendError, MissingDriver
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_args import argument_spec
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_task import LockFailed, Request, acquire_waiting, run
from ansible_collections.dlock.fleet.plugins.modules import dlock as module

URL = "redis://127.0.0.1:6379/0"
ME = "ansible@ctl:100:aaaa"
OTHER = "node2:200:bbbb"


def params(**kwargs):
    """Task parameters with the module's defaults, as AnsibleModule would pass them."""
    kwargs.setdefault("key", "nightly")
    kwargs.setdefault("backend_url", URL)
    kwargs.setdefault("owner", ME)
    result = ArgumentSpecValidator(argument_spec()).validate(kwargs)
    assert not result.error_messages
    return result.validated_parameters


class Clock(object):
    """Monotonic time that moves only when the code waits (the backend's
    wait_change); it also moves the backend's clock."""

    def __init__(self, backend):
        self.backend = backend
        self.t = 0.0
        self.sleeps = []
        backend.wait_change = self.wait_change

    def __call__(self):
        return self.t

    def wait_change(self, key, timeout):
        self.sleeps.append(timeout)
        self.t += timeout
        self.backend.now += timeout


# -- query ------------------------------------------------------------------------------
def test_query_free_key(fake_backend):
    result = run(params(state="query"))
    assert result["changed"] is False
    assert result["acquired"] is False
    assert result["holder"]["held"] is False
    assert result["msg"] == "nightly is free (fence 0)"
    assert fake_backend.closed


def test_query_reports_holder_age_ttl_and_fence(fake_backend):
    fake_backend.hold_by("nightly", OTHER, ttl=60)
    fake_backend.now += 12
    result = run(params(state="query"))
    assert result["holder"]["owner"] == OTHER
    assert result["holder"]["age"] == 12.0
    assert result["ttl_remaining"] == 48.0
    assert result["fence"] == 1
    assert result["msg"] == "nightly is held by %s for 12s, ttl left 48s, fence 1" % OTHER


# -- acquire ----------------------------------------------------------------------------
def test_acquire_grants_then_renews_for_the_same_owner(fake_backend):
    first = run(params(ttl="5m"))
    assert first["changed"] is True and first["acquired"] is True
    assert first["fence"] == 1 and first["ttl_remaining"] == 300.0
    assert first["msg"] == "acquired nightly (fence 1, ttl 5m)"
    fake_backend.now += 100
    again = run(params(ttl="5m"))
    assert again["changed"] is False and again["acquired"] is True
    assert again["fence"] == 1 and again["ttl_remaining"] == 300.0
    assert "already held by this owner" in again["msg"]


def test_acquire_busy_fails_fast_naming_the_holder(fake_backend):
    fake_backend.hold_by("nightly", OTHER)
    with pytest.raises(LockFailed) as failed:
        run(params())
    assert "nightly is held by %s" % OTHER in failed.value.msg
    assert failed.value.msg.endswith("not acquired")
    assert failed.value.result["acquired"] is False
    assert failed.value.result["holder"]["owner"] == OTHER
    assert [c[0] for c in fake_backend.calls].count("acquire") == 2  # hold_by + one try


def test_wait_wakes_when_the_holders_lease_ends(fake_backend):
    fake_backend.hold_by("nightly", OTHER, ttl=10)
    clock = Clock(fake_backend)
    outcome, grant, waited = acquire_waiting(fake_backend, Request(params(wait=60, ttl=20)), clock=clock)
    assert outcome == "granted" and grant.fence == 2
    # Woken by the ticket's renewals (every TICKET_REFRESH), then just after the lease's end.
    assert 10 <= waited <= 10 + 2 * waiting.EXPIRY_SLACK
    assert max(clock.sleeps) <= waiting.TICKET_REFRESH
    assert ("join_queue", "nightly", ME) in fake_backend.calls and ("leave_queue", "nightly", ME) in fake_backend.calls


def test_wait_gives_up_after_its_time(fake_backend):
    fake_backend.hold_by("nightly", OTHER, ttl=600)
    clock = Clock(fake_backend)
    outcome, grant, waited = acquire_waiting(fake_backend, Request(params(wait="30s")), clock=clock)
    assert outcome == "busy" and grant.holder.owner == OTHER
    assert waited == pytest.approx(30.0)
    assert fake_backend.calls[-1] == ("leave_queue", "nightly", ME)  # its place in line is given up


def test_wait_through_run_reports_the_time_waited(fake_backend, monkeypatch):
    fake_backend.hold_by("nightly", OTHER, ttl=1)
    clock = Clock(fake_backend)
    monkeypatch.setattr(dlock_task.time, "monotonic", clock)
    result = run(params(wait=5))
    assert result["acquired"] is True and result["waited"] >= 1.0


# -- release ----------------------------------------------------------------------------
def test_release_own_lock(fake_backend):
    run(params())
    fake_backend.now += 3
    result = run(params(state="released"))
    assert result["changed"] is True and result["acquired"] is False
    assert result["msg"] == "released nightly (fence 1, held for 3s)"
    assert fake_backend.query("nightly").owner is None


def test_release_free_key_is_ok_and_unchanged(fake_backend):
    result = run(params(state="released"))
    assert result["changed"] is False and result["msg"] == "nightly is not held"


def test_release_of_another_owners_lock_fails(fake_backend):
    fake_backend.hold_by("nightly", OTHER)
    with pytest.raises(LockFailed) as failed:
        run(params(state="released"))
    assert "held by another owner" in failed.value.msg and "force=true" in failed.value.msg
    assert fake_backend.query("nightly").owner == OTHER


def test_force_release_says_whose_lock_it_broke(fake_backend):
    fake_backend.hold_by("nightly", OTHER)
    fake_backend.now += 7
    result = run(params(state="released", force=True, reason="holder crashed"))
    assert result["changed"] is True
    assert result["msg"] == "broke the lock of nightly held by %s (fence 1, held for 7s); reason: holder crashed" % OTHER
    assert result["previous_holder"]["owner"] == OTHER
    assert result["reason"] == "holder crashed"
    assert result["holder"]["held"] is False


def test_force_release_of_a_free_key_changes_nothing(fake_backend):
    result = run(params(state="released", force=True, reason="cleanup"))
    assert result["changed"] is False and "nothing to break" in result["msg"]


@pytest.mark.parametrize("reason", [None, "  "])
def test_force_needs_a_reason(fake_backend, reason):
    with pytest.raises(LockFailed) as failed:
        run(dict(params(state="released"), force=True, reason=reason))
    assert failed.value.msg.startswith("reason:")


# -- check mode and diff ----------------------------------------------------------------
def test_check_mode_acquire_changes_nothing(fake_backend):
    result = run(params(), check_mode=True, diff=True)
    assert result["changed"] is True and result["acquired"] is False
    assert result["msg"] == "would acquire nightly"
    assert result["diff"]["before"] == "key: nightly\nheld: false\nfence: 0\n"
    assert result["diff"]["after"] == "key: nightly\nheld: true\nowner: %s\nfence: 1\n" % ME
    assert fake_backend.query("nightly").owner is None
    assert "acquire" not in [c[0] for c in fake_backend.calls]


def test_check_mode_busy_says_wait_or_fail(fake_backend):
    fake_backend.hold_by("nightly", OTHER)
    waiting = run(params(wait="2m"), check_mode=True)
    assert waiting["msg"].startswith("would wait up to 2m for nightly: nightly is held by %s" % OTHER)
    failing = run(params(), check_mode=True)
    assert failing["changed"] is False and failing["msg"].startswith("would fail (wait: 0): nightly is held by")


def test_check_mode_release_and_force(fake_backend):
    run(params())
    assert run(params(state="released"), check_mode=True)["msg"] == "would release nightly"
    result = run(params(state="released", force=True, reason="test"), check_mode=True)
    assert result["msg"].startswith("would break the lock: nightly is held by %s" % ME)
    assert fake_backend.query("nightly").owner == ME
    assert [c[0] for c in fake_backend.calls] == ["acquire"]


def test_diff_shows_holder_before_and_after(fake_backend):
    run(params())
    result = run(params(state="released"), diff=True)
    assert result["diff"]["before"] == "key: nightly\nheld: true\nowner: %s\nfence: 1\n" % ME
    assert result["diff"]["after"] == "key: nightly\nheld: false\nfence: 1\n"


# -- errors -----------------------------------------------------------------------------
@pytest.mark.parametrize("error,words", [
    (MissingDriver("redis", "python3-redis", "redis://"), "Failed to import the required Python library (redis)"),
    (AuthError("redis: authentication failed (WRONGPASS)"), "authentication to the lock backend %s failed" % URL),
    (BackendError("redis: Error 111 connecting"), "lock backend %s is unreachable or failing" % URL),
])
def test_each_backend_error_has_its_message(monkeypatch, error, words):
    def open_backend(*args, **kwargs):
        raise error
    monkeypatch.setattr(dlock_task, "open_backend", open_backend)
    with pytest.raises(LockFailed) as failed:
        run(params(state="query"))
    assert words in failed.value.msg


def test_session_backends_are_refused_for_acquire_and_release(fake_backend):
    fake_backend.lease_survives_reconnect = False
    fake_backend.name = "postgresql+advisory"
    for state in ("acquired", "released"):
        with pytest.raises(LockFailed) as failed:
            run(params(state=state))
        assert "the postgresql+advisory backend keeps its lock only as long as" in failed.value.msg
    assert run(params(state="query"))["changed"] is False


@pytest.mark.parametrize("url", ["redis://:hunter2@127.0.0.1:6379", "redis://u:hunter2@host:badport/0"])
def test_a_password_in_the_url_is_refused_without_echo(fake_backend, url):
    with pytest.raises(LockFailed) as failed:
        run(params(backend_url=url))
    assert "contains a password" in failed.value.msg and "hunter2" not in failed.value.msg


@pytest.mark.parametrize("changes,words", [
    (dict(ttl="500ms"), "ttl: '500ms' is below the minimum of 1s"),
    (dict(wait="soon"), "wait: 'soon' is not a duration"),
    (dict(key="bad key"), "key: 'bad key' is not a valid lock key"),
    (dict(state="query", hold=True), "hold: only applies to state=acquired"),
    (dict(force=True, reason="x"), "force: only applies to state=released"),
    (dict(backend_url=None), "backend_url: required"),
    (dict(state="released", owner=None), "owner: required to release without force"),
])
def test_bad_input_is_refused(fake_backend, changes, words):
    with pytest.raises(LockFailed) as failed:
        run(params(**changes))
    assert words in failed.value.msg
    assert not fake_backend.calls


def test_password_file_is_read(fake_backend, tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    run(params(state="query", backend_password_file=str(secret)))
    assert fake_backend.opened_with[0]["password"] == "s3cret"


# -- the module's main() ----------------------------------------------------------------
def run_module(capsys, **args):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            module.main()
    return json.loads(capsys.readouterr().out)


def test_module_main_acquires_and_hides_the_password(fake_backend, capsys):
    out = run_module(capsys, key="nightly", backend_url=URL, backend_password="s3cret", owner=ME)
    assert out["acquired"] is True and out["changed"] is True
    assert fake_backend.opened_with[0]["password"] == "s3cret"
    assert "s3cret" not in json.dumps(out)


def test_module_main_fails_with_the_holder(fake_backend, capsys):
    fake_backend.hold_by("nightly", OTHER)
    out = run_module(capsys, key="nightly", backend_url=URL, owner=ME)
    assert out["failed"] is True and OTHER in out["msg"] and out["holder"]["owner"] == OTHER


def test_module_main_refuses_hold(fake_backend, capsys):
    out = run_module(capsys, key="nightly", backend_url=URL, hold=True)
    assert out["failed"] is True and "needs the controller" in out["msg"]
    assert not fake_backend.calls


def test_module_main_check_mode(fake_backend, capsys):
    out = run_module(capsys, key="nightly", backend_url=URL, owner=ME, _ansible_check_mode=True)
    assert out["msg"] == "would acquire nightly" and fake_backend.query("nightly").owner is None
