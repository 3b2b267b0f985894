# -*- coding: utf-8 -*-
# Copyright: dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""The pause operation of dlock.fleet.dlock_pause: a pause of a job's lock,
of a group's jobs or of every lock, made to match the task (state paused or
resumed), with check mode and diff. The backend keeps the pause and refuses
the grants itself (dlock/backends/base.py, Backend.pause): this is
`dlock pause` and `dlock resume` as a task. The action plugin resolves a job
and a group through the host's dlock_jobs_list (drain_keys, check_group);
the module on a target takes them as given.
"""

from __future__ import annotations

import datetime
import time

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import (
    ALL_SCOPE, Pause, group_scope, job_scope, log_pause, pause_path, scope_parts)
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.owner import operator
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.slots import BOUNDARY_FORMAT
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_args import backend_argument_spec
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_task import BackendRequest, with_backend

# How far an existing pause's end may be from the one asked for and still be
# the same pause: etcd grants whole-second leases and reads its clock from a
# Date header (whole seconds), so a pause asked for twice may end 1.5 s apart.
SAME_END = 2.0


def argument_spec():
    return dict(
        backend_argument_spec(),
        job=dict(type="str"),
        key=dict(type="str", no_log=False),
        group=dict(type="str"),
        all=dict(type="bool", default=False),
        state=dict(type="str", default="paused", choices=["paused", "resumed"]),
        reason=dict(type="str"),
        # raw: YAML reads an unquoted 2026-11-27T05:00:00Z as a timestamp (PauseRequest._until)
        until=dict(type="raw"),
        drain=dict(type="str", default="wait", choices=["wait", "kill"]),
        drain_keys=dict(type="list", elements="str", no_log=False),
        mirror=dict(type="bool", default=True),
        pauses_dir=dict(type="path"),
    )


class PauseRequest(BackendRequest):
    """The task's parameters, checked and converted (ConfigError when wrong).
    `job` comes here as its lock key (the action plugin looks it up)."""

    def __init__(self, params, read_files=True):
        BackendRequest.__init__(self, params, read_files)
        self.state = params["state"]
        named = [name for name in ("job", "key", "group") if params.get(name) is not None]
        named += ["all"] if params.get("all") else []
        if len(named) != 1:
            raise ConfigError("name what to %s: one of job, key, group or all=true (%s)"
                              % ("pause" if self.state == "paused" else "resume",
                                 "given: " + ", ".join(named) if named else "none given"))
        if params.get("all"):
            self.scope = ALL_SCOPE
        elif params.get("group") is not None:
            self.scope = group_scope(validate.group_name(params["group"], "group"))
        else:
            field = named[0]
            self.scope = job_scope(validate.lock_key(params[field], field))
        self.drain = params.get("drain") or "wait"
        self.drain_keys = validate.items(params.get("drain_keys") or [], "drain_keys", validate.lock_key,
                                         max_items=10000)
        if self.state == "resumed":
            if params.get("until") is not None or self.drain != "wait":
                raise ConfigError("until and drain: only apply to state=paused")
            self.reason = None if params.get("reason") is None else validate.reason(params["reason"], "reason")
            self.until = None
            return
        if params.get("reason") is None or params.get("until") is None:
            raise ConfigError("state=paused needs reason (why; every run it refuses logs it) and until (a "
                              "duration such as 2h, at most 30d, or a UTC moment such as 2026-11-27T05:00:00Z)")
        self.reason = validate.reason(params["reason"], "reason")
        self.until = _until(params["until"])
        if self.drain == "kill" and scope_parts(self.scope)[0] == "job":
            self.drain_keys = [scope_parts(self.scope)[1]]


def _until(value):
    """`until` as --until takes it: a duration or a UTC moment, as text. An
    unquoted moment in YAML (2026-11-27T05:00:00Z) arrives as a datetime:
    it is that moment when it says UTC, and is refused otherwise (a moment
    without a zone would be read in the controller's)."""
    if isinstance(value, datetime.datetime):
        offset = value.utcoffset()
        if offset is None or offset.total_seconds() != 0:
            raise ConfigError("until: %s is not a UTC moment; write it as 2026-11-27T05:00:00Z"
                              % validate.shown(str(value)))
        return value.strftime(BOUNDARY_FORMAT)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError("until: %s must be a duration (2h) or a UTC moment (2026-11-27T05:00:00Z)"
                          % validate.shown(value))
    return validate.text(value if isinstance(value, str) else repr(value), "until", 64)


def check_params(params):
    """Every parameter that needs no file: the action plugin calls it before it uses any."""
    PauseRequest(params, read_files=False)


def run(params, check_mode=False, diff=False):
    """The result dict of the task; raises dlock_task.LockFailed."""
    return with_backend(params, PauseRequest, lambda backend, request: _run(backend, request, check_mode, diff))


def _run(backend, request, check_mode, diff):
    before = _live(backend, request.scope)
    if request.state == "resumed":
        changed = before is not None
        unlogged = None
        if changed and not check_mode:
            backend.resume(request.scope)
            unlogged = log_pause(backend, request.scope)
        msg = ("resumed %s (paused by %s: %s)" % (request.scope, before.by, before.reason) if changed
               else "%s was not paused" % request.scope)
        return _result(request, before, None, changed, check_mode, diff, msg, unlogged=unlogged)
    now = backend.server_time()
    seconds = validate.pause_length(request.until, "until", now)
    wanted_end = now + seconds
    same = (before is not None and before.reason == request.reason and before.until is not None
            and abs(before.until - wanted_end) <= SAME_END)
    after, drained, unlogged = before, [], None
    if not same:
        if check_mode:
            after = _Shown(request.scope, request.reason, wanted_end, operator(), now)
        else:
            after = backend.pause(request.scope, request.reason, seconds, operator())
            unlogged = log_pause(backend, request.scope, after)
    if request.drain == "kill" and request.drain_keys:
        drained = _drain(backend, request.drain_keys, check_mode)
    msg = "%s %s until %s: %s" % ("already paused" if same else "would pause" if check_mode else "paused",
                                  request.scope, _utc(after.until), request.reason)
    if drained:
        msg += "; %s %d run(s) going on: %s" % (
            "would drain" if check_mode else "drained", len(drained), ", ".join(row["key"] for row in drained))
    return _result(request, before, after, not same or bool(drained), check_mode, diff, msg, drained=drained,
                   unlogged=unlogged)


def mirror_entry(pauses_dir, scope, paused):
    """The dlock.fleet.dlock_files entry of the node's mirror of the pause of
    `scope` (pause_files.py) after the task: the backend's record of
    `paused` (the result's `paused`), or, none, no file."""
    path = pause_path(validate.path(pauses_dir, "pauses_dir"), scope)
    if paused is None:
        return {"path": path, "state": "absent"}
    record = Pause(scope, paused["reason"], paused["until"], paused["by"], paused["at"]).as_record()
    return {"path": path, "content": record + "\n", "mode": "0644"}


def _live(backend, scope):
    pauses = backend.read_pauses([scope])
    return pauses[0] if pauses else None


def _drain(backend, keys, check_mode):
    """drain=kill: the runs going on under KEYS, their locks broken (not in
    check mode; Backend.drain): each runner kills its job at its next
    renewal. A lock that cannot be broken fails the task once every other
    one is, naming it."""
    drained, failed = backend.drain(keys, dry_run=check_mode)
    if failed:
        raise ConfigError("; ".join("%s is paused, but its run going on was not drained: %s" % (key, why)
                                    for key, why in failed))
    return [{"key": key, "previous_owner": view.owner, "fence": view.fence} for key, view in drained]


class _Shown(object):
    """The pause check mode says would be made (a Pause's fields)."""

    def __init__(self, scope, reason, until, by, at):
        self.scope, self.reason, self.until, self.by, self.at = scope, reason, until, by, at


def _utc(seconds):
    return time.strftime(BOUNDARY_FORMAT, time.gmtime(seconds)) if seconds is not None else "?"


def _shown(pause):
    if pause is None:
        return None
    return {"scope": pause.scope, "reason": pause.reason, "until": pause.until, "until_utc": _utc(pause.until),
            "by": pause.by, "at": pause.at}


def _diff_text(pause):
    if pause is None:
        return "not paused\n"
    return "paused until %s\nreason: %s\nby: %s\n" % (_utc(pause.until), pause.reason, pause.by)


def _result(request, before, after, changed, check_mode, diff, msg, drained=(), unlogged=None):
    result = {"changed": changed, "scope": request.scope, "paused": _shown(after), "previous": _shown(before),
              "drained": list(drained), "msg": msg}
    if unlogged:
        # The pause stands; only a run after a whole-fleet outage could mistake its slots (history.py).
        result["warnings"] = ["the backend's pause log was not written (%s): a run that finds the whole fleet was "
                              "down during this pause may count its slots missed, or catch them up" % unlogged]
    if diff:
        result["diff"] = {"before": _diff_text(before), "after": _diff_text(after),
                          "before_header": request.scope, "after_header": request.scope}
    return result
