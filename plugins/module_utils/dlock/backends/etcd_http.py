"""One etcd member's gRPC gateway (JSON over HTTP/1.1), with the standard
library alone (http.client, ssl): the etcd backend needs no driver.

Why not a client library: every call of ours was already built, bounded,
authenticated and read by etcd_gateway.py; the library (etcd3gw, through
requests) only carried the bytes, and importing it was most of what a run
cost a node: `python3 -c "import etcd3gw"` takes about 125 ms of CPU, the
interpreter with http.client and ssl about 30 ms
(tests/bench/bench_run_cost.py). Every node's runner pays that at each
firing, and when a fleet's nodes fire together on small hosts that is how
late the slot's winner starts.

Calls go over one kept-alive connection a member (a lock serialises the
heartbeat's thread and the main one on it); a stream (a watch) gets a
connection of its own, closed with it. What a failed call says is
Unavailable.maybe_applied: whether the request may have reached the member.
"""

import http.client
import json
import select
import threading

from .base import transport_error

API = "/v3"


class Unavailable(Exception):
    """This member did not answer (or cannot serve): try the next one.
    `maybe_applied`: the request may have reached it, and a write may have
    been applied though no answer came (read timeout, a connection broken
    after the request was sent, a 503 such as "request timed out"); false
    only when the request was never sent (no connection was made)."""

    def __init__(self, why, maybe_applied=True):
        Exception.__init__(self, why)
        self.maybe_applied = maybe_applied


class Answer(object):
    """A member's whole answer: status, headers, the body read."""

    def __init__(self, response, body):
        self.status_code = response.status
        self.reason = response.reason
        self.headers = response.headers
        self.body = body

    def json(self):
        """The body's JSON (ValueError when it is not)."""
        return json.loads(self.body.decode("utf-8"))

    def close(self):
        """Nothing is left open: Stream's counterpart."""


class Stream(Answer):
    """An answer still being sent (a watch), on a connection of its own."""

    def __init__(self, connection, response):
        Answer.__init__(self, response, None)
        self._connection = connection
        self._response = response

    def json(self):
        self.body = _reading(self._response.read)
        return Answer.json(self)

    def chunks(self):
        """The body as it comes, a piece at a time; Unavailable when the read
        times out (the connection's read timeout) or the connection breaks."""
        while True:
            chunk = _reading(self._response.read1, 65536)
            if not chunk:
                return
            yield chunk

    def close(self):
        self._connection.close()


class Member(object):
    """One member of the URL, as HOST:PORT; TLS: an ssl context, or None for
    plain HTTP."""

    def __init__(self, host, port, tls=None):
        self.host = host
        self.port = port
        self._tls = tls
        self._kept = None  # the kept-alive connection of calls
        self._using = threading.Lock()

    def post(self, path, payload, headers, timeouts, stream=False):
        """POST PAYLOAD (JSON) to the gateway's PATH. TIMEOUTS: (connect,
        answer) in seconds; the answer's bound holds for each read of the
        socket. Returns an Answer, or a Stream that the caller closes.
        Raises Unavailable."""
        connect_timeout, answer_timeout = timeouts
        body = json.dumps(payload).encode("utf-8")
        headers = dict(headers, **{"Content-Type": "application/json"})
        if stream:
            connection = self._connect(connect_timeout)
            try:
                return Stream(connection, self._send(connection, path, body, headers, answer_timeout))
            except BaseException:
                connection.close()
                raise
        with self._using:
            if self._kept is None or _dropped(self._kept):
                self.close()
                self._kept = self._connect(connect_timeout)
            try:
                response = self._send(self._kept, path, body, headers, answer_timeout)
                answer = Answer(response, _reading(response.read))
            except BaseException:
                self.close()
                raise
            if response.will_close:
                self.close()
            return answer

    def _connect(self, timeout):
        """A new connection, made within TIMEOUT (the TLS handshake too).
        Failing here, nothing was sent."""
        if self._tls is not None:
            connection = http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self._tls)
        else:
            connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            connection.connect()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise Unavailable(transport_error(exc), maybe_applied=False)
        return connection

    @staticmethod
    def _send(connection, path, body, headers, answer_timeout):
        """The request sent and its answer's status line and headers read, each
        read of the socket within ANSWER_TIMEOUT."""
        connection.sock.settimeout(answer_timeout)
        try:
            connection.request("POST", API + path, body, headers)
            return connection.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            raise Unavailable(transport_error(exc))

    def close(self):
        kept, self._kept = self._kept, None
        if kept is not None:
            kept.close()


def _reading(read, *args):
    """READ(*ARGS) of an answer's body; Unavailable when the read times out
    or the connection breaks."""
    try:
        return read(*args)
    except (OSError, http.client.HTTPException) as exc:
        raise Unavailable(transport_error(exc))


def _dropped(connection):
    """Whether a kept-alive connection was closed by the member (or has bytes
    no request asked for) while it was idle: its socket reads at once. As
    urllib3 checks before it reuses one; a request sent on it would fail
    with the member unable to tell whether it arrived."""
    sock = connection.sock
    if sock is None:
        return True
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True
