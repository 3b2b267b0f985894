"""The job units as rendered in Python (module_utils/dlock_job_files.py).

The golden files (dlock_job_files_golden/) were written by the role's former
templates (job.service.j2, job.timer.j2) and its copy of `to_nice_json`,
through ansible-playbook's template and copy modules, for the jobs below
under two sets of role settings: the renderer must write them byte for byte,
so that the first rollout with the module rewrites no unit. One line
differs: ReadWritePaths= was in the order of a Python set there (Ansible's
`union` filter), a different order in each run; it is now the metrics
directory, then the job's paths, each once."""

from __future__ import annotations

import os

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils import dlock_job_files as job_files
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_jobs import validate_jobs

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dlock_job_files_golden")

JOBS = [
    {"name": "report", "command": ["/usr/bin/report", "--to", "ops@example.com"], "schedule": "hourly"},
    {"name": "backup.db-1", "command": ["/usr/local/bin/backup", "100%", "$HOME"],
     "schedule": "Mon..Fri *-*-* 02:00:00 Europe/Berlin", "description": "Nightly 100% backup of %h",
     "user": "postgres", "group": "backup", "environment": {"PGHOST": "db1", "PORT": 5432},
     "working_directory": "/var/lib/backup", "key": "backup-db", "randomized_delay": "1500ms", "accuracy": "1m",
     "persistent": True, "read_write_paths": ["/var/lib/backup", "/var/lib/prometheus/node-exporter", "/srv/dumps"],
     "unit_settings": {"CPUQuota": "50%", "MemoryMax": "1G", "Nice": 5, "ProtectSystem": "full",
                       "IOSchedulingClass": "idle", "IgnoreSIGPIPE": "no"},
     "ttl": "10m", "once_per": "1d", "max_runtime": "2h"},
    {"name": "plain", "command": "echo hi | logger", "shell": True, "schedule": "*:0/5", "hardening": False,
     "read_write_paths": ["/srv/x"], "unit_settings": {"MemoryMax": "100M"}},
    {"name": "old", "state": "absent"},
]

SETTINGS = {
    # The role's defaults, no password file on the node.
    "defaults": job_files.Settings("Ansible managed", "/usr/local/bin/dlock", "/etc/dlock/jobs", "dlock", "root",
                                   True, 0, "1s", False, "/etc/dlock/backend.password",
                                   "/var/lib/prometheus/node-exporter", False),
    # Every setting changed, the password file there.
    "other": job_files.Settings("Ansible managed", "/opt/dlock/bin/dlock", "/etc/dlock/jobs", "jobs", "nobody",
                                False, 30, "2s", True, "/etc/dlock/pw", "", True),
}


def rendered(settings):
    """{file name: text} of every present job of JOBS."""
    files = {}
    for job in validate_jobs(JOBS, {}, settings.randomized_delay, ""):
        if job["state"] == "present":
            files[job_files.job_file_name(job["name"])] = job_files.job_file(job)
            files[job_files.service_name(job["name"])] = job_files.service_unit(job, settings)
            files[job_files.timer_name(job["name"])] = job_files.timer_unit(job, settings)
    return files


@pytest.mark.parametrize("variant", sorted(SETTINGS))
def test_the_files_are_byte_for_byte_those_the_templates_wrote(variant):
    files = rendered(SETTINGS[variant])
    assert sorted(files) == sorted(os.listdir(os.path.join(GOLDEN, variant)))
    for name, text in files.items():
        with open(os.path.join(GOLDEN, variant, name), "rb") as handle:
            assert text.encode("utf-8") == handle.read(), (variant, name)


def service(job, settings=SETTINGS["defaults"]):
    [checked] = validate_jobs([dict({"name": "j", "command": ["/bin/true"], "schedule": "hourly"}, **job)])
    return job_files.service_unit(checked, settings)


def lines_of(text, key):
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(key + "=")]


def test_read_write_paths_are_the_metrics_directory_then_the_job_s_each_once():
    text = service({"read_write_paths": ["/srv/b", "/srv/a", "/var/lib/prometheus/node-exporter", "/srv/b"]})
    assert lines_of(text, "ReadWritePaths") == ["/var/lib/prometheus/node-exporter /srv/b /srv/a"]
    no_metrics = SETTINGS["defaults"]._replace(metrics_dir="")
    assert lines_of(service({}, no_metrics), "ReadWritePaths") == []
    assert lines_of(service({"read_write_paths": ["/srv/a"], "hardening": False}), "ReadWritePaths") == []


def test_percent_is_escaped_except_in_unit_settings():
    text = service({"description": "50% of %h", "unit_settings": {"CPUQuota": "50%"}})
    assert lines_of(text, "Description") == ["dlock job j: 50%% of %%h"]
    assert lines_of(text, "CPUQuota") == ["50%"]


def test_unit_settings_override_the_hardening_and_hardening_off_drops_it():
    assert lines_of(service({"unit_settings": {"ProtectSystem": "full"}}), "ProtectSystem") == ["full"]
    off = service({"hardening": False})
    assert not any(lines_of(off, key) for key in job_files.HARDENING)
    on = service({})
    assert all(lines_of(on, key) == [value] for key, value in job_files.HARDENING.items())


def test_the_credential_is_named_only_when_the_password_file_exists():
    settings = SETTINGS["defaults"]
    assert lines_of(service({}, settings), "LoadCredential") == []
    assert lines_of(service({}, settings._replace(credential=True)), "LoadCredential") == [
        "dlock-backend:/etc/dlock/backend.password"]


@pytest.mark.parametrize("field, value", [("managed", "Ansible\nmanaged"), ("runner_bin", "dlock"),
                                          ("group", "dlock\nUser=root"), ("randomized_delay", "NaN"),
                                          ("metrics_dir", "relative")])
def test_the_settings_are_checked_each_by_its_rule(field, value):
    values = dict(managed="Ansible managed", runner_bin="/usr/local/bin/dlock", jobs_dir="/etc/dlock/jobs",
                  group="dlock", user="root", hardening=True, randomized_delay=0, accuracy="1s", persistent=False,
                  password_path="/etc/dlock/backend.password", metrics_dir="")
    values[field] = value
    with pytest.raises(ConfigError, match=field):
        job_files.make_settings(**values)


def test_a_value_that_would_start_a_new_line_is_refused_where_it_is_rendered():
    """The second wall: even an entry that skipped validation cannot add a line."""
    job = {"name": "j", "schedule": "hourly", "description": "x\nExecStartPre=/bin/id", "file": {}}
    with pytest.raises(ConfigError, match="description"):
        job_files.service_unit(job, SETTINGS["defaults"])
    with pytest.raises(ConfigError, match="schedule"):
        job_files.timer_unit(dict(job, schedule="hourly\\"), SETTINGS["defaults"])
