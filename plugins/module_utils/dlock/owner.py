"""Owner tokens: who holds a lease. The runner makes one per run, and the
Ansible module one per task run without the action plugin (which gives every
task of a playbook run the same token). A module of its own, so that the
module's payload (AnsiballZ) carries no runner, job process or metrics code."""

import binascii
import os


def hostname():
    """socket.gethostname() without importing socket (~1.5ms a start): on
    Linux gethostname(2) is the node name of uname(2)."""
    return os.uname().nodename


def operator():
    """Who pauses or breaks a lock by hand: the user (the one behind sudo,
    when there is one) at this host, as `user@host`."""
    import getpass
    return "%s@%s" % (os.environ.get("SUDO_USER") or getpass.getuser(), hostname())


def new_owner(prefix=None):
    """Owner token: who holds it (for humans) plus 96 random bits (for safety)."""
    # os.urandom is what secrets uses; importing secrets costs every run ~5ms.
    return "%s:%d:%s" % (prefix or hostname(), os.getpid(), binascii.hexlify(os.urandom(12)).decode())
