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
    # cron's forms, with what OnCalendar writes instead
    ([dict(GOOD, schedule="@daily")], "schedule: '@daily' is cron's shorthand; a systemd OnCalendar expression "
                                      "writes it daily"),
    ([dict(GOOD, schedule=" @annually")], "writes it yearly"),
    ([dict(GOOD, schedule="0 3 * * *")], "schedule: '0 3 * * *' is a cron line; write a systemd OnCalendar"),
    ([dict(GOOD, schedule="*/5 * * * 1-5")], "'*/5 * * * 1-5' is a cron line"),
    ([dict(GOOD, schedule=["daily"])], "schedule: ['daily'] must be a string"),
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


# Issue 25: the reproduction's options (ttl 5s, renew 4s, op 400ms, kill 300ms,
# skew 1s) fit etcd, not a backend counting the lease on its wall clock.
REPRO = dict(GOOD, ttl="5s", renew_every="4s", op_timeout="400ms", kill_grace="300ms", max_clock_skew="1s")


@pytest.mark.parametrize("backend_url", ["redis://127.0.0.1:6379/0", "postgresql://dlock@db1/dlock", ""])
def test_a_wall_clock_backend_or_an_unknown_one_counts_two_skews(backend_url):
    with pytest.raises(AnsibleFilterError) as err:
        dlock_jobs([REPRO], backend_url=backend_url)
    assert "+ 2 x max_clock_skew (2s) = 6.8s must be below ttl (5s)" in str(err.value)
    assert "dlock_jobs_list[0] (report)" in str(err.value)


@pytest.mark.parametrize("backend_url", ["etcd://127.0.0.1:2379/dlock", "file:///var/lib/dlock"])
def test_a_backend_without_a_server_wall_clock_does_not(backend_url):
    [job] = dlock_jobs([REPRO], backend_url=backend_url)
    assert job["file"]["ttl"] == "5s"


def test_the_runner_defaults_count_in_a_job_s_rule():
    """The runner merges its defaults under the job's options: so does the check."""
    job = dict(GOOD, ttl="5s", renew_every="3900ms", op_timeout="400ms", kill_grace="300ms")
    with pytest.raises(AnsibleFilterError):  # the engine's default skew for 5s: 250ms, 2 x = 500ms
        dlock_jobs([job], backend_url="redis://127.0.0.1:6379/0")
    [checked] = dlock_jobs([job], defaults={"max_clock_skew": "100ms"}, backend_url="redis://127.0.0.1:6379/0")
    assert "max_clock_skew" not in checked["file"]  # the job file keeps the job's own options


@pytest.mark.parametrize("schedule", ["daily", "*:0/5", "*-*-* 03:00:00", "Mon..Fri 09:00", "*:*:0/5",
                                      "2026-12-01 00:00:00 UTC", "Sat,Sun 10:00"])
def test_oncalendar_expressions_are_not_taken_for_cron(schedule):
    assert dlock_jobs([dict(GOOD, schedule=schedule)])[0]["schedule"] == schedule
