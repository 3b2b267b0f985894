# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment(object):
    # Backend connection options, shared by everything that talks to a lock backend.
    DOCUMENTATION = r"""
options:
  backend_url:
    description:
      - URL of the lock backend.
      - V(redis://[user@]host[:port][/db]), V(rediss://...) (TLS), V(postgresql://user@host/db)
        (lease table), V(postgresql+advisory://...) (session advisory locks),
        V(etcd://[user@]host1:2379[,host2:2379,...][/prefix]), V(etcd+https://...) (TLS) or V(file:///dir).
      - Never put a password in the URL; use O(backend_password) or O(backend_password_file).
      - Defaults to C(url) of the inventory variable C(dlock_backend).
    type: str
  backend_password:
    description:
      - Password of the backend user.
      - Defaults to C(password) of the inventory variable C(dlock_backend).
      - Never shown in results, diffs, warnings or logs.
    type: str
  backend_password_file:
    description:
      - File holding the backend password (one line), read on the host that runs the lock
        operation, the controller unless M(dlock.fleet.dlock) runs on the target (C(run_on=target)).
      - Defaults to C(password_file) of the inventory variable C(dlock_backend).
    type: path
  ca_file:
    description:
      - CA bundle to verify the backend's TLS certificate (V(rediss://), V(etcd+https://), PostgreSQL
        C(sslmode=verify-full)).
      - Defaults to C(ca_file) of the inventory variable C(dlock_backend).
    type: path
  op_timeout:
    description:
      - Bound of one backend call (connect, query).
      - Seconds, or a duration such as V(500ms) or V(5s).
      - Defaults to C(op_timeout) of the inventory variable C(dlock_backend), else V(2).
    type: raw
    default: 2
  fence_epoch:
    description:
      - Fence epoch of the backend, as the nodes' C(fence_epoch) in C(dlock.json) (C(dlock_fence_epoch) of
        C(playbooks/site.yml)). Every fence is O(fence_epoch) * 2**40 plus the backend's counter, so that a
        fleet switched to a new backend with the epoch one higher hands out fences above all of the old one's.
      - A whole number from V(0) to V(8191), 2**13 - 1, so that every fence stays below 2**53.
      - Defaults to C(fence_epoch) of the inventory variable C(dlock_backend) (or of the record of
        C(playbooks/site.yml) when the backend comes from it), else V(0).
    type: raw
    default: 0
notes:
  - The backend options can be set once for a group of hosts in the inventory variable C(dlock_backend),
    a mapping with the keys C(url), C(password), C(password_file), C(ca_file), C(op_timeout) and C(fence_epoch)
    (or a plain URL string). Options given on the task override it field by field; a password or
    password file on the task replaces both of them.
  - When neither the task nor C(dlock_backend) gives a URL, a task run on the controller uses the record of
    the backend that C(playbooks/site.yml) provisioned (C(dlock_backend_type)), which it writes in
    C(credentials/dlock-backend.json) beside the inventory of the first host of the group C(dlock_backend).
    Its C(url), C(password_file), C(ca_file) and C(fence_epoch) are filled in as C(dlock_backend)'s are. A password given to
    C(site.yml) as a variable is written nowhere; give it as C(password) of C(dlock_backend) then.
  - The backend's driver (see the requirements) is needed on the host that runs the lock operation, the
    controller unless M(dlock.fleet.dlock) runs on the target (C(run_on=target)), and only the one of the backend
    in use. V(redis://), V(rediss://), V(etcd://) and V(etcd+https://) need none, as the engine speaks their
    protocols with the standard library.
# ansible-doc joins the requirements with commas: each is a phrase, not a sentence.
requirements:
  - psycopg >= 3.1 (Python package) for V(postgresql://) and V(postgresql+advisory://)
"""
