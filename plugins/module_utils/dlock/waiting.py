"""Waiting for a busy lock: a place in line, a wake-up, and a fresh try.

One implementation for the runner (`on_contention: wait`) and the Ansible
module (`wait`). A waiter:

1. tries once; a lock that is free with nobody in line is granted at once;
2. otherwise takes a ticket in the backend's queue (join_queue): a place in
   arrival order with an expiry of its own (TICKET_TTL), kept while it waits,
   so a waiter that dies leaves the line within TICKET_TTL;
3. tries again and, while refused, sleeps in wait_change until the backend
   tells it the lock or the line changed (Redis pub/sub, PostgreSQL
   LISTEN/NOTIFY, etcd watch), until the holder's lease runs out (the
   refusal says when: expiries are not announced), or at the latest after
   TICKET_REFRESH, when it renews its ticket and looks again.

The grant itself (backend.acquire) is unchanged in what it promises: it
checks the lease, the fence and the once-per slot exactly as before, and
adds only "nobody alive is ahead of you in line". A wake-up is never a
grant: it is only a reason to ask again. A ticket is only a place in line.
"""

import time

from .errors import DlockError

# A ticket lives this long unless its waiter renews it (every TICKET_REFRESH,
# leaving two renewals of slack for a slow waiter or round trip). It bounds
# how long a dead waiter can hold up the line (etcd counts whole seconds and
# lengthens leases below its minimum, about 2s, which 3s is above).
TICKET_TTL = 3.0
TICKET_REFRESH = 1.0
# Wake this long after the holder's lease could have ended on the backend
# (the refusal's ttl_remaining is counted from when the backend answered,
# which is after we sent the request: waking by it is never early by more
# than the round trip, and asking early only costs one more refusal).
EXPIRY_SLACK = 0.002


def wake_after(grant, remaining, refresh_in):
    """Seconds to wait after a refusal: until a notification, the holder's
    lease end, the next ticket renewal or the end of the wait, whichever first."""
    timeout = min(remaining, refresh_in)
    holder = grant.holder
    if holder is not None and holder.owner is not None and holder.ttl_remaining is not None:
        timeout = min(timeout, holder.ttl_remaining + EXPIRY_SLACK)
    return max(0.0, timeout)


def acquire(backend, key, owner, ttl, slot, wait, clock=time.monotonic, pauses=()):
    """(last Grant, attempts, clock time the last request was sent; a grant's
    lease_age earlier, when its lease was counting before: the lease's
    deadline is never later than the backend's expiry).

    Returns the first answer that is not "locked", or the last "locked" one
    once `wait` seconds have passed (wait 0: one try, no ticket). A lock
    held by `owner` itself is returned as "locked" at once: the caller
    decides (the module renews its own lease)."""
    started = clock()
    attempts = 1
    sent = clock()
    grant = backend.acquire(key, owner, ttl, slot, pauses)
    if grant.status != "locked" or wait <= 0 or _ours(grant, owner):
        return grant, attempts, sent - grant.lease_age
    queued, refresh_at = False, started
    try:
        while True:
            now = clock()
            if now >= started + wait:
                return grant, attempts, sent
            if now >= refresh_at:
                # Take our place, or keep it; from here on the backend tells us
                # of releases, so one that lands after the next try still wakes us.
                backend.join_queue(key, owner, TICKET_TTL)
                queued, refresh_at = True, clock() + TICKET_REFRESH
            attempts += 1
            sent = clock()
            grant = backend.acquire(key, owner, ttl, slot, pauses)
            if grant.status != "locked" or _ours(grant, owner):
                return grant, attempts, sent - grant.lease_age
            now = clock()
            backend.wait_change(key, wake_after(grant, started + wait - now, refresh_at - now))
    finally:
        if queued:
            try:
                backend.leave_queue(key, owner)
            except DlockError:
                pass  # the ticket expires by itself within TICKET_TTL


def _ours(grant, owner):
    return grant.holder is not None and grant.holder.owner == owner
