"""Redis lease: SET-NX-style grant with a server-side PX TTL, owner-checked
Lua scripts for renew and release, and a fence counter INCRed in the grant.

Keys (all under the `dlock:` prefix, so an ACL `~dlock:*` suffices; the hash
tag keeps one lock's keys in one cluster slot):
  dlock:{KEY}:lease   hash owner, fence, acquired_ms (expires with the lease)
  dlock:{KEY}:fence   counter, never expires (fences grow across restarts with AOF)
  dlock:{KEY}:slot:N  once-per marker of slot N
  dlock:{KEY}:last    JSON of the last finished run
"""

import json

from ..errors import AuthError, BackendError, MissingDriver
from ..slots import SLOT_TRIES
from ..validate import MAX_DURATION
from .base import Backend, Grant, Holder, endpoint, lease_ms

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError:
    redis = None

# Time in ms from the server clock, inside scripts (TIME is allowed with
# effects replication, the default since Redis 5).
_NOW = "local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000) "

# KEYS[3], the slot marker, is passed only with once_per: an ACL limited to
# ~dlock:* refuses any other key name, the empty one included. With ARGV[4]
# (the slot width, ms) the slot must be the server's current one (slots.py's
# slot_number on TIME), else the answer names it and the caller asks again.
ACQUIRE = _NOW + """
if KEYS[3] and ARGV[4] then
  local current = math.floor(now / tonumber(ARGV[4]) + 0.5)
  if current ~= tonumber(ARGV[5]) then return {'moved', string.format('%d', current)} end
end
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 1 then
  return {'duplicate', redis.call('GET', KEYS[3])}
end
local lease = redis.call('HMGET', KEYS[1], 'owner', 'fence', 'acquired_ms')
if lease[1] then
  return {'locked', lease[1], lease[2], lease[3], redis.call('PTTL', KEYS[1]), string.format('%d', now)}
end
local fence = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'fence', fence, 'acquired_ms', string.format('%d', now))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if KEYS[3] then
  redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[3])
end
return {'granted', fence}
"""

RENEW = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# Release keeps the lease until acquired + min_hold (lockAtLeastFor), never
# extends it, and records the last run.
RELEASE = _NOW + """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return 0
end
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[2], ARGV[3])
end
local keep = tonumber(redis.call('HGET', KEYS[1], 'acquired_ms')) + tonumber(ARGV[2]) - now
if keep > 0 and keep < redis.call('PTTL', KEYS[1]) then
  redis.call('PEXPIRE', KEYS[1], keep)
elseif keep <= 0 then
  redis.call('DEL', KEYS[1])
end
return 1
"""

FORCE_RELEASE = """
local lease = redis.call('HMGET', KEYS[1], 'owner', 'fence', 'acquired_ms')
redis.call('DEL', KEYS[1])
return lease
"""


def _keys(key):
    base = "dlock:{%s}:" % key
    return base + "lease", base + "fence", base + "last"


class RedisBackend(Backend):
    name = "redis"

    def __init__(self, url, password=None, op_timeout=2.0, ca_file=None):
        if redis is None:
            raise MissingDriver("redis", "python3-redis", "redis://")
        kwargs = dict(password=password, socket_timeout=op_timeout, socket_connect_timeout=op_timeout,
                      decode_responses=True, retry_on_timeout=False, retry=Retry(NoBackoff(), 0))
        if url.startswith("rediss://"):
            # Verify the server's name too: redis-py before 5 (Debian 12 ships
            # 4.3) only checks that some certificate of the CA is presented.
            kwargs["ssl_check_hostname"] = True
            if ca_file:
                kwargs["ssl_ca_certs"] = ca_file
        self.client = redis.Redis.from_url(url, **kwargs)
        self._scripts = {}

    def _script(self, source, keys, args):
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = self.client.register_script(source)
        return self._call(script, keys=keys, args=args)

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except redis.AuthenticationError as exc:
            raise AuthError("redis: authentication failed (%s)" % exc)
        except redis.ResponseError as exc:
            if "WRONGPASS" in str(exc) or "NOAUTH" in str(exc):
                raise AuthError("redis: authentication failed (%s)" % exc)
            raise BackendError("redis: %s" % exc)
        except redis.RedisError as exc:
            raise BackendError("redis: %s" % (exc or exc.__class__.__name__))

    def server_time(self):
        seconds, micros = self._call(self.client.time)
        return seconds + micros / 1e6

    def acquire(self, key, owner, ttl, slot=None):
        for _try in range(SLOT_TRIES):
            reply = self._acquire(key, owner, ttl, slot)
            if reply[0] != "moved":
                break
            slot.number = int(reply[1])  # the server's slot: ask again for that one
        else:
            raise BackendError("redis: the slot kept moving during the grant of %s (once_per too short?)" % key)
        status = reply[0]
        if status == "granted":
            return Grant("granted", fence=int(reply[1]))
        if status == "duplicate":
            return Grant("duplicate", holder=Holder(key, owner=reply[1]))
        owner_, fence_, acquired_ms, pttl, now_ms = reply[1:6]
        return Grant("locked", holder=Holder(
            key, owner=owner_, fence=int(fence_), acquired_at=int(acquired_ms) / 1000.0,
            ttl_remaining=max(0, int(pttl)) / 1000.0, server_time=int(now_ms) / 1000.0))

    def _acquire(self, key, owner, ttl, slot):
        lease, fence, _last = _keys(key)
        keys, args = [lease, fence], [owner, lease_ms(ttl), 0]
        if slot is not None:
            keys.append("dlock:{%s}:slot:%d" % (key, slot.number))
            args[2] = lease_ms(slot.marker_ttl, "once_per marker", 1.0, 1.5 * MAX_DURATION)
            if slot.width is not None:
                args += [lease_ms(slot.width, "once_per"), slot.number]
        return self._script(ACQUIRE, keys, args)

    def renew(self, key, owner, ttl):
        return self._script(RENEW, [_keys(key)[0]], [owner, lease_ms(ttl)]) == 1

    def release(self, key, owner, min_hold=0.0, last=None):
        lease, _fence, last_key = _keys(key)
        record = json.dumps(last, sort_keys=True) if last else ""
        return self._script(RELEASE, [lease, last_key], [owner, lease_ms(min_hold, "min_hold", 0.0), record]) == 1

    def force_release(self, key):
        before = self.query(key)
        owner, _fence, _acquired = self._script(FORCE_RELEASE, [_keys(key)[0]], [])
        # Report the holder we actually removed (it may have changed since the query).
        before.owner = owner
        return before

    def query(self, key):
        lease, fence, last = _keys(key)
        pipe = self.client.pipeline(transaction=True)
        pipe.hmget(lease, "owner", "acquired_ms", "fence")
        pipe.pttl(lease)
        pipe.get(fence)
        pipe.get(last)
        pipe.time()
        (owner, acquired_ms, lease_fence), pttl, counter, last_json, (sec, usec) = self._call(pipe.execute)
        return Holder(
            key,
            owner=owner,
            fence=int(lease_fence or counter or 0),
            acquired_at=int(acquired_ms) / 1000.0 if acquired_ms else None,
            ttl_remaining=pttl / 1000.0 if owner and pttl >= 0 else None,
            last=json.loads(last_json) if last_json else None,
            server_time=sec + usec / 1e6,
        )

    def describe(self, cluster=False):
        """The one server of the URL (a lock never runs on Redis replicas)."""
        kwargs = self.client.connection_pool.connection_kwargs
        return {"backend": self.name, "member": {"endpoint": endpoint(kwargs["host"], kwargs["port"])}, "cluster": None}

    def close(self):
        self.client.close()
