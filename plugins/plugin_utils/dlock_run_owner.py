# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""The owner token that every dlock.fleet.dlock task of one ansible-playbook
run shares, so that a lock one task takes is released by a later one. It
lives in ansible-playbook's local temp dir (C.DEFAULT_LOCAL_TMP,
ansible-local-PID...), which it removes when it exits normally."""

from __future__ import annotations

import os
import secrets
import socket


def run_owner(run_dir):
    """The owner token of this ansible-playbook run, made by its first dlock task."""
    path = os.path.join(run_dir, "dlock-owner")
    if not os.path.exists(path):
        # Workers are forked by ansible-playbook: the parent pid is the run's.
        token = "ansible@%s:%d:%s" % (socket.gethostname(), os.getppid(), secrets.token_hex(12))
        tmp = "%s.%d" % (path, os.getpid())
        with open(tmp, "w") as handle:
            handle.write(token)
        try:
            os.link(tmp, path)  # atomic: the first of concurrent workers wins
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    with open(path) as handle:
        return handle.read()
