"""Pauses kept as files: the file:// backend's, and each node's mirror of
the fleet's pauses (docs/runner.md, Pausing).

A pause of scope S (backends.pause_scopes) is the file S.pause in its
directory (job:KEY.pause, group:NAME.pause, all.pause), holding the pause's
record (base.Pause.as_record), replaced atomically.

The mirror: the backend keeps the fleet's pauses and refuses paused grants
itself, on its clock. dlock.fleet.dlock_pause (and `dlock pause` on the node
it runs on) also writes each pause it makes to every node's pauses_dir, and
removes it there when it ends it. A run refuses when either says paused, so
a backend restarted empty, or restored from a backup older than the pause,
cannot resume the fleet in silence; `dlock status` and the metric
dlock_pause_mirror_only show a pause only the nodes still hold. A mirrored
pause ends at its `until` on the node's clock (synchronised with the
backend's: clock.py refuses runs past max_clock_skew), and only ever adds a
refusal: a node never grants from it.
"""

import os

from .backends.base import live_pause, pause_path
from .safefile import read_regular, replace_file

DEFAULT_PAUSES_DIR = "/var/lib/dlock/pauses"


def mirrored_pauses(directory, scopes):
    """The live pauses of `scopes` in the mirror `directory`, in the order of
    scopes. ConfigError for a file there that is not a regular file (a link,
    a FIFO) or cannot be read: nothing but the module writes there, and a
    run must not guess."""
    pauses = []
    for scope in scopes:
        path = pause_path(directory, scope)
        try:
            text = read_regular(path, "pause mirror", follow=False)
        except FileNotFoundError:
            continue
        pause = live_pause(path, scope, text)
        if pause is not None:
            pauses.append(pause)
    return pauses


def mirror_pause(directory, pause):
    """Write `pause` (the backend's record of it) to the mirror; OSError when
    it cannot be."""
    replace_file(pause_path(directory, pause.scope), pause.as_record(), mode=0o644, durable=True)


def unmirror_pause(directory, scope):
    """Remove the mirror's pause of `scope`; True when there was one."""
    try:
        os.unlink(pause_path(directory, scope))
    except FileNotFoundError:
        return False
    return True
