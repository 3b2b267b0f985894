#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: dlock_patroni_cluster
short_description: Check the Patroni cluster of dlock_postgresql's HA mode and keep its cluster-wide settings
version_added: 0.3.0
description:
  - Checks the Patroni cluster of the C(dlock.fleet.dlock_postgresql) role's HA mode and keeps its dynamic
    configuration, idempotently, through a member's REST API (Patroni 3.0), with Python's standard library only.
  - Waits until the cluster is healthy - every member of O(members) there and running, one of them the leader and,
    with more than one member, one a synchronous standby (C(sync_standby), or C(quorum_standby) in quorum mode;
    C(GET /cluster)).
  - Compares the dynamic configuration (C(GET /config)) with O(dcs) and sets what differs (C(PATCH /config)), then
    waits for health again, and until the cluster shows the new settings.
  - Restarts the members whose settings wait for a restart (C(POST /restart) with C(restart_pending)), one at a time,
    the leader last, each followed by a wait for health.
author:
  - dlock.fleet developers (@dlock-fleet)
extends_documentation_fragment:
  - dlock.fleet.node_changes
options:
  api:
    description:
      - A member's REST API, V(http://ADDRESS:PORT).
    type: str
    required: true
  members:
    description:
      - Every member's name.
    type: list
    elements: str
    required: true
  user:
    description:
      - The REST API's user, for changes.
    type: str
    required: true
  password:
    description:
      - The REST API's password, for changes.
    type: str
    required: true
  dcs:
    description:
      - The dynamic configuration wanted, C(setting) to value; settings not named are left as they are.
    type: dict
    default: {}
  wait:
    description:
      - Seconds to wait for the cluster to be healthy (each time), and for a new configuration to show.
    type: int
    default: 300
"""

EXAMPLES = r"""
- name: Check the cluster and keep its settings
  dlock.fleet.dlock_patroni_cluster:
    api: http://10.0.0.1:8008
    members: [p1, p2, p3]
    user: patroni
    password: "{{ patroni_restapi_password }}"
    dcs:
      synchronous_mode: quorum
      synchronous_mode_strict: true
      ttl: 15
  run_once: true
"""

RETURN = r"""
actions:
  description: The changes made (in check mode, the changes it would make), in order.
  returned: always
  type: list
  elements: str
  sample: ["set ttl=30 in the cluster's configuration", "restart p2 (a setting needs it)"]
leader:
  description: The name of the leader.
  returned: success
  type: str
  sample: p1
members:
  description: The members, as the cluster lists them.
  returned: success
  type: list
  elements: dict
  contains:
    name:
      description: The member's name.
      type: str
    role:
      description: Its role, such as C(leader), C(sync_standby), C(quorum_standby), C(replica).
      type: str
    state:
      description: Its state, such as C(running), C(streaming).
      type: str
    host:
      description: Its PostgreSQL address.
      type: str
"""

import base64
import json
import time
import urllib.error

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

from ansible_collections.dlock.fleet.plugins.module_utils.dlock_changes import Changes, Failure, failure_message

REQUEST_TIMEOUT = 10  # seconds per request
RUNNING = ("running", "streaming")  # a member's state when it serves (3.0: running; later: streaming)
# The roles of a standby a commit can wait for: synchronous_mode on (one
# sync_standby), or quorum (Patroni 4: every standby of the quorum).
SYNCHRONOUS_ROLES = ("sync_standby", "quorum_standby")


class Api(object):
    def __init__(self, user, password):
        token = base64.b64encode(("%s:%s" % (user, password)).encode("utf-8")).decode("ascii")
        self.auth = "Basic " + token

    def call(self, url, method="GET", body=None):
        headers = {"Content-Type": "application/json"}
        if method != "GET":
            headers["Authorization"] = self.auth
        data = json.dumps(body).encode("utf-8") if body is not None else None
        try:
            with open_url(url, data=data, headers=headers, method=method, timeout=REQUEST_TIMEOUT,
                          use_netrc=False) as response:
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
    if len(members) > 1 and not [m for m in members if m.get("role") in SYNCHRONOUS_ROLES]:
        return "no synchronous standby"
    if settled and [m for m in members if m.get("pending_restart")]:
        return "a member waits for a restart"
    return None


class Cluster(object):
    def __init__(self, params, check):
        self.params = params
        self.api = Api(params["user"], params["password"])
        self.base = params["api"].rstrip("/")
        self.changes = Changes(check)

    def wait_healthy(self, settled=True):
        deadline = time.monotonic() + self.params["wait"]
        while True:
            try:
                cluster = self.api.call(self.base + "/cluster")
                why = problem(cluster, self.params["members"], settled)
            except (OSError, ValueError, Failure) as exc:
                cluster, why = {}, "%s: %s" % (type(exc).__name__, exc)
            if why is None:
                return cluster
            if time.monotonic() > deadline:
                raise Failure("the Patroni cluster is not healthy after %ss (%s; %s): see journalctl -u patroni on "
                              "the members" % (self.params["wait"], why, describe(cluster)))
            time.sleep(1)

    def settings(self):
        have = self.api.call(self.base + "/config")
        change = dict((name, value) for name, value in self.params["dcs"].items() if have.get(name) != value)
        if change:
            self.changes.make("set %s in the cluster's configuration" % ", ".join(
                "%s=%s" % (name, json.dumps(value)) for name, value in sorted(change.items())), self.set_config, change)

    def set_config(self, change):
        self.api.call(self.base + "/config", "PATCH", change)
        self.wait_healthy(settled=False)
        # Patroni applies a new configuration in its next loop: wait until it shows.
        deadline = time.monotonic() + self.params["wait"]
        while [name for name, value in change.items() if self.api.call(self.base + "/config").get(name) != value]:
            if time.monotonic() > deadline:
                raise Failure("the cluster's configuration did not take %s" % sorted(change))
            time.sleep(1)

    def restarts(self, cluster):
        pending = [m for m in cluster["members"] if m.get("pending_restart")]
        for member in sorted(pending, key=lambda m: m.get("role") == "leader"):
            self.changes.make("restart %s (a setting needs it)" % member["name"], self.restart, member)

    def restart(self, member):
        self.api.call(member["api_url"].rsplit("/", 1)[0] + "/restart", "POST", {"restart_pending": True})
        self.wait_healthy(settled=False)

    def run(self):
        cluster = self.wait_healthy(settled=False)
        self.settings()
        self.restarts(cluster)
        if not self.changes.check:
            cluster = self.wait_healthy()
        leader = [m["name"] for m in cluster["members"] if m.get("role") == "leader"][0]
        return {"changed": self.changes.changed, "actions": self.changes.actions, "leader": leader,
                "members": [dict((k, m.get(k)) for k in ("name", "role", "state", "host")) for m in cluster["members"]]}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            api=dict(type="str", required=True),
            members=dict(type="list", elements="str", required=True),
            user=dict(type="str", required=True),
            password=dict(type="str", required=True, no_log=True),
            dcs=dict(type="dict", default={}),
            wait=dict(type="int", default=300),
        ),
        supports_check_mode=True,
    )
    try:
        result = Cluster(module.params, module.check_mode).run()
    except (Failure, OSError, KeyError, ValueError) as exc:
        module.fail_json(msg=failure_message("dlock_postgresql: ", exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
