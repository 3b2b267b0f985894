"""Pausing grants (base.Backend.pause): a live pause of a job's key, or of
every key, refuses the grant inside the backend's own grant step, before
any fence is taken or slot marker claimed, and ends by itself at its
`until` on the backend's clock (Redis: a key's PX expiry; PostgreSQL: the
row's until against clock_timestamp(); etcd: its key's lease; file: the
record's until on the host's clock).
"""

import fcntl
import os
import threading
import time

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import (
    ALL_SCOPE, Pause, Slot, file_lock, group_scope, job_scope, open_backend, pause_scopes)
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.etcd_lease import EtcdBackend
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.file_lock import FileBackend
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.pg_common import LIVE_PAUSES
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.safefile import replace_file
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.etcd_gateway import b64
from runner_proc import last_log, run_dlock, wait_for
from servers import url_of

LONG = 600.0  # a pause no test waits out
SHORT = 2.0  # one a test does wait out (etcd: a 2s lease, reaped up to a second late)


@pytest.fixture(params=["redis", "postgresql", "postgresql+advisory", "etcd", "file"])
def url(request, tmp_path):
    return url_of(request, request.param, tmp_path)


@pytest.fixture
def two_clients(url):
    """A runner (a) and an operator (b) on one backend."""
    a, b = open_backend(url), open_backend(url)
    yield a, b
    a.close()
    b.close()


def grant(backend, key, owner, slot=None):
    """The runner's grant: the scopes of its key's pauses named."""
    return backend.acquire(key, owner, 10, slot, pause_scopes(key))


def test_a_paused_run_exits_72_and_says_why(url, unique_key, tmp_path):
    """`dlock run` names its key's pauses in its grant (runner.acquire)."""
    operator = open_backend(url)
    try:
        paused = operator.pause(job_scope(unique_key), "disk full on db-1", LONG, "ops")
    finally:
        operator.close()
    marker = tmp_path / "ran"
    run = run_dlock("run", "--job", "j", "--key", unique_key, "--backend", url, "--", "touch", str(marker))
    log = last_log(run.stderr)
    assert (run.returncode, log["result"]) == (72, "skipped_paused"), run.stderr
    assert (log["paused"], log["pause_reason"], log["paused_by"]) == (paused.scope, paused.reason, paused.by)
    assert log["paused_until"] == paused.until and not marker.exists()


def test_a_pause_of_the_job_refuses_its_grant_with_the_pause(two_clients, unique_key):
    a, b = two_clients
    before = b.server_time()
    paused = b.pause(job_scope(unique_key), "disk full on db-1", LONG, "ops@bastion")
    refused = grant(a, unique_key, "owner-a")
    assert refused.status == "paused" and not refused.granted
    assert refused.pause.as_dict() == paused.as_dict()
    assert (paused.scope, paused.reason, paused.by) == (job_scope(unique_key), "disk full on db-1", "ops@bastion")
    # Its times are the backend's: etcd's, whole seconds from a Date header (rounded up).
    slack = b.clock_resolution + 0.5
    assert before - slack <= paused.at <= b.server_time() + slack
    assert LONG <= paused.until - paused.at <= LONG + slack
    assert a.query(unique_key).owner is None


def test_a_pause_of_all_refuses_every_grant(two_clients, unique_key):
    a, b = two_clients
    paused = b.pause(ALL_SCOPE, "freeze", LONG, "ops")
    try:
        for key in (unique_key, unique_key + "-other"):
            refused = grant(a, key, "owner-a")
            assert refused.status == "paused"
            assert refused.pause.as_dict() == paused.as_dict() and refused.pause.scope == ALL_SCOPE
        # A grant that names no pause (a caller that does not honour them) is not refused.
        assert a.acquire(unique_key, "owner-a", 10).granted
    finally:
        assert b.resume(ALL_SCOPE).as_dict() == paused.as_dict()  # the other tests share the server


def test_the_job_pause_comes_before_the_fleets(two_clients, unique_key):
    """Both live: the refusal names the job's own (the first of pause_scopes)."""
    a, b = two_clients
    b.pause(ALL_SCOPE, "freeze", LONG, "ops")
    try:
        b.pause(job_scope(unique_key), "this one", LONG, "ops")
        assert grant(a, unique_key, "owner-a").pause.reason == "this one"
    finally:
        b.resume(ALL_SCOPE)


def test_a_pause_of_a_group_refuses_the_grants_of_its_jobs_only(two_clients, unique_key):
    """A grant names its job's groups (pause_scopes(key, groups)); the
    refusal names the first paused scope: the job's, then its groups', in
    its order, then the fleet's."""
    a, b = two_clients
    group = "g-" + unique_key[-6:]
    paused = b.pause(group_scope(group), "ledger freeze", LONG, "ops")
    try:
        refused = a.acquire(unique_key, "owner-a", 10, None, pause_scopes(unique_key, ["other", group]))
        assert refused.status == "paused" and refused.pause.as_dict() == paused.as_dict()
        assert refused.pause.scope == "group:" + group
        # The same key named without the group (a job not in it), and another group's job: granted.
        assert grant(a, unique_key, "owner-a").granted
        assert a.release(unique_key, "owner-a")
        assert a.acquire(unique_key, "owner-a", 10, None, pause_scopes(unique_key, ["other"])).granted
        assert a.release(unique_key, "owner-a")
        b.pause(job_scope(unique_key), "its own", LONG, "ops")
        assert a.acquire(unique_key, "owner-a", 10, None, pause_scopes(unique_key, [group])).pause.reason == "its own"
        assert [pause.scope for pause in b.read_pauses(list(pause_scopes(unique_key, [group])))] == [
            job_scope(unique_key), group_scope(group)]
    finally:
        assert b.resume(group_scope(group)).as_dict() == paused.as_dict()
    assert a.acquire(unique_key, "owner-a", 10, None, pause_scopes(unique_key, [group])).pause.scope == (
        job_scope(unique_key))


def test_a_pause_is_the_answer_whether_the_lock_is_held_or_the_slot_done(two_clients, unique_key):
    """A paused job's run exits 72 on every backend, not 73 or 74 when its
    lock happens to be held or its slot done: the pause comes first."""
    a, b = two_clients
    slot = Slot(int(time.time() // 3600), 5400.0)
    assert grant(a, unique_key, "owner-a", slot).granted  # held, and its slot claimed
    paused = b.pause(job_scope(unique_key), "disk full on db-1", LONG, "ops")
    for asked in (None, slot):
        refused = grant(b, unique_key, "owner-b", asked)
        assert refused.status == "paused" and refused.pause.as_dict() == paused.as_dict(), refused.status
    assert b.resume(job_scope(unique_key)) is not None
    assert grant(b, unique_key, "owner-b").status == "locked"
    assert a.release(unique_key, "owner-a", last={"result": "success"}, slot=slot)
    assert grant(b, unique_key, "owner-b", slot).status == "duplicate"


def test_a_pause_of_another_key_refuses_nothing(two_clients, unique_key):
    a, b = two_clients
    b.pause(job_scope(unique_key + "-other"), "not this one", LONG, "ops")
    assert grant(a, unique_key, "owner-a").granted


def test_a_paused_grant_takes_no_fence(two_clients, unique_key):
    a, b = two_clients
    first = grant(a, unique_key, "owner-a")
    assert first.granted and a.release(unique_key, "owner-a")
    fence = a.query(unique_key).fence
    b.pause(job_scope(unique_key), "maintenance", LONG, "ops")
    for attempt in range(3):
        assert grant(a, unique_key, "owner-%d" % attempt).status == "paused"
    assert a.query(unique_key).fence == fence  # the counter (etcd: the fence key) untouched
    b.resume(job_scope(unique_key))
    second = grant(a, unique_key, "owner-b")
    assert second.granted
    if isinstance(a, EtcdBackend):  # a revision of the store: the pause's own writes count
        assert second.fence > first.fence
    else:
        assert second.fence == first.fence + 1


def test_a_paused_grant_claims_no_slot(two_clients, unique_key):
    a, b = two_clients
    slot = Slot(7, marker_ttl=120)
    b.pause(job_scope(unique_key), "maintenance", LONG, "ops")
    assert grant(a, unique_key, "owner-a", slot).status == "paused"
    b.resume(job_scope(unique_key))
    assert grant(a, unique_key, "owner-b", Slot(7, marker_ttl=120)).granted  # the slot still free
    assert a.release(unique_key, "owner-b", last={"result": "success"}, slot=slot)
    assert grant(a, unique_key, "owner-c", Slot(7, marker_ttl=120)).status == "duplicate"  # and now claimed


def test_resume_ends_the_pause_and_returns_it(two_clients, unique_key):
    a, b = two_clients
    scope = job_scope(unique_key)
    paused = b.pause(scope, "maintenance", LONG, "ops")
    assert grant(a, unique_key, "owner-a").status == "paused"
    assert b.resume(scope).as_dict() == paused.as_dict()
    assert b.resume(scope) is None  # nothing left to end
    assert b.read_pauses([scope]) == []
    assert grant(a, unique_key, "owner-a").granted


def test_a_pause_ends_by_itself_at_its_until(two_clients, unique_key):
    a, b = two_clients
    paused = b.pause(job_scope(unique_key), "short", SHORT, "ops")
    assert grant(a, unique_key, "owner-a").status == "paused"
    wait_for(lambda: grant(a, unique_key, "owner-a").granted, SHORT + 10, "the pause to end")
    # Not before its until, on the backend's clock (etcd's reads whole seconds).
    assert a.server_time() + a.clock_resolution >= paused.until
    assert b.read_pauses([job_scope(unique_key)]) == []


def test_pausing_again_replaces_the_pause(two_clients, unique_key):
    """The new record, and the new end: a shorter pause over a long one ends
    when the shorter one does (etcd: the key leaves the old pause's lease)."""
    a, b = two_clients
    scope = job_scope(unique_key)
    b.pause(scope, "first", LONG, "ops-1")
    second = b.pause(scope, "second", SHORT, "ops-2")
    assert [pause.as_dict() for pause in b.read_pauses([scope])] == [second.as_dict()]
    assert grant(a, unique_key, "owner-a").pause.as_dict() == second.as_dict()
    wait_for(lambda: grant(a, unique_key, "owner-a").granted, SHORT + 10, "the second pause to end")


def test_read_pauses_gives_the_live_ones_in_the_order_asked(two_clients, unique_key):
    a, b = two_clients
    scopes = [job_scope(unique_key), job_scope(unique_key + "-x"), job_scope(unique_key + "-y")]
    long_pause = b.pause(scopes[2], "long", LONG, "ops")
    short_pause = b.pause(scopes[0], "short", SHORT, "ops")
    assert [pause.as_dict() for pause in a.read_pauses(scopes)] == [short_pause.as_dict(), long_pause.as_dict()]
    wait_for(lambda: len(a.read_pauses(scopes)) == 1, SHORT + 10, "the short pause to end")
    assert [pause.as_dict() for pause in a.read_pauses(scopes)] == [long_pause.as_dict()]
    assert a.read_pauses([]) == []


def test_a_scope_that_is_no_scope_is_refused(two_clients):
    _a, b = two_clients
    for scope in ("job:../escape", "everything", "job:", "group:../escape", "group:", "group:a b"):
        with pytest.raises(ConfigError, match="pause scope"):
            b.pause(scope, "r", LONG, "ops")


# -- PostgreSQL: pauses and grants are ordered by dlock_pause's table lock ------

@pytest.fixture(params=["postgresql", "postgresql+advisory"])
def pg_pair(request, pg_server):
    url = pg_server.url(scheme=request.param)
    # op_timeout: long enough for the test to let them go on, on a busy host
    a, b = open_backend(url, op_timeout=20.0), open_backend(url, op_timeout=20.0)
    b.read_pauses([ALL_SCOPE])  # the tables made
    yield a, b, pg_server
    a.close()
    b.close()


def _waiting_for_the_pause_table(pg_server):
    with pg_server.connect() as conn:
        return conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted "
                            "AND relation = 'dlock_pause'::regclass").fetchone()[0] > 0


def test_a_grant_sent_while_a_pause_is_written_waits_and_sees_it(pg_pair, unique_key):
    """The pause's transaction holds the table's lock (as pause() does): the
    grant waits for its commit, then sees the pause (READ COMMITTED takes
    the statement's snapshot once its locks are held)."""
    a, _b, pg_server = pg_pair
    answers = []
    with pg_server.connect() as conn:
        with conn.transaction():
            conn.execute("LOCK TABLE dlock_pause IN ACCESS EXCLUSIVE MODE")
            conn.execute("INSERT INTO dlock_pause (scope, record, until) VALUES (%s, %s, now() + interval '1 hour')",
                         (job_scope(unique_key), '{"reason": "r", "by": "b", "at": 0, "until": 1}'))
            runner = threading.Thread(target=lambda: answers.append(grant(a, unique_key, "owner-a")))
            runner.start()
            wait_for(lambda: _waiting_for_the_pause_table(pg_server), 10, "the grant to wait for the pause")
        runner.join(10)
    assert [answer.status for answer in answers] == ["paused"]


def test_a_pause_waits_for_the_grants_in_flight(pg_pair, unique_key):
    """A grant's transaction that read the pauses before the pause was
    written (here: a transaction that read the table) holds pause() back
    until it ends: no grant is made after pause() has returned."""
    _a, b, pg_server = pg_pair
    written = []
    with pg_server.connect() as conn:
        with conn.transaction():
            conn.execute(LIVE_PAUSES, {"scopes": list(pause_scopes(unique_key))})
            operator = threading.Thread(target=lambda: written.append(b.pause(ALL_SCOPE, "r", LONG, "ops")))
            operator.start()
            wait_for(lambda: _waiting_for_the_pause_table(pg_server), 10, "the pause to wait for the grant")
            assert written == []
        operator.join(10)
    try:
        assert [pause.reason for pause in written] == ["r"]
    finally:
        b.resume(ALL_SCOPE)


# -- file: pauses and grants are ordered by _pause.lock ---------------------------

def test_a_file_grant_sent_while_a_pause_is_written_waits_and_sees_it(tmp_path, unique_key, monkeypatch):
    """A pause holds _pause.lock exclusive while it writes (taken here, the
    file written by hand): a grant that has its key's flock waits for it,
    then reads the pause."""
    monkeypatch.setattr(file_lock, "DIR_LOCK_WAIT", 30.0)  # the test's own pace on a busy host
    runner, operator = FileBackend(str(tmp_path)), FileBackend(str(tmp_path))
    answers = []
    with operator._pauses_locked(fcntl.LOCK_EX):
        thread = threading.Thread(target=lambda: answers.append(grant(runner, unique_key, "owner-a")))
        thread.start()
        wait_for(lambda: operator._is_locked(unique_key), 10, "the grant to take its key's flock")
        scope = job_scope(unique_key)
        replace_file(operator._pause_path(scope), Pause(scope, "r", time.time() + LONG, "ops", time.time()).as_record())
    thread.join(30)
    assert [answer.status for answer in answers] == ["paused"]
    runner.close()


def test_an_etcd_pause_whose_lease_outlives_its_end_ends_at_its_end(etcd_server, unique_key):
    """A new etcd leader starts every lease again at its full TTL: a pause's
    key can outlive its `until`. The record's end is the pause's end: a
    grant after it deletes the key and is granted, and no read shows it."""
    a, b = open_backend(etcd_server.url), open_backend(etcd_server.url)
    try:
        now = b.server_time()
        overdue = Pause(job_scope(unique_key), "leader change", now - 5.0, "ops", now - 65.0)
        lease = b.gateway.grant_lease(600)  # what a restarted lease looks like: long after its end
        name = b.names.pause(overdue.scope)
        b.gateway.post("/kv/put", {"key": b64(name), "value": b64(overdue.as_record()), "lease": lease})
        assert b.read_pauses([overdue.scope]) == []
        assert grant(a, unique_key, "owner-a").granted
        assert b.gateway.get(name) is None
        assert a.release(unique_key, "owner-a")
        live = b.pause(overdue.scope, "still on", LONG, "ops")  # one not overdue still refuses
        assert grant(a, unique_key, "owner-c").status == "paused"
        assert [pause.reason for pause in b.read_pauses([live.scope])] == ["still on"]
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("record", ["not json", '{"reason": "x", "until": Infinity, "by": "b", "at": 0}'])
def test_a_stray_file_pause_ends_where_the_longest_pause_would(tmp_path, unique_key, record):
    """A record no `dlock pause` wrote pauses, but not for good: it ends 30
    days after its file was written, as the longest pause then would."""
    backend = FileBackend(str(tmp_path))
    scope = job_scope(unique_key)
    path = tmp_path / (scope + ".pause")
    path.write_text(record)
    [pause] = backend.read_pauses([scope])
    assert pause.until == pytest.approx(path.stat().st_mtime + 30 * 86400)
    assert grant(backend, unique_key, "owner-a").status == "paused"
    month_ago = time.time() - 31 * 86400
    os.utime(path, (month_ago, month_ago))
    assert backend.read_pauses([scope]) == []
    assert grant(backend, unique_key, "owner-a").granted
