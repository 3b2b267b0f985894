#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: dlock_services
short_description: Enable, disable, start or stop a role's systemd units in one call
version_added: 0.3.0
description:
  - Brings each unit of O(units) to the state it asks for - enabled or disabled, started or stopped - in one module run,
    where the C(systemd_service) module takes one run a unit (the collection's roles start two or three units a node,
    and each such run costs the node about twice a light module's CPU).
  - Reads every unit's state in one C(systemctl show), then makes the changes in at most four C(systemctl) calls, in
    this order - C(enable), C(disable), C(start), C(stop) - each for all the units that need it.
  - To enable a unit is to make its unit file state C(enabled) (from C(disabled), or from C(enabled-runtime), an
    enablement lost at the next boot); to disable it, C(disabled) (from C(enabled); a runtime enablement is left, as
    C(systemctl disable) leaves it). A unit in another state (C(static), C(indirect), C(generated), C(alias) and the
    like) cannot be switched by C(systemctl enable) or C(disable) and is left as it is.
  - A unit counts as started while C(active), C(activating), C(reloading) or C(refreshing), as stopped while
    C(inactive), C(failed), C(deactivating) or C(maintenance).
  - Each unit is known by the name given (an alias too).
  - A masked unit asked to be enabled or started fails the module, naming it; unmasking is the operator's decision.
  - Does not reload systemd; the roles reload it (a handler) after writing a unit file and before this runs.
  - Systemd runs when C(/run/systemd/system) exists; elsewhere (a container, a chroot) the module fails, naming the
    units it was asked to change. The roles do not call it there.
author:
  - dlock.fleet developers (@dlock-fleet)
options:
  units:
    description:
      - The units, in any order. A unit named twice fails the module.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description:
          - The unit's full name, with its type (V(chrony.service), V(dlock-lock-state.timer)).
        type: str
        required: true
      enabled:
        description:
          - V(true) to enable the unit (at boot), V(false) to disable it; omitted, it is left as it is.
        type: bool
      state:
        description:
          - V(started) or V(stopped); omitted, the unit is left running or not.
        type: str
        choices: [started, stopped]
      if_installed:
        description:
          - V(true) - a unit systemd does not know (no unit file) is left alone and reported as V(absent).
          - V(false) - such a unit fails the module, naming it.
        type: bool
        default: false
attributes:
  check_mode:
    support: full
    description: Reads every unit's state as a real run does and reports what it would change; changes nothing.
  diff_mode:
    support: full
    description: Each unit changed, its enabled and active states before and after.
  platform:
    support: full
    platforms: posix
    description: Runs on the node, with Python's standard library and systemd's C(systemctl).
"""

EXAMPLES = r"""
- name: Enable and start node_exporter and the refresh timer (if it is installed)
  dlock.fleet.dlock_services:
    units:
      - name: prometheus-node-exporter.service
        enabled: true
        state: started
      - name: dlock-lock-state.timer
        enabled: true
        state: started
        if_installed: true

- name: Start chrony, and keep chrony-wait off at boot
  dlock.fleet.dlock_services:
    units:
      - name: chrony.service
        enabled: true
        state: started
      - name: chrony-wait.service
        enabled: false
"""

RETURN = r"""
units:
  description: For each unit of O(units), by name - whether it changed, and its unit file state and active state before
    and after (in check mode, what they would be). A unit systemd does not know, with O(units[].if_installed), has
    C(absent) true and nothing else changed.
  returned: always
  type: dict
  sample: {"chrony.service": {"changed": true, "absent": false, "enabled": ["disabled", "enabled"],
           "active": ["inactive", "active"]}}
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dlock.fleet.plugins.module_utils import dlock_units as units
from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_changes import Failure, failure_message


def run(params, check, diff, run_command, systemd_dir=units.SYSTEMD_RUNNING):
    """The call's result. `run_command(argv)` answers (rc, stdout, stderr), as
    AnsibleModule.run_command does; `systemd_dir` tells whether systemd runs
    (a test points it elsewhere)."""
    wanted = {}
    for number, entry in enumerate(params["units"]):
        name = validate.unit_name(entry["name"], "units[%d].name" % number)
        if name in wanted:
            raise ConfigError("units[%d].name: %s is named twice" % (number, validate.shown(name)))
        wanted[name] = entry
    if not os.path.isdir(systemd_dir):
        raise Failure("systemd is not running here: cannot change %s" % ", ".join(sorted(wanted)))
    states = units.unit_states(run_command, sorted(wanted))
    todo = {"enable": [], "disable": [], "start": [], "stop": []}
    report = {}
    for name in sorted(wanted):
        entry, state = wanted[name], states[name]
        if state.get("LoadState") == "not-found":
            if not entry["if_installed"]:
                raise Failure("%s is not installed: systemd does not know it" % name)
            report[name] = {"changed": False, "absent": True}
            continue
        actions = units.needs(name, state, entry["enabled"], entry["state"])
        for verb, needed in zip(("enable", "disable", "start", "stop"), actions):
            if needed:
                todo[verb].append(name)
        before = (state.get("UnitFileState", ""), state.get("ActiveState", ""))
        after = ("enabled" if actions[0] else "disabled" if actions[1] else before[0],
                 "active" if actions[2] else "inactive" if actions[3] else before[1])
        report[name] = {"changed": any(actions), "absent": False,
                        "enabled": list((before[0], after[0])), "active": list((before[1], after[1]))}
    if not check:
        for verb in ("enable", "disable", "start", "stop"):
            if todo[verb]:
                units.systemctl(run_command, verb, "--", *todo[verb])
    result = {"changed": any(unit["changed"] for unit in report.values()), "units": report}
    if diff:
        changed = [name for name in sorted(report) if report[name]["changed"]]
        result["diff"] = {
            "before": "".join("%s: %s, %s\n" % (name, report[name]["enabled"][0], report[name]["active"][0])
                              for name in changed),
            "after": "".join("%s: %s, %s\n" % (name, report[name]["enabled"][1], report[name]["active"][1])
                             for name in changed)}
    return result


ARGUMENT_SPEC = dict(
    units=dict(type="list", elements="dict", required=True, options=dict(
        name=dict(type="str", required=True),
        enabled=dict(type="bool"),
        state=dict(type="str", choices=["started", "stopped"]),
        if_installed=dict(type="bool", default=False),
    )),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = run(module.params, module.check_mode, module._diff, module.run_command)
    except (Failure, ConfigError) as exc:
        module.fail_json(msg=failure_message("dlock_services: ", exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
