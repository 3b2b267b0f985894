"""One Redis server's protocol (RESP2) over one socket, with the standard
library alone (socket, ssl): the Redis backend needs no driver.

Why not redis-py: the backend sends a handful of commands (EVALSHA and
SCRIPT LOAD, MULTI/EXEC of reads, TIME, EXISTS, LRANGE, SUBSCRIBE), and
importing redis-py was most of what a run cost a node: Debian 12's 4.3
takes about 65 ms of CPU to import (it loads asyncio for its cluster
commands), a run about 115 ms in all (tests/bench/bench_run_cost.py). Every
node's runner pays that at each firing, and when a fleet's nodes fire
together on small hosts, that is how late the slot's winner starts.

What a failed command says: Unanswered.maybe_applied, whether the command
may have reached the server; a ReplyError is the server's own refusal.
"""

import socket

from .base import transport_error

ENCODING = "utf-8"
MAX_BULK = 512 * 1024 * 1024  # Redis's own limit of a string: a longer length is not Redis talking
MAX_DEPTH = 8  # arrays in arrays: the engine's replies nest two deep (EXEC of HMGET)
_INCOMPLETE = object()


class ReplyError(Exception):
    """An error reply of the server (-ERR, -NOSCRIPT, -WRONGPASS, -NOPERM ...):
    the command was refused or failed there."""

    @property
    def code(self):
        """Its first word (NOSCRIPT, WRONGPASS, NOPERM, ERR ...)."""
        return str(self).split(" ", 1)[0]


class Unanswered(Exception):
    """No answer (a timeout, a connection refused, closed or broken).
    `maybe_applied`: the command may have reached the server, and run there;
    false only when no connection was made."""

    def __init__(self, why, maybe_applied=True):
        Exception.__init__(self, why)
        self.maybe_applied = maybe_applied


def encode(args):
    """A command as RESP: an array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode(ENCODING)
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def parse(buffer, start=0, depth=0):
    """(reply, end) of the reply at START of BUFFER, or (_INCOMPLETE, start)
    while it has not all arrived. Strings are decoded; an error reply is a
    ReplyError (returned, not raised: one in an EXEC's array is one
    command's); a nil is None. ValueError: not a reply Redis sends."""
    if depth > MAX_DEPTH:
        raise ValueError("arrays nested more than %d deep" % MAX_DEPTH)
    line_end = buffer.find(b"\r\n", start)
    if line_end < 0:
        return _INCOMPLETE, start
    kind, line, at = buffer[start:start + 1], bytes(buffer[start + 1:line_end]), line_end + 2
    if kind == b"+":
        return line.decode(ENCODING, "replace"), at
    if kind == b"-":
        return ReplyError(line.decode(ENCODING, "replace")), at
    if kind == b":":
        return int(line), at
    if kind == b"$":
        length = _length(line)
        if length is None:
            return None, at
        if len(buffer) < at + length + 2:
            return _INCOMPLETE, start
        return bytes(buffer[at:at + length]).decode(ENCODING, "replace"), at + length + 2
    if kind == b"*":
        count = _length(line)
        if count is None:
            return None, at
        items = []
        for _index in range(count):
            item, at = parse(buffer, at, depth + 1)
            if item is _INCOMPLETE:
                return _INCOMPLETE, start
            items.append(item)
        return items, at
    raise ValueError("not a RESP reply: %r" % bytes(buffer[start:start + 20]))


def _length(line):
    """A bulk string's or an array's length: None for -1 (nil)."""
    length = int(line)
    if length == -1:
        return None
    if not 0 <= length <= MAX_BULK:
        raise ValueError("a length of %d" % length)
    return length


class Connection(object):
    """A connection to HOST:PORT, made at the first command and again after a
    failure: TLS with an ssl context when given (the server's name checked),
    then AUTH (USERNAME and PASSWORD; PASSWORD alone: the default user) and
    SELECT DB. Each command waits TIMEOUT seconds for the connection and for
    each read of its answer."""

    def __init__(self, host, port, db=0, username=None, password=None, tls=None, timeout=2.0):
        self.host = host
        self.port = port
        self.db = db
        self.username = username
        self.password = password
        self.tls = tls
        self.timeout = timeout
        self._sock = None
        self._buffer = bytearray()

    def call(self, *args):
        """One command's reply; a ReplyError is raised."""
        return _raised(self.execute([args])[0])

    def execute(self, commands):
        """The replies of COMMANDS, sent at once, in order (one round trip).
        Error replies are in the list, not raised."""
        self._connected()
        self._send(b"".join(encode(args) for args in commands))
        return [self._read(self.timeout) for _command in commands]

    def transaction(self, commands):
        """COMMANDS in MULTI/EXEC: their replies, in order; the first error
        reply is raised (EXECABORT when a command was refused when queued)."""
        replies = self.execute([("MULTI",)] + list(commands) + [("EXEC",)])
        for reply in replies[:-1]:
            _raised(reply)
        results = _raised(replies[-1])
        if results is None:
            raise ReplyError("EXECABORT the transaction was discarded")
        for result in results:
            _raised(result)
        return results

    def send(self, *args):
        """Send a command whose replies read() takes (SUBSCRIBE)."""
        self._connected()
        self._send(encode(args))

    def read(self, timeout):
        """The next reply, waited for at most TIMEOUT seconds: None when none
        came (what arrived of it is kept for the next read)."""
        try:
            return self._read(max(timeout, 0.001), keep_on_timeout=True)  # 0 would make the socket non-blocking
        except _TimedOut:
            return None

    def _connected(self):
        if self._sock is not None:
            return
        try:
            sock = socket.create_connection((self.host, self.port), self.timeout)
        except OSError as exc:
            raise Unanswered(transport_error(exc), maybe_applied=False)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_hostname=self.host)
        except OSError as exc:
            sock.close()
            raise Unanswered(transport_error(exc), maybe_applied=False)
        self._sock, self._buffer = sock, bytearray()
        hello = []
        if self.password is not None:
            hello.append(("AUTH", self.username, self.password) if self.username else ("AUTH", self.password))
        if self.db:
            hello.append(("SELECT", self.db))
        if hello:
            try:
                for reply in self.execute(hello):
                    _raised(reply)
            except ReplyError:
                self.close()
                raise

    def _send(self, data):
        self._sock.settimeout(self.timeout)
        try:
            self._sock.sendall(data)
        except OSError as exc:
            self.close()
            raise Unanswered(transport_error(exc))

    def _read(self, timeout, keep_on_timeout=False):
        """The next reply, within TIMEOUT a read of the socket; Unanswered
        when it fails, the connection then closed: a reply that comes late
        would be taken for the next command's. KEEP_ON_TIMEOUT: a timeout
        keeps the connection and what arrived (a subscription's wait)."""
        self._sock.settimeout(timeout)
        while True:
            try:
                reply, end = parse(self._buffer)
            except ValueError as exc:
                self.close()
                raise Unanswered("the server's answer is not RESP: %s" % exc)
            if reply is not _INCOMPLETE:
                del self._buffer[:end]
                return reply
            try:
                chunk = self._sock.recv(65536)
            except socket.timeout:
                if not keep_on_timeout:
                    self.close()
                raise _TimedOut("timed out")
            except OSError as exc:
                self.close()
                raise Unanswered(transport_error(exc))
            if not chunk:
                self.close()
                raise Unanswered("the server closed the connection")
            self._buffer += chunk

    def close(self):
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()


class _TimedOut(Unanswered):
    """No reply within the time given."""


def _raised(reply):
    if isinstance(reply, ReplyError):
        raise reply
    return reply
