#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: dlock_pause
short_description: Pause and resume the runs of dlock jobs across the fleet
version_added: 0.3.0
description:
  - Pauses the runs of a job, of a group of jobs, or of every job, on every node at once, until a set end; or
    ends such a pause. It is C(dlock pause) and C(dlock resume) as a task.
  - The pause is kept by the lock backend, which refuses the paused jobs' grants itself, in the grant's atomic
    step, on its own clock, whichever node asks; a refused run exits 72 and logs C(skipped_paused) with the
    pause's reason. The backend ends the pause at its end by itself.
  - Runs on the controller (the action plugin), like M(dlock.fleet.dlock); the backend options default to the
    inventory variable C(dlock_backend), else to the record of the backend that C(playbooks/site.yml) provisioned.
  - Run it on the job nodes (without C(run_once)). The pause is made in the backend once per run of the task, by
    the first host that gets there (its end, from O(until), is one for the fleet; the other hosts report its result
    with RV(made_here=false)); then each host writes the pause to its mirror (O(mirror)), or removes it there.
  - The mirror makes a pause outlive the backend's copy of it. A node refuses a paused run when either the backend
    or its mirror says paused, so a backend restarted empty, or restored from a backup older than the pause, does
    not resume the fleet in silence; C(dlock status) and the metric C(dlock_pause_mirror_only) (alert
    C(DlockPauseLostByBackend)) show a pause only the nodes still hold. A mirrored pause ends at its O(until) on the
    node's clock, which C(dlock run) keeps within C(max_clock_skew) of the backend's.
  - O(job) and O(group) are looked up in the host's C(dlock_jobs_list), the job list of the C(dlock_jobs) role.
    A job that is not in it, or a group that no job of it is in, is refused as a typo.
author:
  - dlock.fleet developers (@dlock-fleet)
extends_documentation_fragment:
  - dlock.fleet.backend
options:
  job:
    description:
      - The job whose runs to pause or resume, by its name in C(dlock_jobs_list); its lock key is its C(key), else
        its name.
      - Exactly one of O(job), O(key), O(group) and O(all=true).
    type: str
  key:
    description:
      - The lock key whose grants to pause or resume, whatever job uses it.
    type: str
  group:
    description:
      - The group of jobs to pause or resume, the jobs whose C(groups) list names it.
    type: str
  all:
    description:
      - Pause or resume every lock of the backend, whatever its job.
    type: bool
    default: false
  state:
    description:
      - V(paused) makes the pause, or replaces a live one whose reason or end differ; an identical live pause
        (the same reason, an end within 2 seconds) is left alone.
      - V(resumed) ends the live pause of the scope, if there is one. A job paused by several scopes (its own,
        a group's, all) runs again only once each has ended.
    type: str
    choices: [paused, resumed]
    default: paused
  reason:
    description:
      - Why; required with O(state=paused). At most 500 characters, no control characters. Every run the pause
        refuses logs it.
    type: str
  until:
    description:
      - When the pause ends, required with O(state=paused), on the backend's clock.
      - A duration from now, such as V(90m) or V(2h) (a number is seconds), at most V(30d); a task run again
        later asks for a later end, and so changes the pause. Or a UTC moment, V(2026-11-27T05:00:00Z), at most
        30 days ahead; run again, the task changes nothing. Unquoted, YAML reads the moment as a timestamp, which
        is taken as the same moment; a timestamp that is not in UTC is refused.
    type: raw
  drain:
    description:
      - The runs going on when the pause is made.
      - V(wait) lets them finish.
      - V(kill) breaks their locks once the pause is written, so that each runner kills its job at its next
        renewal, before its lease could expire; the lock keys are the job's, or those of the jobs of
        C(dlock_jobs_list) in the group (all of them with O(all=true)). A C(file://) lock cannot be broken;
        the task then fails, naming it, with the pause made.
    type: str
    choices: [wait, kill]
    default: wait
  drain_keys:
    description:
      - Set by the action plugin from C(dlock_jobs_list) with O(drain=kill); give it only when the module runs
        without it.
    type: list
    elements: str
  mirror:
    description:
      - Write the pause to the mirror of the host the task runs for, with M(dlock.fleet.dlock_files) (the backend's
        record of it, mode 0644, in O(pauses_dir)), or, with O(state=resumed), remove it there.
      - V(false) for a host with no runner, such as the controller.
    type: bool
    default: true
  pauses_dir:
    description:
      - The host's mirror directory; defaults to the host's C(dlock_runner_pauses_dir), else
        V(/var/lib/dlock/pauses), what the C(dlock_runner) role sets up and C(dlock run) reads.
      - An absolute path, looked at on the host before the pause is made or ended; one that is there and is not
        a directory (a file, a FIFO) fails the task with nothing written.
    type: path
attributes:
  check_mode:
    support: full
    description: Reports the pause it would make or end, the runs it would drain and the mirror it would write, and
      changes nothing.
  diff_mode:
    support: full
    description: The pause before and after (its end, reason and author), on the host that made it, and the host's
      mirror file.
  platform:
    support: full
    platforms: posix
    description: Runs on the controller; writes the mirror on the host.
notes:
  - Runners of a release before pauses ignore them; upgrade every node's runner first.
  - The M(dlock.fleet.dlock) module's locks do not read pauses, so a playbook may take a paused job's lock for
    the maintenance the pause is for.
seealso:
  - module: dlock.fleet.dlock
"""

EXAMPLES = r"""
# In a play on the job nodes (hosts: dlock_nodes, become: true): the pause is
# made once, and mirrored on every node.
- name: Pause the billing jobs on every node for the ledger migration
  dlock.fleet.dlock_pause:
    group: billing
    reason: "CHG-118: ledger migration"
    until: 2026-11-27T05:00:00Z

- name: Pause one job for two hours, and stop its run going on
  dlock.fleet.dlock_pause:
    job: nightly-report
    reason: "INC-4211: storage migration"
    until: 2h
    drain: kill

- name: Resume it, in the backend and in every node's mirror
  dlock.fleet.dlock_pause:
    job: nightly-report
    state: resumed

- name: Freeze every job during a failover drill, from the controller alone (no node's mirror)
  dlock.fleet.dlock_pause:
    all: true
    reason: DC failover drill
    until: 30m
    mirror: false
  run_once: true
"""

RETURN = r"""
changed:
  description: Whether the pause was made, replaced or ended, a run drained, or the host's mirror changed (or would
    be, in check mode).
  returned: always
  type: bool
scope:
  description: What the pause covers, as the backend and the runners' logs name it.
  returned: success
  type: str
  sample: group:billing
paused:
  description: The pause after the task, null when there is none.
  returned: success
  type: dict
  contains:
    scope:
      description: What it covers.
      type: str
      returned: success
    reason:
      description: Why.
      type: str
      returned: success
    until:
      description: When it ends, Unix time on the backend's clock.
      type: float
      returned: success
    until_utc:
      description: When it ends, in UTC.
      type: str
      returned: success
    by:
      description: Who made it (C(user@host)).
      type: str
      returned: success
    at:
      description: When it was made, Unix time on the backend's clock.
      type: float
      returned: success
  sample:
    scope: group:billing
    reason: "CHG-118: ledger migration"
    until: 1795755600.0
    until_utc: "2026-11-27T05:00:00Z"
    by: ops@bastion
    at: 1795748400.5
previous:
  description: The pause before the task (same fields as RV(paused)), null when there was none.
  returned: success
  type: dict
made_here:
  description: Whether this host made the pause (or ended it) in the backend; false on the task's other hosts, which
    report that host's result (RV(changed) then says whether their mirror changed).
  returned: success
  type: bool
mirror:
  description: This host's mirror file of the pause (with O(mirror=true)), its C(path) and whether it C(changed).
  returned: success
  type: dict
  sample:
    path: /var/lib/dlock/pauses/group:billing.pause
    changed: true
drained:
  description: The runs whose locks were broken (O(drain=kill)), each with its C(key), C(previous_owner) and C(fence).
  returned: success
  type: list
  elements: dict
msg:
  description: What happened, in words.
  returned: always
  type: str
  sample: "paused group:billing until 2026-11-27T05:00:00Z: CHG-118: ledger migration"
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dlock.fleet.plugins.module_utils.dlock_args import MUTUALLY_EXCLUSIVE
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_pause_task import argument_spec, run
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_task import LockFailed


def main():
    module = AnsibleModule(argument_spec=argument_spec(), mutually_exclusive=MUTUALLY_EXCLUSIVE,
                           supports_check_mode=True)
    try:
        result = run(module.params, check_mode=module.check_mode, diff=module._diff)
    except LockFailed as exc:
        module.fail_json(**dict(exc.result, msg=exc.msg))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
