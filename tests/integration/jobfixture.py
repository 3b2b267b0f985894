"""Jobs the runner tests run as the child process (`python jobfixture.py MODE ...`).

  interval LEDGER SECONDS   append {"start","end","fence","run_id"} after sleeping SECONDS
  beat FILE                 append the wall time every 20ms until killed
  fenced LEDGER             every 50ms try a write to a fencing-token ledger until killed
  env FILE                  dump the DLOCK_* environment as JSON
  trap FILE                 write "ready" to FILE once its handler is set; on SIGTERM write "TERM" to FILE
                            and exit 0 after 0.2s
  stubborn FILE             append {"pid", "t"} every 20ms and {"term": t} on each SIGTERM, until SIGKILLed
  phases FILE SECONDS       append {"phase": "start"}, sleep SECONDS, append {"phase": "end"}, exit 0
  pidbeat FILE              append {"pid", "t"} every 20ms until killed (a process of a job's tree)
"""

import fcntl
import json
import os
import signal
import sys
import time


def append(path, record):
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write(json.dumps(record) + "\n")
        handle.flush()


def fenced_write(path, token, writer):
    """A resource that rejects stale writers: it remembers the highest token seen."""
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        seen = [json.loads(line) for line in handle if line.strip()]
        highest = max([r["token"] for r in seen if r["accepted"]] or [0])
        accepted = token >= highest
        handle.write(json.dumps({"token": token, "writer": writer, "accepted": accepted, "t": time.time()}) + "\n")


def main(mode, path, *rest):
    fence = int(os.environ.get("DLOCK_FENCING_TOKEN") or 0)
    if mode == "interval":
        start = time.time()
        time.sleep(float(rest[0]))
        append(path, {"start": start, "end": time.time(), "fence": fence, "run_id": os.environ.get("DLOCK_RUN_ID"),
                      "pid": os.getpid()})
    elif mode == "until":
        # Ends once `path` holds a line, which a process started beside this
        # one writes: a wait on that fact, bounded, never a guess of how long
        # that process takes to start (exit 1 past the bound).
        deadline = time.time() + float(rest[0])
        while not (os.path.exists(path) and os.path.getsize(path) > 0):
            if time.time() > deadline:
                sys.exit(1)
            time.sleep(0.01)
    elif mode == "beat":
        while True:
            append(path, {"t": time.time()})
            time.sleep(0.02)
    elif mode == "phases":
        append(path, {"phase": "start", "pid": os.getpid()})
        time.sleep(float(rest[0]))
        append(path, {"phase": "end", "pid": os.getpid()})
    elif mode == "pidbeat":
        while True:
            append(path, {"pid": os.getpid(), "t": time.time()})
            time.sleep(0.02)
    elif mode == "fenced":
        while True:
            fenced_write(path, fence, os.environ.get("DLOCK_OWNER"))
            time.sleep(0.05)
    elif mode == "env":
        with open(path, "w") as handle:
            json.dump(dict((k, v) for k, v in os.environ.items() if k.startswith(("DLOCK_", "JOBVAR"))), handle)
    elif mode == "trap":
        def on_term(_signum, _frame):
            with open(path, "w") as handle:
                handle.write("TERM")
            time.sleep(0.2)
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        with open(path, "w") as handle:  # a test's cue: a SIGTERM from now on is handled
            handle.write("ready")
        while True:
            time.sleep(0.05)
    elif mode == "stubborn":
        # Written by the loop: the handler appending itself could wait for
        # ever on the ledger's flock, held by the append it interrupted.
        terms = []
        signal.signal(signal.SIGTERM, lambda _signum, _frame: terms.append(time.time()))
        while True:
            append(path, {"pid": os.getpid(), "t": time.time()})
            while terms:
                append(path, {"term": terms.pop(0)})
            time.sleep(0.02)


if __name__ == "__main__":
    main(*sys.argv[1:])
