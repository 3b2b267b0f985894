"""The clock lease deadlines are judged on: CLOCK_BOOTTIME, which keeps
counting through a suspend of the machine, as a backend's TTL does
(deadline.py says why). Its own module: the backends count a lease taken
ahead on it too (an etcd waiter's spare lease), and they go to the Ansible
modules' payload, where the runner's modules do not."""

import time

try:
    _BOOTTIME = time.CLOCK_BOOTTIME

    def now():
        return time.clock_gettime(_BOOTTIME)
except AttributeError:  # not Linux
    now = time.monotonic
