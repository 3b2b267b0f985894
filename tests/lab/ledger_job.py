"""A lab job that records its run in the node's journal: one line
LEDGER {host, run_id, fence, start, end} on stdout.

The nodes share the host's kernel clock, so the test can merge every node's
lines into one timeline, whatever the lock backend is.
"""

import json
import os
import socket
import sys
import time

start = time.time()
time.sleep(float(os.environ.get("LEDGER_WORK_SECONDS", "0.5")))
sys.stdout.write("LEDGER " + json.dumps({
    "host": socket.gethostname(), "run_id": os.environ["DLOCK_RUN_ID"],
    "fence": int(os.environ["DLOCK_FENCING_TOKEN"]), "start": start, "end": time.time(),
}) + "\n")
