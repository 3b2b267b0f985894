"""The Redis protocol (RESP2) of the backend, on real loopback sockets: what
a failed command says (whether it may have run on the server), that a reply
that comes late is never taken for the next command's, and that a
subscription's wait keeps what arrived of a message. The parser's
round trip and hostile replies are tests/integration/test_redis_resp_property.py's."""

import threading

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.redis_resp import (
    Connection, ReplyError, Unanswered, encode, parse)


def commands(conn):
    """The commands a client sends on CONN, as lists of strings, one by one."""
    buffer = bytearray()
    while True:
        command, end = parse(buffer)
        if isinstance(command, list):
            del buffer[:end]
            yield command
            continue
        chunk = conn.recv(65536)
        if not chunk:
            return
        buffer += chunk


def test_a_refused_connection_ran_nothing(closed_port):
    with pytest.raises(Unanswered) as err:
        Connection("127.0.0.1", closed_port, timeout=1.0).call("EVALSHA", "x", 0)
    assert err.value.maybe_applied is False and "ConnectionRefusedError" in str(err.value)


def test_a_reply_that_comes_late_is_never_taken_for_the_next_commands(serve):
    """The first EVALSHA's reply comes after the client gave up on it: the
    client must not read it as the answer to the GET that follows."""
    def late_then_prompt(conn):
        for command in commands(conn):
            if command[0] == "EVALSHA":
                threading.Event().wait(0.6)  # longer than the client's timeout
                conn.sendall(b":1\r\n")  # the late reply of the EVALSHA
            else:
                conn.sendall(encode(["reply to", command[0]]))
    server = serve(late_then_prompt)
    client = Connection("127.0.0.1", server.port, timeout=0.3)
    with pytest.raises(Unanswered) as err:
        client.call("EVALSHA", "abc", 0)
    assert err.value.maybe_applied is True and str(err.value) == "timed out"
    assert client.call("GET", "k") == ["reply to", "GET"]
    assert server.accepted == 2  # the timed-out connection was dropped, not read again


def test_an_error_reply_is_the_servers_refusal_and_the_connection_stays(serve):
    def refuses_then_answers(conn):
        for number, _command in enumerate(commands(conn)):
            conn.sendall(b"-NOSCRIPT No matching script.\r\n" if number == 0 else b"+OK\r\n")
    server = serve(refuses_then_answers)
    client = Connection("127.0.0.1", server.port, timeout=1.0)
    with pytest.raises(ReplyError) as err:
        client.call("EVALSHA", "abc", 0)
    assert err.value.code == "NOSCRIPT"
    assert client.call("SCRIPT", "LOAD", "return 1") == "OK" and server.accepted == 1


def test_auth_and_select_come_first_on_each_new_connection(serve):
    seen = []

    def records(conn):
        for command in commands(conn):
            seen.append(command)
            conn.sendall(b"+OK\r\n")
    server = serve(records)
    client = Connection("127.0.0.1", server.port, db=3, username="dlock", password="pw\n\x00", timeout=1.0)
    assert client.call("PING") == "OK"
    assert seen == [["AUTH", "dlock", "pw\n\x00"], ["SELECT", "3"], ["PING"]]


def test_a_transaction_raises_the_error_of_a_command_in_it(serve):
    def execs(conn):
        for command in commands(conn):
            if command[0] == "EXEC":
                conn.sendall(b"*2\r\n$1\r\na\r\n-WRONGTYPE Operation against a key\r\n")
            else:
                conn.sendall(b"+OK\r\n" if command[0] == "MULTI" else b"+QUEUED\r\n")
    server = serve(execs)
    with pytest.raises(ReplyError, match="^WRONGTYPE"):
        Connection("127.0.0.1", server.port, timeout=1.0).transaction([("GET", "a"), ("LRANGE", "b", 0, 1)])


def test_a_subscriptions_wait_keeps_what_arrived_of_a_message(serve):
    message = encode(["message", "dlock:{k}:wake", "owner-1"])
    go_on = threading.Event()

    def halves(conn):
        next(commands(conn))
        conn.sendall(b"*3\r\n$9\r\nsubscribe\r\n$14\r\ndlock:{k}:wake\r\n:1\r\n" + message[:9])
        go_on.wait(5)
        conn.sendall(message[9:])
        threading.Event().wait(5)
    server = serve(halves)
    client = Connection("127.0.0.1", server.port, timeout=1.0)
    client.send("SUBSCRIBE", "dlock:{k}:wake")
    assert client.read(1.0) == ["subscribe", "dlock:{k}:wake", 1]
    assert client.read(0.2) is None  # half a message, then nothing within the wait
    go_on.set()
    assert client.read(1.0) == ["message", "dlock:{k}:wake", "owner-1"]
