# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""The renewer behind hold=true of dlock.fleet.dlock, on the controller: a
process that keeps the lease of one key for the rest of the ansible-playbook
run (plugins/module_utils/dlock/hold.py), started, found and stopped here.

Its files live in ansible-playbook's local temp dir (C.DEFAULT_LOCAL_TMP,
ansible-local-PID...), which it removes when it exits normally: per held key
a lock file, the renewer's state and its log.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

from ansible_collections.dlock.fleet.plugins.module_utils import dlock as engine
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.hold import process_start
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.validate import duration as parse_duration
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_task import LockFailed
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_task import run as run_lock

RENEWER_START_SECONDS = 30.0


def is_renewer(pid):
    """Whether PID is a live renewer (not another process that got its pid)."""
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
        if state and state.get("status") in ("starting", "holding") and is_renewer(state["pid"]):
            return state
        return None

    def lost(self):
        """Why an earlier hold of this run ended without a release, if it did (told once)."""
        state = self.state()
        if state and state.get("status") in ("lost", "expiring"):
            os.unlink(self.state_file)
            return state.get("error") or state["status"]
        return None

    def spawn(self, settings, timeout=RENEWER_START_SECONDS):
        """Start the renewer before the lock is taken and wait until it is
        connected (hold.py says why); settings go on its stdin (they hold the
        password). Returns (the renewer, None), or (None, why it is not ready)."""
        module_utils = os.path.dirname(os.path.dirname(os.path.abspath(engine.__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([module_utils] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        with open(self.log_file, "ab") as log:
            # Own session: a Ctrl-C of ansible-playbook's terminal must not reach it.
            # Unbuffered: its answers are read a line at a time after select().
            proc = subprocess.Popen([sys.executable, "-m", "dlock.hold", self.key], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=log, env=env, cwd="/", bufsize=0,
                                    start_new_session=True, close_fds=True)
        self._tell(proc, json.dumps(settings).encode("utf-8") + b"\n")
        answer = self._answer(proc, timeout)
        if "ready" not in answer:
            self._end(proc)
            return None, answer.get("error", answer)
        return proc, None

    def abandon(self, proc):
        """The lock was not taken: the spawned renewer exits without touching it."""
        self._end(proc, gently=True)

    def start(self, proc, timeout=RENEWER_START_SECONDS):
        """The lock is ours: the spawned renewer renews it once and answers."""
        self._tell(proc, b"go\n", last=True)
        answer = self._answer(proc, timeout)
        proc.stdout.close()
        if "ok" not in answer:
            self._end(proc)
            raise LockFailed("hold: the renewer did not start: %s; the lease expires within its ttl"
                             % answer.get("error", answer))
        return proc.pid

    @staticmethod
    def _tell(proc, line, last=False):
        """A line to the renewer (the last closes its stdin); one that died
        already answers nothing, which _answer says."""
        try:
            proc.stdin.write(line)
            if last:
                proc.stdin.close()
        except OSError:
            pass

    def _answer(self, proc, timeout):
        ready = select.select([proc.stdout], [], [], timeout)[0]
        line = proc.stdout.readline() if ready else b""
        try:
            return json.loads(line.decode("utf-8"))
        except ValueError:
            return {"error": "no answer within %ds (see %s)" % (timeout, self.log_file)}

    @staticmethod
    def _end(proc, gently=False):
        """Close the renewer's pipes and reap it: let it leave (gently, it
        exits on stdin's end), else kill it."""
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        if gently:
            try:
                proc.wait(RENEWER_START_SECONDS)
                return
            except subprocess.TimeoutExpired:
                pass
        proc.kill()
        proc.wait()

    def stop(self, timeout):
        """Stop a running renewer without releasing; True if there was one."""
        state = self.running()
        if state is None:
            return False
        pid = state["pid"]
        os.kill(pid, signal.SIGTERM)
        give_up = time.monotonic() + timeout
        while is_renewer(pid):
            if time.monotonic() > give_up:
                os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.05)
        return True


def run_with_hold(params, check_mode, diff, run_dir):
    """Acquire or release params' key on the controller, with this run's
    renewer of it: a release stops the renewer first (without releasing),
    an acquire with hold=true starts one. Warns once of an earlier hold of
    the run that ended without a release."""
    hold = RunHold(run_dir, params["key"])
    with hold.locked():
        lost = hold.lost()
        if params["state"] == "released":
            if not check_mode:
                hold.stop(parse_duration(params["op_timeout"], "op_timeout") + 3.0)
            result = run_lock(params, check_mode, diff)
        elif params["hold"] and not check_mode and hold.running() is None:
            renewer, not_ready = hold.spawn(_renewer_settings(params, hold, run_dir))
            if not_ready:
                # The task's own words when the backend refuses this
                # controller (unreachable, a bad password), as without hold.
                run_lock(params, True, diff)
                raise LockFailed("hold: the renewer did not start: %s; the lock was not taken" % not_ready)
            try:
                result = run_lock(params, check_mode, diff)
            except BaseException:
                hold.abandon(renewer)
                raise
            hold.start(renewer)
            result["changed"] = True
            result["msg"] += "; held for the rest of the run"
        else:
            result = run_lock(params, check_mode, diff)
            if params["hold"] and check_mode and hold.running() is None:
                result["msg"] += "; would hold it for the rest of the run"
    if lost:
        result.setdefault("warnings", []).append("the hold of %s ended before this task: %s" % (params["key"], lost))
    return result


def _renewer_settings(params, hold, run_dir):
    return dict(
        url=params["backend_url"], password=params["backend_password"], ca_file=params["ca_file"],
        op_timeout=parse_duration(params["op_timeout"], "op_timeout"), key=params["key"],
        owner=params["owner"], ttl=parse_duration(params["ttl"], "ttl"), pid=os.getppid(),
        run_dir=run_dir, state_file=hold.state_file)
