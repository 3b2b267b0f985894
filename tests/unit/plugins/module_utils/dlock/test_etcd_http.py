"""What a call to one etcd member says when it fails, on real loopback
sockets: whether the request may have reached the member (a write then may
have been applied) decides whether the gateway's next member's answer
stands. And a kept-alive connection the member closed while idle is not
mistaken for a member that failed."""

import select
import threading

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.etcd_gateway import EtcdGateway, answer_date
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.etcd_http import Member, Unavailable

TIMEOUTS = (1.0, 0.5)
LINE = b'{"a": 1}\n'
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
DATED = (b"HTTP/1.1 200 OK\r\nDate: Sun, 29 Nov 2026 21:00:00 GMT\r\nContent-Type: application/json\r\n"
         b"Content-Length: 2\r\n\r\n{}")


def read_request(conn, seen):
    """One request's bytes (headers and a JSON body, which ends in '}'),
    appended to SEEN; None when the client closed the connection."""
    data = b""
    while not data.endswith(b"}"):
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    seen.append(data)
    return data


def test_a_member_that_refuses_the_connection_was_never_sent_the_request(closed_port):
    member = Member("127.0.0.1", closed_port)
    with pytest.raises(Unavailable) as err:
        member.post("/kv/txn", {}, {}, TIMEOUTS)
    assert err.value.maybe_applied is False
    assert "ConnectionRefusedError" in str(err.value)


def test_a_member_that_takes_the_request_and_never_answers_may_have_applied_it(serve):
    seen = []  # the requests the member received

    def silent(conn):
        read_request(conn, seen)
        threading.Event().wait(5)  # holds the connection open, with no answer
    server = serve(silent)
    member = Member("127.0.0.1", server.port)
    with pytest.raises(Unavailable) as err:
        member.post("/kv/txn", {"compare": []}, {}, TIMEOUTS)
    assert err.value.maybe_applied is True and str(err.value) == "timed out"
    assert len(seen) == 1


def test_a_member_that_breaks_the_connection_after_the_request_may_have_applied_it(serve):
    seen = []  # the requests the member received

    def breaks(conn):
        read_request(conn, seen)
        conn.close()
    server = serve(breaks)
    with pytest.raises(Unavailable) as err:
        Member("127.0.0.1", server.port).post("/kv/txn", {}, {}, TIMEOUTS)
    assert err.value.maybe_applied is True and len(seen) == 1


def test_calls_share_one_connection_and_one_the_member_closed_while_idle_is_made_again(serve):
    seen = []  # the requests the member received
    closing = threading.Event()

    def answers_then_closes_when_told(conn):
        while read_request(conn, seen) is not None:
            conn.sendall(OK)
            if closing.is_set():
                conn.close()  # as a member's idle timeout, or its restart, would
                return
    server = serve(answers_then_closes_when_told)
    member = Member("127.0.0.1", server.port)
    assert member.post("/kv/range", {}, {}, TIMEOUTS).json() == {}
    assert member.post("/kv/range", {}, {}, TIMEOUTS).json() == {}
    assert server.accepted == 1
    closing.set()
    member.post("/kv/range", {}, {}, TIMEOUTS)  # answered, then the member closes the connection
    # Synchronise on the member's close reaching our socket (it reads at
    # once), not on time: before that, no client could tell.
    assert select.select([member._kept.sock], [], [], 2.0)[0]  # pylint: disable=protected-access
    answer = member.post("/kv/txn", {}, {}, TIMEOUTS)  # not an Unavailable: a new connection
    assert answer.status_code == 200 and server.accepted == 2 and len(seen) == 4


def test_a_stream_has_a_connection_of_its_own_and_its_read_times_out(serve):
    seen = []  # the requests the member received

    def streams(conn):
        read_request(conn, seen)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n" + LINE + b"\r\n")
        threading.Event().wait(5)  # the rest of the stream never comes
    server = serve(streams)
    member = Member("127.0.0.1", server.port)
    stream = member.post("/watch", {}, {}, (1.0, 0.3), stream=True)
    chunks = stream.chunks()
    assert next(chunks) == LINE
    with pytest.raises(Unavailable, match="timed out"):
        next(chunks)
    stream.close()
    assert member._kept is None  # pylint: disable=protected-access


def test_a_dated_call_such_as_the_grant_keeps_to_the_kept_alive_connection(serve):
    """The grant's transaction and the other calls that read the member's
    clock (its Date header) are not streams: a connection each would cost
    every grant a TCP handshake, and a TLS one on etcd+https."""
    seen = []

    def answers(conn):
        while read_request(conn, seen) is not None:
            conn.sendall(DATED)
    server = serve(answers)
    gateway = EtcdGateway([("127.0.0.1", server.port)], "http", 2.0)
    try:
        assert answer_date(gateway.post("/kv/txn", {}, dated=True)) == 1795986000  # 2026-11-29 21:00:00 UTC
        assert gateway.post("/kv/range", {}) == {}
        assert answer_date(gateway.post("/lease/grant", {}, dated=True)) == 1795986000
    finally:
        gateway.close()
    assert len(seen) == 3 and server.accepted == 1
