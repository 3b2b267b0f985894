"""Renews the lease every renew_every while the job runs.

Each renew runs in a short-lived worker thread bounded by op_timeout, so a
stalled connection (a frozen server keeps the TCP connection open) is
abandoned and the next attempt reconnects. Safety does not rest on this
thread: the runner kills the job at the LeaseDeadline whatever happens here.
"""

import os
import threading
from .boottime import now
from .errors import BackendError


class Heartbeat(threading.Thread):
    def __init__(self, backend, key, owner, options, deadline, wake_fd):
        threading.Thread.__init__(self, name="dlock-heartbeat")
        self.daemon = True
        self.backend = backend
        self.key = key
        self.owner = owner
        self.options = options
        self.deadline = deadline
        self.wake_fd = wake_fd
        self.lost = None  # why the lease is no longer ours, once it is not
        self.last_error = None
        self.renewals = 0
        self._stop_event = threading.Event()
        # stop() and _signal_lost() hold this: once stop() returns, this thread
        # never writes to wake_fd again, so the runner may close it (a renew in
        # flight when the job ended would otherwise write to a closed
        # descriptor, or to whatever file reused its number).
        self._stop_lock = threading.Lock()
        self._worker = None  # the last renewal's thread, which may outlive its op_timeout

    def stop(self):
        with self._stop_lock:
            self._stop_event.set()

    def wait_done(self, timeout):
        """After stop(): wait at most TIMEOUT in all for this thread and for
        its last renewal, which may still run after the loop gave up on it
        at op_timeout (a PostgreSQL commit's wait ends only at its cancel):
        a release begun meanwhile would share the backend's session with it."""
        deadline = now() + timeout
        self.join(timeout)
        worker = self._worker
        if worker is not None:
            worker.join(max(0.0, deadline - now()))

    def _renew_bounded(self):
        box = []

        def call():
            try:
                box.append(self.backend.renew(self.key, self.owner, self.options.ttl))
            except Exception as exc:  # reported to the loop, which retries or fences
                box.append(exc)

        worker = threading.Thread(target=call, name="dlock-renew")
        worker.daemon = True
        self._worker = worker
        worker.start()
        worker.join(self.options.op_timeout)
        if worker.is_alive():
            self.backend.reset()
            return BackendError("renew got no answer within op_timeout (%.3fs)" % self.options.op_timeout)
        return box[0]

    def _signal_lost(self, why):
        with self._stop_lock:
            if self._stop_event.is_set():  # the run is over: what a late renew found is not its result
                return
            self.lost = why
            os.write(self.wake_fd, b"x")

    def run(self):
        renew_every = self.options.renew_every
        retry_every = min(1.0, renew_every / 2)
        next_at = self.deadline.expires_at - self.options.ttl + renew_every
        while not self._stop_event.wait(max(0.0, next_at - now())):
            sent = now()
            outcome = self._renew_bounded()
            if outcome is True:
                self.deadline.renewed(sent)
                self.renewals += 1
                self.last_error = None
                next_at = sent + renew_every
            elif outcome is False:
                self._signal_lost("the lease is no longer ours (expired or broken)")
                return
            else:
                self.last_error = str(outcome)
                if not self.backend.lease_survives_reconnect:
                    self._signal_lost("the lock's session failed: %s" % outcome)
                    return
                # Paced from the failed try's start, not its end: a refusal
                # that came at once waits retry_every (no busy loop on a
                # member that refuses), but a try that hung for op_timeout
                # has spent that lease already, and the next goes at once.
                next_at = sent + retry_every
