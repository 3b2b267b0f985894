"""A watchdog that runs an action when an operation outlives its time.

One long-lived daemon thread per watchdog, armed and disarmed around each
operation: starting a threading.Timer per call costs a thread start (some
hundreds of microseconds), as much as a whole PostgreSQL round trip.

Arming and disarming wake the thread only when they must: a wake-up is a
switch to the watchdog's thread and back, twice an operation (about a fifth
of a PostgreSQL round trip on loopback). The thread sleeps until the
earliest deadline it knows of; a later deadline (the next operation's) or a
disarm needs no wake-up: the thread finds the change when it wakes, and goes
back to sleep until the current deadline, or for good when there is none.
Only a deadline earlier than the thread's wake-up time wakes it.

An arming may have a last resort: a second action, due `grace` seconds after
the first, for an operation that the first did not end (PostgreSQL: a cancel
request that a stopped server process never acts on; then the socket is
shut down).
"""

import threading
import time

_IDLE = float("inf")


class Watchdog(object):
    """arm(timeout, action) ... disarm(): action() runs, on the watchdog's
    thread, only if disarm() did not come within timeout; with
    then=(grace, last_resort), last_resort() runs too if disarm() did not
    come within timeout + grace. One operation at a time; disarm() returns
    True when an action ran (or is running)."""

    def __init__(self, name="dlock-watchdog"):
        self._cond = threading.Condition()
        self._deadline = None
        self._action = None
        self._then = None  # (grace, last_resort) of the current arming
        self._arming = 0  # counts armings and disarmings: a stage is for its own arming only
        self._fired = False
        self._name = name
        self._thread = None
        self._wakes_at = _IDLE  # when the thread wakes by itself (monotonic)

    def arm(self, timeout, action, then=None):
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._deadline = time.monotonic() + timeout
            self._action, self._then = action, then
            self._arming += 1
            self._fired = False
            if self._deadline < self._wakes_at:
                self._cond.notify()

    def disarm(self):
        with self._cond:
            self._deadline = None
            self._action = self._then = None
            self._arming += 1
            return self._fired

    def _loop(self):
        while True:
            with self._cond:
                if self._deadline is None:
                    self._wakes_at = _IDLE
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._wakes_at = self._deadline
                    self._cond.wait(left)
                    continue
                action, then, arming, due = self._action, self._then, self._arming, self._deadline
                self._deadline = self._action = self._then = None
                self._fired = True
            action()  # outside the lock: a slow action never holds up disarm()
            if then is not None:
                with self._cond:
                    if self._arming == arming:  # neither disarmed nor armed again meanwhile
                        grace, last_resort = then
                        self._deadline, self._action = due + grace, last_resort
