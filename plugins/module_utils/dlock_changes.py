# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the node modules (dlock_etcd_access, dlock_postgresql_access,
dlock_patroni_cluster) share: a list of the changes they make, which check
mode only fills, and the way a failure reaches the operator."""

from __future__ import annotations


class Failure(Exception):
    """Stop, and tell the operator why."""


class Changes(object):
    """The changes a run makes, described for the operator (never a secret).
    In check mode they are described, not made."""

    def __init__(self, check):
        self.check = check
        self.actions = []

    def make(self, description, apply, *args):
        """Record a change; make it (apply(*args)) unless in check mode."""
        self.actions.append(description)
        if not self.check:
            apply(*args)

    def note(self, description):
        """Record a change that a check run cannot make, nor look further into
        (what a missing database or table would get once made)."""
        self.actions.append(description)

    @property
    def changed(self):
        return bool(self.actions)


def failure_message(prefix, exc):
    """The message the role's operator reads: PREFIX, the kind of error, what it says."""
    return "%s%s: %s" % (prefix, exc.__class__.__name__, exc)
