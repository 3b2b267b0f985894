"""A stand-in server on loopback for the tests of the backends' own
protocol clients (test_etcd_http.py, test_redis_resp.py): real sockets, so
that a refused connection, a timeout or a connection closed is the kernel's."""

import socket
import threading

import pytest


class LoopbackServer(object):
    """A listener on 127.0.0.1; each connection it accepts is served by
    HANDLER(conn) in a thread of its own. `accepted` counts them."""

    def __init__(self, handler):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self._handler = handler
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _address = self.listener.accept()
            except OSError:
                return  # closed
            self.accepted += 1
            threading.Thread(target=self._handler, args=(conn,), daemon=True).start()


@pytest.fixture
def serve():
    """serve(HANDLER): a LoopbackServer, closed at the end of the test."""
    servers = []

    def start(handler):
        servers.append(LoopbackServer(handler))
        return servers[-1]
    yield start
    for server in servers:
        server.listener.close()


@pytest.fixture
def closed_port():
    """A loopback port nothing listens on: a connection to it is refused."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return probe.getsockname()[1]
