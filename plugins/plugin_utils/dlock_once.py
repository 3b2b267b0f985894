# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""One operation per run of a task, whichever of its hosts comes first.

An action plugin runs once per host, each in a worker process forked from
ansible-playbook. dlock.fleet.dlock_pause runs on every job node, to write
each node's mirror of the pause, but must make the pause in the backend once:
its `until: 2h` must mean one end for the whole fleet, and drain=kill must
break each lock once. The workers share the controller's per-run temporary
directory (DEFAULT_LOCAL_TMP, made by ansible-playbook before it forks, and
removed when it exits), and the task's uuid, the same for every host of one
run of the task (a new one each time the playbook runs). So the first worker
takes an flock on a file named by both, does the operation and writes its
result there; the others wait on the flock and read it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os

from ansible import constants as C

MAX_RESULT_BYTES = 16 * 1024 * 1024


def once_per_task(task, identity, operation):
    """(operation()'s result, True) for the first host of this run of `task`
    that asks with `identity` (what the operation is: its scope and values,
    made JSON with str() for what JSON has no type for); (the same result,
    False) for every other host that asks the same. The result must be
    JSON-serialisable. A failed operation (it raised) is not kept: the next
    host tries it again, and reports its own error."""
    name = json.dumps([task._uuid, identity], sort_keys=True, default=str)
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()
    path = os.path.join(C.DEFAULT_LOCAL_TMP, "dlock-once-%s.json" % digest[:40])
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "r+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        kept = handle.read(MAX_RESULT_BYTES + 1)
        if kept:
            if len(kept) > MAX_RESULT_BYTES:
                raise ValueError("%s: a kept result above %d bytes" % (path, MAX_RESULT_BYTES))
            return json.loads(kept.decode("utf-8")), False
        result = operation()
        handle.write(json.dumps(result).encode("utf-8"))
        return result, True
