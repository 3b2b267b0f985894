"""flock(2) on a file in one directory: mutual exclusion on one host only.

The kernel drops the lock when the last descriptor of its open file closes,
so there is no TTL: the runner holds one, and the job's guard a copy until
nothing of the job is left (guard_fds), so a runner's death frees the lock
only once its job is dead too.
Waiters keep no line here: they try the flock every POLL seconds (a local
system call), so among waiters the lock goes to whoever tries first after the
release, as it would among processes blocked in flock(2), not by arrival.
Beside the lock file, KEY.json (replaced atomically, under the lock) keeps the
fence, holder, min-hold deadline, last slot and last run, and the markers of
the slots claimed whose expiry has not passed (slots.py: the owner, or the
outcome): {"N": [marker, expiry]}.

A pause of scope S (base.pause_scopes) is the file S.pause (job:KEY.pause,
group:NAME.pause, all.pause; no lock's file ends so), its record (base.Pause) replaced
atomically, live until the `until` it names on this host's clock (an
unreadable one pauses until it is removed). _pause.lock orders pauses and
grants (no key starts with '_'): a grant holds its flock shared while it
reads the pauses and writes its state, a pause exclusive while it writes.
So a grant sees every pause written before it, and pause() returns only
once every grant that did not see it is done.

A key's history (base.history_record) is KEY.history, JSON lines, oldest
first, replaced atomically under _history.lock's flock with its newest
entries.

The directory may be shared by the jobs of several users, so what lies in it
is not trusted: a symbolic link or a FIFO at a lock or state file's name is
refused with a BackendError (never followed, never waited on), and the state
file is replaced with safefile.replace_file (no link planted at its temporary
name is written through).
"""

import contextlib
import errno
import fcntl
import json
import math
import os
import stat
import time

from ..errors import BackendError, ConfigError
from ..safefile import read_regular, replace_file
from ..slots import marker_owner, outcome_marker
from .base import (Backend, Grant, LockView, Pause, history_entry, history_keep, history_record, live_pause, pause_ms,
                   pause_path, rerun_refusal)

POLL = 0.01
MAX_FENCE = 2 ** 63 - 1
PAUSES = "_pause"  # the name of the lock file that orders pauses and grants
HISTORY = "_history"  # the name of the lock file that orders the writes of the histories
DIR_LOCK_WAIT = 2.0


def _number_or_none(value):
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))


def _int_or_none(value):
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def _markers_or_none(value):
    return value is None or (isinstance(value, dict) and all(
        isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
        and isinstance(entry[1], (int, float)) and not isinstance(entry[1], bool) and math.isfinite(entry[1])
        for entry in value.values()))


def _state(text):
    """The state KEY.json holds, or {} when it is not what dlock writes there
    (not JSON, torn, edited by hand into other types): as before any grant.
    The lock itself is the flock, not this file."""
    try:
        state = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(state, dict):
        return {}
    fence = state.get("fence", 0)
    sane = (isinstance(fence, int) and not isinstance(fence, bool) and 0 <= fence < MAX_FENCE
            and _number_or_none(state.get("acquired_at")) and _number_or_none(state.get("hold_until"))
            and _int_or_none(state.get("slot")) and isinstance(state.get("owner"), (str, type(None)))
            and _markers_or_none(state.get("markers"))
            and isinstance(state.get("last"), (dict, type(None))))
    return state if sane else {}


def _live_markers(state, now):
    """The markers of state whose expiry has not passed at `now`: {"N":
    [value, expiry]}, the lists state's own (changed in place)."""
    return dict((number, entry) for number, entry in (state.get("markers") or {}).items() if entry[1] > now)


def _marker(state, slot):
    """The live marker of slot in state, [value, expiry], or None."""
    return _live_markers(state, time.time()).get(str(slot.number))


class FileBackend(Backend):
    name = "file"
    lease_survives_reconnect = False

    def __init__(self, directory):
        self.directory = directory
        self._fds = {}  # key -> fd of the lock file we hold

    def _path(self, key, suffix):
        return os.path.join(self.directory, key + suffix)

    def _read(self, path, what):
        """The text of a state or pause file of the directory, None when there is none."""
        try:
            return read_regular(path, what, follow=False)
        except FileNotFoundError:
            return None
        except ConfigError as exc:  # a link, a FIFO, a directory, unreadable: the backend is not usable
            raise BackendError(str(exc))

    def _read_state(self, key):
        text = self._read(self._path(key, ".json"), "file: lock state")
        return {} if text is None else _state(text)

    def _pause_path(self, scope):
        return pause_path(self.directory, scope)

    def _read_pause(self, scope):
        """The live pause of scope, or None (none, or its until has passed;
        base.live_pause: a stray file cannot stop the jobs for good)."""
        path = self._pause_path(scope)
        return live_pause(path, scope, self._read(path, "file: pause"))

    def _pauses_locked(self, operation):
        """_pause.lock's flock (LOCK_SH: a grant, LOCK_EX: a pause) while the block runs."""
        return self._dir_locked(PAUSES, operation)

    @contextlib.contextmanager
    def _dir_locked(self, name, operation):
        """The flock of the directory's lock file `name` (_pause, _history)
        while the block runs. Each holder holds it for one write; one that
        holds it longer (a process stopped meanwhile) is waited for
        DIR_LOCK_WAIT at most."""
        fd = self._open_shared_lock(name)
        try:
            deadline = time.monotonic() + DIR_LOCK_WAIT
            while True:
                try:
                    fcntl.flock(fd, operation | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise BackendError("file: %s stayed locked for %gs (a process stopped while "
                                           "writing?)" % (self._path(name, ".lock"), DIR_LOCK_WAIT))
                    time.sleep(POLL)
                except OSError as exc:
                    raise BackendError("file: cannot lock %s (%s)" % (self._path(name, ".lock"), exc.strerror or exc))
            yield
        finally:
            os.close(fd)

    def _open_shared_lock(self, name):
        """NAME.lock, read-only: the jobs of every user of the directory take
        it, so it is made readable by all where its maker's umask made it private."""
        fd = self._open_new(name, os.O_RDONLY)
        info = os.fstat(fd)
        if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) & 0o444 != 0o444:
            try:
                os.fchmod(fd, 0o644)
            except OSError:
                pass  # a read-only file system: the other users' grants say they cannot open it
        return fd

    def _open_lock(self, key, flags):
        """KEY.lock, a regular file of the lock directory, opened without
        following a link and without blocking (a FIFO would wait for a writer)."""
        path = self._path(key, ".lock")
        try:
            fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o640)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise BackendError("file: lock %s: is a symbolic link (refused: it could point anywhere)" % path)
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise BackendError("file: lock %s: is not a regular file (a FIFO, device or socket is refused)" % path)
        return fd

    def _write_state(self, key, state, durable=False):
        """Replace KEY.json (a temp file renamed over it: a reader never sees
        half of one). durable: its data is on disk before the rename.

        Only a grant is written durably. Without the fsync a power loss can
        leave an empty KEY.json where the filesystem does not flush a file
        renamed over another (ext4 does, XFS does not): the fence would start
        over at 1, below tokens a resource has already seen, and every later
        run's writes would be refused. The rename itself is not forced to disk
        (no fsync of the directory): losing it loses only the last grant, whose
        holder died in the same crash (one host), so no live holder ever
        shares a fence. The release's record (the last run, min_hold's end)
        is not fsynced: a power loss then costs that record and the min_hold,
        never a fence or a grant; each fsync costs a start 1-10 ms of disk."""
        path = self._path(key, ".json")
        try:
            replace_file(path, json.dumps(state, sort_keys=True), durable=durable)
        except (IOError, OSError) as exc:
            raise BackendError("file: cannot write %s (%s)" % (path, exc.strerror or exc))

    def _holder(self, key, state, held):
        now = time.time()
        hold_until = state.get("hold_until") or 0
        busy = held or hold_until > now
        return LockView(key, owner=state.get("owner") if busy else None, fence=state.get("fence", 0),
                        acquired_at=state.get("acquired_at") if busy else None,
                        ttl_remaining=(hold_until - now) if (busy and not held) else None,
                        last=state.get("last"), server_time=now)

    def server_time(self):
        return time.time()

    def wait_change(self, key, timeout):
        time.sleep(max(0.0, min(timeout, POLL)))

    def describe(self, cluster=False):
        """This host's lock directory: the only "server" there is."""
        return {"backend": self.name, "member": {"endpoint": self.directory}, "cluster": None}

    def _open_new(self, key, flags=os.O_RDWR):
        """KEY.lock, made (with the directory) where it does not exist yet."""
        try:
            # exist_ok: runners started together race to create it.
            os.makedirs(self.directory, 0o750, exist_ok=True)
            return self._open_lock(key, flags | os.O_CREAT)
        except OSError as exc:
            raise BackendError("file: cannot open the lock in %s (%s)" % (self.directory, exc))

    def acquire(self, key, owner, ttl, slot=None, pauses=()):
        fd = self._open_new(key)
        try:
            grant = self._grant(fd, key, owner, slot, pauses)
        except BaseException:
            os.close(fd)
            raise
        if grant.granted:
            self._fds[key] = fd
        else:
            os.close(fd)
        return grant

    def _grant(self, fd, key, owner, slot, pauses):
        if slot is not None and slot.width is not None and not slot.rerun:
            # This host's clock is the backend's; read again under the lock
            # below, so a runner that waited for it claims the slot open then.
            slot.number = slot.number_at(time.time())
        if slot is not None and not slot.rerun and slot.blackout is not None:
            return self._unless_paused(pauses, Grant("blackout", window=slot.blackout))
        state = self._read_state(key)
        if slot is not None and not slot.rerun and state.get("slot") == slot.number:
            return self._unless_paused(pauses, Grant("duplicate", holder=self._holder(key, state, held=False)))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (IOError, OSError):
            return self._unless_paused(pauses, Grant("locked", holder=self._holder(key, state, held=True)))
        with self._pauses_locked(fcntl.LOCK_SH):
            return self._live_pause(pauses) or self._grant_held(key, owner, slot)

    def _live_pause(self, pauses):
        """A "paused" Grant for the first live pause of `pauses`, or None
        (the caller holds _pause.lock)."""
        for scope in pauses:
            pause = self._read_pause(scope)
            if pause is not None:
                return Grant("paused", pause=pause)
        return None

    def _unless_paused(self, pauses, refusal):
        """A refusal made before the pauses are read (the lock held, the slot
        done): a live pause is the answer instead, as every backend gives it."""
        if not pauses:
            return refusal
        with self._pauses_locked(fcntl.LOCK_SH):
            return self._live_pause(pauses) or refusal

    def _grant_held(self, key, owner, slot):
        """The grant under the key's flock, no pause found."""
        state = self._read_state(key)  # now under the lock
        if slot is not None and slot.width is not None and not slot.rerun:
            slot.number = slot.number_at(time.time())
            if slot.blackout is not None:  # the slot opened while this runner waited for the lock
                return Grant("blackout", window=slot.blackout)
        if slot is not None and slot.rerun:
            refusal = self._rerun_refusal(state, slot)
            if refusal == "duplicate":
                return Grant(refusal, holder=LockView(key, owner=marker_owner(_marker(state, slot)[0])))
            if refusal is not None:
                return Grant(refusal, holder=self._holder(key, state, held=False) if refusal == "locked" else None)
            if slot.blackout is not None:
                return Grant("blackout", window=slot.blackout)
        elif slot is not None and (_marker(state, slot) is not None or state.get("slot") == slot.number):
            # Any live marker of the slot, not only the last slot granted:
            # a run-now's or a catch-up's slot is granted after the schedule's.
            return Grant("duplicate", holder=self._holder(key, state, held=False))
        elif (state.get("hold_until") or 0) > time.time():
            return Grant("locked", holder=self._holder(key, state, held=False))
        state.update(owner=owner, fence=state.get("fence", 0) + 1, acquired_at=time.time(), hold_until=None)
        if slot is not None and slot.rerun:
            _marker(state, slot)[0] = owner  # its expiry kept
        elif slot is not None:
            now = time.time()
            live = _live_markers(state, now)
            live[str(slot.number)] = [owner, now + slot.marker_ttl]
            state.update(slot=slot.number, markers=live)
        self._write_state(key, state, durable=True)
        return Grant("granted", fence=state["fence"])

    @staticmethod
    def _rerun_refusal(state, slot):
        """base.rerun_refusal on this host's clock, under the lock; a held
        min_hold is 'locked' as for any grant."""
        now = time.time()
        marker = _marker(state, slot)
        refusal = rerun_refusal(slot.number, slot.number_at(now), marker[0] if marker else None)
        if refusal is None and (state.get("hold_until") or 0) > now:
            return "locked"
        return refusal

    def pause(self, scope, reason, seconds, by):
        path, length = self._pause_path(scope), pause_ms(seconds) / 1000.0
        with self._pauses_locked(fcntl.LOCK_EX):
            now = time.time()
            pause = Pause(scope, reason, now + length, by, now)
            try:
                replace_file(path, pause.as_record(), durable=True)
            except (IOError, OSError) as exc:
                raise BackendError("file: cannot write %s (%s)" % (path, exc.strerror or exc))
        return pause

    def resume(self, scope):
        with self._pauses_locked(fcntl.LOCK_EX):  # not a pause written between the read and the unlink
            pause = self._read_pause(scope)
            try:
                os.unlink(self._pause_path(scope))
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise BackendError("file: cannot remove %s (%s)" % (self._pause_path(scope), exc.strerror or exc))
        return pause

    def read_pauses(self, scopes):
        return [pause for pause in (self._read_pause(scope) for scope in scopes) if pause is not None]

    def _history_path(self, key):
        return self._path(key, ".history")

    def _read_history(self, key):
        """The entries' texts of KEY.history, oldest first (JSON lines)."""
        text = self._read(self._history_path(key), "file: history")
        return [line for line in (text or "").splitlines() if line.strip()]

    def add_history(self, key, entry, keep, once=None, once_ttl=None):
        keep = history_keep(keep)
        with self._dir_locked(HISTORY, fcntl.LOCK_EX):
            lines = self._read_history(key)
            if once is not None and any(history_entry(line).get("once") == once for line in lines):
                return False
            lines = (lines + [history_record(entry, once)])[-keep:]
            path = self._history_path(key)
            try:
                replace_file(path, "\n".join(lines) + "\n")
            except (IOError, OSError) as exc:
                raise BackendError("file: cannot write %s (%s)" % (path, exc.strerror or exc))
        return True

    def slot_claimed(self, key, number):
        return str(number) in _live_markers(self._read_state(key), time.time())

    def read_history(self, key, limit):
        return [history_entry(line) for line in reversed(self._read_history(key)[-limit:])]

    def renew(self, key, owner, ttl):
        return key in self._fds and self._read_state(key).get("owner") == owner

    def guard_fds(self, key):
        """The flock's descriptor: the guard's copy shares its open file, so the
        lock stays taken until the guard has killed the job, even when the
        runner dies first. The guard closes its copy before it reports the
        job's end, so the release (after that report) still frees the lock."""
        return (self._fds[key],) if key in self._fds else ()

    def release(self, key, owner, min_hold=0.0, last=None, slot=None):
        fd = self._fds.pop(key, None)
        if fd is None:
            return False
        try:
            state = self._read_state(key)
            if last:
                state["last"] = last
                marker = _marker(state, slot) if slot is not None else None
                if marker is not None and marker[0] == owner:
                    marker[0] = outcome_marker(owner, last.get("result"))
            hold_until = (state.get("acquired_at") or 0) + min_hold
            if hold_until > time.time():
                state["hold_until"] = hold_until
            else:
                state["owner"] = None
            self._write_state(key, state)
        finally:
            os.close(fd)  # the flock goes with it, recorded or not
        return True

    def force_release(self, key):
        state = self._read_state(key)
        holder = self._holder(key, state, held=self._is_locked(key))
        if self._is_locked(key):
            raise BackendError("file: %s is held by a live process (owner %s); a flock cannot be "
                               "broken, stop that process instead" % (key, state.get("owner")))
        state.update(owner=None, hold_until=None)
        self._write_state(key, state)
        return holder

    def _is_locked(self, key):
        if key in self._fds:
            return True
        try:
            fd = self._open_lock(key, os.O_RDONLY)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except (IOError, OSError):
            return True
        finally:
            os.close(fd)

    def query(self, key):
        return self._holder(key, self._read_state(key), held=self._is_locked(key))

    def close(self):
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
