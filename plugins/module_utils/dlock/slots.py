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


def run_id(job, slot, width, fence):
    """DLOCK_RUN_ID: stable for one slot (job@boundary, UTC), else job#fence."""
    if slot is None:
        return "%s#%d" % (job, fence)
    boundary = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(slot * width))
    return "%s@%s" % (job, boundary)
