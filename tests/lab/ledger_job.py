"""A lab job that records its run in the node's journal: a line
LEDGER_START {host, owner, run_id, slot, fence, start} as it starts, then
LEDGER {the same, and end} when its work (LEDGER_WORK_SECONDS) is done.

The start line is flushed at once, so a run that is killed before its end
(a runner that lost its lease) still shows it began; the runner's own log
line then bounds its end. The nodes share the host's kernel clock, so the
test can merge every node's lines into one timeline, whatever the lock
backend is.
"""

import json
import os
import socket
import sys
import time

start = time.time()
run_id = os.environ["DLOCK_RUN_ID"]
record = {
    "host": socket.gethostname(), "owner": os.environ["DLOCK_OWNER"], "run_id": run_id,
    # With once_per the run id is JOB@BOUNDARY: the slot; else JOB#FENCE.
    "slot": run_id.split("@", 1)[1] if "@" in run_id else None,
    "fence": int(os.environ["DLOCK_FENCING_TOKEN"]), "start": start,
}
sys.stdout.write("LEDGER_START " + json.dumps(record) + "\n")
sys.stdout.flush()
time.sleep(float(os.environ.get("LEDGER_WORK_SECONDS", "0.5")))
record["end"] = time.time()
sys.stdout.write("LEDGER " + json.dumps(record) + "\n")
