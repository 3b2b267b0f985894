"""Keep a lease while another process lives: the renewer behind `hold` of the
Ansible module, started on the controller for one key of one playbook run.

    python3 -m dlock.hold KEY  < settings as one JSON line, then "go"

Settings (stdin, so the password is on no command line or environment):
url, password, ca_file, op_timeout, key, owner, ttl, pid (ansible-playbook),
run_dir (its local temp dir), state_file.

The caller starts the renewer before it takes the lock, so that Python's
start, the driver's import and the connection are paid before the lease's
ttl starts to run (a loaded controller once took longer than a 3 s ttl):
1. the renewer reads the settings, connects and queries the key (the
   connection is made on first use), then answers one line on stdout:
   {"ready": true}, else {"error": "..."};
2. the caller takes the lock and writes "go" (or closes stdin without it:
   the lock was not taken, and the renewer exits having touched nothing);
3. after "go", one more line: {"ok": true} once a first renewal worked and
   the state file names this renewer, else {"error": "..."}.

The lease is renewed every ttl/3 (the runner's Heartbeat) until one of:
- run_dir is removed: ansible-playbook removes it from an atexit handler, so
  the run ended normally (success, failure, Ctrl-C): release the lease.
- pid is gone and run_dir is still there: ansible-playbook was killed
  (SIGKILL, SIGTERM) or crashed, and tasks it started may still be running:
  stop renewing and let the lease expire within ttl.
- SIGTERM: stop renewing and leave the lease (the caller releases it).
- the lease is lost (broken, or not renewed before it could expire).
The outcome goes to state_file (JSON, no secrets) for the action plugin.
"""

import json
import os
import select
import signal
import sys
import time

from .backends import open_backend
from .boottime import now
from .deadline import LeaseDeadline
from .errors import DlockError
from .heartbeat import Heartbeat
from .options import clock_margin

POLL_SECONDS = 0.25


class _Timing(object):
    """The options Heartbeat reads."""

    def __init__(self, ttl, op_timeout):
        self.ttl = ttl
        self.renew_every = ttl / 3.0
        self.op_timeout = op_timeout


def process_start(pid):
    """Start time of pid (clock ticks since boot, from /proc), None when it is gone
    or a zombie; True where /proc is missing and pid exists (no reuse check then)."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (IOError, OSError):
        if os.path.isdir("/proc/self"):
            return None
        try:
            os.kill(pid, 0)
        except OSError:
            return None
        return True
    # fields[0] is the state, fields[19] the start time (fields 3 and 22 of stat(5)).
    return None if fields[0] in ("Z", "X") else fields[19]


def write_state(path, state):
    tmp = "%s.%d.tmp" % (path, os.getpid())
    try:
        with open(tmp, "w") as handle:
            json.dump(state, handle, sort_keys=True)
        os.rename(tmp, path)
    except (IOError, OSError):
        pass  # the run dir is gone: nobody is left to read it


class Renewer(object):
    def __init__(self, settings, backend):
        self.settings = settings
        self.backend = backend
        self.key = settings["key"]
        self.owner = settings["owner"]
        self.timing = _Timing(float(settings["ttl"]), float(settings["op_timeout"]))
        self.state = {"pid": os.getpid(), "key": self.key, "owner": self.owner, "status": "starting",
                      "error": None, "renewals": 0, "updated": time.time()}
        self.wake_r, self.wake_w = os.pipe()
        self.terminated = False

    def save(self, **fields):
        self.state.update(fields, updated=time.time())
        write_state(self.settings["state_file"], self.state)

    def start(self):
        """First renewal: the lease must still be ours. Returns the deadline.
        Tried twice: the connection made before the lock was taken may have
        been dropped while the caller waited for the lock (the failed request
        drops it here too, and the second opens a new one)."""
        for attempt in (1, 2):
            sent = now()
            try:
                renewed = self.backend.renew(self.key, self.owner, self.timing.ttl)
                break
            except DlockError:
                if attempt == 2:
                    raise
        if not renewed:
            raise DlockError("%s is no longer held by %s" % (self.key, self.owner))
        return LeaseDeadline(self.timing.ttl, clock_margin(self.timing.ttl), 0.0, sent)

    def _on_sigterm(self, _signum, _frame):
        self.terminated = True
        os.write(self.wake_w, b"x")

    def hold(self, deadline):
        """Renew until the run ends; returns the outcome recorded in the state file."""
        signal.signal(signal.SIGTERM, self._on_sigterm)
        watched, started = self.settings["pid"], process_start(self.settings["pid"])
        heartbeat = Heartbeat(self.backend, self.key, self.owner, self.timing, deadline, self.wake_w)
        heartbeat.start()
        self.save(status="holding")
        try:
            while True:
                readable = select.select([self.wake_r], [], [], POLL_SECONDS)[0]
                if readable:
                    os.read(self.wake_r, 64)
                if self.terminated:
                    return "stopped", None
                if heartbeat.lost:
                    return "lost", heartbeat.lost
                if now() >= deadline.kill_by:
                    return "lost", "not renewed before the lease could expire: %s" % heartbeat.last_error
                # The pid first: the run dir is removed before the process exits.
                alive = started is not None and process_start(watched) == started
                if not os.path.isdir(self.settings["run_dir"]):
                    return "released", None
                if not alive:
                    return "expiring", "ansible-playbook (pid %d) was killed; the lease expires within its ttl" % watched
                if heartbeat.renewals != self.state["renewals"]:
                    self.save(renewals=heartbeat.renewals)
        finally:
            heartbeat.stop()
            # An in-flight renewal must not land after the caller's release.
            heartbeat.join(self.timing.op_timeout + 1.0)

    def finish(self, outcome, error):
        if outcome == "released":
            try:
                if not self.backend.release(self.key, self.owner):
                    outcome, error = "lost", "the lease was no longer ours at the end of the run"
            except DlockError as exc:
                outcome, error = "expiring", "release failed (%s); the lease expires within its ttl" % exc
        self.save(status=outcome, error=error)


def _answer(stdout, answer):
    stdout.write(json.dumps(answer) + "\n")
    stdout.flush()


def main(stdin=None, stdout=None):
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    settings = json.loads(stdin.readline())
    backend = None
    try:
        backend = open_backend(settings["url"], settings.get("password"), float(settings["op_timeout"]),
                               settings.get("ca_file"))
        backend.query(settings["key"])  # connected, and allowed to read the key
    except DlockError as exc:
        _answer(stdout, {"error": str(exc)})
        if backend is not None:
            backend.close()
        return 1
    _answer(stdout, {"ready": True})
    go = stdin.readline().strip() == "go"
    stdin.close()
    if not go:  # the lock was not taken
        backend.close()
        return 0
    renewer = Renewer(settings, backend)
    try:
        deadline = renewer.start()
    except DlockError as exc:
        _answer(stdout, {"error": str(exc)})
        backend.close()
        return 1
    # Named in the state file before the answer: another task of this run on
    # the same key (several hosts, no run_once) finds it running, and starts
    # no second renewer.
    renewer.save(status="starting")
    _answer(stdout, {"ok": True})
    stdout.close()
    try:
        renewer.finish(*renewer.hold(deadline))
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
