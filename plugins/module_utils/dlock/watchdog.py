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
"""

import threading
import time

_IDLE = float("inf")


class Watchdog(object):
    """arm(timeout, action) ... disarm(): action() runs, on the watchdog's
    thread, only if disarm() did not come within timeout. One operation at a
    time; disarm() returns True when the action ran (or is running)."""

    def __init__(self, name="dlock-watchdog"):
        self._cond = threading.Condition()
        self._deadline = None
        self._action = None
        self._fired = False
        self._name = name
        self._thread = None
        self._wakes_at = _IDLE  # when the thread wakes by itself (monotonic)

    def arm(self, timeout, action):
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._deadline = time.monotonic() + timeout
            self._action = action
            self._fired = False
            if self._deadline < self._wakes_at:
                self._cond.notify()

    def disarm(self):
        with self._cond:
            self._deadline = None
            self._action = None
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
                action, self._deadline, self._action = self._action, None, None
                self._fired = True
            action()  # outside the lock: a slow action never holds up disarm()
