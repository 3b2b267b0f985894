"""When a holder must have stopped its job, on the monotonic clock.

A lease granted or renewed by a request sent at local monotonic time S
cannot expire on the backend before S + ttl (the backend starts counting
after it receives the request). We keep that lower bound, less a margin for
clock-rate differences, and kill the job strictly before it:
    SIGTERM at  expires - margin - kill_grace
    SIGKILL at  expires - margin
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
