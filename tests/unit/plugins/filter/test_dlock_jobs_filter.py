import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.dlock.fleet.plugins.filter.dlock_jobs import dlock_jobs
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_jobs import schedule_every, schedule_period

GOOD = {"name": "report", "command": ["/usr/bin/report"], "schedule": "hourly", "ttl": "2m", "once_per": "1h"}


def test_good_job_gets_its_file_content():
    [job] = dlock_jobs([GOOD])
    assert job["state"] == "present"
    # hourly, once_per 1h: a run is expected in every slot (a slot without one is missed).
    assert job["file"] == {"command": ["/usr/bin/report"], "environment": {}, "ttl": "2m", "once_per": "1h",
                           "every_slot": True}


@pytest.mark.parametrize("schedule, once_per, every_slot", [
    ("hourly", "1h", True), ("*:0/5", "5m", True), ("*:0/10", "5m", None), ("Mon..Fri 02:00", "1d", None),
    ("weekly", "7d", True), ("*:0/20 UTC", "20m", True), ("*:0/7", "4m", None),
])
def test_every_slot_is_set_where_the_schedule_fires_once_in_every_slot(schedule, once_per, every_slot):
    [job] = dlock_jobs([dict(GOOD, schedule=schedule, once_per=once_per, ttl="1m")])
    assert job["file"].get("every_slot") is every_slot


def test_shell_string_becomes_sh_c():
    [job] = dlock_jobs([dict(GOOD, command="echo $HOME", shell=True)])
    assert job["file"]["command"] == ["/bin/sh", "-c", "echo $HOME"]


def test_durations_are_normalised_for_the_timer():
    [job] = dlock_jobs([dict(GOOD, randomized_delay="1500ms", accuracy="1m")])
    assert (job["randomized_delay_sec"], job["accuracy_sec"]) == ("1.5s", "60s")


def test_a_job_s_groups_go_to_its_file():
    [job] = dlock_jobs([dict(GOOD, groups=["ledger", "nightly"])])
    assert job["file"]["groups"] == ["ledger", "nightly"]


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
    # the slot window, with no backend named: the strictest rule (a second for etcd's Date header)
    ([dict(GOOD, schedule="*:*:0/5", once_per="5s", randomized_delay="2s", max_clock_skew="500ms")],
     "randomized_delay (2s) + accuracy (1s) + 2 x max_clock_skew (500ms) + the backend's clock resolution (1s: "
     "etcd/etcd+https, or the backend is not known) must stay below once_per (5s), or nodes that fire for one slot "
     "could claim two and run twice"),
    # a firing late in its slot leaves less of it: *:59:59 is one second before the next slot
    ([dict(GOOD, schedule="*:59:59 UTC")], "(report): the schedule can fire 59m59s after a slot's boundary, and that "
                                           "+ randomized_delay (0ms) + accuracy (1s) + 2 x max_clock_skew (2s)"),
    # a time zone a quarter of an hour off UTC puts a firing on the hour 45 minutes into an hourly slot
    ([dict(GOOD, randomized_delay="15m")], "the schedule can fire 45m after a slot's boundary in some time zone (a "
                                           "zone's offset is a multiple of 15 minutes: name UTC in the schedule"),
    # a slot that does not divide a day: firings every 10 minutes step through a 7-minute slot
    ([dict(GOOD, once_per="7m", schedule="*:0/10 UTC", randomized_delay="1m")],
     "the schedule can fire 6m after a slot's boundary"),
    # a weekly slot starts on a Thursday (1970-01-01): Monday 00:00 in some zone is late on a Sunday
    ([dict(GOOD, once_per="7d", schedule="Mon 00:00", randomized_delay="1h")],
     "the schedule can fire 6d23h45m after a slot's boundary in some time zone"),
    # times that cannot be read: the window cannot be checked
    ([dict(GOOD, schedule="*:*:0/0.5", once_per="1h")], "its firing times cannot be read here"),
    ([dict(GOOD, once_per="1.5s")], "(report): once_per: '1.5s' is not a whole number of seconds"),
    # once_per longer than the schedule's period: firings skipped silently
    ([dict(GOOD, once_per="1d")], "dlock_jobs_list[0] (report): once_per (1d) is longer than the period of its "
                                  "schedule 'hourly' (1h, the shortest time between two firings): it would run once "
                                  "per 1d and skip the other firings; make once_per 1h or less"),
    ([dict(GOOD, schedule="*:0/15", once_per="1h")], "once_per (1h) is longer than the period of its schedule "
                                                     "'*:0/15' (15m,"),
    ([dict(GOOD, schedule="Mon,Thu 01:00 UTC", once_per="4d")], "schedule 'Mon,Thu 01:00 UTC' (3d,"),
    ([dict(GOOD, schedule="monthly", once_per="30d")], "schedule 'monthly' (28d,"),
    # hostile once_per values are refused as durations, before the period is looked at
    ([dict(GOOD, once_per="NaN")], "(report): once_per: 'NaN' is not a duration"),
    ([dict(GOOD, once_per=float("nan"))], "(report): once_per: nan is not a finite duration"),
    ([dict(GOOD, once_per=1e308)], "(report): once_per: 1e+308 is above the maximum of 30d"),
    ([dict(GOOD, once_per="1e308")], "(report): once_per: '1e308' is not a duration"),
    ([dict(GOOD, once_per="hourly")], "(report): once_per: 'hourly' is not a duration"),
    ([dict(GOOD, colour="blue")], "unknown field 'colour'"),
    ([dict(GOOD, state="gone")], "state must be present or absent"),
    ([dict(GOOD, environment={"1X": "y"})], "environment"),
    ("not a list", "must be a list"),
    ([dict(GOOD, groups="ledger")], "(report): groups: 'ledger' must be a list of group names"),
    ([dict(GOOD, groups=["ledger/x"])], "(report): groups[0]: 'ledger/x' is not a valid group name"),
    ([dict(GOOD, groups=["a", "a"])], "(report): groups: names a more than once"),
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
    assert dlock_jobs([dict(GOOD, schedule=schedule, once_per=None)])[0]["schedule"] == schedule


def test_once_per_from_the_runner_defaults_is_held_to_the_slot_window_too():
    """The runner takes once_per from its defaults when the job has none: the
    randomized delay must fit in that slot just the same."""
    job = dict(GOOD, schedule="*:0/1", once_per=None, randomized_delay="55s")
    with pytest.raises(AnsibleFilterError) as err:
        dlock_jobs([job], defaults={"once_per": "1m"}, backend_url=REDIS)
    assert "(report): randomized_delay (55s) + accuracy (1s) + 2 x max_clock_skew (2s) must stay below once_per of " \
        "dlock_runner_defaults (1m)" in str(err.value)
    assert dlock_jobs([dict(job, randomized_delay="50s")], defaults={"once_per": "1m"})[0]["state"] == "present"


REDIS = "redis://127.0.0.1:6379/0"


@pytest.mark.parametrize("job, backend_url", [
    (dict(GOOD, schedule="*:00 UTC", randomized_delay="30m"), ""),  # UTC named: the firing is on the boundary
    (dict(GOOD, schedule="*:30", randomized_delay="10m"), ""),  # half a slot off the boundary is safe
    (dict(GOOD, schedule="*:*:0/5", once_per="5s", randomized_delay="2s", max_clock_skew="500ms"), REDIS),
    (dict(GOOD, schedule="*:*:0/5", once_per="5s", randomized_delay="1s", max_clock_skew="500ms"), "etcd://e1:2379"),
    (dict(GOOD, schedule="*:0/5", once_per="5m", randomized_delay="4m"), ""),  # 5 minutes divide any zone's offset
    (dict(GOOD, schedule="*-*-* 03:00 UTC", once_per="1d", randomized_delay="2h"), ""),
    (dict(GOOD, schedule="Thu 12:00 UTC", once_per="7d", randomized_delay="6h"), ""),  # mid-slot: weeks start Thursday
    (dict(GOOD, schedule="*-*~01 03:00 UTC", once_per="1d", randomized_delay="1h"), ""),  # date words not read
])
def test_firings_that_stay_in_their_slot_are_accepted(job, backend_url):
    assert dlock_jobs([job], backend_url=backend_url)[0]["state"] == "present"


def test_the_backends_clock_resolution_is_in_the_window():
    """etcd judges a slot's window by whole seconds: a second less for the rest."""
    job = dict(GOOD, schedule="*:*:0/5", once_per="5s", randomized_delay="2s", max_clock_skew="500ms")
    assert dlock_jobs([job], backend_url=REDIS)[0]["state"] == "present"
    with pytest.raises(AnsibleFilterError) as err:
        dlock_jobs([job], backend_url="etcd://e1:2379")
    assert "+ the backend's clock resolution (1s: etcd/etcd+https, or the backend is not known)" in str(err.value)


@pytest.mark.parametrize("schedule, once_per", [
    ("hourly", "1h"), ("*:0/5", "5m"), ("daily", "1d"), ("*-*-* 02:00:00 Europe/Berlin", "1d"), ("weekly", "7d"),
    ("Mon..Fri 09:00", "1d"), ("Sat,Sun 10:00", "1d"), ("*:*:0/10", "10s"), ("monthly", "28d"),
    # period not known from the expression: not checked (systemd-analyze judges the expression on the node)
    ("2026-12-01 00:00:00", "30d"), ("*-02~03", "30d"),
])
def test_once_per_up_to_the_period_or_an_unknown_period_passes(schedule, once_per):
    assert dlock_jobs([dict(GOOD, schedule=schedule, once_per=once_per)])[0]["file"]["once_per"] == once_per


DAY = 86400.0


@pytest.mark.parametrize("expression, period", [
    ("minutely", 60.0), ("hourly", 3600.0), ("Daily", DAY), ("weekly", 7 * DAY), ("monthly", 28 * DAY),
    ("quarterly", 90 * DAY), ("semiannually", 181 * DAY), ("yearly", 365 * DAY), ("hourly UTC", 3600.0),
    ("*:0/5", 300.0), ("*:*:0/5", 5.0), ("*-*-* *:*:*", 1.0), ("00/6:00", 6 * 3600.0), ("*:0..10/3", 180.0),
    ("Mon..Fri 09:00", DAY), ("Mon,Thu 1:00", 3 * DAY), ("mon 9:00", 7 * DAY), ("Monday..Wednesday 10:00", DAY),
    ("00,23:59", 3600.0),                 # 23:59, then 00:59 the next day
    ("*-*-29 01:00", 29 * DAY),           # 29 February to 29 March in a leap year
    ("Fri *-*-13", 28 * DAY),             # Friday the 13th of February and of March
    ("*-*-01,15 04:00", 14 * DAY),        # 1 to 15 of any month, 15 February to 1 March
    ("*-*-* 1:00 Etc/GMT-5", DAY),
    # not known: a year named, the last days of a month, fractions of a second, not an expression
    ("2026-12-01 00:00:00 UTC", None), ("*-02~03", None), ("*:*:0/0.5", None), ("*:5/70", None), ("*:50/20", None),
    ("Fri..Mon 1:00", None), ("every tuesday-ish", None), ("", None), ("24:00", None), ("*:0/0", None),
])
def test_the_period_of_a_schedule(expression, period):
    assert schedule_period(expression) == period


@pytest.mark.parametrize("expression, every", [
    ("hourly", 3600.0), ("daily", 86400.0), ("weekly", 7 * 86400.0), ("minutely", 60.0), ("*:0/5", 300.0),
    ("*-*-* 00/6:00:00", 6 * 3600.0), ("*:0/20 Europe/Berlin", 1200.0), ("Mon *-*-* 03:00", 7 * 86400.0),
    # Unequal gaps: weekdays only, the days of a month, a step that does not divide the hour or day.
    ("Mon..Fri 02:00", None), ("monthly", None), ("*-*-01 00:00", None), ("*:0/7", None), ("*:00,10,30", None),
    ("Mon,Wed 01:00", None), ("Mon 01,13:00", None), ("", None), ("every tuesday-ish", None),
])
def test_the_equal_gap_of_a_schedule(expression, every):
    assert schedule_every(expression) == every


def test_catch_up_needs_a_schedule_that_fires_in_every_slot():
    [job] = dlock_jobs([dict(GOOD, catch_up={"policy": "all", "window": "1d"})])
    assert job["file"]["catch_up"] == {"policy": "all", "window": "1d"} and job["file"]["every_slot"] is True
    with pytest.raises(AnsibleFilterError, match=r"catch_up: policy latest needs a schedule that fires in every "
                                                 r"once_per slot \('Mon..Fri 02:00' does not with once_per 1d"):
        dlock_jobs([dict(GOOD, schedule="Mon..Fri 02:00", once_per="1d", catch_up={"policy": "latest"})])
