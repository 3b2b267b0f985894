"""Check the Patroni cluster of dlock_postgresql's HA mode and keep its
cluster-wide settings, idempotently.

Talks to Patroni's REST API (3.0) with the standard library only; the spec
comes as JSON on stdin, so the REST API's password is never on a command
line, in the environment or in a file.

Spec: {"api": "http://ADDRESS:PORT" (a member's REST API), "members": [every
member's name], "user", "password" (the REST API's, for changes), "dcs":
{setting: value} (the dynamic configuration wanted), "wait" (seconds for
the cluster to be healthy), "check": bool}.

What it does:
1. waits until the cluster is healthy: every member there and running, one
   of them the leader and, with more than one member, one a synchronous
   standby (GET /cluster);
2. compares the dynamic configuration (GET /config) with the wanted one and
   sets what differs (PATCH /config), then waits for health again;
3. restarts the members whose settings wait for a restart (POST /restart
   with restart_pending), one at a time, the leader last, each followed by a
   wait for health.
Prints {"changed": bool, "actions": [...], "leader": NAME, "members": [...]}
(never the password) and exits 0, or prints {"failed": true, "msg": ...} and
exits 1. In check mode it only reports.
"""

import base64
import json
import sys
import time
import urllib.error
import urllib.request

REQUEST_TIMEOUT = 10  # seconds per request
RUNNING = ("running", "streaming")  # a member's state when it serves (3.0: running; later: streaming)


class Failure(Exception):
    """Stop, and tell the operator why."""


class Api(object):
    def __init__(self, user, password):
        token = base64.b64encode(("%s:%s" % (user, password)).encode("utf-8")).decode("ascii")
        self.auth = "Basic " + token

    def call(self, url, method="GET", body=None):
        headers = {"Content-Type": "application/json"}
        if method != "GET":
            headers["Authorization"] = self.auth
        data = json.dumps(body).encode("utf-8") if body is not None else None
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
                text = response.read().decode("utf-8")
        except urllib.error.HTTPError as exc:
            raise Failure("%s %s: HTTP %s %s" % (method, url, exc.code, exc.read().decode("utf-8", "replace")[:200]))
        try:
            return json.loads(text)
        except ValueError:
            return text


def describe(cluster):
    """The members as 'name: role, state' for messages."""
    return "; ".join("%s: %s, %s%s" % (m.get("name"), m.get("role"), m.get("state"),
                                       ", pending restart" if m.get("pending_restart") else "")
                     for m in cluster.get("members", [])) or "no member"


def problem(cluster, names, settled):
    """Why the cluster is not healthy yet, or None."""
    members = cluster.get("members", [])
    have = sorted(m.get("name") for m in members)
    if have != sorted(names):
        return "members %s, not %s" % (have, sorted(names))
    leaders = [m for m in members if m.get("role") == "leader"]
    if len(leaders) != 1 or leaders[0].get("state") not in RUNNING:
        return "no running leader"
    if [m for m in members if m.get("state") not in RUNNING]:
        return "a member is not running"
    if len(members) > 1 and not [m for m in members if m.get("role") == "sync_standby"]:
        return "no synchronous standby"
    if settled and [m for m in members if m.get("pending_restart")]:
        return "a member waits for a restart"
    return None


class Cluster(object):
    def __init__(self, spec):
        self.spec = spec
        self.check = bool(spec.get("check"))
        self.api = Api(spec["user"], spec["password"])
        self.base = spec["api"].rstrip("/")
        self.actions = []

    def wait_healthy(self, settled=True):
        deadline = time.monotonic() + float(self.spec.get("wait", 300))
        while True:
            try:
                cluster = self.api.call(self.base + "/cluster")
                why = problem(cluster, self.spec["members"], settled)
            except (OSError, ValueError, Failure) as exc:
                cluster, why = {}, "%s: %s" % (type(exc).__name__, exc)
            if why is None:
                return cluster
            if time.monotonic() > deadline:
                raise Failure("the Patroni cluster is not healthy after %ss (%s; %s): see journalctl -u patroni on "
                              "the members" % (self.spec.get("wait"), why, describe(cluster)))
            time.sleep(1)

    def settings(self):
        have = self.api.call(self.base + "/config")
        change = dict((name, value) for name, value in self.spec["dcs"].items() if have.get(name) != value)
        if change:
            self.actions.append("set %s in the cluster's configuration" % ", ".join(
                "%s=%s" % (name, json.dumps(value)) for name, value in sorted(change.items())))
            if not self.check:
                self.api.call(self.base + "/config", "PATCH", change)
                self.wait_healthy(settled=False)
                # Patroni applies a new configuration in its next loop: wait until it shows.
                deadline = time.monotonic() + float(self.spec.get("wait", 300))
                while [name for name, value in change.items() if self.api.call(self.base + "/config").get(name) != value]:
                    if time.monotonic() > deadline:
                        raise Failure("the cluster's configuration did not take %s" % sorted(change))
                    time.sleep(1)

    def restarts(self, cluster):
        pending = [m for m in cluster["members"] if m.get("pending_restart")]
        for member in sorted(pending, key=lambda m: m.get("role") == "leader"):
            self.actions.append("restart %s (a setting needs it)" % member["name"])
            if not self.check:
                self.api.call(member["api_url"].rsplit("/", 1)[0] + "/restart", "POST", {"restart_pending": True})
                self.wait_healthy(settled=False)

    def run(self):
        cluster = self.wait_healthy(settled=False)
        self.settings()
        self.restarts(cluster)
        if not self.check:
            cluster = self.wait_healthy()
        leader = [m["name"] for m in cluster["members"] if m.get("role") == "leader"][0]
        return {"changed": bool(self.actions), "actions": self.actions, "leader": leader,
                "members": [dict((k, m.get(k)) for k in ("name", "role", "state", "host")) for m in cluster["members"]]}


def main():
    try:
        result = Cluster(json.load(sys.stdin)).run()
    except (Failure, OSError, KeyError, ValueError) as exc:
        sys.stdout.write(json.dumps({"failed": True, "msg": "%s: %s" % (exc.__class__.__name__, exc)}) + "\n")
        return 1
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
