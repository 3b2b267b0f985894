"""A lab job that records its run in a ledger on the backend Redis:
RPUSH dlock:lab-ledger {host, run_id, fence, start, end}.

It reads the backend password the way the runner does under systemd, from
the unit's credential, so no secret lands in a job file.
"""

import json
import os
import socket
import time

import redis

password = open(os.path.join(os.environ["CREDENTIALS_DIRECTORY"], "dlock-backend")).read().strip()
ledger = redis.Redis(host=os.environ["LEDGER_HOST"], password=password, socket_timeout=5)
start = time.time()
time.sleep(float(os.environ.get("LEDGER_WORK_SECONDS", "0.5")))
ledger.rpush("dlock:lab-ledger", json.dumps({
    "host": socket.gethostname(), "run_id": os.environ["DLOCK_RUN_ID"],
    "fence": int(os.environ["DLOCK_FENCING_TOKEN"]), "start": start, "end": time.time(),
}))
