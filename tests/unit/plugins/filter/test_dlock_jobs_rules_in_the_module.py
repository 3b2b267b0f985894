"""The node module dlock_job_units runs the filter's rules again (a module
trusts no input): every bad entry of the filter's own table
(test_dlock_jobs_filter.py) is refused by the module too, with the filter's
message, before anything is written. Here, beside the filter's tests: that
table is read from a controller-side test module."""

from __future__ import annotations

import os

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.modules import dlock_job_units as module
from ansible_collections.dlock.fleet.tests.unit.plugins.filter import test_dlock_jobs_filter as filter_tests

FILTER_CASES = [mark.args[1] for mark in filter_tests.test_bad_entries_are_refused_with_the_job_named.pytestmark
                if mark.name == "parametrize"][0]


def test_the_table_is_read():
    assert len(FILTER_CASES) > 20


@pytest.mark.parametrize("jobs, message", FILTER_CASES)
def test_the_module_refuses_the_filter_s_bad_entries_with_its_messages(tmp_path, jobs, message):
    params = dict((name, spec.get("default")) for name, spec in module.ARGUMENT_SPEC.items())
    params.update(jobs=jobs, jobs_dir=str(tmp_path), unit_dir=str(tmp_path))
    with pytest.raises(ConfigError) as raised:
        module.JobUnits(params, False, False, None, str(tmp_path / "no-systemd")).run()
    assert message in str(raised.value)
    assert os.listdir(str(tmp_path)) == []
