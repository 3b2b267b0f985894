#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: dlock_etcd_access
short_description: Check a dlock etcd cluster's members and set up its accounts
version_added: 0.3.0
description:
  - Checks the members of the etcd cluster of the C(dlock.fleet.dlock_etcd) role and sets up its accounts, idempotently,
    through one member's JSON gateway (C(/v3/...), etcd 3.4), with Python's standard library only.
  - Waits until the member says it is healthy (it has a leader and its quorum).
  - Compares the cluster's members (their peer URLs) with O(peer_urls) and fails if they differ, changing nothing
    (membership changes are an operator's steps, the role's README).
  - Logs in as root; when etcd says authentication is not enabled yet, goes on without a token (the first run).
    A wrong O(root_password) fails.
  - Makes sure that user C(root) exists and has role C(root), and that for O(user) and every one of O(extra_users),
    the role of the user's name has exactly one permission, readwrite on the keys under its prefix followed by C(/),
    and the user has exactly that role and the given password (told by logging in as the user; etcd keeps only a
    bcrypt hash). Other permissions and roles of these accounts are revoked.
  - Enables authentication, last.
author:
  - dlock.fleet developers (@dlock-fleet)
extends_documentation_fragment:
  - dlock.fleet.node_changes
options:
  endpoint:
    description:
      - A member's client URL, V(http://ADDRESS:PORT) or V(https://ADDRESS:PORT).
    type: str
    required: true
  ca_file:
    description:
      - The CA certificate that signed the member's certificate, for an V(https://) O(endpoint).
      - Without it, the system's CA certificates.
    type: path
  peer_urls:
    description:
      - Every member's peer URL, as the inventory has them.
    type: list
    elements: str
    required: true
  root_password:
    description:
      - The password of etcd's user C(root). Set on the first run; afterwards it must be the one root has.
    type: str
    required: true
  user:
    description:
      - The runners' user, and the name of its role.
    type: str
    required: true
  password:
    description:
      - The runners' user's password.
    type: str
    required: true
  prefix:
    description:
      - The runners' key prefix, a path such as V(/dlock) (no trailing slash).
    type: str
    required: true
  extra_users:
    description:
      - More users set up like O(user), for instance Patroni's.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: User name, and the name of its role.
        type: str
        required: true
      password:
        description: Its password.
        type: str
        required: true
      prefix:
        description: Its key prefix, a path such as V(/patroni) (no trailing slash).
        type: str
        required: true
  wait:
    description:
      - Seconds to wait for the member to be healthy.
    type: int
    default: 60
notes:
  - The passwords reach etcd in the gateway's requests only, never on a command line, in the environment or in a file.
"""

EXAMPLES = r"""
- name: Check the members and set up the accounts
  dlock.fleet.dlock_etcd_access:
    endpoint: https://10.0.0.1:2379
    ca_file: /etc/etcd/tls/ca.pem
    peer_urls: [https://10.0.0.1:2380, https://10.0.0.2:2380, https://10.0.0.3:2380]
    root_password: "{{ etcd_root_password }}"
    user: dlock
    password: "{{ etcd_dlock_password }}"
    prefix: /dlock
    extra_users:
      - name: patroni
        password: "{{ etcd_patroni_password }}"
        prefix: /patroni
  run_once: true
"""

RETURN = r"""
actions:
  description: The changes made (in check mode, the changes it would make), in order. Never a password.
  returned: always
  type: list
  elements: str
  sample: ["add user root", "grant role root to user root", "add role dlock", "grant readwrite on /dlock/* to role dlock",
           "add user dlock", "grant role dlock to user dlock", "enable authentication"]
"""

import base64
import json
import time
import urllib.error

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

from ansible_collections.dlock.fleet.plugins.module_utils.dlock_changes import Changes, Failure, failure_message

REQUEST_TIMEOUT = 10  # seconds per request
# etcd's error texts (etcdserver/api/v3rpc/rpctypes), as the gateway returns them.
AUTH_NOT_ENABLED = "authentication is not enabled"
AUTH_FAILED = "authentication failed, invalid user ID or password"
USER_NOT_FOUND = "user name not found"
ROLE_NOT_FOUND = "role name not found"


class EtcdError(Exception):
    """An error answer of the gateway: etcd's own message."""


def b64(text):
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def unb64(data):
    return base64.b64decode(data).decode("utf-8", "replace")


def prefix_range(prefix):
    """[key, range_end) of every key under PREFIX/: etcd's --prefix range."""
    key = prefix + "/"
    return key, key[:-1] + chr(ord(key[-1]) + 1)


class Member(object):
    def __init__(self, endpoint, ca_file):
        self.endpoint = endpoint.rstrip("/")
        # https: this CA, or the system's when none is given (as ssl's default context).
        self.ca_file = (ca_file or None) if endpoint.startswith("https") else None
        self.token = None

    def _open(self, url, data=None, headers=None, method="GET"):
        try:
            with open_url(url, data=data, headers=headers, method=method, timeout=REQUEST_TIMEOUT,
                          ca_path=self.ca_file, use_netrc=False) as response:
                return json.loads(response.read().decode("utf-8") or "{}")
        except urllib.error.HTTPError as exc:
            try:
                answer = json.loads(exc.read().decode("utf-8"))
            except ValueError:
                answer = {}
            raise EtcdError(str(answer.get("error") or exc).replace("etcdserver: ", ""))

    def call(self, path, body):
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = self.token
        return self._open(self.endpoint + "/v3" + path, data=json.dumps(body).encode("utf-8"), headers=headers,
                          method="POST")

    def health(self):
        return self._open(self.endpoint + "/health")

    def login(self, name, password):
        """True with a token; False when etcd has authentication off."""
        try:
            self.token = self.call("/auth/authenticate", {"name": name, "password": password})["token"]
        except EtcdError as exc:
            if AUTH_NOT_ENABLED in str(exc):
                return False
            raise
        return True


class Accounts(object):
    def __init__(self, params, check):
        self.params = params
        self.member = Member(params["endpoint"], params["ca_file"])
        self.changes = Changes(check)

    def do(self, description, path, body):
        self.changes.make(description, self.member.call, path, body)

    def wait_healthy(self):
        deadline = time.monotonic() + self.params["wait"]
        last = "no answer"
        while True:
            try:
                answer = self.member.health()
                if answer.get("health") == "true":
                    return
                last = json.dumps(answer)
            except (OSError, ValueError, EtcdError) as exc:
                last = "%s: %s" % (type(exc).__name__, exc)
            if time.monotonic() > deadline:
                raise Failure("etcd at %s is not healthy after %ss (%s): are the other members up, and can they "
                              "reach each other on the peer port?" % (self.params["endpoint"], self.params["wait"], last))
            time.sleep(1)

    def check_members(self):
        members = self.member.call("/cluster/member/list", {}).get("members", [])
        have = sorted(url for member in members for url in member.get("peerURLs", []))
        want = sorted(self.params["peer_urls"])
        if have != want:
            raise Failure("the cluster's members (peer URLs %s) are not the inventory's (%s): add or remove members "
                          "with etcdctl as the role's README describes, then run the role again" % (have, want))

    def root(self, auth_enabled):
        try:
            roles = self.member.call("/auth/user/get", {"name": "root"}).get("roles", [])
        except EtcdError as exc:
            if USER_NOT_FOUND not in str(exc):
                raise
            self.do("add user root", "/auth/user/add", {"name": "root", "password": self.params["root_password"]})
            roles = []
        else:
            if not auth_enabled:  # a run that stopped before enabling auth: make the password ours
                self.do("set the password of user root", "/auth/user/changepw",
                        {"name": "root", "password": self.params["root_password"]})
        if "root" not in roles:
            self.do("grant role root to user root", "/auth/user/grant", {"user": "root", "role": "root"})

    def role(self, name, prefix):
        key, range_end = prefix_range(prefix)
        want = {"permType": "READWRITE", "key": b64(key), "range_end": b64(range_end)}
        try:
            perms = self.member.call("/auth/role/get", {"role": name}).get("perm", [])
        except EtcdError as exc:
            if ROLE_NOT_FOUND not in str(exc):
                raise
            self.do("add role %s" % name, "/auth/role/add", {"name": name})
            perms = []
        # The gateway leaves out fields at their zero value (READ, an empty range_end).
        haves = [{"permType": perm.get("permType", "READ"), "key": perm.get("key", ""),
                  "range_end": perm.get("range_end", "")} for perm in perms]
        for have in haves:
            if have != want:
                self.do("revoke %s on %s from role %s" % (have["permType"], unb64(have["key"]), name),
                        "/auth/role/revoke", {"role": name, "key": have["key"], "range_end": have["range_end"]})
        if want not in haves:
            self.do("grant readwrite on %s* to role %s" % (key, name), "/auth/role/grant", {"name": name, "perm": want})

    def user(self, name, password, auth_enabled):
        try:
            roles = self.member.call("/auth/user/get", {"name": name}).get("roles", [])
        except EtcdError as exc:
            if USER_NOT_FOUND not in str(exc):
                raise
            self.do("add user %s" % name, "/auth/user/add", {"name": name, "password": password})
            roles = []
        else:
            # With auth on, a login tells whether the password is right; with it
            # off (the first run) it cannot, so the password is set.
            same = False
            if auth_enabled:
                try:
                    same = Member(self.params["endpoint"], self.params["ca_file"]).login(name, password)
                except EtcdError as exc:
                    if AUTH_FAILED not in str(exc):
                        raise
            if not same:
                self.do("set the password of user %s" % name, "/auth/user/changepw", {"name": name, "password": password})
        for role in roles:
            if role != name:
                self.do("revoke role %s from user %s" % (role, name), "/auth/user/revoke", {"name": name, "role": role})
        if name not in roles:
            self.do("grant role %s to user %s" % (name, name), "/auth/user/grant", {"user": name, "role": name})

    def run(self):
        self.wait_healthy()
        self.check_members()
        try:
            auth_enabled = self.member.login("root", self.params["root_password"])
        except EtcdError as exc:
            if AUTH_FAILED in str(exc):
                raise Failure("etcd has authentication on, and root's password is not dlock_etcd_root_password: "
                              "give the password root has (the role cannot change it without it)")
            raise
        self.root(auth_enabled)
        accounts = [{"name": self.params["user"], "password": self.params["password"], "prefix": self.params["prefix"]}]
        for account in accounts + self.params["extra_users"]:
            self.role(account["name"], account["prefix"])
            self.user(account["name"], account["password"], auth_enabled)
        if not auth_enabled:
            self.do("enable authentication", "/auth/enable", {})
        return self.changes


def main():
    module = AnsibleModule(
        argument_spec=dict(
            endpoint=dict(type="str", required=True),
            ca_file=dict(type="path"),
            peer_urls=dict(type="list", elements="str", required=True),
            root_password=dict(type="str", required=True, no_log=True),
            user=dict(type="str", required=True),
            password=dict(type="str", required=True, no_log=True),
            prefix=dict(type="str", required=True),
            extra_users=dict(type="list", elements="dict", default=[], options=dict(
                name=dict(type="str", required=True),
                password=dict(type="str", required=True, no_log=True),
                prefix=dict(type="str", required=True),
            )),
            wait=dict(type="int", default=60),
        ),
        supports_check_mode=True,
    )
    try:
        changes = Accounts(module.params, module.check_mode).run()
    except (Failure, EtcdError, OSError, KeyError, ValueError) as exc:
        module.fail_json(msg=failure_message("dlock_etcd: ", exc))
    module.exit_json(changed=changes.changed, actions=changes.actions)


if __name__ == "__main__":
    main()
