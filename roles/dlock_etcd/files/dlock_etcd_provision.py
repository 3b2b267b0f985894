"""Check the dlock etcd cluster and set up its accounts, idempotently.

Talks to one member's JSON gateway (/v3/..., etcd 3.4) with the standard
library only; the spec comes as JSON on stdin, so no password is ever on a
command line, in the environment or in a file.

Spec: {"endpoint": "http(s)://ADDRESS:PORT", "ca_file": path or "",
"peer_urls": [every member's peer URL, from the inventory], "root_password",
"user", "password", "prefix" (e.g. /dlock), "extra_users": [{"name",
"password", "prefix"}] (say Patroni's), "wait" (seconds for the member to be
healthy), "check": bool}.

What it does:
1. waits until the member says it is healthy (it has a leader and its quorum);
2. compares the cluster's members (their peer URLs) with the inventory's and
   stops if they differ: membership changes are an operator's steps (README);
3. logs in as root; if etcd says authentication is not enabled yet, goes on
   without a token (the first run); a wrong root password stops it;
4. makes sure that root exists and has the root role, and that for the
   runners' user and every extra user, the role USER has exactly one
   permission, readwrite on the keys under its PREFIX/, and the user USER has
   exactly that role and the given password (checked by logging in as USER;
   etcd keeps only a bcrypt hash);
5. enables authentication, last.
Prints {"changed": bool, "actions": [...]} (never a password) and exits 0, or
prints {"failed": true, "msg": ...} and exits 1. In check mode it only reports.
"""

import base64
import json
import ssl
import sys
import time
import urllib.error
import urllib.request

REQUEST_TIMEOUT = 10  # seconds per request
# etcd's error texts (etcdserver/api/v3rpc/rpctypes), as the gateway returns them.
AUTH_NOT_ENABLED = "authentication is not enabled"
AUTH_FAILED = "authentication failed, invalid user ID or password"
USER_NOT_FOUND = "user name not found"
ROLE_NOT_FOUND = "role name not found"


class EtcdError(Exception):
    """An error answer of the gateway: etcd's own message."""


class Failure(Exception):
    """Stop, and tell the operator why."""


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
        self.context = ssl.create_default_context(cafile=ca_file or None) if endpoint.startswith("https") else None
        self.token = None

    def _open(self, request):
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT, context=self.context) as response:
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
        request = urllib.request.Request(self.endpoint + "/v3" + path, data=json.dumps(body).encode("utf-8"),
                                         headers=headers, method="POST")
        return self._open(request)

    def health(self):
        return self._open(urllib.request.Request(self.endpoint + "/health"))

    def login(self, name, password):
        """True with a token; False when etcd has authentication off."""
        try:
            self.token = self.call("/auth/authenticate", {"name": name, "password": password})["token"]
        except EtcdError as exc:
            if AUTH_NOT_ENABLED in str(exc):
                return False
            raise
        return True


class Provisioner(object):
    def __init__(self, spec):
        self.spec = spec
        self.check = bool(spec.get("check"))
        self.member = Member(spec["endpoint"], spec.get("ca_file"))
        self.actions = []

    def do(self, description, path, body):
        """Record an action; run it unless in check mode."""
        self.actions.append(description)
        if not self.check:
            self.member.call(path, body)

    def wait_healthy(self):
        deadline = time.monotonic() + float(self.spec.get("wait", 60))
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
                              "reach each other on the peer port?" % (self.spec["endpoint"], self.spec.get("wait"), last))
            time.sleep(1)

    def check_members(self):
        members = self.member.call("/cluster/member/list", {}).get("members", [])
        have = sorted(url for member in members for url in member.get("peerURLs", []))
        want = sorted(self.spec["peer_urls"])
        if have != want:
            raise Failure("the cluster's members (peer URLs %s) are not the inventory's (%s): add or remove members "
                          "with etcdctl as the role's README describes, then run the role again" % (have, want))

    def root(self, auth_enabled):
        try:
            roles = self.member.call("/auth/user/get", {"name": "root"}).get("roles", [])
        except EtcdError as exc:
            if USER_NOT_FOUND not in str(exc):
                raise
            self.do("add user root", "/auth/user/add", {"name": "root", "password": self.spec["root_password"]})
            roles = []
        else:
            if not auth_enabled:  # a run that stopped before enabling auth: make the password ours
                self.do("set the password of user root", "/auth/user/changepw",
                        {"name": "root", "password": self.spec["root_password"]})
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
                    same = Member(self.spec["endpoint"], self.spec.get("ca_file")).login(name, password)
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
            auth_enabled = self.member.login("root", self.spec["root_password"])
        except EtcdError as exc:
            if AUTH_FAILED in str(exc):
                raise Failure("etcd has authentication on, and root's password is not dlock_etcd_root_password: "
                              "give the password root has (the role cannot change it without it)")
            raise
        self.root(auth_enabled)
        accounts = [{"name": self.spec["user"], "password": self.spec["password"], "prefix": self.spec["prefix"]}]
        for account in accounts + list(self.spec.get("extra_users") or []):
            self.role(account["name"], account["prefix"])
            self.user(account["name"], account["password"], auth_enabled)
        if not auth_enabled:
            self.do("enable authentication", "/auth/enable", {})
        return {"changed": bool(self.actions), "actions": self.actions}


def main():
    try:
        result = Provisioner(json.load(sys.stdin)).run()
    except (Failure, EtcdError, OSError, KeyError, ValueError) as exc:
        sys.stdout.write(json.dumps({"failed": True, "msg": "%s: %s" % (exc.__class__.__name__, exc)}) + "\n")
        return 1
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
