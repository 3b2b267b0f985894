"""The dlock_services module's property (Hypothesis), against the unit
tests' fake systemctl (tests/unit/plugins/modules/test_dlock_services.py):
from any unit file and active state of four units, and any wanted state,
check mode reports what the real call then does, the call brings every unit
to what it asks (where systemctl can switch it), and a second call changes
nothing; a masked unit asked to be enabled or started fails the call before
any change."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.dlock.fleet.plugins.module_utils import dlock_units as units
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_changes import Failure
from ansible_collections.dlock.fleet.tests.unit.plugins.modules.test_dlock_services import (
    ACTIVE_STATES, FILE_STATES, FakeSystemctl, call)

UNIT_NAMES = ["a.service", "b.timer", "c.socket", "d@x.service"]


@settings(max_examples=300, deadline=None)
@given(table=st.fixed_dictionaries(dict((name, st.tuples(st.sampled_from(FILE_STATES), st.sampled_from(ACTIVE_STATES)))
                                        for name in UNIT_NAMES)),
       wanted=st.fixed_dictionaries(dict((name, st.tuples(st.sampled_from([True, False, None]),
                                                          st.sampled_from(["started", "stopped", None])))
                                         for name in UNIT_NAMES)))
def test_one_call_brings_every_unit_to_its_state_and_a_second_changes_nothing(table, wanted):
    entries = [dict((key, value) for key, value in (("name", name), ("enabled", enabled), ("state", state))
                    if value is not None) for name, (enabled, state) in sorted(wanted.items())]
    masked_and_wanted_up = any(table[name][0] == "masked" and (enabled or state == "started")
                               for name, (enabled, state) in wanted.items())
    systemctl = FakeSystemctl(table)
    if masked_and_wanted_up:
        with pytest.raises(Failure, match="is masked"):
            call(systemctl, entries)
        assert systemctl.changes() == []
        return
    check = call(FakeSystemctl(table), entries, check=True)
    first = call(systemctl, entries)
    assert first["units"] == check["units"]  # check mode tells what the real run does
    for name, (enabled, state) in wanted.items():
        file_state, active = systemctl.table[name]
        if enabled is True and table[name][0] in ("enabled", "enabled-runtime", "disabled"):
            assert file_state == "enabled"
        if enabled is False and table[name][0] in ("enabled", "disabled"):
            assert file_state == "disabled"
        if state == "started":
            assert active in units.STARTED
        if state == "stopped":
            assert active in units.STOPPED
    systemctl.calls = []
    assert not call(systemctl, entries)["changed"] and systemctl.changes() == []
