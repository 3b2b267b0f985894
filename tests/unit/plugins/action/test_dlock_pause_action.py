"""The controller side of dlock.fleet.dlock_pause: a job and a group looked
up in the host's dlock_jobs_list, the keys a drain breaks, and the task's
values through the validation core (PauseRequest)."""

from __future__ import annotations

import datetime

import pytest

from ansible_collections.dlock.fleet.plugins.action.dlock_pause import resolve_scope
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_pause_task import PauseRequest

JOBS = [{"name": "billing", "key": "ledger-billing", "groups": ["ledger", "nightly"]},
        {"name": "report", "groups": ["nightly"]},
        {"name": "old", "key": "old-key", "groups": ["ledger"], "state": "absent"}]
BASE = {"job": None, "key": None, "group": None, "all": False, "state": "paused", "reason": "r", "until": "1h",
        "drain": "wait", "drain_keys": None, "backend_url": "redis://127.0.0.1:6379/0", "op_timeout": 2,
        "fence_epoch": 0}


def params(**values):
    return dict(BASE, **values)


def test_a_job_is_paused_by_its_key():
    resolved = resolve_scope(params(job="billing"), JOBS)
    assert (resolved["job"], resolved["key"]) == (None, "ledger-billing")
    assert PauseRequest(resolved, read_files=False).scope == "job:ledger-billing"
    assert resolve_scope(params(job="report"), JOBS)["key"] == "report"  # no key: its name


@pytest.mark.parametrize("group, keys", [("ledger", ["ledger-billing"]), ("nightly", ["ledger-billing", "report"]),
                                         (None, ["ledger-billing", "report"])])
def test_drain_kill_breaks_the_locks_of_the_present_jobs_in_the_scope(group, keys):
    resolved = resolve_scope(params(group=group, all=group is None, drain="kill"), JOBS)
    assert resolved["drain_keys"] == keys  # never the absent job's


@pytest.mark.parametrize("values, jobs, message", [
    ({"job": "old"}, JOBS, "job: old is not a job of dlock_jobs_list on this host"),
    ({"job": "billing"}, None, "is not a job of dlock_jobs_list on this host (not defined)"),
    ({"group": "ledgr"}, JOBS, "no job of dlock_jobs_list on this host is in group ledgr"),
    ({"all": True, "drain": "kill"}, None, "drain=kill: needs dlock_jobs_list"),
    ({"job": "billing"}, "billing", "dlock_jobs_list: 'billing' must be a list"),
    ({"job": "billing"}, [["billing"]], "dlock_jobs_list[0]: ['billing'] must be a mapping"),
    ({"job": "billing"}, [{"name": float("nan")}], "dlock_jobs_list[0]: name: nan must be a string"),
    ({"job": "billing"}, [{"name": 1e308}], "must be a string"),
    ({"job": "billing"}, [{"name": "billing\n"}], "holds a control character"),
    ({"job": "billing"}, [{"name": "billing", "key": "a b"}], "dlock_jobs_list[0]: key: 'a b' is not a valid lock key"),
    ({"job": "billing"}, [{"name": "billing", "groups": "ledger"}], "groups: 'ledger' must be a list of group names"),
    ({"job": "bil\x00ling"}, JOBS, "job: 'bil\\x00ling' holds a control character"),
    ({"group": "a/b"}, JOBS, "group: 'a/b' is not a valid group name"),
])
def test_what_is_not_there_or_not_well_formed_is_refused(values, jobs, message):
    with pytest.raises(ConfigError) as err:
        resolve_scope(params(**values), jobs)
    assert message in str(err.value)


@pytest.mark.parametrize("values, message", [
    ({"key": "k", "group": "g"}, "(given: key, group)"),
    ({}, "(none given)"),
    ({"key": "k", "reason": None}, "state=paused needs reason"),
    ({"key": "k", "until": "NaN"}, None),  # checked against the backend's clock, when it is asked
    ({"key": "k", "until": "x" * 65}, "until: 'xxxxxxxx"),
    ({"key": "k", "until": "1h\n"}, "until: '1h\\n' holds a control character"),
    ({"key": "k", "reason": "\u202eevil"}, "reason: '\\u202eevil' holds a control character"),
    ({"key": "k", "state": "resumed", "drain": "kill"}, "until and drain: only apply to state=paused"),
    ({"key": "k", "drain_keys": "k"}, "drain_keys: 'k' must be a list"),
    ({"key": "k", "drain_keys": ["k", 1e308]}, "drain_keys[1]: 1e+308 must be a string"),
    ({"key": "k", "op_timeout": float("nan")}, "op_timeout: nan is not a finite duration"),
])
def test_the_task_s_values_go_through_the_validation_core(values, message):
    if message is None:
        assert PauseRequest(params(**values), read_files=False).until == values["until"]
        return
    with pytest.raises(ConfigError) as err:
        PauseRequest(params(**values), read_files=False)
    assert message in str(err.value)


@pytest.mark.parametrize("until, taken", [
    (datetime.datetime(2026, 11, 27, 5, 0, tzinfo=datetime.timezone.utc), "2026-11-27T05:00:00Z"),
    (7200, "7200"), ("2h", "2h")])
def test_until_as_yaml_gives_it(until, taken):
    """An unquoted moment in YAML is a timestamp; a number is seconds."""
    assert PauseRequest(params(key="k", until=until), read_files=False).until == taken


@pytest.mark.parametrize("until, message", [
    (datetime.datetime(2026, 11, 27, 5, 0), "until: '2026-11-27 05:00:00' is not a UTC moment"),
    (datetime.datetime(2026, 11, 27, 5, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
     "is not a UTC moment; write it as 2026-11-27T05:00:00Z"),
    (True, "until: True must be a duration (2h) or a UTC moment"),
    (["2h"], "until: ['2h'] must be a duration"),
    ({"hours": 2}, "must be a duration"),
])
def test_until_of_another_kind_is_refused(until, message):
    with pytest.raises(ConfigError) as err:
        PauseRequest(params(key="k", until=until), read_files=False)
    assert message in str(err.value)
