"""The fleet's pause log read back (base.paused_spans): how long each pause
of a job's scopes lasted, whatever else the log holds; and its key, which
no job may use."""

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.base import paused_spans
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError

SCOPES = ("job:billing", "group:finance", "all")


def spans(*entries):
    """The spans of entries given oldest first (the log reads newest first)."""
    return [(start, end) for start, end, _entry in paused_spans(list(reversed(entries)), SCOPES)]


def test_a_pause_lasts_until_its_end():
    assert spans({"result": "paused", "scope": "job:billing", "at": 100, "until": 200}) == [(100, 200)]


def test_a_resume_or_a_new_pause_of_the_scope_ends_it_early():
    assert spans({"result": "paused", "scope": "job:billing", "at": 100, "until": 200},
                 {"result": "resumed", "scope": "job:billing", "at": 150}) == [(100, 150)]
    assert sorted(spans({"result": "paused", "scope": "all", "at": 100, "until": 200},
                        {"result": "paused", "scope": "all", "at": 120, "until": 300})) == [(100, 120), (120, 300)]
    # A resume of another scope ends nothing here.
    assert spans({"result": "paused", "scope": "group:finance", "at": 100, "until": 200},
                 {"result": "resumed", "scope": "job:other", "at": 150}) == [(100, 200)]


def test_other_scopes_and_entries_that_do_not_read_are_left_out():
    assert spans({"result": "paused", "scope": "job:other", "at": 100, "until": 200},
                 {"result": "paused", "scope": "job:billing", "at": "100", "until": 200},
                 {"result": "paused", "scope": "job:billing", "at": float("nan"), "until": 200},
                 {"result": "paused", "scope": "job:billing", "at": 100, "until": True},
                 {"result": "paused", "scope": "job:billing", "at": 100, "until": float("inf")},
                 {"result": "unreadable", "record": "{"},
                 {"result": "paused", "scope": ["job:billing"], "at": 100, "until": 200}) == []


def test_a_resume_before_a_pause_ends_nothing_of_it():
    assert spans({"result": "resumed", "scope": "job:billing", "at": 50},
                 {"result": "paused", "scope": "job:billing", "at": 100, "until": 200}) == [(100, 200)]


@pytest.mark.parametrize("value", [validate.PAUSE_LOG_KEY])
def test_no_job_may_use_the_pause_logs_key(value):
    with pytest.raises(ConfigError, match="is the key of the backend's pause log"):
        validate.lock_key(value, "key")
    assert validate.lock_key(value + "-x", "key") == value + "-x"
