"""Once-per slots.

A slot of width W is the window of width W centred on a boundary (multiples
of W since the Unix epoch, UTC, on the backend's clock). Timers that fire on
a boundary land in the same slot as long as randomized delay + clock skew
stay below W/2, whichever side of the boundary each node's clock is on.
"""

import math
import time

# A grant whose slot is decided on the backend's clock asks again, with the
# backend's slot, when the caller's estimate was another; twice suffices
# unless a window edge passes in between, which a slot of 1s or more allows
# at most once more.
SLOT_TRIES = 3


def slot_number(server_now, width):
    """Number of the slot holding `server_now`: the nearest boundary / width."""
    return int(math.floor(server_now / width + 0.5))


def marker_ttl(width):
    """How long the slot marker lives: past the end of any window it can be
    claimed from (a claim at the window's start needs W; half a slot spare)."""
    return 1.5 * width


def boundary(slot, width):
    """The slot's boundary as run ids and `dlock run --rerun` write it (UTC)."""
    return time.strftime(BOUNDARY_FORMAT, time.gmtime(slot * width))


BOUNDARY_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def run_id(job, slot, width, fence):
    """DLOCK_RUN_ID: stable for one slot (job@boundary, UTC), else job#fence."""
    if slot is None:
        return "%s#%d" % (job, fence)
    return "%s@%s" % (job, boundary(slot, width))


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
