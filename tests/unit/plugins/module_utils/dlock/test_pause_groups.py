"""A job's `groups` and the pause scopes they give, through the one
validation core: what `dlock pause --group` and a job file's groups accept,
and what each backend names a scope's pause by."""

import os

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.base import (
    ALL_SCOPE, group_scope, job_scope, pause_scopes, scope_parts)
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.etcd_keys import KeyNames
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.redis_lease import _pause_key
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError


def test_a_grant_names_its_job_then_its_groups_then_the_fleet():
    assert pause_scopes("billing", ["ledger", "nightly"]) == (
        "job:billing", "group:ledger", "group:nightly", "all")
    assert pause_scopes("billing") == ("job:billing", "all")


@pytest.mark.parametrize("scope,parts", [
    ("all", ("all", None)), ("job:a.b@c:d", ("job", "a.b@c:d")), ("group:ledger-2", ("group", "ledger-2"))])
def test_every_scope_a_grant_names_has_its_parts(scope, parts):
    assert scope_parts(scope) == parts


@pytest.mark.parametrize("scope", [
    "group:", "group:a/b", "group:../x", "group:a b", "group:a\nb", "group:a\x00", "group:.hidden", "job:",
    "job:a/b", "Group:x", "groups:x", "ALL", "", None, 7, ["group:x"], "group:" + "x" * 65, "group:\u202ex"])
def test_any_other_scope_is_refused(scope):
    with pytest.raises(ConfigError) as err:
        scope_parts(scope)
    assert "pause scope" in str(err.value)


def test_each_backend_keeps_a_group_s_pause_apart_from_a_job_s_of_the_same_name():
    names = KeyNames("/dlock")
    assert names.pause(group_scope("ledger")) == "/dlock/_pause/group/ledger"
    assert names.pause(job_scope("ledger")) == "/dlock/_pause/job/ledger"
    assert names.pause(ALL_SCOPE) == "/dlock/_pause/all"
    assert _pause_key(group_scope("ledger")) == "dlock:pause:group:ledger"
    assert _pause_key(job_scope("ledger")) == "dlock:{ledger}:pause"
    # A job whose key is "group:x" is no group's: its pause is its own key's.
    assert _pause_key(job_scope("group:x")) == "dlock:{group:x}:pause"


@pytest.mark.parametrize("value", [["ledger"], ["ledger", "nightly-2", "a.b_c"], [], ["x" * 64]])
def test_good_groups_come_back_as_given(value):
    assert validate.groups(value, "groups") == value


@pytest.mark.parametrize("value,fragment", [
    ("ledger", "must be a list of group names, such as [billing] (the Unix group a job runs as is `group`)"),
    ("", "must be a list of group names"),
    (None, "must be a list"),
    ({"ledger": True}, "must be a list"),
    (7, "must be a list"),
    (float("nan"), "must be a list"),
    ([1e308], "groups[0]: 1e+308 must be a string"),
    ([float("nan")], "groups[0]: nan must be a string"),
    ([True], "groups[0]: True must be a string"),
    ([["ledger"]], "must be a string"),
    ([""], "groups[0]: must not be empty"),
    (["ledger\n"], "holds a control character"),
    (["led\x00ger"], "holds a control character"),
    (["\u2028ledger"], "holds a control character"),
    (["\u202eregdel"], "holds a control character"),
    (["led\udcffger"], "is not valid UTF-8"),
    (["a/b"], "is not a valid group name"),
    (["../etc"], "is not a valid group name"),
    (["-x"], "is not a valid group name"),
    (["a b"], "is not a valid group name"),
    (["x" * 65], "is longer than 64 characters"),
    (["ledger", "ledger"], "groups: names ledger more than once"),
    (["g%d" % n for n in range(17)], "has more than 16 items"),
])
def test_bad_groups_are_refused_naming_the_field(value, fragment):
    with pytest.raises(ConfigError) as err:
        validate.groups(value, "groups")
    assert fragment in str(err.value)


def test_a_fifo_named_as_a_group_is_only_a_name(tmp_path):
    """A group is a name, never opened: a FIFO of that name blocks nothing."""
    fifo = tmp_path / "ledger"
    os.mkfifo(str(fifo))
    with pytest.raises(ConfigError):
        validate.groups([str(fifo)], "groups")
    assert validate.groups([fifo.name], "groups") == ["ledger"]
