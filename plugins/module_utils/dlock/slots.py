"""Once-per slots.

Slot N of width W is the window [N*W - lead, (N+1)*W - lead) on the backend's
clock: it opens `lead` before its boundary (N*W seconds since the Unix epoch,
UTC) and closes `lead` before the next one. `lead` is the job's
max_clock_skew, at most W/2 (slot_lead): a node whose clock is ahead fires
for a boundary up to that early on the backend's clock, and the runner
refuses a node further ahead. Everything that only delays a run (randomized
delay, timer accuracy, a clock behind, the runner's start, a loaded node)
then has the rest of the slot, W - lead, before the next slot's window opens.

A window centred on the boundary (lead W/2) would give a late runner only W/2,
after which it claimed the next slot, and would let a firing in the second
half of a slot (a timer restarted mid-slot fires at once) run the next slot
early, so that the nodes firing on its boundary found it done.
"""

import binascii
import hashlib
import math
import os
import time

# A grant whose slot is decided on the backend's clock asks again, with the
# backend's slot, when the caller's estimate was another; twice suffices
# unless a window edge passes in between, which a slot of 1s or more allows
# at most once more.
SLOT_TRIES = 3


def slot_lead(width, max_clock_skew):
    """How long before its boundary a slot's window opens (module docstring)."""
    return min(width / 2.0, max_clock_skew)


# How far past a window's edge a backend may still grant the slot, by scheme:
# etcd judges the window from the Date header of its answer, whole seconds
# (etcd_grant._in_window); Redis and PostgreSQL compare on their clock to the
# millisecond, the file backend on the host's. Not known: the most.
COARSE_CLOCK_SCHEMES = ("etcd", "etcd+https")


def edge_uncertainty(scheme):
    return 1.0 if scheme is None or scheme in COARSE_CLOCK_SCHEMES else 0.0


def slot_number(server_now, width, lead=0.0):
    """Number of the slot whose window holds `server_now` (backend seconds).
    The grant scripts and statements write the same rule: Redis's ACQUIRE,
    PostgreSQL's CLAIM_SLOT and RERUN_SLOT."""
    return int(math.floor((server_now + lead) / width))


def marker_ttl(width, catch_up_window=None):
    """How long the slot marker lives: past the end of the window it can be
    claimed in (a claim as the window opens needs W; half a slot spare).
    With a catch-up window (options.check_catch_up), until no catch-up can
    ask for the slot any more, its end `window` ago: window + 1.5 W from
    its claim (which is at most lead, W/2, before its boundary), so a slot
    that ran is never caught up (its marker refuses)."""
    if catch_up_window is None:
        return 1.5 * width
    return catch_up_window + 1.5 * width


def boundary(slot, width):
    """The slot's boundary as run ids and `dlock run --rerun` write it (UTC)."""
    return time.strftime(BOUNDARY_FORMAT, time.gmtime(slot * width))


BOUNDARY_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def run_id(job, slot, width, fence, manual=None):
    """DLOCK_RUN_ID: job@manual:ID for a run asked for by hand, stable for
    one slot (job@boundary, UTC), else job#fence."""
    if manual is not None:
        return "%s@manual:%s" % (job, manual)
    if slot is None:
        return "%s#%d" % (job, fence)
    return "%s@%s" % (job, boundary(slot, width))


# A run asked for by hand (`dlock run-now`) claims a slot of its own, named by
# its id, through the same once-per marker as a schedule's slot, so that it
# runs once whichever nodes send it and however often. Its number is below
# every schedule's slot (those count from 1970, >= 0): minus 1 minus 60 bits
# of the id's SHA-256, so ids do not meet by chance (2**-60), and the backends
# keep it as they keep any slot (a marker key, a bigint row). Its marker lives
# MANUAL_MARKER_TTL: the id runs once within that.
MANUAL_MARKER_TTL = 7 * 86400.0


def manual_slot_number(manual):
    return -1 - int(hashlib.sha256(manual.encode("utf-8")).hexdigest()[:15], 16)


def new_manual_id():
    """A run id for `dlock run-now` without --id: when, and 32 random bits."""
    return "%s-%s" % (time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()), binascii.hexlify(os.urandom(4)).decode())


# What a slot marker holds: the owner token of the grant that claimed the
# slot (its run still going, or its runner died before the release), or,
# once the release of that run recorded its result, DONE or FAILED before
# that owner. Only DONE ends the slot for good: any other marker may be
# rerun (`dlock run --rerun`), a grant that sets the marker to its own owner.
# The prefixes end in a space, which no owner token starts with: a runner's
# begins with its host name (owner.new_owner), and a host named "done"
# would make "done:" ambiguous (its bare owner would read as a success).
DONE = "done "
FAILED = "failed "


def outcome_marker(owner, result):
    """The marker a release writes for a run of `owner` that ended with `result`."""
    return (DONE if result == "success" else FAILED) + owner


def marker_owner(value):
    """The owner token a marker names, whatever outcome it records."""
    for prefix in (DONE, FAILED):
        if value.startswith(prefix):
            return value[len(prefix):]
    return value


def marker_succeeded(value):
    return value.startswith(DONE)
