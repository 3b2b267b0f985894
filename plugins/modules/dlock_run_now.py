#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: dlock_run_now
short_description: Run a dlock job once now, on whichever node of the play gets its lock first
version_added: 0.3.0
description:
  - Runs C(dlock run-now JOB --id ID) on the host, the node's runner, which runs the job once now, in the foreground,
    under its lock, in a slot of its own named by the id (C(manual:ID)), claimed in the backend's atomic grant step.
  - Run it on the job nodes. Every host of one run of the task gets the same id (the task's own, unless O(id) is
    given), so the job runs once on one of them; the others report RV(ran=false) with RV(result) C(skipped_duplicate)
    (the id already ran) or C(skipped_locked) (its run held the lock). Sent again with the same O(id), from this play
    or any node's C(dlock run-now), it does not run again for 7 days.
  - The job obeys its lock, its C(on_contention) and a pause (the backend's or the node's mirror, RV(result)
    C(skipped_paused)). With O(force) a pause does not refuse it, and it waits in line for a run that holds the lock
    (up to the job's C(wait_timeout)) rather than skip; it never runs beside another run. Its schedule is left alone.
  - The task fails when the job ran and failed (RV(exit_code) is the job's), or the runner could not ask (the
    backend unreachable, the clock unsafe, a job that is not the node's).
author:
  - dlock.fleet developers (@dlock-fleet)
options:
  job:
    description:
      - The job, by its name. The action plugin refuses a job that is not in the host's C(dlock_jobs_list), when it is
        defined (a typo would run nothing).
    type: str
    required: true
  id:
    description:
      - What makes the run happen once, however often and from wherever it is asked for; 1-100 letters, digits, C(_), C(.), C(:), C(@)
        and C(-), starting with a letter or digit.
      - Default - the task's own, the same on every host of one run of the playbook (a new one the next time it
        runs). Give one, such as a ticket, to make the task idempotent across runs of the playbook.
    type: str
  reason:
    description:
      - Why (logged with the run); required with O(force). At most 500 characters, no control characters.
    type: str
  force:
    description:
      - Run it although a pause refuses the job, and wait in line for a run that holds its lock (up to the job's
        C(wait_timeout)) rather than skip. Never beside another run.
    type: bool
    default: false
  dlock_bin:
    description:
      - The node's C(dlock) command; defaults to the host's C(dlock_runner_bin), else V(/usr/local/bin/dlock).
    type: path
attributes:
  check_mode:
    support: none
    description: A run cannot be foretold; in check mode the task is skipped and nothing runs.
  diff_mode:
    support: none
    description: A run has no before and after to show.
  platform:
    support: full
    platforms: posix
    description: Runs on the node, through its runner.
notes:
  - The job runs in the foreground of the module, as root (the job file's command, environment and directory); a long
    job keeps the task waiting. Use C(async) for one that runs longer than the connection may stay open.
seealso:
  - module: dlock.fleet.dlock_pause
"""

EXAMPLES = r"""
# In a play on the job nodes (hosts: dlock_nodes, become: true): one of them runs it.
- name: Rebuild the nightly report now
  dlock.fleet.dlock_run_now:
    job: nightly-report
    reason: "INC-4211: rebuild after the storage migration"

- name: Run the billing export once for the change, however often this playbook runs
  dlock.fleet.dlock_run_now:
    job: billing-export
    id: CHG-118
    reason: "CHG-118: export before the migration"
"""

RETURN = r"""
ran:
  description: Whether the job ran on this host (whatever its exit status).
  returned: success
  type: bool
result:
  description: The runner's result, as its log line says it - C(success), C(failed), C(skipped_duplicate),
    C(skipped_locked), C(skipped_paused), ...
  returned: always
  type: str
  sample: success
exit_code:
  description: The runner's exit status - the job's when it ran, 72 to 74 when it was skipped.
  returned: always
  type: int
id:
  description: The run's id.
  returned: always
  type: str
  sample: CHG-118
run_id:
  description: The run's C(DLOCK_RUN_ID), C(JOB@manual:ID), when it ran.
  returned: success
  type: str
  sample: billing-export@manual:CHG-118
log:
  description: The runner's log line (JSON) of the run.
  returned: always
  type: dict
stdout:
  description: What the job wrote on its standard output.
  returned: always
  type: str
msg:
  description: What happened, in words.
  returned: always
  type: str
"""

import json

from ansible.module_utils.basic import AnsibleModule

SKIPPED = {72: "skipped_paused", 73: "skipped_locked", 74: "skipped_duplicate"}

ARGUMENT_SPEC = dict(
    job=dict(type="str", required=True),
    id=dict(type="str"),
    reason=dict(type="str"),
    force=dict(type="bool", default=False),
    dlock_bin=dict(type="path"),
)


DEFAULT_BIN = "/usr/local/bin/dlock"  # the dlock_runner role's dlock_runner_bin


def command(params):
    argv = [params["dlock_bin"] or DEFAULT_BIN, "run-now", params["job"], "--id", params["id"]]
    if params.get("reason") is not None:
        argv += ["--reason", params["reason"]]
    if params.get("force"):
        argv.append("--force")
    return argv


def last_log_line(stderr):
    """The runner's JSON log line: the last line of its stderr that is one."""
    for line in reversed(stderr.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def outcome(params, rc, stdout, stderr):
    """The task's result of `dlock run-now` ending with RC."""
    log = last_log_line(stderr) or {}
    result = log.get("result")
    base = {"id": params["id"], "exit_code": rc, "result": result, "log": log, "stdout": stdout}
    if rc in SKIPPED and result == SKIPPED[rc]:
        why = log.get("refused") or log.get("pause_reason") or "its lock was held"
        return dict(base, changed=False, ran=False, msg="%s: not run here (%s): %s" % (params["job"], result, why))
    if log.get("fence") is not None:  # granted: the job ran, whatever came of it
        ran = dict(base, changed=True, ran=True, run_id=log.get("run_id"))
        if result == "success":
            return dict(ran, msg="%s ran here (%s)" % (params["job"], log.get("run_id")))
        return dict(ran, failed=True, msg="%s ran here and ended %s (exit %d)" % (params["job"], result, rc))
    errors = [line for line in stderr.splitlines() if line.startswith("dlock")]
    return dict(base, changed=False, ran=False, failed=True,
                msg="dlock run-now %s: %s (exit %d)" % (params["job"], log.get("error") or " ".join(errors)
                                                        or stderr.strip()[-500:], rc))


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=False)
    if module.params["id"] is None:
        module.fail_json(msg="id: required on the node (the action plugin gives the task's own)")
    rc, stdout, stderr = module.run_command(command(module.params))
    result = outcome(module.params, rc, stdout, stderr)
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
