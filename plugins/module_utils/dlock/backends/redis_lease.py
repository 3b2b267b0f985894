"""Redis lease: SET-NX-style grant with a server-side PX TTL, owner-checked
Lua scripts for renew and release, and a fence counter INCRed in the grant.

Keys (all under the `dlock:` prefix, so an ACL `~dlock:*` suffices; the hash
tag keeps one lock's keys in one cluster slot):
  dlock:{KEY}:lease   hash owner, fence, acquired_ms (expires with the lease)
  dlock:{KEY}:fence   counter, never expires (fences grow across restarts with AOF)
  dlock:{KEY}:slot:N  once-per marker of slot N (slots.py: the owner, or the outcome)
  dlock:{KEY}:void:OWNER  a grant of OWNER undone before it ran (expires with its ttl)
  dlock:{KEY}:last    JSON of the last finished run
  dlock:{KEY}:history the newest runs, newest first (a list of JSON, LTRIMmed)
  dlock:{KEY}:once:ID an entry of id ID is in the history (base.history_record)
  dlock:{KEY}:queue   waiters in arrival order (sorted set: owner -> place number)
  dlock:{KEY}:tickets the same waiters' ticket expiries (sorted set: owner -> ms)
Channel dlock:{KEY}:wake: on each release, and when a waiter leaves the line
of a free lock, the name of the first live waiter in line: a wake-up for
that waiter, never a grant.

Only waiting touches the queue: the grant and release scripts look at it
with EXISTS and use the sorted-set commands and PUBLISH only when it exists,
so a runner that never waits needs no other commands than before.
"""

import hashlib
import json
import time

from ..errors import AuthError, BackendError, OutcomeUnknown
from ..slots import DONE, SLOT_TRIES, marker_owner, outcome_marker
from ..validate import MAX_DURATION, backend_url
from .base import (Backend, Grant, LockView, Pause, endpoint, grant_not_counted, history_entry, history_keep,
                   history_record, lease_ms, pause_ms, scope_parts)
from .epoch import DEFAULT_PORTS
from .redis_resp import Connection, ReplyError, Unanswered
from .tls import tls_context

# Time in ms from the server clock, inside scripts (TIME is allowed with
# effects replication, the default since Redis 5).
_NOW = "local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000) "

# Live tickets only: drop the expired ones (KEYS q, t: queue and tickets).
# Wake the first live waiter in line, by name: the others stay asleep. pcall:
# PUBLISH needs the channel in the ACL; without it waiters are not told, and
# wake by time.
_QUEUE = """
local function purge(q, t, now)
  local dead = redis.call('ZRANGEBYSCORE', t, '-inf', now)
  if #dead > 0 then
    redis.call('ZREM', q, unpack(dead))
    redis.call('ZREM', t, unpack(dead))
  end
end
local function wake_first(q, t, now, channel)
  purge(q, t, now)
  local first = redis.call('ZRANGE', q, 0, 0)[1]
  if first then
    redis.pcall('PUBLISH', channel, first)
  end
end
"""

# KEYS[5]: the grant's void marker (UNDO_GRANT). KEYS[6], the slot marker, is
# passed only with once_per: an ACL limited to
# ~dlock:* refuses any other key name, the empty one included. With ARGV[4]
# and ARGV[8] (the slot's width and lead, ms) the slot must be the server's
# current one (slots.py's slot_number on TIME), else the answer names it and
# the caller asks again. The last ARGV counts the pause keys that end KEYS
# (_pause_key): while any of them exists (they expire at their pause's end),
# the grant is refused, 'paused' with that pause's record. ARGV[#ARGV - 1]
# '1': the slot asked for, ARGV[5], is blacked out (base.Slot.blackout):
# refused, 'blackout', once the server's slot is that one (a fixed slot's,
# as given).
# A free lock goes to the first live ticket in line, or to anyone when nobody
# waits. ARGV[6] '1': a rerun of slot ARGV[5] (base.rerun_refusal's rule:
# not in the future, a live marker that does not start with ARGV[7],
# slots.DONE), which then sets the marker to its owner, its expiry kept.
ACQUIRE = _NOW + _QUEUE + """
if redis.call('EXISTS', KEYS[5]) == 1 then return {'void'} end
local pauses = tonumber(ARGV[#ARGV])
for i = #KEYS - pauses + 1, #KEYS do
  local pause = redis.call('GET', KEYS[i])
  if pause then return {'paused', KEYS[i], pause} end
end
local marker = (#KEYS - pauses == 6) and KEYS[6] or nil
local width = (#ARGV == 10) and tonumber(ARGV[4]) or nil
local rerun = marker and ARGV[6] == '1'
local current = width and math.floor((now + tonumber(ARGV[8])) / width)
if rerun then
  if tonumber(ARGV[5]) > current then return {'future'} end
  local value = redis.call('GET', marker)
  if not value then return {'unknown'} end
  if string.sub(value, 1, #ARGV[7]) == ARGV[7] then return {'duplicate', value} end
elseif marker and width then
  if current ~= tonumber(ARGV[5]) then return {'moved', string.format('%d', current)} end
end
if marker and ARGV[#ARGV - 1] == '1' then return {'blackout'} end
if marker and not rerun and redis.call('EXISTS', marker) == 1 then
  return {'duplicate', redis.call('GET', marker)}
end
local lease = redis.call('HMGET', KEYS[1], 'owner', 'fence', 'acquired_ms')
if lease[1] then
  return {'locked', lease[1], lease[2], lease[3], redis.call('PTTL', KEYS[1]), string.format('%d', now)}
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  purge(KEYS[3], KEYS[4], now)
  local first = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if first and first ~= ARGV[1] then
    return {'queued', redis.call('ZCARD', KEYS[3]), string.format('%d', now)}
  end
end
local fence = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'fence', fence, 'acquired_ms', string.format('%d', now))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if rerun then
  redis.call('SET', marker, ARGV[1], 'KEEPTTL')
elseif marker then
  redis.call('SET', marker, ARGV[1], 'PX', ARGV[3])
end
return {'granted', fence}
"""

# A pause (KEYS[1], _pause_key) written with its record (ARGV[1], JSON without
# its times) for ARGV[2] ms on the server's clock: the record gets `at` and
# `until` from TIME, and the key expires at `until`. Returns the record.
PAUSE = _NOW + """
local record = cjson.decode(ARGV[1])
record['at'] = now / 1000
record['until'] = (now + tonumber(ARGV[2])) / 1000
local text = cjson.encode(record)
redis.call('SET', KEYS[1], text, 'PX', ARGV[2])
return text
"""

# Undo a grant whose answer was lost (KEYS: lease, void marker, queue,
# tickets[, slot marker]; ARGV: owner, void ttl ms, wake channel). Owner-checked:
# it frees only the lease and the slot marker that carry our owner token, so
# what stays is what a grant that never ran leaves, but for the fence counter
# (fences only have to grow: a number skipped is harmless). The grant may
# also still be on its way (queued behind a slow command, on a connection we
# gave up on): the void marker makes it refuse when it comes, whichever of the
# two runs first.
UNDO_GRANT = _NOW + _QUEUE + """
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
local undone = 0
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  undone = 1
  if redis.call('EXISTS', KEYS[3]) == 1 then
    wake_first(KEYS[3], KEYS[4], now, ARGV[3])
  end
end
if KEYS[5] and redis.call('GET', KEYS[5]) == ARGV[1] then
  redis.call('DEL', KEYS[5])
  undone = 1
end
return undone
"""

# Tries of UNDO_GRANT, each within op_timeout: a server slow enough to lose
# the grant's answer gets as long again, and more, to answer the undo.
UNDO_TRIES = 3

# Take the place after the last live ticket, or keep ours; both sorted sets
# vanish when no waiter renews for a ticket's life.
JOIN = _NOW + _QUEUE + """
purge(KEYS[1], KEYS[2], now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  redis.call('ZADD', KEYS[1], last[2] and tonumber(last[2]) + 1 or 1, ARGV[1])
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
"""

# Leaving may put someone else first while the lock is free: tell them.
LEAVE = _NOW + _QUEUE + """
local left = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if left == 1 and redis.call('EXISTS', KEYS[3]) == 0 then
  wake_first(KEYS[1], KEYS[2], now, ARGV[2])
end
return left
"""

RENEW = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# Release keeps the lease until acquired + min_hold (lockAtLeastFor), never
# extends it, and records the last run; KEYS[5], the slot marker, if it
# still names our owner, becomes ARGV[5] (the outcome), its expiry kept.
RELEASE = _NOW + _QUEUE + """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return 0
end
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[2], ARGV[3])
end
if KEYS[5] and redis.call('GET', KEYS[5]) == ARGV[1] then
  redis.call('SET', KEYS[5], ARGV[5], 'KEEPTTL')
end
local keep = tonumber(redis.call('HGET', KEYS[1], 'acquired_ms')) + tonumber(ARGV[2]) - now
if keep > 0 and keep < redis.call('PTTL', KEYS[1]) then
  redis.call('PEXPIRE', KEYS[1], keep)
elseif keep <= 0 then
  redis.call('DEL', KEYS[1])
  if redis.call('EXISTS', KEYS[3]) == 1 then
    wake_first(KEYS[3], KEYS[4], now, ARGV[4])
  end
end
return 1
"""

FORCE_RELEASE = _NOW + _QUEUE + """
local lease = redis.call('HMGET', KEYS[1], 'owner', 'fence', 'acquired_ms')
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 1 then
  wake_first(KEYS[2], KEYS[3], now, ARGV[1])
end
return lease
"""


# An entry to the history, and its trim, in one step; with a once id, only
# when that id's marker could be set (it lives as long as the id can be sent).
ADD_HISTORY = """
if KEYS[2] and not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[3]) then
  return 0
end
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[2]) - 1)
return 1
"""


def _keys(key):
    base = "dlock:{%s}:" % key
    return base + "lease", base + "fence", base + "last"


def _void(key, owner):
    """The marker that makes a grant of owner's that comes late refuse."""
    return "dlock:{%s}:void:%s" % (key, owner)


def _pause_key(scope):
    """The key of a pause of `scope` (base.pause_scopes): a job's beside its
    lock's keys, a group's and the fleet's under the ACL's ~dlock:* as well."""
    kind, name = scope_parts(scope)
    if kind == "job":
        return "dlock:{%s}:pause" % name
    return "dlock:pause:all" if name is None else "dlock:pause:%s:%s" % (kind, name)


def _slot_marker(key, slot):
    return "dlock:{%s}:slot:%d" % (key, slot.number)


def _lock_view(key, lease, pttl, counter, last_json, now):
    """The LockView of query_many's five replies for key."""
    owner, acquired_ms, lease_fence = lease
    sec, usec = int(now[0]), int(now[1])  # TIME's two strings
    return LockView(
        key,
        owner=owner,
        fence=int(lease_fence or counter or 0),
        acquired_at=int(acquired_ms) / 1000.0 if acquired_ms else None,
        ttl_remaining=pttl / 1000.0 if owner and pttl >= 0 else None,
        last=json.loads(last_json) if last_json else None,
        server_time=sec + usec / 1e6,
    )


class NoAnswer(OutcomeUnknown):
    """A request sent with no answer (a timeout, a lost connection): it may
    or may not have run on the server."""


class _NoScript(BackendError):
    """The server has not loaded the script (EVALSHA's NOSCRIPT)."""


def _queue(key):
    """The line of waiters (queue, tickets) and the channel that wakes them."""
    base = "dlock:{%s}:" % key
    return base + "queue", base + "tickets", base + "wake"


class RedisBackend(Backend):
    name = "redis"

    def __init__(self, url, password=None, op_timeout=2.0, ca_file=None):
        parts = backend_url(url)
        host, port = parts.hosts[0]
        # rediss://: the server's certificate and its name are verified
        # (tls.py), against ca_file when given.
        tls = tls_context(ca_file) if parts.scheme == "rediss" else None
        self._connection = dict(host=host, port=port or DEFAULT_PORTS[parts.scheme], db=int(parts.path or 0),
                                username=parts.user, password=password, tls=tls, timeout=op_timeout)
        self.client = Connection(**self._connection)
        self.op_timeout = op_timeout
        self._shas = {}  # script source -> its SHA1, as EVALSHA names it
        self._pubsub = None  # a connection subscribed to the wake channel of the key we wait for
        self._subscribed = None  # that channel
        self._waiting_as = {}  # key -> the owner that waits in line

    def _script(self, source, keys, args):
        """EVALSHA; the first time a server has not seen the script
        (NOSCRIPT), SCRIPT LOAD and EVALSHA again (the role's ACL allows
        these two, not EVAL)."""
        sha = self._shas.get(source)
        if sha is None:
            sha = self._shas[source] = hashlib.sha1(source.encode("utf-8")).hexdigest()
        command = ["EVALSHA", sha, len(keys)] + list(keys) + list(args)
        try:
            return self._call(*command)
        except _NoScript:
            self._call("SCRIPT", "LOAD", source)
            return self._call(*command)

    def _call(self, *command):
        """One command's reply, its failures as the engine's errors."""
        return self._calls(self.client.call, *command)

    def _transaction(self, commands):
        """COMMANDS in one MULTI/EXEC: their replies."""
        return self._calls(self.client.transaction, commands)

    @staticmethod
    def _calls(send, *args):
        try:
            return send(*args)
        except ReplyError as exc:
            if exc.code in ("WRONGPASS", "NOAUTH"):
                raise AuthError("redis: authentication failed (%s)" % exc)
            if exc.code == "NOSCRIPT":
                raise _NoScript(str(exc))
            raise BackendError("redis: %s" % exc)
        except Unanswered as exc:
            raise NoAnswer("redis: %s" % exc)

    def server_time(self):
        seconds, micros = self._call("TIME")
        return int(seconds) + int(micros) / 1e6

    def acquire(self, key, owner, ttl, slot=None, pauses=()):
        for _try in range(SLOT_TRIES):
            try:
                reply = self._acquire(key, owner, ttl, slot, pauses)
            except NoAnswer as exc:
                raise grant_not_counted(exc, lambda: self._undo_grant(key, owner, ttl, slot))
            if reply[0] != "moved":
                break
            slot.number = int(reply[1])  # the server's slot: ask again for that one
        else:
            raise BackendError("redis: the slot kept moving during the grant of %s (once_per too short?)" % key)
        status = reply[0]
        if status == "void":  # the same owner asks again after an undone grant (the module's retries)
            raise BackendError("redis: a grant of %s to %s was undone (its answer was lost); that owner gets no "
                               "grant of it until the ttl of the undone grant has passed" % (key, owner))
        if status == "granted":
            return Grant("granted", fence=int(reply[1]))
        if status == "paused":
            return Grant("paused", pause=Pause.from_record(self._scope_of(reply[1], pauses), reply[2]))
        if status == "duplicate":
            return Grant("duplicate", holder=LockView(key, owner=marker_owner(reply[1])))
        if status in ("future", "unknown"):  # a rerun refused
            return Grant(status)
        if status == "blackout":
            return Grant(status, window=slot.blackout)
        if status == "queued":  # free, but others came first
            return Grant("locked", holder=LockView(key, queued=int(reply[1]), server_time=int(reply[2]) / 1000.0))
        owner_, fence_, acquired_ms, pttl, now_ms = reply[1:6]
        return Grant("locked", holder=LockView(
            key, owner=owner_, fence=int(fence_), acquired_at=int(acquired_ms) / 1000.0,
            ttl_remaining=max(0, int(pttl)) / 1000.0, server_time=int(now_ms) / 1000.0))

    def _acquire(self, key, owner, ttl, slot, pauses):
        lease, fence, _last = _keys(key)
        queue, tickets, _channel = _queue(key)
        keys, args = [lease, fence, queue, tickets, _void(key, owner)], [owner, lease_ms(ttl), 0]
        if slot is not None:
            keys.append(_slot_marker(key, slot))
            args[2] = lease_ms(slot.marker_ttl, "once_per marker", 1.0, 1.5 * MAX_DURATION)
            if slot.width is not None:
                args += [lease_ms(slot.width, "once_per"), slot.number, "1" if slot.rerun else "0", DONE,
                         int(round(slot.lead * 1000))]
        keys += [_pause_key(scope) for scope in pauses]
        blacked_out = "1" if slot is not None and slot.blackout else "0"
        return self._script(ACQUIRE, keys, args + [blacked_out, len(pauses)])

    @staticmethod
    def _scope_of(pause_key, scopes):
        return next(scope for scope in scopes if _pause_key(scope) == pause_key)

    # -- pauses ---------------------------------------------------------------

    def pause(self, scope, reason, seconds, by):
        record = json.dumps({"reason": reason, "by": by})
        text = self._script(PAUSE, [_pause_key(scope)], [record, pause_ms(seconds)])
        return Pause.from_record(scope, text)

    def resume(self, scope):
        text, _deleted = self._transaction([("GET", _pause_key(scope)), ("DEL", _pause_key(scope))])
        return None if text is None else Pause.from_record(scope, text)

    def read_pauses(self, scopes):
        # GETs in MULTI/EXEC, as query_many reads: commands the role's ACL has (no MGET).
        texts = self._transaction([("GET", _pause_key(scope)) for scope in scopes])
        return [Pause.from_record(scope, text) for scope, text in zip(scopes, texts) if text is not None]

    def _undo_grant(self, key, owner, ttl, slot):
        """UNDO_GRANT, tried UNDO_TRIES times while it gets no answer; True
        when it freed something of ours."""
        queue, tickets, channel = _queue(key)
        # A rerun's marker stays: it names us, which counts as not done, so
        # the slot can be rerun again (deleted, it could not).
        marker = [_slot_marker(key, slot)] if slot is not None and not slot.rerun else []
        keys = [_keys(key)[0], _void(key, owner), queue, tickets] + marker
        for attempt in range(UNDO_TRIES):
            try:
                return self._script(UNDO_GRANT, keys, [owner, lease_ms(ttl), channel]) == 1
            except NoAnswer:
                if attempt == UNDO_TRIES - 1:
                    raise

    def add_history(self, key, entry, keep, once=None, once_ttl=None):
        base = "dlock:{%s}:" % key
        keys, args = [base + "history"], [history_record(entry, once), history_keep(keep)]
        if once is not None:
            keys.append(base + "once:" + once)
            args.append(lease_ms(once_ttl, "history once_ttl", 1.0, 1.5 * MAX_DURATION))
        return self._script(ADD_HISTORY, keys, args) == 1

    def slot_claimed(self, key, number):
        return self._call("EXISTS", "dlock:{%s}:slot:%d" % (key, number)) == 1

    def read_history(self, key, limit):
        texts = self._call("LRANGE", "dlock:{%s}:history" % key, 0, limit - 1)
        return [history_entry(text) for text in texts]

    def renew(self, key, owner, ttl):
        return self._script(RENEW, [_keys(key)[0]], [owner, lease_ms(ttl)]) == 1

    def release(self, key, owner, min_hold=0.0, last=None, slot=None):
        lease, _fence, last_key = _keys(key)
        queue, tickets, channel = _queue(key)
        record = json.dumps(last, sort_keys=True) if last else ""
        keys, args = [lease, last_key, queue, tickets], [owner, lease_ms(min_hold, "min_hold", 0.0), record, channel]
        if slot is not None and last:
            keys.append(_slot_marker(key, slot))
            args.append(outcome_marker(owner, last.get("result")))
        return self._script(RELEASE, keys, args) == 1

    def force_release(self, key):
        before = self.query(key)
        queue, tickets, channel = _queue(key)
        owner, _fence, _acquired = self._script(FORCE_RELEASE, [_keys(key)[0], queue, tickets], [channel])
        # Report the holder we actually removed (it may have changed since the query).
        before.owner = owner
        return before

    def query(self, key):
        return self.query_many([key])[0]

    def query_many(self, keys):
        """One MULTI/EXEC for all keys: one round trip, and no write of
        another client between the reads of a key (nor between the keys)."""
        commands = []
        for key in keys:
            lease, fence, last = _keys(key)
            commands += [("HMGET", lease, "owner", "acquired_ms", "fence"), ("PTTL", lease), ("GET", fence),
                         ("GET", last), ("TIME",)]
        replies = self._transaction(commands)
        return [_lock_view(key, *replies[5 * index:5 * index + 5]) for index, key in enumerate(keys)]

    # -- waiting --------------------------------------------------------------
    def join_queue(self, key, owner, ttl):
        queue, tickets, channel = _queue(key)
        self._waiting_as[key] = owner
        self._subscribe(channel)  # first: a release from now on wakes us
        self._script(JOIN, [queue, tickets], [owner, lease_ms(ttl, "ticket ttl")])

    def leave_queue(self, key, owner):
        queue, tickets, channel = _queue(key)
        self._waiting_as.pop(key, None)
        self._close_pubsub()  # one wait at a time per backend: nothing else to keep
        return self._script(LEAVE, [queue, tickets, _keys(key)[0]], [owner, channel]) == 1

    def _subscribe(self, channel):
        """Subscribe (once) and wait for the server's confirmation: only then
        is a release published after our next try sure to reach us. A
        refusal (an ACL without the channel) leaves us without wake-ups."""
        if self._pubsub is not None and self._subscribed == channel:
            return
        self._close_pubsub()  # one subscription at a time: a wait is for one key
        self._pubsub = Connection(**self._connection)
        try:
            self._pubsub.send("SUBSCRIBE", channel)
            deadline = time.monotonic() + self.op_timeout
            while time.monotonic() < deadline:
                reply = self._pubsub.read(deadline - time.monotonic())
                if isinstance(reply, ReplyError):
                    break  # refused (NOPERM: an ACL without the channel)
                if reply is not None and reply[:2] == ["subscribe", channel]:
                    self._subscribed = channel
                    return
        except (Unanswered, ReplyError):
            pass
        self._close_pubsub()  # not confirmed: no wake-ups, waiting goes by time

    def _close_pubsub(self):
        pubsub, self._pubsub, self._subscribed = self._pubsub, None, None
        if pubsub is not None:
            pubsub.close()

    def wait_change(self, key, timeout):
        """Wait for a message on the key's wake channel, at most TIMEOUT
        (the subscription's connection waits that long for it, whatever
        op_timeout)."""
        channel, owner = _queue(key)[2], self._waiting_as.get(key)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self._pubsub is None:
                time.sleep(left)
                return
            try:
                message = self._pubsub.read(left)
            except Unanswered:
                self._close_pubsub()
                continue
            if isinstance(message, list) and message[:2] == ["message", channel] \
                    and (owner is None or message[2] == owner):
                return

    def describe(self, cluster=False):
        """The one server of the URL (a lock never runs on Redis replicas)."""
        return {"backend": self.name, "member": {"endpoint": endpoint(self.client.host, self.client.port)},
                "cluster": None}

    def close(self):
        self._close_pubsub()
        self.client.close()
