#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: dlock
short_description: Take, release, inspect and break lease locks on Redis, PostgreSQL or etcd
version_added: 0.1.0
description:
  - Takes, releases, inspects and breaks the lease locks that the dlock runner uses on the fleet's
    nodes, on a Redis, PostgreSQL or etcd backend, with owner checks and fencing tokens.
  - By default the lock operation runs on the controller (the action plugin), so targets need no
    backend driver; O(run_on=target) runs it on the target instead.
  - Every task of one C(ansible-playbook) run uses the same owner token, so a lock acquired in one
    task is released by a later one, and hosts of the same run share the lock instead of waiting
    for each other.
  - With O(hold=true) the lock is held for the rest of the playbook run. A renewer process on the
    controller renews it every O(ttl)/3 while C(ansible-playbook) lives. When C(ansible-playbook)
    ends normally (success, failure or Ctrl-C) the renewer releases the lock; when the process is
    killed (C(SIGKILL), C(SIGTERM)) or crashes, the lock is not released but expires within O(ttl),
    since tasks that process had started may still be running.
  - Backend options default to the inventory variable C(dlock_backend), else, on the controller, to the
    record of the backend that C(playbooks/site.yml) provisioned (see the notes on the backend options).
author:
  - dlock.fleet developers (@dlock-fleet)
extends_documentation_fragment:
  - dlock.fleet.backend
options:
  key:
    description:
      - "Name of the lock: 1-200 characters, letters, digits and C(_ . : @ -), starting with a letter or digit."
      - The node runner's jobs use their job name as key, so this module inspects and breaks their locks too.
    type: str
    required: true
  state:
    description:
      - V(acquired) takes the lock for O(owner) (waiting up to O(wait)), or renews it when O(owner) holds it already.
      - V(released) releases it when O(owner) holds it; with O(force=true) breaks it whoever holds it.
      - V(query) reports the holder, its age, the time left on the lease and the fencing token.
    type: str
    choices: [acquired, released, query]
    default: acquired
  ttl:
    description:
      - Lifetime of the lease on the backend, counted by the backend's clock.
      - Without O(hold), the lock must be released, or re-acquired to renew it, before this runs out.
      - With O(hold), how long the lock outlives a killed C(ansible-playbook).
      - Seconds, or a duration such as V(90s), V(5m), V(1h). At least 1 second.
    type: raw
    default: 60
  wait:
    description:
      - How long to wait for a lock held by another owner, in line with the other waiters (first come, first served), woken when it is released.
      - V(0) fails at once when the lock is busy.
      - Seconds, or a duration such as V(30s), V(10m).
    type: raw
    default: 0
  force:
    description:
      - With O(state=released), break the lock whoever holds it. Needs O(reason).
      - A runner on a node whose lock is broken notices at its next renewal and stops its job.
    type: bool
    default: false
  reason:
    description:
      - Why the lock is broken; required with O(force=true) and returned in the result.
    type: str
  owner:
    description:
      - Owner token of the lock.
      - Set by the action plugin to one token per C(ansible-playbook) run
        (C(ansible@CONTROLLER:PID:RANDOM)); give it only to share a lock between runs on purpose.
    type: str
  hold:
    description:
      - With O(state=acquired), hold the lock for the rest of the playbook run (see the description).
      - Runs on the controller only; not with O(run_on=target).
      - A later task with O(state=released) releases it earlier.
    type: bool
    default: false
  run_on:
    description:
      - Where the lock operation runs.
      - V(controller) runs it in the controller's Python; the backend must be reachable from the controller.
      - V(target) runs the module on the target; the backend driver must be installed there and
        O(backend_password_file) is read there.
    type: str
    choices: [controller, target]
    default: controller
  history:
    description:
      - With O(state=query), also return the key's fleet-wide history (RV(history)), its newest this many entries,
        newest first, as C(dlock history JOB) shows it. V(0) returns none. At most V(1000).
    type: raw
    default: 0
    version_added: 0.3.0
attributes:
  check_mode:
    support: full
    description: Reports what would happen (would acquire, would wait, held by another owner) and changes nothing.
  diff_mode:
    support: full
    description: Shows the holder and fencing token of the key before and after.
  platform:
    support: full
    platforms: posix
    description: The lock operation runs on the controller, or on a POSIX target with O(run_on=target).
notes:
  - Not for V(postgresql+advisory://) and V(file://) backends when acquiring or releasing by owner, since their lock
    ends with the connection or process of the task that took it; query and force release work with them.
  - A lease lock does not give exactly-once side effects; use the returned fencing token (RV(fence)) to make
    writes idempotent.
  - The node runner C(dlock), its exit codes and the roles that install it are described in the collection's
    C(README.md), shipped with the collection.
seealso:
  - plugin: dlock.fleet.dlock_jobs
    plugin_type: filter
    description: Checks and normalises the job list that the dlock_jobs role turns into systemd timers.
"""

EXAMPLES = r"""
- name: Show who holds the nightly-report lock
  dlock.fleet.dlock:
    key: nightly-report
    state: query
    backend_url: redis://127.0.0.1:6379/0
  register: lock

- name: The last ten runs of nightly-report on every node, newest first
  dlock.fleet.dlock:
    key: nightly-report
    state: query
    history: 10
  run_once: true
  register: report_runs

- name: Fail when one of them failed
  ansible.builtin.assert:
    that: report_runs.history | selectattr('result', 'equalto', 'failed') | list | length == 0
    fail_msg: "{{ report_runs.history | selectattr('result', 'equalto', 'failed') | map(attribute='run_id') | list }}"
  run_once: true

- name: Break a stale lock, saying why
  dlock.fleet.dlock:
    key: nightly-report
    state: released
    force: true
    reason: holder crashed
    backend_url: redis://127.0.0.1:6379/0

- name: Take the lock for a schema migration, waiting up to 10 minutes for another run
  dlock.fleet.dlock:
    key: schema-migration
    ttl: 15m
    wait: 10m
  run_once: true

- name: Release it when the migration is done (same playbook run, same owner)
  dlock.fleet.dlock:
    key: schema-migration
    state: released
  run_once: true

- name: Hold a lock for the rest of this playbook run
  dlock.fleet.dlock:
    key: deploy-web
    hold: true
    ttl: 1m
    wait: 30m
  run_once: true

- name: Take the lock for the rest of the run, unless another run holds it
  dlock.fleet.dlock:
    key: deploy-web
    hold: true
  register: deploy_lock
  # Busy is not an error here; anything else (backend down, bad options) is.
  failed_when: deploy_lock is failed and not (deploy_lock.holder.held | default(false))
  run_once: true

- name: Skip the rest of the play when another run holds the lock
  ansible.builtin.meta: end_play
  when: deploy_lock.holder.held and not deploy_lock.acquired

- name: Run the lock operation on the target, with a password file there
  dlock.fleet.dlock:
    key: "backup-{{ inventory_hostname }}"
    run_on: target
    backend_url: postgresql://dlock@db.example.com/dlock
    backend_password_file: /etc/dlock/backend.password
"""

RETURN = r"""
changed:
  description: Whether the lock changed hands (acquired, released or broken), or would in check mode.
  returned: always
  type: bool
acquired:
  description: Whether O(owner) holds the lock after the task.
  returned: success
  type: bool
  sample: true
owner:
  description: The owner token the task used (one per C(ansible-playbook) run).
  returned: success
  type: str
  sample: ansible@controller.example.com:41234:2f9c7d0b6a1e4c33a8d2e1f0
fence:
  description:
    - Fencing token of the lease that O(owner) holds, else the key's latest.
    - Grows with every grant of the key; pass it to what the lock protects so it can reject stale writers.
  returned: success
  type: int
  sample: 17
ttl_remaining:
  description: Seconds left on the key's lease after the task; null when it is free or held by a session.
  returned: success
  type: float
  sample: 59.998
waited:
  description: Seconds spent waiting for the lock.
  returned: success
  type: float
  sample: 0.0
holder:
  description: The key's holder after the task.
  returned: success
  type: dict
  contains:
    key:
      description: The lock key.
      type: str
      returned: success
    held:
      description: Whether anybody holds the lock.
      type: bool
      returned: success
    owner:
      description: Owner token of the holder, null when free.
      type: str
      returned: success
    fence:
      description: Fencing token of the current or latest grant.
      type: int
      returned: success
    age:
      description: Seconds since the holder acquired the lock, null when free.
      type: float
      returned: success
    ttl_remaining:
      description: Seconds left on the lease, null when free or held by a session.
      type: float
      returned: success
    last:
      description: What the node runner recorded about the last finished run under this key (result, exit code, host).
      type: dict
      returned: success
  sample:
    key: nightly-report
    held: true
    owner: node3:5123:8c1f0e9a2b7d4c6e5f3a1b0c
    fence: 17
    age: 12.345
    ttl_remaining: 47.655
    last: null
history:
  description:
    - With O(history), the key's fleet-wide history, newest first, as the node runners wrote it (C(dlock history)).
    - Each entry has the run's C(result), C(exit_code), C(host), C(owner), C(fence), C(run_id), C(slot),
      C(started_at) and C(finished_at) (Unix time), and where they apply its C(release), the pause that skipped
      it (C(paused), C(pause_reason)), the holder that did (C(holder)), a run-now's C(manual_id) and
      C(manual_reason), C(forced), and C(unrecorded_before) (that node's entries missing before this one).
  returned: when O(history) is above 0
  type: list
  elements: dict
  sample:
    - result: success
      exit_code: 0
      host: node2
      fence: 18
      run_id: nightly-report@2026-11-29T02:00:00Z
      slot: 20421
      started_at: 1795917600.012
      finished_at: 1795917605.131
previous_holder:
  description: With O(force=true), the holder whose lock was broken (same fields as RV(holder)).
  returned: when O(force=true)
  type: dict
reason:
  description: With O(force=true), the reason given.
  returned: when O(force=true)
  type: str
  sample: holder crashed
msg:
  description: What happened, in words.
  returned: always
  type: str
  sample: acquired nightly-report (fence 17, ttl 1m)
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dlock.fleet.plugins.module_utils.dlock_args import MUTUALLY_EXCLUSIVE, REQUIRED_IF, argument_spec
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_task import LockFailed, run


def main():
    module = AnsibleModule(argument_spec=argument_spec(), mutually_exclusive=MUTUALLY_EXCLUSIVE,
                           required_if=REQUIRED_IF, supports_check_mode=True)
    if module.params["hold"]:
        module.fail_json(msg="hold: needs the controller (run_on=controller), where the renewer runs")
    try:
        result = run(module.params, check_mode=module.check_mode, diff=module._diff)
    except LockFailed as exc:
        module.fail_json(**dict(exc.result, msg=exc.msg))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
