# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""systemd units as `systemctl show` reports them, read in one call for any
number of units, and what each wanted state needs done to them. The node
modules that start units (dlock_services, dlock_job_units) share it: the
systemd_service module reads one unit per run with several systemctl calls,
about 0.55 s of a node's CPU a unit (measured on the lab's nodes)."""

from __future__ import annotations

from ansible_collections.dlock.fleet.plugins.module_utils.dlock_changes import Failure

SYSTEMD_RUNNING = "/run/systemd/system"  # sd_booted(3): systemd is PID 1
PROPERTIES = "--property=Id,LoadState,ActiveState,UnitFileState"

# UnitFileState values (systemctl(1), is-enabled). `systemctl enable` makes
# a disabled unit, or one enabled until the next boot only (enabled-runtime),
# enabled; `systemctl disable` makes an enabled one disabled, and leaves a
# runtime enablement (links in /run, gone at the next boot) as it is.
ENABLE_FROM = ("disabled", "enabled-runtime")
DISABLE_FROM = ("enabled",)
MASKED = ("masked", "masked-runtime")
# The others (static, indirect, generated, transient, alias, linked, or none
# at all) are not switched by `systemctl enable` or `disable`: such a unit is
# left as it is, as `systemctl is-enabled` would accept it.

# ActiveState values (systemd.unit(5)): a unit on its way up counts as
# started and one on its way down as stopped, as the systemd_service module
# judges them; asking again would only queue the same job.
STARTED = ("active", "activating", "reloading", "refreshing")
STOPPED = ("inactive", "failed", "deactivating", "maintenance")


def systemctl(run_command, *args):
    """systemctl's output; a failure (rc != 0) stops the module, with its message."""
    rc, out, err = run_command(["systemctl"] + list(args))
    if rc != 0:
        raise Failure("systemctl %s failed (rc %d): %s" % (" ".join(args), rc, (err or out).strip()))
    return out


def unit_states(run_command, units):
    """{unit: {Id, LoadState, ActiveState, UnitFileState}} of these units, in
    one systemctl show; a unit systemd does not know has LoadState not-found.
    Keyed by the names asked for: systemctl answers one block an argument, in
    their order, and an alias's block has the real unit's Id."""
    if not units:
        return {}
    out = systemctl(run_command, "show", PROPERTIES, "--", *units)
    blocks = [dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
              for block in out.strip().split("\n\n")]
    if len(blocks) != len(units):
        raise Failure("systemctl show answered %d blocks for %d units: %s" % (len(blocks), len(units), " ".join(units)))
    return dict(zip(units, blocks))


def needs(name, state, enabled=None, active=None):
    """(enable, disable, start, stop): what unit `name` in `state` (its
    unit_states entry) needs done for `enabled` (True, False or None: left) and `active`
    ("started", "stopped" or None: left). A masked unit asked to be enabled
    or started is refused: unmasking is the operator's decision."""
    file_state = state.get("UnitFileState", "")
    active_state = state.get("ActiveState", "inactive")
    if file_state in MASKED and (enabled or active == "started"):
        raise Failure("%s is masked: unmask it (systemctl unmask %s) to let the role start it" % (name, name))
    return (enabled is True and file_state in ENABLE_FROM,
            enabled is False and file_state in DISABLE_FROM,
            active == "started" and active_state not in STARTED,
            active == "stopped" and active_state not in STOPPED)
