"""The dlock_patroni_cluster module, run by real `ansible`, against a
stand-in for Patroni 3.0's REST API (GET /cluster and /config, PATCH
/config, POST /restart, as Patroni answers them): the waits for health, the
settings kept, the restarts in order, check mode sending no change,
idempotence, and the REST API's password kept out of the output. Patroni
itself, with etcd and PostgreSQL: molecule/postgresql-ha and the lab."""

import base64
import http.server
import json
import threading

import pytest
from ansible_cli import run_module

PASSWORD = "Api-Pw-5ecret-0005"
AUTH = "Basic " + base64.b64encode(("patroni:" + PASSWORD).encode()).decode()


class StandIn(http.server.ThreadingHTTPServer):
    """One REST API for the three members; each member's own endpoints (its
    restart) under /NAME/."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server_address[1]
        self.config = {"ttl": 20, "loop_wait": 10, "synchronous_mode": True}
        self.members = [dict(name=name, role=role, state="running" if role == "leader" else "streaming",
                             host="10.0.0.%d" % n, api_url="%s/%s/patroni" % (self.url, name))
                        for n, (name, role) in enumerate((("p1", "leader"), ("p2", "sync_standby"),
                                                          ("p3", "replica")), 1)]
        self.changes = []  # (method, path) of every request that changes something

    def member(self, name):
        return [m for m in self.members if m["name"] == name][0]


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/cluster":
            return self.answer(200, {"members": self.server.members})
        if self.path == "/config":
            return self.answer(200, self.server.config)
        return self.answer(404, {})

    def changing(self):
        """The body of an authorised change, recorded; None after a 401."""
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        if self.headers.get("Authorization") != AUTH:
            self.answer(401, "no auth header received")
            return None
        self.server.changes.append((self.command, self.path))
        return body

    def do_PATCH(self):
        body = self.changing()
        if body is not None:
            self.server.config.update(body)
            self.answer(200, self.server.config)

    def do_POST(self):
        body = self.changing()
        if body is not None:
            assert body == {"restart_pending": True}
            self.server.member(self.path.split("/")[1]).pop("pending_restart", None)
            self.answer(200, "restarted successfully")


@pytest.fixture
def patroni():
    server = StandIn()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(10)


def cluster(server, *options, **changed):
    args = dict({"api": server.url, "members": ["p1", "p2", "p3"], "user": "patroni", "password": PASSWORD,
                 "dcs": {"ttl": 30, "synchronous_mode": True}, "wait": 10}, **changed)
    rc, result, output = run_module("dlock_patroni_cluster", args, *options)
    assert PASSWORD not in output and AUTH.split()[1] not in output, output
    return rc, result, output


def test_check_mode_reports_the_settings_and_restarts_and_sends_no_change(patroni):
    patroni.member("p1")["pending_restart"] = True
    patroni.member("p3")["pending_restart"] = True
    rc, result, output = cluster(patroni, "--check")
    assert rc == 0 and result["changed"], output
    assert result["actions"] == ["set ttl=30 in the cluster's configuration", "restart p3 (a setting needs it)",
                                 "restart p1 (a setting needs it)"]  # the leader last
    assert result["leader"] == "p1" and patroni.changes == [] and patroni.config["ttl"] == 20


def test_a_run_keeps_the_settings_restarts_the_leader_last_and_a_second_run_changes_nothing(patroni):
    patroni.member("p1")["pending_restart"] = True
    patroni.member("p3")["pending_restart"] = True
    rc, result, output = cluster(patroni)
    assert rc == 0 and result["changed"], output
    assert patroni.changes == [("PATCH", "/config"), ("POST", "/p3/restart"), ("POST", "/p1/restart")]
    assert patroni.config == {"ttl": 30, "loop_wait": 10, "synchronous_mode": True}
    assert [(m["name"], m["role"]) for m in result["members"]] == [("p1", "leader"), ("p2", "sync_standby"),
                                                                   ("p3", "replica")]
    rc, result, output = cluster(patroni)
    assert rc == 0 and (result["changed"], result["actions"], len(patroni.changes)) == (False, [], 3), output


def test_a_cluster_that_stays_unhealthy_is_named_member_by_member(patroni):
    patroni.member("p2")["role"] = "replica"
    rc, result, output = cluster(patroni, wait=1)
    assert rc != 0 and patroni.changes == [], output
    assert result["msg"] == ("dlock_postgresql: Failure: the Patroni cluster is not healthy after 1s (no synchronous "
                             "standby; p1: leader, running; p2: replica, streaming; p3: replica, streaming): see "
                             "journalctl -u patroni on the members"), output


def test_a_refused_change_says_what_the_api_answered(patroni):
    rc, result, output = cluster(patroni, password="Api-Pw-wrong-000005")
    assert rc != 0 and patroni.changes == [] and patroni.config["ttl"] == 20, output
    assert result["msg"] == ('dlock_postgresql: Failure: PATCH %s/config: HTTP 401 "no auth header received"'
                             % patroni.url), output
