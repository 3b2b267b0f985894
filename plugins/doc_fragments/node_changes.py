# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment(object):
    # The attributes and result of the modules that set up a backend from a node
    # (dlock_etcd_access, dlock_postgresql_access, dlock_patroni_cluster).
    DOCUMENTATION = r"""
attributes:
  check_mode:
    support: full
    description: Reads the backend as a real run does and returns the changes it would make, making none.
  diff_mode:
    support: none
    description: The changes are listed in the result's C(actions) instead.
  platform:
    support: full
    platforms: posix
    description: Runs on the node, with Python's standard library and the requirements listed.
"""
