"""What every backend offers, and the values it returns."""

import json
import math
import os
import socket
import time

from .. import validate
from ..errors import ConfigError, DlockError
from ..options import HISTORY_MAX
from ..slots import marker_succeeded, slot_number


def validate_key(key, field="key"):
    return validate.lock_key(key, field)


def endpoint(host, port):
    """host:port as a URL writes it ([v6]:port)."""
    return "%s:%s" % ("[%s]" % host if ":" in str(host) else host, port)


def transport_error(exc):
    """A socket's or a protocol's error as the log shows it (redis_resp.py,
    etcd_http.py): "timed out", else its class with its text if any."""
    if isinstance(exc, socket.timeout):  # TimeoutError since Python 3.10
        return "timed out"
    text = str(exc)
    return "%s: %s" % (exc.__class__.__name__, text) if text else exc.__class__.__name__


def lease_ms(seconds, field="ttl", minimum=1.0, maximum=validate.MAX_DURATION):
    """A lease or marker length in whole milliseconds for the server: finite
    and bounded, so no grant can ever be written without an expiry (a Lua
    overflow or a NULL interval would mean one). The last wall before the
    backend: options are checked long before this."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or not minimum <= seconds <= maximum:
        raise ConfigError("%s: %s is not a lease length from %gs to %s"
                          % (field, validate.shown(seconds), minimum, validate.format_duration(maximum)))
    return int(math.ceil(seconds * 1000))


def grant_not_counted(error, undo):
    """The error to raise for a grant whose outcome is unknown (its answer was
    lost to a timeout or a broken connection, or its commit is not known to
    be replicated), once undo() has run: the backend's owner-checked release
    of whatever that grant may have written. The rule of every backend: such
    a grant is no grant (the runner fails closed, exit 75, the job never
    starts), and it is undone, else it would block every other runner, under
    an owner nobody runs, until its TTL. undo() returns True when it freed
    something of ours; if it fails as well, the lease ends at its TTL."""
    try:
        outcome = "what it wrote was released" if undo() else "nothing of it was left to release"
    except DlockError as exc:
        outcome = "releasing it failed (%s): the lease ends at its TTL" % exc
    return error.__class__("%s; the grant is not counted and %s" % (error, outcome))


class Slot(object):
    """A once-per slot: its number and how long its marker must outlive the grant.

    With a width (the runner's once_per) and its lead (slots.slot_lead), the
    slot is decided at grant time on the backend's clock (slots.slot_number
    of the backend's "now", inside the grant script or statement, by
    number_at here): `number` is only the caller's estimate until
    acquire() sets it to the slot actually claimed. A runner delayed between
    its estimate and the grant (stopped, paused, slow network) so can never
    claim a slot whose window has passed and whose marker may have expired.
    Without a width the number is taken as given (tests, tools).

    rerun: a rerun of slot `number` (`dlock run --rerun`), whose number is
    never moved; the grant rule is rerun_refusal's, applied inside the
    backend's atomic grant step: the marker then names the new owner, its
    expiry unchanged."""

    def __init__(self, number, marker_ttl, width=None, rerun=False, lead=0.0, blackout_of=None):
        if rerun and width is None:
            raise ValueError("a rerun's slot needs its width: whether it has begun is judged on it")
        self.number = number
        self.marker_ttl = marker_ttl
        self.width = width
        self.rerun = rerun
        self.lead = lead
        self.blackout_of = blackout_of

    @property
    def blackout(self):
        """The window that blacks this slot out (blackout.py), or None. A
        function of the number alone: the grant refuses the slot, 'blackout',
        only once the backend's clock says it is the slot open (each backend
        checks the number first, and asks again with its own when it differs)."""
        return self.blackout_of(self.number) if self.blackout_of is not None else None

    def number_at(self, server_now):
        """The number of the slot open at `server_now` (backend seconds)."""
        return slot_number(server_now, self.width, self.lead)

    def __repr__(self):
        return "Slot(%d)" % self.number


def rerun_refusal(number, current, marker):
    """Why a rerun of slot `number` is refused, or None: the rule of a rerun
    grant, for the backends that judge it in Python under their lock or
    compare (file, etcd); Redis's ACQUIRE and PostgreSQL's RERUN_SLOT write
    the same rule in Lua and SQL. `current`: the backend's slot now;
    `marker`: the slot's live marker (None: expired, or never claimed).
    'future' (not yet begun), 'unknown' (no marker: nothing ran that a
    rerun could repeat) or 'duplicate' (the slot succeeded: a success is
    final). A grant still needs the lock free by the usual rules."""
    if number > current:
        return "future"
    if marker is None:
        return "unknown"
    if marker_succeeded(marker):
        return "duplicate"
    return None


class LockView(object):
    """A key's lock as the backend reports it: who holds it (owner, None when
    nobody does), its fence, since when and for how long more, the last
    finished run and the waiters in line. query() and force_release() return
    one; a refused Grant carries one (its `holder`)."""

    def __init__(self, key, owner=None, fence=0, acquired_at=None, ttl_remaining=None,
                 last=None, server_time=None, queued=None):
        self.key = key
        self.owner = owner
        self.fence = fence
        self.acquired_at = acquired_at  # backend epoch seconds
        self.ttl_remaining = ttl_remaining  # seconds; None: no expiry (held by a session)
        self.last = last  # dict describing the last finished run, or None
        self.server_time = server_time
        self.queued = queued  # waiters in line, when the lock is free but they come first

    @property
    def age(self):
        if self.owner is None or self.acquired_at is None or self.server_time is None:
            return None
        return max(0.0, self.server_time - self.acquired_at)

    def as_dict(self):
        return {
            "key": self.key,
            "held": self.owner is not None,
            "owner": self.owner,
            "fence": self.fence,
            "age": None if self.age is None else round(self.age, 3),
            "ttl_remaining": None if self.ttl_remaining is None else round(self.ttl_remaining, 3),
            "last": self.last,
        }


class Grant(object):
    """Answer to an acquire: status is 'granted', 'locked', 'duplicate',
    'paused' or 'blackout'; a rerun's also 'future' or 'unknown'
    (rerun_refusal). A duplicate's holder names the owner of the slot's
    marker (slots.marker_owner); a paused one's `pause` is the Pause that
    refused it; a blacked-out one's `window` the window (Slot.blackout).
    A granted one's `lease_age`: seconds its lease had already been counting
    on the backend when the acquire began (a lease taken ahead, as an etcd
    waiter's spare): the caller's lease deadline counts from then (waiting.py)."""

    def __init__(self, status, fence=None, holder=None, pause=None, window=None, lease_age=0.0):
        self.status = status
        self.fence = fence
        self.holder = holder
        self.pause = pause
        self.window = window
        self.lease_age = lease_age

    @property
    def granted(self):
        return self.status == "granted"


# What a pause covers: one lock key ("job:KEY"), the jobs of a group
# ("group:NAME", a job's `groups`) or every lock ("all"). A grant names the
# scopes that pause it (pause_scopes); the backend refuses it inside the
# grant's atomic step while any of them has a live pause.
ALL_SCOPE = "all"
JOB_SCOPE = "job:"
GROUP_SCOPE = "group:"


def job_scope(key):
    return JOB_SCOPE + key


def group_scope(group):
    return GROUP_SCOPE + group


def pause_scopes(key, groups=()):
    """The scopes whose pause refuses a grant of `key`, a job of `groups`:
    the most particular first (a refusal names the first that is paused)."""
    return (job_scope(key),) + tuple(group_scope(group) for group in groups) + (ALL_SCOPE,)


def scope_parts(scope):
    """(kind, name) of a scope: ("job", KEY), ("group", NAME) or ("all",
    None), what a backend names a pause's key or file by. Anything else is
    refused (a scope becomes a file name in the file backend's directory,
    a key name in the others)."""
    if scope == ALL_SCOPE:
        return "all", None
    if isinstance(scope, str) and scope.startswith(JOB_SCOPE):
        return "job", validate_key(scope[len(JOB_SCOPE):], "pause scope")
    if isinstance(scope, str) and scope.startswith(GROUP_SCOPE):
        return "group", validate.group_name(scope[len(GROUP_SCOPE):], "pause scope")
    raise ConfigError("pause scope: %s is none of %r, job:KEY or group:NAME" % (validate.shown(scope), ALL_SCOPE))


def pause_ms(seconds):
    """A pause's length in whole milliseconds, the same bounds in every
    backend (etcd then rounds it up to whole seconds)."""
    return lease_ms(seconds, "pause")


class Pause(object):
    """A pause of grants as the backend holds it (docs/runner.md, Pausing):
    its scope, why, until when and since when (backend epoch seconds, its
    clock), and who set it. The backend stores the record as JSON
    (as_record) and ends it at `until` by itself (an expiry on its clock)."""

    def __init__(self, scope, reason, until, by, at):
        self.scope = scope
        self.reason = reason
        self.until = until
        self.by = by
        self.at = at

    def as_record(self):
        return json.dumps({"reason": self.reason, "until": self.until, "by": self.by, "at": self.at},
                          sort_keys=True)

    @classmethod
    def from_record(cls, scope, text):
        """The Pause a stored record describes; an unreadable one still
        pauses (it exists), with the reason saying so."""
        try:
            record = json.loads(text)
            return cls(scope, str(record["reason"]), float(record["until"]), str(record["by"]),
                       float(record["at"]))
        except (ValueError, TypeError, KeyError):
            return cls(scope, "(unreadable pause record)", None, None, None)

    def as_dict(self):
        return {"scope": self.scope, "reason": self.reason, "until": self.until, "by": self.by, "at": self.at}


def pause_path(directory, scope):
    """The file of the pause of `scope` in `directory` (the file:// backend's,
    a node's mirror: pause_files.py)."""
    scope_parts(scope)  # checked: the scope is part of a file name
    return os.path.join(directory, scope + ".pause")


def live_pause(path, scope, text, now=None):
    """The live Pause the file `path` holding `text` (None: no file) says,
    or None when its until has passed. A record that is unreadable, or ends
    later than the longest pause could when its file was written, ends where
    that longest pause would: a stray file cannot stop the jobs for good."""
    if text is None:
        return None
    pause = Pause.from_record(scope, text)
    try:
        latest = os.stat(path).st_mtime + validate.MAX_DURATION
    except FileNotFoundError:
        return None  # ended since it was read
    if pause.until is None or not pause.until <= latest:  # not <=: NaN too
        pause.until = latest
    return pause if pause.until > (time.time() if now is None else now) else None


# The fleet-wide history of a lock's runs (docs/runner.md, "History"): the
# newest `keep` entries per key (the job option `history`), kept by the
# backend, written by each runner after its run as one more operation, never
# inside the grant: a history that cannot be written never fails or delays a
# run. An entry is a JSON object (Runner._history_entry). An entry with a
# `once` id (a slot's skip, "skipped_paused@29347") is written by the first
# node only: the others find it there (on Redis, its marker, which lives
# `once_ttl`: as long as the slot can still be asked for).


def history_record(entry, once=None):
    """The stored text of an entry: JSON, its `once` id inside it."""
    if once is not None:
        entry = dict(entry, once=once)
    return json.dumps(entry, sort_keys=True)


def history_entry(text):
    """The entry a stored text holds; one that does not read is kept as such."""
    try:
        entry = json.loads(text)
    except ValueError:
        entry = None
    return entry if isinstance(entry, dict) else {"result": "unreadable", "record": str(text)[:200]}


# The fleet's pause log: each pause made and ended, kept by the backend as a
# history of its own (under validate.PAUSE_LOG_KEY, which no job may use),
# so that the run that finds a gap in its job's history after the whole
# fleet was down can tell which of those slots a pause covered: no node was
# there to be refused, yet they were paused, so skipped, never missed nor
# caught up (history.py). Written after the pause, outside it: a log that
# cannot be written never undoes a pause.
PAUSE_LOG_KEEP = HISTORY_MAX


def log_pause(backend, scope, pause=None):
    """Record that `scope` was paused (`pause`, the Pause the backend stored)
    or resumed (None: now, on the backend's clock). None when written, else
    why not (the pause or resume stands either way)."""
    try:
        if pause is not None:
            entry = {"result": "paused", "scope": scope, "at": pause.at, "until": pause.until,
                     "reason": pause.reason, "by": pause.by}
        else:
            entry = {"result": "resumed", "scope": scope, "at": backend.server_time()}
        backend.add_history(validate.PAUSE_LOG_KEY, entry, PAUSE_LOG_KEEP)
    except DlockError as exc:
        return str(exc)
    return None


def paused_spans(entries, scopes):
    """[(start, end, the pause's entry)]: how long pauses of `scopes` lasted,
    from the pause log's `entries` (newest first, as read_history gives
    them). A pause ends at its until, or earlier when its scope was resumed
    or paused again (the new pause then replaces it)."""
    spans, ended = [], {}
    for entry in entries:
        scope, at = entry.get("scope"), entry.get("at")
        if scope not in scopes or not _moment(at):
            continue
        if entry.get("result") == "paused" and _moment(entry.get("until")):
            end = min(entry["until"], ended.get(scope, entry["until"]))
            if end > at:
                spans.append((at, end, entry))
        ended[scope] = at
    return spans


def _moment(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def history_keep(keep):
    """`keep` checked where every backend receives it: 1 to HISTORY_MAX."""
    return validate.integer(keep, "history", 1, HISTORY_MAX)


class Backend(object):
    """A lease store. Times are the backend's; ttl and durations in seconds.

    renew() returns False when the lease is no longer ours (expired, taken,
    broken); it raises BackendError when it cannot tell (the caller retries
    until its own deadline).
    """

    name = "backend"
    # True when renew() can still succeed after a connection error (server-side
    # lease); False when the lock lives in the session (advisory, flock).
    lease_survives_reconnect = True
    # How coarse server_time() is, in seconds: the clock check counts it as
    # uncertainty like the round trip (etcd's clock is an HTTP Date header).
    clock_resolution = 0.0

    def server_time(self):
        raise NotImplementedError

    def join_queue(self, key, owner, ttl):
        """Take owner's place at the end of key's line of waiters, or keep the
        place it has: its ticket then lives `ttl` seconds more. From then on
        wait_change(key) returns when the lock or the line changes. While
        live tickets exist, acquire() grants only to the first of them (a
        caller without a ticket is refused). The default keeps no line."""

    def leave_queue(self, key, owner):
        """Give up owner's place in line (granted, or done waiting)."""

    def wait_change(self, key, timeout):
        """Wait at most `timeout` seconds, less when the backend tells of a
        release or a change of the line (it says nothing of lease expiries:
        the caller wakes for those by the holder's ttl_remaining). Never a
        grant, never an error: any trouble ends in a plain sleep, and the
        caller's next request says whether the backend is down. The default
        sleeps the whole timeout."""
        time.sleep(max(0.0, timeout))

    def acquire(self, key, owner, ttl, slot=None, pauses=()):
        """The grant. `pauses`: scopes (pause_scopes) any live pause of which
        refuses it, 'paused' with that Pause, checked in the grant's own
        atomic step on the backend's clock."""
        raise NotImplementedError

    def pause(self, scope, reason, seconds, by):
        """Pause every grant that names `scope` for `seconds` from now on the
        backend's clock (a pause already there is replaced); the Pause stored."""
        raise NotImplementedError

    def resume(self, scope):
        """End the pause of `scope` now; the Pause it ended, or None."""
        raise NotImplementedError

    def read_pauses(self, scopes):
        """The live pauses of `scopes`, in their order (those without one left out)."""
        raise NotImplementedError

    def renew(self, key, owner, ttl):
        raise NotImplementedError

    def add_history(self, key, entry, keep, once=None, once_ttl=None):
        """Add `entry` (a dict) to key's history and keep its newest `keep`
        entries. With `once`, only when no entry of that id is there:
        True when written, False when one was."""
        raise NotImplementedError

    def read_history(self, key, limit):
        """The newest `limit` entries of key's history, newest first."""
        raise NotImplementedError

    def slot_claimed(self, key, number):
        """Whether a live marker of slot `number` of key is there: a run
        claimed it (going on, done, failed, or its runner died)."""
        raise NotImplementedError

    def guard_fds(self, key):
        """Descriptors of this process that hold key's lock, which the job's
        guard must keep until nothing of the job is left: a lock that goes
        with its last descriptor (a flock; an advisory lock, with its
        session's socket) would otherwise be freed by the runner's death
        (SIGKILL) while the job still runs. None by default: a lease on a
        server outlives the runner by its TTL."""
        return ()

    def release(self, key, owner, min_hold=0.0, last=None, slot=None):
        """Owner-checked release; with `last` (the run's record, its result)
        and `slot`, the slot's marker, if it still names `owner`, is
        rewritten in the same step to record the outcome
        (slots.outcome_marker), its expiry unchanged."""
        raise NotImplementedError

    def force_release(self, key):
        raise NotImplementedError

    def query(self, key):
        raise NotImplementedError

    def query_many(self, keys):
        """[query(key) for each of keys], in their order: `dlock status` and
        `dlock metrics` read every job's lock at once. A backend that can
        read many keys in one round trip (or a few) does so; each view is
        the one query() gives, its server_time from the same clock. The
        default asks once per key."""
        return [self.query(key) for key in keys]

    def drain(self, keys, dry_run=False):
        """A pause's drain=kill (`dlock pause --drain kill`, dlock_pause),
        once the pause is written, so that no new run starts meanwhile: the
        lock of each run going on under `keys` broken (force_release). Its
        runner learns at its next renewal that the lease is gone and kills
        its job before the lease could have expired. Every key is tried,
        whatever the others did. dry_run: only say which would be. Returns
        ([(key, the holder broken, a LockView)], [(key, why it could not be)])."""
        drained, failed = [], []
        if not keys:  # nothing in the scope: no read sent
            return drained, failed
        for key, view in zip(keys, self.query_many(keys)):
            if view.owner is None:
                continue
            if not dry_run:
                try:
                    view = self.force_release(key)
                except DlockError as exc:
                    failed.append((key, str(exc)))
                    continue
            drained.append((key, view))
        return drained, failed

    def describe(self, cluster=False):
        """Which member of the backend answered the last operation, and with
        cluster=True the cluster's health as this node sees it (`dlock
        status`, `dlock metrics`; the run's log line names the member that
        answered its grant). A dict:

          backend  the backend's name
          member   {"endpoint": "host:port", and where known "name", "id",
                   "role"}; None before any answer
          cluster  what the backend can tell of its cluster, cheaply and with
                   the runners' own rights (etcd: members, healthy members,
                   leader; PostgreSQL: standbys); None when there is none

        member costs no request (it is what the last answer said); cluster
        may ask the backend and raise a DlockError."""
        return {"backend": self.name, "member": None, "cluster": None}

    def reset(self):
        """Forget the current connection (after a stuck operation)."""

    def close(self):
        """Close connections; safe to call twice."""
