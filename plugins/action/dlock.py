# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""Controller side of dlock.fleet.dlock.

Fills backend options from the inventory variable dlock_backend, or, when
neither the task nor that variable names a backend, from the record that
playbooks/site.yml writes of the backend it provisioned (backend_record);
gives every task of one ansible-playbook run the same owner token, runs the lock
operation in the controller's Python (or the module on the target with
run_on=target), and for hold=true starts a renewer process that keeps the
lease for the rest of the run (plugins/module_utils/dlock/hold.py).

Per-run files live in ansible-playbook's local temp dir (C.DEFAULT_LOCAL_TMP,
ansible-local-PID...), which it removes when it exits normally: the owner
token, and per held key a lock file, the renewer's state and its log.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from contextlib import contextmanager

from ansible import constants as C
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.parameters import remove_values
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.dlock.fleet.plugins.module_utils import dlock as engine
from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.config import read_secret
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.safefile import read_regular
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.validate import duration as parse_duration
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.hold import process_start
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_args import (
    BACKEND_FIELDS, BACKEND_VAR, MUTUALLY_EXCLUSIVE, REQUIRED_IF, argument_spec)
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_task import LockFailed, check_params
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_task import run as run_lock

display = Display()

MODULE = "dlock.fleet.dlock"
RENEWER_START_SECONDS = 30.0


def merge_backend(args, backend, where=BACKEND_VAR):
    """Task args completed from the dlock_backend variable (a mapping, or a
    URL), or from site.yml's record (WHERE names it in errors)."""
    if backend is None:
        return dict(args)
    if isinstance(backend, str):
        backend = {"url": backend}
    if not isinstance(backend, Mapping):
        raise ConfigError("%s: must be a mapping (url, password, password_file, ca_file, op_timeout, fence_epoch) "
                          "or a URL"
                          % where)
    # Shown as the validation core shows any value: a key that is no string,
    # or holds a line break, is named, never sorted against str or echoed raw.
    unknown = sorted(validate.shown(key) for key in backend if key not in BACKEND_FIELDS)
    if unknown:
        raise ConfigError("%s: unknown key(s) %s (allowed: %s)"
                          % (where, ", ".join(unknown), ", ".join(sorted(BACKEND_FIELDS))))
    merged = dict(args)
    # A password or password file on the task replaces both of the inventory's.
    own_credentials = args.get("backend_password") is not None or args.get("backend_password_file") is not None
    for field, option in BACKEND_FIELDS.items():
        if own_credentials and field in ("password", "password_file"):
            continue
        if merged.get(option) is None and backend.get(field) is not None:
            merged[option] = backend[field]
    return merged


# site.yml's record of the backend it provisioned (dlock_backend_type): the
# file, in the credentials directory beside the inventory of the first host
# of dlock_backend, where site.yml also generates the backend's password by
# default; and the fields it may hold (never a password).
RECORD_DIR = "credentials"
RECORD_NAME = "dlock-backend.json"
RECORD_FIELDS = ("url", "password_file", "ca_file", "fence_epoch")
RECORD_MAX_BYTES = 64 * 1024


def record_path(task_vars):
    """(path of site.yml's backend record, None), or (None, why there is
    none): the one rule for where the controller looks; site.yml writes its
    record at the same place (its __dlock_site_credentials)."""
    backend_hosts = (task_vars.get("groups") or {}).get("dlock_backend") or []
    if not backend_hosts:
        return None, "the inventory has no dlock_backend group, beside whose first host site.yml records its backend"
    try:
        inventory_dir = task_vars["hostvars"][backend_hosts[0]]["inventory_dir"]
    except (KeyError, TypeError):
        inventory_dir = None
    if not isinstance(inventory_dir, str) or not os.path.isabs(inventory_dir):
        return None, "%s, the first host of dlock_backend, comes from no inventory file" % backend_hosts[0]
    return os.path.join(inventory_dir, RECORD_DIR, RECORD_NAME), None


def backend_record(path):
    """The backend options in site.yml's record at PATH (url, and
    password_file, ca_file and fence_epoch when it has them), checked by the validation
    core; None when there is no file. A bad record is a ConfigError naming
    the file, never a traceback."""
    what = "site.yml's backend record"
    try:
        text = read_regular(path, what, RECORD_MAX_BYTES)
    except FileNotFoundError:
        return None
    where = "%s %s" % (what, path)
    try:
        data = validate.parse_json(text)
    except ValueError as exc:
        raise ConfigError("%s: not valid JSON (%s)" % (where, exc))
    if not isinstance(data, dict):
        raise ConfigError("%s: must hold a JSON object (url, password_file, ca_file, fence_epoch)" % where)
    unknown = sorted(set(data) - set(RECORD_FIELDS))
    if unknown:
        raise ConfigError("%s: unknown field %s (allowed: %s)"
                          % (where, ", ".join(validate.shown(key) for key in unknown), ", ".join(RECORD_FIELDS)))
    if "url" not in data:
        raise ConfigError("%s: has no url" % where)
    record = {"url": validate.backend_url(data["url"], "%s: url" % where).url}
    for field in ("password_file", "ca_file"):
        if data.get(field) is not None:
            record[field] = validate.path(data[field], "%s: %s" % (where, field))
    # The fleet's epoch (dlock_fence_epoch), so that the controller's fences
    # are the nodes' fences.
    if data.get("fence_epoch") is not None:
        record["fence_epoch"] = validate.fence_epoch(data["fence_epoch"], "%s: fence_epoch" % where)
    return record


def backend_from_record(args, task_vars):
    """ARGS completed from site.yml's record, when neither the task nor
    dlock_backend named a backend; a ConfigError that says where the
    controller looked and what to set when there is no record."""
    path, why_none = record_path(task_vars)
    record = backend_record(path) if path else None
    if record is None:
        raise ConfigError(
            "backend_url: required, and none was found: not on the task, not in the inventory variable %s, "
            "and %s. Set %s (url: redis://..., postgresql://..., etcd://...; password_file or a vaulted password) "
            "in the inventory, or roll out playbooks/site.yml with dlock_backend_type, which records the backend "
            "it provisions there." % (BACKEND_VAR, why_none or "no record of site.yml's backend at %s" % path, BACKEND_VAR))
    where = "site.yml's backend record %s" % path
    merged = merge_backend(args, record, where)
    if merged.get("backend_password") is None and merged.get("backend_password_file") is None:
        # site.yml writes a password given as a variable nowhere.
        raise ConfigError(
            "%s: names no password file: site.yml was given the backend password as the variable "
            "dlock_backend_password, which it writes nowhere. Give the controller's tasks that password as "
            "dlock_backend.password (in group_vars/all: the same vaulted value) or backend_password on the task."
            % where)
    if record.get("ca_file") and merged.get("ca_file") == record["ca_file"] and not os.path.isfile(record["ca_file"]):
        raise ConfigError(
            "%s: ca_file %s: is not a file on the controller. site.yml records dlock_backend_controller_ca_file, "
            "else dlock_backend_ca_file (the nodes' path): set dlock_backend_controller_ca_file to the CA's path on "
            "the controller and roll out site.yml again, or set dlock_backend.ca_file." % (where, record["ca_file"]))
    display.vvv("dlock: the backend of %s" % where)
    return merged


def run_owner(run_dir):
    """The owner token of this ansible-playbook run, made by its first dlock task."""
    path = os.path.join(run_dir, "dlock-owner")
    if not os.path.exists(path):
        # Workers are forked by ansible-playbook: the parent pid is the run's.
        token = "ansible@%s:%d:%s" % (socket.gethostname(), os.getppid(), secrets.token_hex(12))
        tmp = "%s.%d" % (path, os.getpid())
        with open(tmp, "w") as handle:
            handle.write(token)
        try:
            os.link(tmp, path)  # atomic: the first of concurrent workers wins
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    with open(path) as handle:
        return handle.read()


def _is_renewer(pid):
    if process_start(pid) is None:  # gone, or a zombie
        return False
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return b"dlock.hold" in handle.read()
    except (IOError, OSError):
        return not os.path.isdir("/proc/self")  # no /proc: existence is all we can check


class RunHold(object):
    """The renewer of one key for this playbook run, and its files in the run dir."""

    def __init__(self, run_dir, key):
        base = os.path.join(run_dir, "dlock-hold-%s" % key)
        self.key = key
        self.state_file = base + ".json"
        self.lock_file = base + ".lock"
        self.log_file = base + ".log"

    @contextmanager
    def locked(self):
        """Serialise this run's tasks on the key (several hosts without run_once)."""
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def state(self):
        try:
            with open(self.state_file) as handle:
                return json.load(handle)
        except (IOError, OSError, ValueError):
            return None

    def running(self):
        state = self.state()
        if state and state.get("status") in ("starting", "holding") and _is_renewer(state["pid"]):
            return state
        return None

    def lost(self):
        """Why an earlier hold of this run ended without a release, if it did (told once)."""
        state = self.state()
        if state and state.get("status") in ("lost", "expiring"):
            os.unlink(self.state_file)
            return state.get("error") or state["status"]
        return None

    def start(self, settings, timeout=RENEWER_START_SECONDS):
        """Start the renewer; settings go on its stdin (they hold the password)."""
        module_utils = os.path.dirname(os.path.dirname(os.path.abspath(engine.__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([module_utils] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        with open(self.log_file, "ab") as log:
            # Own session: a Ctrl-C of ansible-playbook's terminal must not reach it.
            proc = subprocess.Popen([sys.executable, "-m", "dlock.hold", self.key], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=log, env=env, cwd="/",
                                    start_new_session=True, close_fds=True)
        proc.stdin.write(json.dumps(settings).encode("utf-8"))
        proc.stdin.close()
        ready = select.select([proc.stdout], [], [], timeout)[0]
        line = proc.stdout.readline() if ready else b""
        proc.stdout.close()
        try:
            answer = json.loads(line.decode("utf-8"))
        except ValueError:
            answer = {"error": "no answer within %ds (see %s)" % (timeout, self.log_file)}
        if "error" in answer:
            proc.kill()
            proc.wait()
            raise LockFailed("hold: the renewer did not start: %s; the lease expires within its ttl"
                             % answer["error"])
        return proc.pid

    def stop(self, timeout):
        """Stop a running renewer without releasing; True if there was one."""
        state = self.running()
        if state is None:
            return False
        pid = state["pid"]
        os.kill(pid, signal.SIGTERM)
        give_up = time.monotonic() + timeout
        while _is_renewer(pid):
            if time.monotonic() > give_up:
                os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.05)
        return True


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        hidden = set()
        try:
            args = merge_backend(self._task.args, self._templar.template(task_vars.get(BACKEND_VAR)))
            # The record names files on the controller: a task run on a target names its own backend.
            if not args.get("backend_url") and args.get("run_on", "controller") != "target":
                args = backend_from_record(args, task_vars)
            if args.get("backend_password"):
                hidden.add(args["backend_password"])
            validation = ArgumentSpecValidator(argument_spec(), mutually_exclusive=MUTUALLY_EXCLUSIVE,
                                               required_if=REQUIRED_IF).validate(args)
            if validation.error_messages:
                raise ConfigError("; ".join(validation.error_messages))
            params = validation.validated_parameters
            params["owner"] = params["owner"] or run_owner(C.DEFAULT_LOCAL_TMP)
            # Before any value is used, shown (-vvv) or sent to a target.
            check_params(params)
            if params["run_on"] == "target":
                result.update(self._on_target(args, params, task_vars))
            else:
                result.update(self._on_controller(params, hidden))
        except LockFailed as exc:
            result.update(exc.result, failed=True, msg=exc.msg)
        except ConfigError as exc:
            result.update(failed=True, msg=str(exc))
        return remove_values(result, hidden)

    def _on_target(self, args, params, task_vars):
        if params["hold"]:
            raise ConfigError("hold: runs on the controller only (the renewer lives there); not with run_on=target")
        display.vvv("dlock: %s on %s from the target as %s" % (params["key"], params["backend_url"], params["owner"]))
        return self._execute_module(module_name=MODULE, module_args=dict(args, owner=params["owner"]),
                                    task_vars=task_vars)

    def _on_controller(self, params, hidden):
        check_mode, diff = bool(self._task.check_mode), bool(self._task.diff)
        if params["backend_password_file"]:
            # Read here, so the renewer gets it on stdin and results can be scrubbed of it.
            params["backend_password"] = read_secret(params["backend_password_file"], "backend_password_file")
            params["backend_password_file"] = None
            hidden.add(params["backend_password"])
        display.vvv("dlock: %s on %s from the controller as %s"
                    % (params["key"], params["backend_url"], params["owner"]))
        if params["state"] == "query":
            return run_lock(params, check_mode, diff)
        if params["hold"] and 3 * parse_duration(params["op_timeout"], "op_timeout") > parse_duration(params["ttl"], "ttl"):
            raise ConfigError("hold: op_timeout must be at most ttl/3, the renewal interval")
        hold = RunHold(C.DEFAULT_LOCAL_TMP, params["key"])
        with hold.locked():
            lost = hold.lost()
            if params["state"] == "released":
                if not check_mode:
                    hold.stop(parse_duration(params["op_timeout"], "op_timeout") + 3.0)
                result = run_lock(params, check_mode, diff)
            else:
                result = run_lock(params, check_mode, diff)
                if params["hold"]:
                    self._hold(hold, params, result, check_mode)
        if lost:
            result.setdefault("warnings", []).append("the hold of %s ended before this task: %s" % (params["key"], lost))
        return result

    def _hold(self, hold, params, result, check_mode):
        if hold.running() is not None:
            return
        if check_mode:
            result["msg"] += "; would hold it for the rest of the run"
            return
        hold.start(dict(
            url=params["backend_url"], password=params["backend_password"], ca_file=params["ca_file"],
            op_timeout=parse_duration(params["op_timeout"], "op_timeout"), key=params["key"],
            owner=params["owner"], ttl=parse_duration(params["ttl"], "ttl"), pid=os.getppid(),
            run_dir=C.DEFAULT_LOCAL_TMP, state_file=hold.state_file))
        result["changed"] = True
        result["msg"] += "; held for the rest of the run"
