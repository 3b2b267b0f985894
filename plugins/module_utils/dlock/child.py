"""The job's process: its own process group, killed with the runner.

The job runs in a new session so the runner can signal it and everything it
started as a group. PR_SET_PDEATHSIG makes the kernel SIGKILL the job when the
runner dies, so a crashed runner never leaves an unlocked job behind.
"""

import os
import select
import signal
import subprocess

PR_SET_PDEATHSIG = 1


def _die_with_parent():
    """preexec_fn for Popen; prctl is looked up here, before the fork."""
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None  # not Linux: systemd's cgroup kill still covers the service case
    parent_pid = os.getpid()

    def preexec():
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the runner died before prctl took effect
            os._exit(1)
    return preexec


def exit_status(returncode):
    """Shell convention: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class Child(object):
    def __init__(self, argv, env, cwd=None):
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, start_new_session=True,
                                     preexec_fn=_die_with_parent())
        self.pid = self.proc.pid
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self._pidfd = None  # Python < 3.9 or kernel < 5.3: poll instead

    def signal_group(self, signum):
        """Signal the job's whole process group; False when none of it is left."""
        try:
            os.killpg(self.pid, signum)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def wait(self, timeout, wake_fd=None):
        """The return code, or None when `timeout` passes or wake_fd becomes readable."""
        if self._pidfd is None:
            try:
                return self.proc.wait(timeout=min(timeout, 0.05))
            except subprocess.TimeoutExpired:
                return None
        fds = [self._pidfd] + ([wake_fd] if wake_fd is not None else [])
        select.select(fds, [], [], max(0.0, timeout))
        return self.proc.poll()

    def close(self):
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
