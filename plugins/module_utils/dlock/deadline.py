"""When a holder must have stopped its job, on CLOCK_BOOTTIME.

A lease granted or renewed by a request sent at local time S cannot expire
on the backend before S + ttl (the backend starts counting after it
receives the request). We keep that lower bound, less a margin for
clock-rate differences and for the scheduling of the kill, and kill the
job strictly before it:
    SIGTERM at  expires - margin - kill_grace
    SIGKILL at  expires - margin
The margin is LockOptions.margin (options.clock_margin): on Redis and
PostgreSQL, whose servers count the TTL on their wall clock, it holds
2 x max_clock_skew too, what a step of that clock can take off the lease.

The clock is CLOCK_BOOTTIME (boottime.now): it keeps counting through a
suspend of the machine, as the backend's TTL does; CLOCK_MONOTONIC
(time.monotonic() on Linux) stops then, and a deadline on it would be
passed late by the whole suspend. Any pause of the runner itself (SIGSTOP,
a frozen VM) shows on both; the runner checks the deadline again each time
it wakes (overrun()).
"""


class LeaseDeadline(object):
    def __init__(self, ttl, margin, kill_grace, sent_at):
        self.ttl = ttl
        self.margin = margin
        self.kill_grace = kill_grace
        self.expires_at = sent_at + ttl

    def renewed(self, sent_at):
        # max(): a slow reply to an older request never moves the bound back.
        self.expires_at = max(self.expires_at, sent_at + self.ttl)

    @property
    def kill_by(self):
        return self.expires_at - self.margin

    @property
    def terminate_at(self):
        return self.kill_by - self.kill_grace

    def overrun(self, at):
        """Seconds by which `at` is past the earliest moment the backend could
        have expired the lease (> 0: it could have expired), as seen here."""
        return at - self.expires_at
