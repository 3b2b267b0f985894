import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.dlock.fleet.plugins.filter.dlock_jobs import dlock_jobs

GOOD = {"name": "report", "command": ["/usr/bin/report"], "schedule": "hourly", "ttl": "2m", "once_per": "1h"}


def test_good_job_gets_its_file_content():
    [job] = dlock_jobs([GOOD])
    assert job["state"] == "present"
    assert job["file"] == {"command": ["/usr/bin/report"], "environment": {}, "ttl": "2m", "once_per": "1h"}


def test_shell_string_becomes_sh_c():
    [job] = dlock_jobs([dict(GOOD, command="echo $HOME", shell=True)])
    assert job["file"]["command"] == ["/bin/sh", "-c", "echo $HOME"]


def test_durations_are_normalised_for_the_timer():
    [job] = dlock_jobs([dict(GOOD, randomized_delay="1500ms", accuracy="1m")])
    assert (job["randomized_delay_sec"], job["accuracy_sec"]) == ("1.5s", "60s")


def test_absent_job_needs_only_a_name():
    assert dlock_jobs([{"name": "old", "state": "absent"}]) == [{"name": "old", "state": "absent"}]


@pytest.mark.parametrize("jobs,message", [
    ([dict(GOOD, command="rm -rf /")], "set shell: true"),
    ([dict(GOOD, name="bad name")], "not a valid job name"),
    ([GOOD, GOOD], "duplicate job name"),
    ([dict(GOOD, schedule=None)], "schedule"),
    ([dict(GOOD, ttl="10s", renew_every="9s")], "must be below ttl (10s)"),
    ([dict(GOOD, once_per="5s", randomized_delay="2s", max_clock_skew="500ms")],
     "randomized_delay (2s) + max_clock_skew (500ms) must stay below half of once_per (5s)"),
    ([dict(GOOD, colour="blue")], "unknown field 'colour'"),
    ([dict(GOOD, state="gone")], "state must be present or absent"),
    ([dict(GOOD, environment={"1X": "y"})], "environment"),
    ("not a list", "must be a list"),
])
def test_bad_entries_are_refused_with_the_job_named(jobs, message):
    with pytest.raises(AnsibleFilterError) as err:
        dlock_jobs(jobs)
    assert message in str(err.value)
