# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""The lock operation of dlock.fleet.dlock: query, acquire (waiting in
line, as the runner does: dlock/waiting.py), release, force release, with check mode and diff.

The same code runs in the action plugin on the controller (the default) and
in the module on a target (run_on=target). Engine errors become a LockFailed
with its message here, in one place.
"""

from __future__ import annotations

import time

from ansible.module_utils.basic import missing_required_lib

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import LockView, open_backend
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.config import read_secret
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.safefile import require_regular
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.validate import format_duration
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import AuthError, BackendError, ConfigError, MissingDriver
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.options import HISTORY_MAX, MIN_TTL, check_backend_ttl
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.owner import new_owner
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.waiting import acquire as wait_in_line


class LockFailed(Exception):
    """The task fails with `msg`; `result` holds the fields it still reports."""

    def __init__(self, msg, result=None):
        Exception.__init__(self, msg)
        self.msg = msg
        self.result = result or {}


def check_backend_url(url):
    """Refuse a missing URL or one with a password, without echoing the URL
    (the validation core looks for credentials before anything else)."""
    if not url:
        raise ConfigError("backend_url: required; set it on the task or in the inventory variable "
                          "dlock_backend (url: redis://..., postgresql://..., etcd://...)")
    try:
        return validate.backend_url(url, "backend_url")
    except ConfigError as exc:
        if "contains a password" in str(exc):
            raise ConfigError("backend_url: contains a password; give it as backend_password or "
                              "backend_password_file (or dlock_backend.password / password_file) instead")
        raise


def check_params(params):
    """Every parameter that needs no file: called by the action plugin before
    it uses any of them (a key names a file of the hold, a URL is shown at
    -vvv), and by Request on the side that runs the lock."""
    Request(params, read_files=False)


class BackendRequest(object):
    """The backend options of a task (the doc fragment dlock.fleet.backend),
    checked and converted (ConfigError when wrong): what every module that
    talks to a lock backend takes."""

    def __init__(self, params, read_files=True):
        self.url = params.get("backend_url")
        self.scheme = check_backend_url(self.url).scheme
        self.op_timeout = validate.duration(params["op_timeout"], "op_timeout", positive=True)
        self.fence_epoch = validate.fence_epoch(params.get("fence_epoch", 0), "fence_epoch")
        self.ca_file = params.get("ca_file")
        if self.ca_file is not None:
            validate.path(self.ca_file, "ca_file")
            if read_files:
                require_regular(self.ca_file, "ca_file")
        self.password = params.get("backend_password")
        if self.password is not None:
            validate.text(self.password, "backend_password", 1024, secret=True)
        if params.get("backend_password_file"):
            validate.path(params["backend_password_file"], "backend_password_file")
            if read_files:
                self.password = read_secret(params["backend_password_file"], "backend_password_file")


class Request(BackendRequest):
    """The task's parameters, checked and converted (ConfigError when wrong)."""

    def __init__(self, params, read_files=True):
        self.state = params["state"]
        BackendRequest.__init__(self, params, read_files)
        self.key = validate.lock_key(params["key"], "key")
        self.ttl = check_backend_ttl(validate.duration(params["ttl"], "ttl", MIN_TTL), self.scheme)
        self.wait = validate.duration(params["wait"], "wait")
        self.force = params["force"]
        self.reason = params.get("reason")
        if self.reason is not None:
            validate.text(self.reason, "reason", 500, allow_empty=True)
        if self.force and self.state != "released":
            raise ConfigError("force: only applies to state=released")
        if self.force and not (self.reason or "").strip():
            raise ConfigError("reason: say why the lock is broken (force=true needs a reason)")
        if params.get("hold") and self.state != "acquired":
            raise ConfigError("hold: only applies to state=acquired")
        self.history = validate.integer(params.get("history", 0), "history", 0, HISTORY_MAX)
        if self.history and self.state != "query":
            raise ConfigError("history: only applies to state=query")
        self.owner = params.get("owner")
        if self.owner is not None:
            validate.text(self.owner, "owner", 200)
        if self.owner is None and self.state == "acquired" and read_files:
            self.owner = new_owner()  # only without the action plugin, which always sets one
        if self.owner is None and self.state == "released" and not self.force:
            raise ConfigError("owner: required to release without force (the action plugin sets it)")


def run(params, check_mode=False, diff=False):
    """The result dict of the task; raises LockFailed."""
    return with_backend(params, Request, lambda backend, request: OPERATIONS[request.state](
        backend, request, check_mode, diff))


def with_backend(params, request_class, operation):
    """operation(backend, request) on the backend of the task's parameters,
    checked by request_class (a BackendRequest); engine errors become a
    LockFailed that says what to do, here in one place."""
    url = validate.redact_url(params.get("backend_url"))
    request = None
    try:
        request = request_class(params)
        backend = open_backend(request.url, request.password, request.op_timeout, request.ca_file,
                               request.fence_epoch)
        try:
            return operation(backend, request)
        finally:
            backend.close()
    except MissingDriver as exc:
        # The module usually runs on the controller (pip), sometimes on a node (the OS package).
        pip_name = {"psycopg": '"psycopg[binary]"'}.get(exc.package, exc.package)
        raise LockFailed("%s (on the controller: python3 -m pip install %s; on a Debian or Ubuntu target: "
                         "apt install %s)" % (missing_required_lib(exc.package, reason="for the %s backend"
                                                                   % request.url.split("://")[0]),
                                              pip_name, exc.distro_package))
    except AuthError as exc:
        raise LockFailed("authentication to the lock backend %s failed: %s; check backend_password or "
                         "backend_password_file (dlock_backend.password / password_file)" % (url, exc))
    except BackendError as exc:
        raise LockFailed("lock backend %s is unreachable or failing: %s" % (url, exc))
    except ConfigError as exc:
        raise LockFailed(str(exc))


# -- words ------------------------------------------------------------------------------
def _duration(seconds):
    return format_duration(round(seconds, 1))


def describe(holder):
    """One line about a key's holder, for messages."""
    if holder.owner is None and holder.queued:
        return "%s is free, but %d waiter(s) came first (fence %d)" % (holder.key, holder.queued, holder.fence)
    if holder.owner is None:
        return "%s is free (fence %d)" % (holder.key, holder.fence)
    text = "%s is held by %s" % (holder.key, holder.owner)
    if holder.age is not None:
        text += " for %s" % _duration(holder.age)
    if holder.ttl_remaining is not None:
        text += ", ttl left %s" % _duration(holder.ttl_remaining)
    else:
        text += ", until its session ends"
    return text + ", fence %d" % holder.fence


def _diff_text(holder):
    lines = ["key: %s" % holder.key, "held: %s" % ("true" if holder.owner else "false")]
    if holder.owner:
        lines.append("owner: %s" % holder.owner)
    lines.append("fence: %d" % holder.fence)
    return "\n".join(lines) + "\n"


def _result(request, holder, changed, msg, diff, before=None, waited=0.0, **extra):
    """The fields every state returns, about `holder` (the key after the task)."""
    state = holder.as_dict()
    result = dict(
        changed=changed,
        msg=msg,
        owner=request.owner,
        acquired=holder.owner is not None and holder.owner == request.owner,
        fence=holder.fence,
        ttl_remaining=state["ttl_remaining"],
        holder=state,
        waited=round(waited, 3),
    )
    if diff and before is not None:
        result["diff"] = _diff(request, before, holder)
    result.update(extra)
    return result


def _diff(request, before, after):
    return dict(before=_diff_text(before), after=_diff_text(after),
                before_header="lock %s" % request.key, after_header="lock %s" % request.key)


def _needs_lease(backend, what):
    """Refuse backends whose lock ends with this task's connection or process."""
    if not backend.lease_survives_reconnect:
        raise ConfigError(
            "%s needs a lease that outlives this task, but the %s backend keeps its lock only as long as "
            "the connection or process that took it, which ends with the task; use redis:// or "
            "postgresql:// (lease table). query and force release work with every backend."
            % (what, backend.name))


# -- states -----------------------------------------------------------------------------
def query(backend, request, check_mode, diff):
    holder = backend.query(request.key)
    if not request.history:
        return _result(request, holder, False, describe(holder), diff=False)
    # The fleet-wide history (`dlock history`), newest first.
    return _result(request, holder, False, describe(holder), diff=False,
                   history=backend.read_history(request.key, request.history))


def acquire_waiting(backend, request, clock=None):
    """('granted' | 'renewed' | 'busy', last Grant, seconds waited). Our own lease
    (an earlier task of this run, or another host of it) is renewed, not waited for."""
    clock = clock or time.monotonic
    started = clock()
    while True:
        remaining = max(0.0, started + request.wait - clock())
        grant = wait_in_line(backend, request.key, request.owner, request.ttl, None, remaining, clock)[0]
        if grant.granted:
            return "granted", grant, clock() - started
        if grant.holder is not None and grant.holder.owner == request.owner:
            if backend.renew(request.key, request.owner, request.ttl):
                return "renewed", grant, clock() - started
            continue  # it expired in between: ask again
        return "busy", grant, clock() - started


def acquire(backend, request, check_mode, diff):
    _needs_lease(backend, "state=acquired")
    before = backend.query(request.key)
    if check_mode:
        return _would_acquire(request, before, diff)
    outcome, grant, waited = acquire_waiting(backend, request)
    if outcome == "busy":
        waited_text = " after waiting %s" % _duration(waited) if request.wait else ""
        msg = "%s; not acquired%s" % (describe(grant.holder), waited_text)
        raise LockFailed(msg, _result(request, grant.holder, False, msg, diff=False, waited=waited))
    after = backend.query(request.key)
    if outcome == "granted":
        msg = "acquired %s (fence %d, ttl %s)" % (request.key, after.fence, _duration(request.ttl))
    else:
        msg = "%s was already held by this owner; ttl renewed to %s" % (request.key, _duration(request.ttl))
    return _result(request, after, outcome == "granted", msg, diff, before=before, waited=waited)


def _would_acquire(request, before, diff):
    """Check mode: the result reports the key as it is; the diff shows what would be."""
    if before.owner == request.owner:
        msg = "%s is already held by this owner; would renew its ttl to %s" % (request.key, _duration(request.ttl))
        return _result(request, before, False, msg, diff=False)
    if before.owner is not None and not request.wait:
        return _result(request, before, False, "would fail (wait: 0): %s" % describe(before), diff=False)
    if before.owner is None:
        msg = "would acquire %s" % request.key
    else:
        msg = "would wait up to %s for %s: %s" % (_duration(request.wait), request.key, describe(before))
    result = _result(request, before, True, msg, diff=False)
    if diff:
        ours = LockView(request.key, owner=request.owner, fence=before.fence + 1)
        result["diff"] = _diff(request, before, ours)
    return result


def release(backend, request, check_mode, diff):
    before = backend.query(request.key)
    if request.force:
        return _force_release(backend, request, before, check_mode, diff)
    _needs_lease(backend, "state=released without force")
    if before.owner is None:
        return _result(request, before, False, "%s is not held" % request.key, diff=False)
    if before.owner != request.owner:
        msg = ("%s: held by another owner, not released (this owner is %s); to break it, use "
               "force=true with a reason" % (describe(before), request.owner))
        raise LockFailed(msg, _result(request, before, False, msg, diff=False))
    free = LockView(request.key, fence=before.fence)
    if check_mode:
        return _result(request, free, True, "would release %s" % request.key, diff, before=before)
    if not backend.release(request.key, request.owner):
        after = backend.query(request.key)
        return _result(request, after, False, "%s expired before it could be released" % request.key, diff=False)
    after = backend.query(request.key)
    msg = "released %s (fence %d, held for %s)" % (request.key, before.fence, _duration(before.age or 0))
    return _result(request, after, True, msg, diff, before=before)


def _force_release(backend, request, before, check_mode, diff):
    if check_mode:
        if before.owner is None:
            return _result(request, before, False, "%s is not held; nothing to break" % request.key, diff=False)
        msg = "would break the lock: %s (reason: %s)" % (describe(before), request.reason)
        return _result(request, LockView(request.key, fence=before.fence), True, msg, diff, before=before,
                       previous_holder=before.as_dict(), reason=request.reason)
    broken = backend.force_release(request.key)
    after = backend.query(request.key)
    if broken.owner is None:
        return _result(request, after, False, "%s is not held; nothing to break" % request.key, diff=False,
                       previous_holder=broken.as_dict(), reason=request.reason)
    msg = "broke the lock of %s held by %s (fence %d%s); reason: %s" % (
        request.key, broken.owner, broken.fence,
        ", held for %s" % _duration(broken.age) if broken.age is not None else "", request.reason)
    return _result(request, after, True, msg, diff, before=broken, previous_holder=broken.as_dict(),
                   reason=request.reason)


OPERATIONS = {"query": query, "acquired": acquire, "released": release}
