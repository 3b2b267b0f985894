import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.validate import duration as parse_duration
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.validate import format_duration
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.options import LockOptions, clock_margin


@pytest.mark.parametrize("text,seconds", [
    ("500ms", 0.5), ("90", 90.0), ("90s", 90.0), ("5m", 300.0), ("1h", 3600.0), ("1d", 86400.0),
    (" 2.5s ", 2.5), (30, 30.0), (1.5, 1.5), ("0", 0.0),
])
def test_parse_duration_accepts_operator_forms(text, seconds):
    assert parse_duration(text, "ttl") == seconds


@pytest.mark.parametrize("text", ["", "5x", "1h30m", "-5s", "s", "fast", True, "1e3", None])
def test_parse_duration_names_the_field(text):
    with pytest.raises(ConfigError) as err:
        parse_duration(text, "renew_every")
    assert str(err.value).startswith("renew_every:")


def test_format_duration_round_trips_common_values():
    assert [format_duration(v) for v in (0.25, 20, 1.5, 300, 7200)] == ["250ms", "20s", "1.5s", "5m", "2h"]


def test_derived_defaults_follow_ttl():
    opts = LockOptions(ttl=30)
    assert opts.renew_every == 10
    assert opts.kill_grace == 6
    assert opts.op_timeout == 2
    assert LockOptions(ttl=600).kill_grace == 10


def test_safety_rule_names_every_number():
    with pytest.raises(ConfigError) as err:
        LockOptions(ttl=30, renew_every=20, kill_grace=10)
    message = str(err.value)
    for part in ("renew_every (20s)", "op_timeout (2s)", "kill_grace (10s)", "ttl (30s)", "must be below"):
        assert part in message


@pytest.mark.parametrize("scheme", ["etcd", "etcd+https", "file", "postgresql+advisory"])
def test_safety_rule_boundary_without_a_server_wall_clock(scheme):
    margin = clock_margin(10)
    LockOptions(ttl=10, renew_every=5, op_timeout=1, kill_grace=3.9 - margin, max_clock_skew=2, scheme=scheme)
    with pytest.raises(ConfigError):
        LockOptions(ttl=10, renew_every=5, op_timeout=1, kill_grace=4 - margin, max_clock_skew=2, scheme=scheme)


@pytest.mark.parametrize("scheme", ["redis", "rediss", "postgresql", None])
def test_safety_rule_boundary_on_a_server_wall_clock_counts_two_skews(scheme):
    """Redis and PostgreSQL's lease table (and a backend not known yet): a
    step of the server's clock from -max_clock_skew to +max_clock_skew takes
    2 x max_clock_skew off a live lease, so the budget and the deadline count it."""
    margin = clock_margin(10, 0.5, wall_clock=True)
    assert margin == clock_margin(10) + 1.0
    options = LockOptions(ttl=10, renew_every=5, op_timeout=1, kill_grace=3.9 - margin, max_clock_skew=0.5,
                          scheme=scheme)
    assert options.margin == margin
    with pytest.raises(ConfigError) as err:
        LockOptions(ttl=10, renew_every=5, op_timeout=1, kill_grace=4 - margin, max_clock_skew=0.5, scheme=scheme)
    assert "+ 2 x max_clock_skew (1s) =" in str(err.value)
    assert "wall clock" in str(err.value)


def test_the_reproduction_of_issue_25_is_refused_on_redis_and_postgresql():
    # ttl 5s, renew 4s, op 400ms, kill 300ms and a 1s skew: 4.8s < 5s before; 6.8s now.
    values = {"ttl": "5s", "renew_every": "4s", "op_timeout": "400ms", "kill_grace": "300ms", "max_clock_skew": "1s"}
    LockOptions.from_mapping(values, "", "etcd")
    for scheme in ("redis", "postgresql"):
        with pytest.raises(ConfigError) as err:
            LockOptions.from_mapping(values, "here", scheme)
        assert str(err.value).startswith("here: renew_every (4s) + op_timeout (400ms) + kill_grace (300ms) + "
                                         "clock margin (100ms) + 2 x max_clock_skew (2s) = 6.8s must be below ttl (5s)")


@pytest.mark.parametrize("ttl", [1, 1.5, 2, 5, 11.5, 12, 30, 60, 600, 86400])
@pytest.mark.parametrize("scheme", [None, "redis", "postgresql", "etcd", "file"])
def test_derived_defaults_pass_the_rule_on_every_backend(ttl, scheme):
    options = LockOptions(ttl=ttl, scheme=scheme)
    assert options.max_clock_skew == min(2.0, ttl / 20.0)
    assert LockOptions().max_clock_skew == 2.0 and LockOptions().ttl == 60


@pytest.mark.parametrize("kwargs,fragment", [
    ({"ttl": 0.5}, "ttl"),
    ({"on_contention": "queue"}, "on_contention"),
    ({"once_per": 0.5}, "once_per"),
    ({"max_runtime": 0}, "max_runtime"),
    ({"exit_codes": {"locked": 300}}, "exit_codes.locked"),
    ({"exit_codes": {"bogus": 1}}, "unknown name"),
])
def test_invalid_options_are_refused(kwargs, fragment):
    with pytest.raises(ConfigError) as err:
        LockOptions(**kwargs)
    assert fragment in str(err.value)


def test_from_mapping_reports_where_and_field():
    with pytest.raises(ConfigError) as err:
        LockOptions.from_mapping({"ttl": "ten"}, "job file /etc/dlock/jobs/x.json")
    assert str(err.value) == ("job file /etc/dlock/jobs/x.json: ttl: 'ten' is not a duration "
                              "(use e.g. 500ms, 90, 90s, 5m, 1h)")
    with pytest.raises(ConfigError) as err:
        LockOptions.from_mapping({"fail_open": "yes"}, "here")
    assert "fail_open" in str(err.value)


def test_exit_code_overrides_merge_with_defaults():
    opts = LockOptions(exit_codes={"locked": 0})
    assert opts.exit_codes["locked"] == 0
    assert opts.exit_codes["duplicate"] == 74
    assert opts.exit_codes["lock_lost"] == 76
