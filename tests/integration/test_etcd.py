"""What only the etcd backend has to show, against real etcd members on
loopback: a TTL kept by the server, fences across a restart, any one member
down, auth limited to the prefix, waiting by watch, and a whole run.

The contract every backend shares (grant, owner checks, slots, min_hold,
force_release, last run) is in test_backends.py, which runs on etcd too.
"""

import json
import os
import re
import socket
import threading
import time
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from runner_proc import last_log, run_dlock, start_dlock

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import Slot, open_backend, pause_scopes
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.boottime import now
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import AuthError, BackendError, ConfigError

import servers


def watchers(server, index=0):
    """How many watches the member serves (its Prometheus metrics)."""
    url = "http://127.0.0.1:%d/metrics" % server.client_ports[index]
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    return int(float(re.search(r"^etcd_debugging_mvcc_watcher_total (\S+)$", text, re.M).group(1)))


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(0.02)


@pytest.fixture(scope="module")
def cluster():
    """Three members on loopback; tests stop and start member 0."""
    server = servers.EtcdServer(members=3)
    yield server
    server.stop()


def test_the_ttl_is_kept_by_the_server(etcd_server, unique_key):
    a, b = open_backend(etcd_server.url), open_backend(etcd_server.url)
    asked = time.monotonic()
    first = a.acquire(unique_key, "owner-a", 2)
    assert first.granted
    assert 0 < b.query(unique_key).ttl_remaining <= 2
    # Nobody renews: the server alone ends the lease (2s, revoked within 500ms).
    wait_for(lambda: b.query(unique_key).owner is None, 4, "the lease to expire")
    assert time.monotonic() - asked >= 2
    assert a.renew(unique_key, "owner-a", 2) is False
    second = b.acquire(unique_key, "owner-b", 2)
    assert second.granted and second.fence > first.fence
    a.close()
    b.close()


def test_fences_grow_across_a_restart(own_etcd, unique_key):
    backend = open_backend(own_etcd.url)
    first = backend.acquire(unique_key, "a", 30)
    assert backend.release(unique_key, "a")
    backend.close()
    own_etcd.restart()
    backend = open_backend(own_etcd.url)
    assert backend.query(unique_key).fence == first.fence  # the last grant's fence is kept
    second = backend.acquire(unique_key, "b", 30)
    assert second.granted and second.fence > first.fence
    backend.close()


def test_a_lease_outlives_a_restart(own_etcd, unique_key):
    backend = open_backend(own_etcd.url)
    assert backend.acquire(unique_key, "a", 30).granted
    own_etcd.restart()
    assert backend.renew(unique_key, "a", 30) is True  # a new connection, the same lease
    assert backend.acquire(unique_key, "b", 30).status == "locked"
    backend.close()


def test_one_member_down_is_not_an_outage(cluster, unique_key):
    cluster.stop_member(0)  # the first member of the URL, asked first
    # If it led, the others elect a leader (1-2 election timeouts, during
    # which etcd serves no write): a member down is not an outage once that is done.
    cluster.wait_healthy()
    try:
        backend = open_backend(cluster.url, op_timeout=2.0)
        started = time.monotonic()
        grant = backend.acquire(unique_key, "a", 10)
        assert grant.granted
        assert backend.renew(unique_key, "a", 10) is True
        assert backend.query(unique_key).owner == "a"
        assert backend.release(unique_key, "a")
        assert time.monotonic() - started < 2.0
        backend.close()
        # Only the stopped member: a BackendError that names it, within op_timeout.
        alone = open_backend(cluster.member_url(0), op_timeout=0.5)
        with pytest.raises(BackendError) as err:
            alone.acquire(unique_key, "a", 10)
        assert "127.0.0.1:%d" % cluster.client_ports[0] in str(err.value)
    finally:
        cluster.start_member(0)


def test_a_member_going_down_while_held(cluster, unique_key):
    backend = open_backend(cluster.url)
    assert backend.acquire(unique_key, "a", 10).granted  # asked member 0
    cluster.stop_member(0)
    cluster.wait_healthy()
    try:
        assert backend.renew(unique_key, "a", 10) is True
        assert backend.release(unique_key, "a")
    finally:
        cluster.start_member(0)
        backend.close()


def test_a_user_limited_to_the_prefix_works(etcd_auth, unique_key):
    url = "etcd://dlock@127.0.0.1:%d/dlock" % etcd_auth.client_ports[0]
    a, b = open_backend(url, password="Locker-Secret-1"), open_backend(url, password="Locker-Secret-1")
    grant = a.acquire(unique_key, "a", 10)
    assert grant.granted
    assert b.acquire(unique_key, "b", 10).status == "locked"
    assert a.renew(unique_key, "a", 10) is True
    assert b.query(unique_key).owner == "a"
    assert a.release(unique_key, "a", last={"result": "success"})
    assert b.acquire(unique_key, "b", 10).granted
    assert abs(b.server_time() - time.time()) < 5
    # Pausing (dlock pause and resume, with the runners' user) and a grant a pause refuses.
    key, scopes = unique_key + "-paused", pause_scopes(unique_key + "-paused")
    assert [b.pause(scope, "maintenance", 60, "ops").scope for scope in scopes] == list(scopes)
    assert [pause.scope for pause in a.read_pauses(scopes)] == list(scopes)
    assert a.acquire(key, "a", 10, None, scopes).status == "paused"
    assert [b.resume(scope).scope for scope in scopes] == list(scopes)
    assert a.acquire(key, "a", 10, None, scopes).granted
    # Outside its prefix the user may do nothing.
    outside = open_backend("etcd://dlock@127.0.0.1:%d/other" % etcd_auth.client_ports[0], password="Locker-Secret-1")
    with pytest.raises(AuthError) as err:
        outside.acquire(unique_key, "a", 10)
    assert "permission denied" in str(err.value)
    for backend in (a, b, outside):
        backend.close()


def test_a_wrong_password_is_an_auth_error(etcd_auth, unique_key):
    url = "etcd://dlock@127.0.0.1:%d/dlock" % etcd_auth.client_ports[0]
    backend = open_backend(url, password="Not-The-Password-9")
    with pytest.raises(AuthError) as err:
        backend.acquire(unique_key, "a", 10)
    assert "Not-The-Password-9" not in str(err.value)
    assert "authentication failed" in str(err.value)
    anonymous = open_backend(url)
    with pytest.raises(AuthError):
        anonymous.acquire(unique_key, "a", 10)


def test_an_expired_token_is_renewed(etcd_auth, unique_key):
    url = "etcd://dlock@127.0.0.1:%d/dlock" % etcd_auth.client_ports[0]
    backend = open_backend(url, password="Locker-Secret-1")
    assert backend.acquire(unique_key, "a", 10).granted
    backend.gateway._token = "not-a-token.1"  # as after the server forgot it (restart, 5 minutes unused)
    assert backend.renew(unique_key, "a", 10) is True
    assert backend.gateway._token != "not-a-token.1"
    backend.close()


def test_a_password_needs_a_user():
    with pytest.raises(ConfigError) as err:
        open_backend("etcd://127.0.0.1:2379/dlock", password="Locker-Secret-1")
    assert "name the user" in str(err.value) and "Locker-Secret-1" not in str(err.value)


def test_waiting_wakes_on_the_release_by_watch(etcd_server, unique_key):
    a, b = open_backend(etcd_server.url), open_backend(etcd_server.url)
    assert a.acquire(unique_key, "a", 30).granted
    assert b.acquire(unique_key, "b", 30).status == "locked"
    before = watchers(etcd_server)
    woke = threading.Event()
    events = []

    def waiter():
        # 30s: only the release ends it early.
        b.wait_change(unique_key, 30)
        events.append(("woke", time.monotonic()))
        woke.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    wait_for(lambda: watchers(etcd_server) > before, 5, "the waiter's watch")
    assert not woke.is_set()  # held: the watch does not end by itself
    released = time.monotonic()
    events.append(("released", released))
    assert a.release(unique_key, "a")
    assert woke.wait(2), "the waiter did not wake within 2s of the release"
    thread.join(5)
    assert [name for name, _at in events] == ["released", "woke"]
    assert events[1][1] - released < 1.0
    assert b.acquire(unique_key, "b", 30).granted
    a.close()
    b.close()


def record_requests(backend):
    """The paths of the requests `backend` sends from now on, in order."""
    paths, post = [], backend.gateway.post

    def recorded(path, payload, **kwargs):
        paths.append(path)
        return post(path, payload, **kwargs)
    backend.gateway.post = recorded
    return paths


def leases(server):
    """The ids of the leases the member holds."""
    url = "http://127.0.0.1:%d/v3/lease/leases" % server.client_ports[0]
    request = urllib.request.Request(url, data=b"{}", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        return set(int(item["ID"]) for item in json.loads(answer.read().decode()).get("leases") or [])


def waiting_behind(server, key):
    """(holder, waiter): "a" holds key, "b" waits in line behind it, refused once."""
    a, b = open_backend(server.url), open_backend(server.url)
    assert a.acquire(key, "a", 30).granted
    b.join_queue(key, "b", 3)
    assert b.acquire(key, "b", 30).status == "locked"
    return a, b


def test_a_handoff_is_one_write_to_release_and_one_to_grant(own_etcd, unique_key):
    """From the job's end to the next job's grant, the fewest round trips and
    one Raft write each side: the holder's release is one transaction (its
    lease, not a read, says the key is ours) before the deletion the next
    waiter watches; the woken waiter sends the grant's transaction alone,
    on the spare lease it took while it waited (no lease grant, no read
    first, no revoke after), and the transaction deletes its ticket too.
    The grant says how long that lease had been counting (lease_age), so
    the job's deadline is never past the lease's end."""
    began = now()
    a, b = waiting_behind(own_etcd, unique_key)
    before = watchers(own_etcd)
    thread = threading.Thread(target=b.wait_change, args=(unique_key, 30))
    thread.start()
    wait_for(lambda: watchers(own_etcd) > before, 5, "the waiter's watch")
    released = record_requests(a)
    assert a.release(unique_key, "a")
    thread.join(5)
    assert not thread.is_alive(), "the release did not wake the waiter"
    assert released == ["/kv/txn", "/lease/revoke"]
    granting = record_requests(b)
    written = proposals(own_etcd)
    asked = now()
    grant = b.acquire(unique_key, "b", 30)
    assert grant.granted
    assert proposals(own_etcd) - written == 1  # the transaction alone
    assert granting == ["/kv/txn"]
    assert 0 < grant.lease_age <= asked - began  # since the spare's grant, at the refused try
    assert b.line.waiters(unique_key) == 0  # the ticket went with the grant
    b.leave_queue(unique_key, "b")
    assert granting[1:] == ["/kv/range"]  # waiters() only: leaving had nothing left to do
    held = b.gateway.get(b.names.lock(unique_key))
    assert b.gateway.lease_ttl(held.lease) >= 29  # whole seconds: 30 less the moments since its keep-alive
    assert b.query(unique_key).owner == "b"
    assert b.release(unique_key, "b")
    a.close()
    b.close()


def test_a_spare_lease_gone_or_spent_is_replaced_and_one_left_unused_is_revoked(own_etcd, unique_key):
    """A waiter's spare lease gone (revoked here, as etcd revokes one that
    expired: the keep-alive with the ticket sees it) or a quarter spent (its
    waiter was stopped) costs the grant a lease of its own, counted from the
    try (lease_age 0); a waiter that leaves the line without a grant revokes its spare."""
    a, b = waiting_behind(own_etcd, unique_key)
    spare = b.line._spares[(unique_key, "b")][0]
    assert spare in leases(own_etcd)
    b.gateway.revoke(spare)
    b.join_queue(unique_key, "b", 3)  # the ticket's keep-alive finds the spare gone
    assert a.release(unique_key, "a")
    granting = record_requests(b)
    grant = b.acquire(unique_key, "b", 30)
    assert grant.granted and grant.lease_age == 0.0
    assert "/lease/grant" in granting, granting
    b.leave_queue(unique_key, "b")
    assert b.release(unique_key, "b")

    a, b = waiting_behind(own_etcd, unique_key)
    b.line._spares[(unique_key, "b")][2] -= 30 / 4.0  # as if its waiter had been stopped that long
    spent = b.line._spares[(unique_key, "b")][0]
    assert a.release(unique_key, "a")
    grant = b.acquire(unique_key, "b", 30)
    assert grant.granted and grant.lease_age == 0.0
    assert spent not in leases(own_etcd)  # revoked, not used
    b.leave_queue(unique_key, "b")
    assert b.release(unique_key, "b")

    a, b = waiting_behind(own_etcd, unique_key)
    unused = b.line._spares[(unique_key, "b")][0]
    b.leave_queue(unique_key, "b")
    assert unused not in leases(own_etcd)
    assert a.release(unique_key, "a")
    a.close()
    b.close()


def test_a_renewal_reads_its_key_from_the_member_and_asks_the_leader_only_when_unsure(etcd_server, unique_key):
    """A renewal is the keep-alive, then a serializable read of the key (the
    member's own state, no round trip to the leader); a member that does not
    show the key ours (behind its leader, here a read made stale on purpose)
    is checked by a linearizable read, which decides; a key broken by
    force_release fails the renewal."""
    a, b = open_backend(etcd_server.url), open_backend(etcd_server.url)
    assert a.acquire(unique_key, "a", 30).granted
    sent, post = [], a.gateway.post

    def recorded(path, payload, **kwargs):
        sent.append((path, dict(payload)))
        return post(path, payload, **kwargs)
    a.gateway.post = recorded
    assert a.renew(unique_key, "a", 30) is True
    assert [path for path, _payload in sent] == ["/lease/keepalive", "/kv/range"]
    assert sent[1][1].get("serializable") is True
    del sent[:]
    get = a.gateway.get
    a.gateway.get = lambda name, serializable=False: None if serializable else get(name)  # a member behind
    assert a.renew(unique_key, "a", 30) is True
    assert [path for path, _payload in sent] == ["/lease/keepalive", "/kv/range"]  # the linearizable read only
    assert "serializable" not in sent[1][1]
    a.gateway.get = get
    b.force_release(unique_key)
    assert a.renew(unique_key, "a", 30) is False
    a.close()
    b.close()


def test_a_lease_check_release_refuses_a_key_that_is_not_on_our_lease(etcd_server, unique_key):
    """The release without a read: a lock broken and taken by another since
    our grant is not deleted, and says False."""
    a, b = open_backend(etcd_server.url), open_backend(etcd_server.url)
    assert a.acquire(unique_key, "a", 30).granted
    b.force_release(unique_key)
    assert b.acquire(unique_key, "b", 30).granted
    assert a.release(unique_key, "a", last={"result": "success"}) is False
    view = b.query(unique_key)
    assert view.owner == "b" and view.last is None
    assert b.release(unique_key, "b")
    a.close()
    b.close()


def proposals(server):
    """Raft proposals the member committed (its Prometheus metrics): every write."""
    url = "http://127.0.0.1:%d/metrics" % server.client_ports[0]
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    return int(float(re.search(r"^etcd_server_proposals_committed_total (\S+)$", text, re.M).group(1)))


def test_a_refused_grant_writes_nothing(own_etcd, unique_key):
    """What most grants of a fleet find (the lock held, the slot done, a
    pause): the grant's compares, read-only, say so; no lease is granted and
    revoked, no transaction goes through Raft. A free lock is still granted."""
    holder, other = open_backend(own_etcd.url), open_backend(own_etcd.url)
    slot = Slot(int(time.time() // 3600), 5400.0, width=3600.0)
    assert holder.acquire(unique_key, "a", 30, slot).granted
    before = proposals(own_etcd)
    asked = record_requests(other)
    assert other.acquire(unique_key, "b", 30).status == "locked"
    assert other.acquire(unique_key + "-slot", "b", 30, slot).granted is True
    assert other.release(unique_key + "-slot", "b", last={"result": "success"}, slot=slot)
    written = proposals(own_etcd) - before
    asked.clear()
    before = proposals(own_etcd)
    assert other.acquire(unique_key + "-slot", "b", 30, slot).status == "duplicate"
    assert other.acquire(unique_key, "b", 30).status == "locked"
    assert proposals(own_etcd) == before and written > 0
    assert "/lease/grant" not in asked and "/lease/revoke" not in asked, asked
    holder.close()
    other.close()


def test_waiting_is_bounded_by_its_timeout(etcd_server, unique_key):
    a, b = open_backend(etcd_server.url), open_backend(etcd_server.url)
    assert a.acquire(unique_key, "a", 30).granted
    assert b.acquire(unique_key, "b", 30).status == "locked"
    started = time.monotonic()
    b.wait_change(unique_key, 0.5)
    assert 0.45 <= time.monotonic() - started < 2.0
    a.close()
    b.close()


def test_a_ttl_below_the_etcd_minimum_is_refused(etcd_server, unique_key):
    result = run_dlock("run", "--job", "short", "--key", unique_key, "--backend", etcd_server.url,
                       "--ttl", "1500ms", "--", "true")
    assert result.returncode == 78
    assert "below the minimum of 2s for etcd://" in result.stderr


def test_a_run_end_to_end_and_a_waiting_runner(etcd_server, unique_key, tmp_path):
    """The node runner on etcd: a job runs under the lock with its fence, and a
    runner with on_contention=wait starts as soon as the holder's run ends."""
    gate = tmp_path / "gate"
    args = ["run", "--job", "e2e", "--key", unique_key, "--backend", etcd_server.url, "--ttl", "6s"]
    holder = start_dlock(*args, "--", "sh", "-c", 'touch "$0.running"; while [ ! -e "$0" ]; do sleep 0.02; done',
                         str(gate))
    wait_for((tmp_path / "gate.running").exists, 20, "the holder's job")
    before = watchers(etcd_server)
    waiter = start_dlock(*args, "--on-contention", "wait", "--wait-timeout", "60s", "--",
                         "sh", "-c", 'echo "$DLOCK_FENCING_TOKEN" > "$0"', str(tmp_path / "fence"))
    wait_for(lambda: watchers(etcd_server) > before, 20, "the waiting runner's watch")
    gate.touch()
    _out, holder_err = holder.communicate(timeout=30)
    _out, waiter_err = waiter.communicate(timeout=30)
    first, second = last_log(holder_err), last_log(waiter_err)
    assert (holder.returncode, waiter.returncode) == (0, 0), (holder_err, waiter_err)
    assert first["result"] == second["result"] == "success"
    assert second["attempt"] >= 2 and second["fence"] > first["fence"]
    assert (tmp_path / "fence").read_text().strip() == str(second["fence"])
    assert open_backend(etcd_server.url).query(unique_key).owner is None


LABELS = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True).filter(lambda s: not s.isdigit())
MEMBERS = st.lists(st.tuples(st.one_of(LABELS, st.ip_addresses(v=4).map(str)), st.integers(1, 65535)),
                   min_size=1, max_size=5)
PREFIXES = st.lists(st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,10}", fullmatch=True), min_size=1, max_size=3)


@settings(max_examples=200, deadline=None)
@given(members=MEMBERS, prefix=PREFIXES, tls=st.booleans(), user=st.one_of(st.none(), LABELS))
def test_every_member_list_and_prefix_is_read_back(members, prefix, tls, user):
    url = "%s://%s%s/%s" % ("etcd+https" if tls else "etcd", user + "@" if user else "",
                            ",".join("%s:%d" % member for member in members), "/".join(prefix))
    parts = validate.backend_url(url)
    assert parts.hosts == members and parts.path == "/" + "/".join(prefix) and parts.user == user


@settings(max_examples=200, deadline=None)
@given(members=MEMBERS, secret=st.from_regex(r"[A-Za-z0-9]{8,20}", fullmatch=True))
def test_a_password_in_an_etcd_url_is_never_shown(members, secret):
    url = "etcd://dlock:%s@%s/dlock" % (secret, ",".join("%s:%d" % member for member in members))
    with pytest.raises(ConfigError) as err:
        validate.backend_url(url)
    assert "contains a password" in str(err.value) and secret not in str(err.value)


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory):
    """A real etcd member that speaks HTTPS only and asks each client for a
    certificate its CA signed (--client-cert-auth), and the files of
    servers.make_tls."""
    directory = str(tmp_path_factory.mktemp("etcd-tls"))
    servers.make_tls(directory)
    server = servers.EtcdServer(tls=directory)
    yield server, directory
    server.stop()


def test_etcd_over_tls_verifies_the_member_by_the_ca_file_given_and_shows_our_certificate(tls_etcd, monkeypatch,
                                                                                          tmp_path, unique_key):
    """The member is verified by the operator's ca_file, whatever bundle the
    environment names (requests, before, let REQUESTS_CA_BUNDLE replace it);
    a member its CA did not sign, or one that wants a certificate we do not
    show, is no member; a CA file that holds no certificate is named."""
    server, tls = tls_etcd
    ca, other_ca = os.path.join(tls, "ca.pem"), os.path.join(tls, "other-ca.pem")
    with_cert = "%s?cert=%s&key=%s" % (server.url, os.path.join(tls, "client.pem"), os.path.join(tls, "client.key"))
    for variable in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.setenv(variable, other_ca)
    backend = open_backend(with_cert, None, 2.0, ca)
    try:
        assert backend.acquire(unique_key, "a", 30).granted
        assert server.etcdctl("get", "--print-value-only", backend.names.lock(unique_key))
        assert backend.release(unique_key, "a")
    finally:
        backend.close()
    refusals = [(open_backend(with_cert, None, 1.0, other_ca), "CERTIFICATE_VERIFY_FAILED"),
                (open_backend(server.url, None, 1.0, ca), "")]  # the member's handshake refuses us
    for refused, why in refusals:
        with pytest.raises(BackendError, match="no member answered.*127.0.0.1:%d: .*%s" % (server.client_ports[0],
                                                                                           why)):
            refused.query(unique_key)
        refused.close()
    not_a_ca = tmp_path / "not-a-ca.pem"
    not_a_ca.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="cannot load the TLS CA file %s" % re.escape(str(not_a_ca))):
        open_backend(with_cert, None, 1.0, str(not_a_ca)).query(unique_key)


class SlowProxy(object):
    """A TCP proxy to one etcd member that holds each piece of the member's
    answers `delay` seconds (None: never passes them on): a member that is
    live but slow to answer (a loaded leader's fsync), or a frozen one."""

    def __init__(self, target_port):
        self.target_port = target_port
        self.delay = 0.0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _address = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, source, sink, answers):
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                while answers and self.delay is None:
                    time.sleep(0.05)  # frozen: the answer never comes while it lasts
                if answers and self.delay:
                    time.sleep(self.delay)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.delay = 0.0
        self.listener.close()


@pytest.fixture(params=["no auth", "auth"])
def served(request):
    """(the etcd member, the URL's user part, its password): without auth,
    and with it, where a process's first call logs in first (a write
    through the leader too)."""
    if request.param == "auth":
        return request.getfixturevalue("etcd_auth"), "dlock@", "Locker-Secret-1"
    return request.getfixturevalue("etcd_server"), "", None


def test_a_slow_member_is_waited_on_and_a_frozen_one_left_for_another(served, unique_key):
    """A URL of three members, each a proxy to the one etcd member: all three
    reach one leader, as a follower forwards a write to its leader. op_timeout
    2 s. Every answer 0.9 s late: an equal share of the 2 s for each of the
    three (0.67 s) would time out on all three; the first member is waited on
    for most of it, and each call succeeds. Then the member that answered
    freezes while the others answer at once: a call waits on it for most of
    the budget, then another member answers within op_timeout, and the next
    call starts with that one."""
    server, user, password = served
    proxies = [SlowProxy(server.client_ports[0]) for _member in range(3)]
    try:
        for proxy in proxies:
            proxy.delay = 0.9  # from the first call on: the login's answer too
        backend = open_backend("etcd://%s%s/dlock" % (user, ",".join("127.0.0.1:%d" % p.port for p in proxies)),
                               password=password, op_timeout=2.0)
        started = time.monotonic()
        assert backend.acquire(unique_key, "a", 30).granted
        assert backend.renew(unique_key, "a", 30) is True
        # Each request within its op_timeout, and with auth the login before
        # the first one within its own (it waits as long as the request); 1 s
        # for a loaded machine (CI8 took 5.8 s of the 6 s with auth). The
        # grant: its read-only check, the lease grant, the transaction; the
        # renewal: the keep-alive and the read of the key.
        requests = 3 + 2 + (1 if password else 0)
        assert time.monotonic() - started < 2.0 * requests + 1.0
        for proxy in proxies:
            proxy.delay = 0.0
        proxies[0].delay = None  # it answered last: asked first
        started = time.monotonic()
        assert backend.renew(unique_key, "a", 30) is True
        took = time.monotonic() - started
        assert 1.4 < took < 2.0, took  # 0.75 of op_timeout on the frozen member, then another
        started = time.monotonic()
        assert backend.renew(unique_key, "a", 30) is True
        assert time.monotonic() - started < 0.5  # the member that answered, not the frozen one
        assert backend.release(unique_key, "a")
        backend.close()
    finally:
        for proxy in proxies:
            proxy.close()
