"""The dlock_services module against a fake systemctl: one read for every
unit, at most one call per kind of change, nothing changed twice, check mode
and diff, masked, static and unknown units, hostile names refused before
systemctl is called. Its Hypothesis property (any state converges in one
call): tests/integration/test_services_property.py."""

from __future__ import annotations

import pytest
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.dlock.fleet.plugins.module_utils import dlock_units as units
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_changes import Failure
from ansible_collections.dlock.fleet.plugins.modules import dlock_services as module

FILE_STATES = ["enabled", "enabled-runtime", "disabled", "static", "indirect", "generated", "alias", "masked"]
ACTIVE_STATES = ["active", "activating", "reloading", "inactive", "failed", "deactivating"]


class FakeSystemctl(object):
    """systemctl show / enable / disable / start / stop on a table
    {unit: [UnitFileState, ActiveState]}; a unit not in it is not found.
    `fail`: the verb whose call fails."""

    def __init__(self, table=None, fail=None):
        self.table = dict((name, list(state)) for name, state in (table or {}).items())
        self.calls = []
        self.fail = fail
        self.aliases = {}  # alias: the real unit, whose Id `show` reports

    def __call__(self, argv):
        assert argv[0] == "systemctl"
        self.calls.append(argv[1:])
        verb = argv[1]
        if verb == self.fail:
            return 1, "", "Failed to %s unit: Access denied" % verb
        if verb == "show":
            assert argv[2:4] == [units.PROPERTIES, "--"]
            return 0, "\n".join(self._show(name) for name in argv[4:]), ""
        assert argv[2] == "--"
        for name in argv[3:]:
            state = self.table[self.aliases.get(name, name)]
            # As systemctl does: disable leaves a runtime enablement (links in /run) in place.
            if verb == "enable" and state[0] in ("disabled", "enabled-runtime"):
                state[0] = "enabled"
            elif verb == "disable" and state[0] == "enabled":
                state[0] = "disabled"
            elif verb == "start":
                assert state[0] not in ("masked",)
                state[1] = "active"
            elif verb == "stop":
                state[1] = "inactive"
        return 0, "", ""

    def _show(self, name):
        name = self.aliases.get(name, name)
        if name not in self.table:
            return "Id=%s\nLoadState=not-found\nActiveState=inactive\nUnitFileState=\n" % name
        file_state, active = self.table[name]
        return "Id=%s\nLoadState=%s\nActiveState=%s\nUnitFileState=%s\n" % (
            name, "masked" if file_state == "masked" else "loaded", active, file_state)

    def changes(self):
        return [call for call in self.calls if call[0] != "show"]


def call(systemctl, entries, check=False, diff=False, systemd_dir="/"):
    """The module's result for these entries, after the argument spec's own checks (as AnsibleModule makes them)."""
    checked = ArgumentSpecValidator(module.ARGUMENT_SPEC).validate({"units": entries})
    assert not checked.error_messages, checked.error_messages
    return module.run(checked.validated_parameters, check, diff, systemctl, systemd_dir)


def test_units_are_read_once_and_changed_in_one_call_per_kind_then_left_alone():
    systemctl = FakeSystemctl({"a.service": ("disabled", "inactive"), "b.timer": ("disabled", "failed"),
                               "c.service": ("enabled", "active")})
    entries = [dict(name=name, enabled=True, state="started") for name in ("a.service", "b.timer", "c.service")]
    first = call(systemctl, entries)
    assert first["changed"]
    assert systemctl.calls == [["show", units.PROPERTIES, "--", "a.service", "b.timer", "c.service"],
                               ["enable", "--", "a.service", "b.timer"], ["start", "--", "a.service", "b.timer"]]
    assert first["units"]["a.service"] == {"changed": True, "absent": False, "enabled": ["disabled", "enabled"],
                                           "active": ["inactive", "active"]}
    assert first["units"]["c.service"]["changed"] is False
    systemctl.calls = []
    second = call(systemctl, entries)
    assert not second["changed"] and systemctl.changes() == []


def test_check_mode_reports_the_same_changes_and_makes_none():
    systemctl = FakeSystemctl({"a.service": ("enabled", "active"), "b.service": ("enabled", "inactive")})
    entries = [dict(name="a.service", enabled=False, state="stopped"), dict(name="b.service", state="started")]
    check = call(systemctl, entries, check=True, diff=True)
    assert check["changed"] and systemctl.changes() == []
    assert check["diff"] == {"before": "a.service: enabled, active\nb.service: enabled, inactive\n",
                             "after": "a.service: disabled, inactive\nb.service: enabled, active\n"}
    real = call(systemctl, entries)
    assert real["units"] == check["units"]
    assert systemctl.changes() == [["disable", "--", "a.service"], ["start", "--", "b.service"],
                                   ["stop", "--", "a.service"]]


def test_a_unit_without_an_enable_switch_is_left_as_it_is():
    systemctl = FakeSystemctl({"s.service": ("static", "active"), "i.service": ("indirect", "inactive")})
    result = call(systemctl, [dict(name="s.service", enabled=True), dict(name="i.service", enabled=False)])
    assert not result["changed"] and systemctl.changes() == []


def test_an_alias_is_known_by_the_name_given():
    systemctl = FakeSystemctl({"redis-server.service": ("disabled", "inactive")})
    systemctl.aliases = {"redis.service": "redis-server.service"}
    result = call(systemctl, [dict(name="redis.service", enabled=True, state="started")])
    assert result["units"]["redis.service"]["changed"]
    assert systemctl.changes() == [["enable", "--", "redis.service"], ["start", "--", "redis.service"]]


def test_a_runtime_enablement_is_made_lasting_and_left_by_disable():
    systemctl = FakeSystemctl({"r.service": ("enabled-runtime", "active"), "s.service": ("enabled-runtime", "active")})
    assert call(systemctl, [dict(name="r.service", enabled=True)])["changed"]
    assert systemctl.table["r.service"][0] == "enabled"
    assert not call(systemctl, [dict(name="s.service", enabled=False)])["changed"]


def test_a_unit_on_its_way_up_counts_as_started_and_one_on_its_way_down_as_stopped():
    systemctl = FakeSystemctl({"up.service": ("enabled", "activating"), "down.service": ("enabled", "deactivating")})
    result = call(systemctl, [dict(name="up.service", state="started"), dict(name="down.service", state="stopped")])
    assert not result["changed"] and systemctl.changes() == []


def test_a_masked_unit_asked_to_start_is_refused_by_name_and_nothing_changes():
    systemctl = FakeSystemctl({"a.service": ("disabled", "inactive"), "m.service": ("masked", "inactive")})
    with pytest.raises(Failure, match=r"m\.service is masked: unmask it"):
        call(systemctl, [dict(name="a.service", enabled=True), dict(name="m.service", state="started")])
    assert systemctl.changes() == []
    # Asked to be stopped or disabled, a masked unit already is: nothing to refuse.
    assert not call(systemctl, [dict(name="m.service", enabled=False, state="stopped")])["changed"]


def test_an_unknown_unit_fails_by_name_unless_it_may_be_absent():
    systemctl = FakeSystemctl({"a.service": ("disabled", "inactive")})
    with pytest.raises(Failure, match=r"gone\.timer is not installed"):
        call(systemctl, [dict(name="a.service", enabled=True), dict(name="gone.timer", state="started")])
    assert systemctl.changes() == []
    result = call(systemctl, [dict(name="a.service", enabled=True),
                              dict(name="gone.timer", state="started", if_installed=True)])
    assert result["units"]["gone.timer"] == {"changed": False, "absent": True}
    assert systemctl.changes() == [["enable", "--", "a.service"]]


def test_a_failing_systemctl_stops_the_call_with_its_message():
    systemctl = FakeSystemctl({"a.service": ("disabled", "inactive")}, fail="enable")
    with pytest.raises(Failure, match=r"systemctl enable -- a\.service failed \(rc 1\): Failed to enable unit"):
        call(systemctl, [dict(name="a.service", enabled=True, state="started")])
    assert systemctl.changes() == [["enable", "--", "a.service"]]  # nothing started after it


def test_without_systemd_the_call_fails_and_systemctl_is_not_run(tmp_path):
    systemctl = FakeSystemctl({"a.service": ("disabled", "inactive")})
    with pytest.raises(Failure, match="systemd is not running here: cannot change a.service"):
        call(systemctl, [dict(name="a.service", enabled=True)], systemd_dir=str(tmp_path / "none"))
    assert systemctl.calls == []


@pytest.mark.parametrize("name, problem", [
    ("a.service\nExecStart=/bin/id", "control character"),
    ("a\x00.service", "control character"),
    ("a b.service", "not a valid unit name"),
    ("chrony", "not a valid unit name"),
    ("../a.service", "not a valid unit name"),
    ("NaN", "not a valid unit name"),
    ("a" * 250 + ".service", "longer than 255"),
    ("", "must not be empty"),
])
def test_hostile_names_are_refused_with_the_entry_named_before_systemctl_runs(name, problem):
    systemctl = FakeSystemctl()
    with pytest.raises(ConfigError, match=r"units\[1\]\.name: .*%s" % problem):
        call(systemctl, [dict(name="ok.service"), dict(name=name)])
    assert systemctl.calls == []


def test_a_unit_named_twice_is_refused():
    with pytest.raises(ConfigError, match=r"units\[1\]\.name: 'a\.service' is named twice"):
        call(FakeSystemctl(), [dict(name="a.service"), dict(name="a.service", enabled=True)])


@pytest.mark.parametrize("entries", [
    "a.service",
    [["a.service"]],
    [dict(name="a.service", state="running")],
    [dict(name="a.service", enabled="maybe")],
    [dict(name="a.service", color="blue")],
    [dict(enabled=True)],
])
def test_the_argument_spec_refuses_a_wrong_shape(entries):
    assert ArgumentSpecValidator(module.ARGUMENT_SPEC).validate({"units": entries}).error_messages


def test_the_examples_pass_the_argument_spec():
    import yaml
    for task in yaml.safe_load(module.EXAMPLES):
        entries = task["dlock.fleet.dlock_services"]["units"]
        systemctl = FakeSystemctl(dict((entry["name"], ("disabled", "inactive")) for entry in entries))
        assert call(systemctl, entries)["changed"]
