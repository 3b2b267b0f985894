#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: dlock_job_units
short_description: Write a node's dlock jobs, their units and timers, in one call
version_added: 0.3.0
description:
  - Writes every job of the C(dlock.fleet.dlock_jobs) role on a node in one call - the job file
    (O(jobs_dir)/NAME.json), the service unit and the timer unit (O(unit_dir)/dlock-NAME.service and .timer)
    of each present job - and removes the three files of each job of O(jobs) with C(state=absent), after
    stopping and disabling its timer.
  - Validates O(jobs) with the same rules as the filter C(dlock.fleet.dlock_jobs) (the role's preflight). A bad entry
    fails the module with the entry and its field named, and nothing is written.
  - Writes only a file whose content, owner, group or mode differ, through a new file in the same
    directory renamed over the old one (a reader sees the old file or the new one). Job files are
    C(root:)O(group) C(0640), units C(root:root) C(0644). A present job's path that holds anything but a regular
    file (a FIFO, a link, a directory) fails the module, naming it; a removed job's is removed whatever it is, but for a directory, which fails the module.
  - Fails, naming it, when O(runner_bin) is not there, except in check mode. Every unit runs it, and the
    C(dlock.fleet.dlock_runner) role installs it.
  - Reloads systemd once when a unit file was written or removed (where systemd runs).
  - With O(timers=started), enables and starts the timers of the present jobs that are not enabled and active
    (their states read in one C(systemctl show), the timers started in one C(systemctl enable --now)).
  - Systemd runs when C(/run/systemd/system) exists; elsewhere (a container, a chroot) no timer is stopped or
    started and systemd is not reloaded.
author:
  - dlock.fleet developers (@dlock-fleet)
options:
  jobs:
    description:
      - The job list, as the role's C(dlock_jobs_list) has it (see C(ansible-doc -t role dlock.fleet.dlock_jobs)).
    type: raw
    required: true
  runner_defaults:
    description:
      - The runners' lock options (C(dlock_runner_defaults)), under which each job's own are checked.
    type: raw
    default: {}
  backend_url:
    description:
      - The runners' backend URL; its scheme decides the timing rule. Empty when not known (the stricter rule).
    type: str
    default: ''
  randomized_delay:
    description:
      - A job's timer's C(RandomizedDelaySec) unless the job sets C(randomized_delay).
    type: raw
    default: 0
  accuracy:
    description:
      - A job's timer's C(AccuracySec) unless the job sets C(accuracy).
    type: raw
    default: 1s
  persistent:
    description:
      - A job's timer's C(Persistent) unless the job sets C(persistent).
    type: raw
    default: false
  user:
    description:
      - The user a job runs as unless the job sets C(user).
    type: raw
    default: root
  hardening:
    description:
      - Whether the service units are sandboxed, unless the job sets C(hardening).
    type: raw
    default: true
  runner_bin:
    description:
      - The runner's path, which each service unit runs. It must exist, except in check mode.
    type: raw
    default: /usr/local/bin/dlock
  jobs_dir:
    description:
      - Where the job files go.
    type: raw
    default: /etc/dlock/jobs
  unit_dir:
    description:
      - Where the units go.
    type: raw
    default: /etc/systemd/system
  group:
    description:
      - The runners' group, the group of the job files and a supplementary group of every job.
      - It must exist (the C(dlock.fleet.dlock_runner) role creates it), except in check mode, where the job files
        are then compared without it.
    type: raw
    default: dlock
  password_path:
    description:
      - The backend's password file; the service units load it as credential C(dlock-backend) when it exists.
    type: raw
    default: /etc/dlock/backend.password
  metrics_dir:
    description:
      - The metrics directory, which a sandboxed job may write to. Empty for none.
    type: raw
    default: /var/lib/prometheus/node-exporter
  managed:
    description:
      - The first line of each unit, after C(# ).
    type: str
    default: Ansible managed
  write:
    description:
      - Write the present jobs' files, and stop the timers of and remove the files of the absent ones.
      - V(false) for a call that only starts timers (O(timers=started)).
    type: bool
    default: true
  timers:
    description:
      - V(started) - enable and start the present jobs' timers that are not enabled and active. In check mode a
        timer whose unit does not exist yet is reported as one that would be started.
      - V(unchanged) - leave the present jobs' timers as they are.
    type: str
    choices: [started, unchanged]
    default: unchanged
attributes:
  check_mode:
    support: full
    description: Compares every file and reads the timers' states as a real run does; writes, removes, stops and starts
      nothing.
  diff_mode:
    support: full
    description: Each file written or removed, before and after (a change of owner, group or mode only, as its attributes).
  platform:
    support: full
    platforms: posix
    description: Runs on the node, with Python's standard library and systemd's C(systemctl).
notes:
  - A job file holds the job's environment, and the diff shows it, as the C(copy) module's would.
"""

EXAMPLES = r"""
- name: Write the jobs
  dlock.fleet.dlock_job_units:
    jobs:
      - name: nightly-report
        command: [/usr/local/bin/nightly-report, --send]
        schedule: "*-*-* 02:00:00"
        once_per: 1d
      - name: old-report
        state: absent
    backend_url: redis://dlock@10.0.0.10:6379/0
    group: dlock
    managed: "{{ lookup('ansible.builtin.config', 'DEFAULT_MANAGED_STR') }}"

- name: Start the timers
  dlock.fleet.dlock_job_units:
    jobs: "{{ my_jobs }}"
    write: false
    timers: started
"""

RETURN = r"""
jobs:
  description: For each job of O(jobs), by name - whether anything of it changed, the files written or removed,
    and what was done to its timer (V(started), V(stopped) or V(unchanged)). In check mode, what would be done.
  returned: always
  type: dict
  sample: {"nightly-report": {"changed": true, "files": ["/etc/dlock/jobs/nightly-report.json",
           "/etc/systemd/system/dlock-nightly-report.service", "/etc/systemd/system/dlock-nightly-report.timer"],
           "timer": "started"}, "old-report": {"changed": false, "files": [], "timer": "unchanged"}}
daemon_reload:
  description: Whether systemd was reloaded (never in check mode).
  returned: always
  type: bool
"""

import grp
import os
import pwd

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dlock.fleet.plugins.module_utils import dlock_job_files as job_files
from ansible_collections.dlock.fleet.plugins.module_utils import dlock_node_files as node_files
from ansible_collections.dlock.fleet.plugins.module_utils import dlock_units as units
from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_jobs import validate_jobs
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_changes import Failure, failure_message

JOB_FILE_MODE = 0o640  # the job's environment may hold secrets: the runners' group only
UNIT_MODE = 0o644


class JobUnits(object):
    """One call's work on a node. `run_command(argv)` answers (rc, stdout,
    stderr), as AnsibleModule.run_command does; `systemd_dir` tells whether
    systemd runs (a test points it elsewhere)."""

    def __init__(self, params, check, diff, run_command, systemd_dir=units.SYSTEMD_RUNNING):
        self.params = params
        self.check = check
        self.diff = diff
        self.run_command = run_command
        self.systemd = os.path.isdir(systemd_dir)
        self.diffs = []
        self.warnings = []
        self.jobs = {}
        self.daemon_reload = False

    # -- the files ---------------------------------------------------------------
    @staticmethod
    def _files(job, settings, unit_dir, gid):
        """(path, content, uid, gid, mode) of each of the job's three files."""
        job_path, service_path, timer_path = _paths(job["name"], settings, unit_dir)
        return [
            (job_path, job_files.job_file(job), node_files.ROOT, gid, JOB_FILE_MODE),
            (service_path, job_files.service_unit(job, settings), node_files.ROOT, node_files.ROOT, UNIT_MODE),
            (timer_path, job_files.timer_unit(job, settings), node_files.ROOT, node_files.ROOT, UNIT_MODE),
        ]

    def _plan(self, name, path, content, uid, gid, mode):
        """(name, the change) of one file, or None when it is as wanted."""
        change = node_files.plan_file(path, content, uid, gid, mode)
        return None if change is None else (name, change)

    def _apply(self, name, change):
        """Make one change (or, in check mode, only record it)."""
        self._record(name, change)
        if not self.check:
            change.apply()

    def _remove(self, name, path):
        """Remove one file of a removed job, whatever it is (never opened unless regular)."""
        change = node_files.plan_removal(path, with_text=self.diff)
        if change is None:
            return False
        self._apply(name, change)
        return True

    def _record(self, name, change):
        self.jobs[name]["changed"] = True
        self.jobs[name]["files"].append(change.path)
        if self.diff:
            self.diffs.append(change.diff())

    # -- the timers --------------------------------------------------------------
    def _systemctl(self, *args):
        return units.systemctl(self.run_command, *args)

    def _timer_states(self, timers):
        """{timer: {LoadState, ActiveState, UnitFileState}} of these timers, in one systemctl show."""
        return units.unit_states(self.run_command, timers)

    def _stop_timers(self, names):
        """Stop the timers of removed jobs that still run, and disable those still enabled."""
        timers = dict((job_files.timer_name(name), name) for name in names)
        states = self._timer_states(sorted(timers))
        # A timer whose unit file is gone (removed by hand, or by a run that
        # stopped half-way) still runs until it is stopped: LoadState
        # not-found with ActiveState active. Stop it whatever its load state.
        stop = [timer for timer in sorted(timers)
                if states.get(timer, {}).get("ActiveState", "inactive") not in ("inactive", "failed")
                or states.get(timer, {}).get("UnitFileState") == "enabled"]
        for timer in stop:
            self.jobs[timers[timer]].update(changed=True, timer="stopped")
        if stop and not self.check:
            self._systemctl("stop", "--", *stop)
            # Only a unit file systemd still has can be disabled (its links go with it).
            enabled = [timer for timer in stop if states.get(timer, {}).get("UnitFileState") == "enabled"]
            if enabled:
                self._systemctl("disable", "--", *enabled)

    def _start_timers(self, names):
        """Enable and start the timers that are not both enabled and active."""
        timers = dict((job_files.timer_name(name), name) for name in names)
        states = self._timer_states(sorted(timers))
        start = [timer for timer in sorted(timers) if states.get(timer, {}).get("ActiveState") != "active"
                 or states[timer].get("UnitFileState") != "enabled"]
        for timer in start:
            self.jobs[timers[timer]].update(changed=True, timer="started")
        if start and not self.check:
            self._systemctl("enable", "--now", "--", *start)

    # -- the call ----------------------------------------------------------------
    def _write_jobs(self, jobs, settings, unit_dir):
        """Write the present jobs' files; stop the absent ones' timers, then
        remove their files; reload systemd once if a unit changed, or if
        systemd says one of the present jobs' units needs it (a call that
        failed after writing, or whose reload failed, left it so: the files
        are as wanted now, and only systemd still has the old ones)."""
        # The runner role, applied before, makes the group; in check mode it may not be there yet.
        gid = node_files.group_id(settings.group, self.check,
                                  "apply the dlock.fleet.dlock_runner role first (it creates it)")
        present = [job for job in jobs if job["state"] == "present"]
        for job in present:
            self._require_accounts(job, settings)
        planned = [change for job in present for change in
                   (self._plan(job["name"], *spec) for spec in self._files(job, settings, unit_dir, gid)) if change]
        for name, change in planned:
            self._apply(name, change)
        changed = [change.path for _name, change in planned if change.text_differs]
        absent = [job["name"] for job in jobs if job["state"] == "absent"]
        if absent and self.systemd:
            self._stop_timers(absent)  # before their files go
        for name in absent:
            for path in _paths(name, settings, unit_dir):
                if self._remove(name, path):
                    changed.append(path)
        if not self.systemd or self.check:
            return
        # The runner reads its job file at each run, and systemd does not look
        # at a unit's owner or mode: only a unit's new text or its removal
        # needs a reload.
        if any(os.path.dirname(path) == unit_dir for path in changed) or self._reload_needed(present):
            self._systemctl("daemon-reload")
            self.daemon_reload = True

    def _reload_needed(self, present):
        """Whether systemd holds an older text of one of these jobs' units."""
        units = [unit for job in present for unit in (job_files.service_name(job["name"]),
                                                      job_files.timer_name(job["name"]))]
        if not units:
            return False
        out = self._systemctl("show", "--property=NeedDaemonReload", "--value", "--", *units)
        return "yes" in out.split()

    def _require_accounts(self, job, settings):
        """The job's user and group exist on the node: systemd would
        otherwise fail the job at each firing (status 217/USER, 216/GROUP)
        while its timer looks well. In check mode an account another role of
        the same run would create is only warned about."""
        for kind, name, lookup in (("user", job.get("user") or settings.user, pwd.getpwnam),
                                   ("group", job.get("group"), grp.getgrnam)):
            if not name or str(name).isdigit():
                continue
            try:
                lookup(name)
            except KeyError:
                message = "job %s: %s %s does not exist on this node" % (job["name"], kind, name)
                if not self.check:
                    raise Failure(message + ": create it first, or name another")
                self.warnings.append(message + " (yet)")

    def run(self):
        params = self.params
        jobs = validate_jobs(params["jobs"], params["runner_defaults"], params["randomized_delay"],
                             params["backend_url"], params["accuracy"])
        unit_dir = validate.path(params["unit_dir"], "dlock_jobs_unit_dir")
        settings = job_files.make_settings(
            params["managed"], params["runner_bin"], params["jobs_dir"], params["group"], params["user"],
            params["hardening"], params["randomized_delay"], params["accuracy"], params["persistent"],
            params["password_path"], params["metrics_dir"])
        # Every unit runs the command the runner role installs; in check mode
        # that role may only have said it would.
        if not self.check and not os.path.isfile(settings.runner_bin):
            raise Failure("%s is missing: apply the dlock.fleet.dlock_runner role first" % settings.runner_bin)
        self.jobs = dict((job["name"], {"changed": False, "files": [], "timer": "unchanged"}) for job in jobs)
        present = [job["name"] for job in jobs if job["state"] == "present"]
        if params["write"]:
            self._write_jobs(jobs, settings, unit_dir)
        if params["timers"] == "started" and present and self.systemd:
            self._start_timers(present)
        # A reload alone (systemd held an older text) is a change too.
        result = {"changed": any(job["changed"] for job in self.jobs.values()) or self.daemon_reload, "jobs": self.jobs,
                  "daemon_reload": self.daemon_reload}
        if self.diff:
            result["diff"] = self.diffs
        if self.warnings:
            result["warnings"] = self.warnings
        return result


def _paths(name, settings, unit_dir):
    """A job's three files: its job file, its service unit, its timer unit."""
    return (os.path.join(settings.jobs_dir, job_files.job_file_name(name)),
            os.path.join(unit_dir, job_files.service_name(name)),
            os.path.join(unit_dir, job_files.timer_name(name)))


ARGUMENT_SPEC = dict(
    jobs=dict(type="raw", required=True),
    runner_defaults=dict(type="raw", default={}),
    backend_url=dict(type="str", default=""),
    randomized_delay=dict(type="raw", default=0),
    accuracy=dict(type="raw", default="1s"),
    persistent=dict(type="raw", default=False),
    user=dict(type="raw", default="root"),
    hardening=dict(type="raw", default=True),
    runner_bin=dict(type="raw", default="/usr/local/bin/dlock"),
    jobs_dir=dict(type="raw", default="/etc/dlock/jobs"),
    unit_dir=dict(type="raw", default="/etc/systemd/system"),
    group=dict(type="raw", default="dlock"),
    password_path=dict(type="raw", default="/etc/dlock/backend.password", no_log=False),  # a path, not the password
    metrics_dir=dict(type="raw", default="/var/lib/prometheus/node-exporter"),
    managed=dict(type="str", default="Ansible managed"),
    write=dict(type="bool", default=True),
    timers=dict(type="str", choices=["started", "unchanged"], default="unchanged"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = JobUnits(module.params, module.check_mode, module._diff, module.run_command).run()
    except (Failure, ConfigError, OSError) as exc:
        module.fail_json(msg=failure_message("dlock_job_units: ", exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
