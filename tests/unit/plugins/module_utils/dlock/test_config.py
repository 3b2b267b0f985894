"""config.load_job_settings: each job of a node loaded on top of the global
settings loaded once (`dlock status` and `dlock metrics` of every job), the
same settings and the same errors as load_settings with the job named."""

import json

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.config import load_job_settings, load_settings
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError

JOBS = {
    "plain": {"command": ["/bin/true"]},
    "keyed": {"command": ["/bin/true"], "key": "reports.daily", "ttl": "10m", "environment": {"A": "1"},
              "working_directory": "/tmp", "description": "the daily report"},
    "unknown-field": {"command": ["/bin/true"], "tll": "1m"},
    "bad-ttl": {"command": ["/bin/true"], "ttl": "fast"},
    "bad-environment": {"command": ["/bin/true"], "environment": {"A": 1}},
}


@pytest.fixture
def node(tmp_path):
    """A node's dlock.json (a password file, defaults) and its job files; the flags naming it."""
    (tmp_path / "jobs").mkdir()
    for name, content in JOBS.items():
        (tmp_path / "jobs" / (name + ".json")).write_text(json.dumps(content))
    (tmp_path / "jobs" / "not a name.json").write_text(json.dumps({"command": ["/bin/true"]}))
    (tmp_path / "password").write_text("secret\n")
    (tmp_path / "dlock.json").write_text(json.dumps({
        "backend": "redis://127.0.0.1:6379/0", "password_file": str(tmp_path / "password"),
        "jobs_dir": str(tmp_path / "jobs"), "defaults": {"ttl": "2m"}}))
    return {"config": str(tmp_path / "dlock.json")}


def fields(settings):
    return dict(vars(settings), options=vars(settings.options))


@pytest.mark.parametrize("job", ["plain", "keyed", "not-there"])
def test_a_job_loads_as_load_settings_loads_it(node, job):
    assert fields(load_job_settings(load_settings(node), node, job)) == fields(load_settings(node, job=job))


def test_the_job_file_decides_its_key_and_options(node):
    keyed = load_job_settings(load_settings(node), node, "keyed")
    plain = load_job_settings(load_settings(node), node, "plain")
    assert (keyed.key, keyed.options.ttl, keyed.environment) == ("reports.daily", 600, {"A": "1"})
    assert (plain.key, plain.options.ttl, plain.environment) == ("plain", 120, {})


@pytest.mark.parametrize("job", ["unknown-field", "bad-ttl", "bad-environment", "not a name"])
def test_a_job_file_that_does_not_load_says_what_load_settings_says(node, job):
    with pytest.raises(ConfigError) as alone:
        load_settings(node, job=job)
    with pytest.raises(ConfigError) as on_top:
        load_job_settings(load_settings(node), node, job)
    assert str(on_top.value) == str(alone.value)


def test_the_global_file_and_the_password_are_read_once(node, tmp_path):
    settings = load_settings(node)
    (tmp_path / "dlock.json").unlink()
    (tmp_path / "password").unlink()
    assert load_job_settings(settings, node, "keyed").password == "secret"
    with pytest.raises(ConfigError):
        load_settings(node, job="keyed")
