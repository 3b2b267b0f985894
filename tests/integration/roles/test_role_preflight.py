"""Every role documents its variables in meta/argument_specs.yml, and the
backend roles' preflight passes good input (bad input: test_role_hostile.py;
the jobs role's entries: the dlock_jobs filter's tests, and below what its
preflight reports).
Only the preflight tasks run (on localhost; they assert and ask
`systemctl is-system-running`, nothing else)."""

import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible_cli import BIN, ROOT, ansible_env

SECRET = "Sekr3t-but-short"  # 16 characters

PLAY = """
- hosts: localhost
  gather_facts: true
  tasks:
    - ansible.builtin.include_role:
        name: dlock.fleet.{role}
        tasks_from: preflight.yml
"""


def run_preflight(tmp_path, role, variables):
    playbook = tmp_path / "preflight.yml"
    playbook.write_text(PLAY.format(role=role))
    extra = tmp_path / "vars.yml"
    extra.write_text(yaml.safe_dump(variables))
    argv = [os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local",
            "-e", "ansible_python_interpreter=" + sys.executable, "-e", "@" + str(extra), "-vvv", str(playbook)]
    return subprocess.run(argv, env=ansible_env(), capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("role, variables", [
    ("dlock_redis", {"dlock_redis_password": SECRET}),
    ("dlock_postgresql", {"dlock_postgresql_password": SECRET, "dlock_postgresql_clients": ["10.0.0.0/24"]}),
    # localhost alone (group ungrouped) is a one-member cluster.
    ("dlock_etcd", {"dlock_etcd_root_password": SECRET, "dlock_etcd_password": SECRET[::-1],
                    "dlock_etcd_group": "ungrouped", "dlock_etcd_address": "127.0.0.1"}),
])
def test_good_input_passes_preflight(tmp_path, role, variables):
    proc = run_preflight(tmp_path, role, variables)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert SECRET not in out


ROLES = sorted(os.listdir(os.path.join(ROOT, "roles")))


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_cover_the_defaults_and_validate(role):
    """Every default is documented in meta/argument_specs.yml (and nothing
    else is), and the spec's own defaults pass ansible-core's validator."""
    with open(os.path.join(ROOT, "roles", role, "defaults", "main.yml")) as handle:
        defaults = yaml.safe_load(handle) or {}
    with open(os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml")) as handle:
        options = yaml.safe_load(handle)["argument_specs"]["main"]["options"]
    assert sorted(defaults) == sorted(options)
    assert all(name.startswith(role + "_") for name in options)
    assert [name for name, spec in options.items() if "password" in name and spec["type"] == "str"
            and not spec.get("no_log")] == []
    result = ArgumentSpecValidator(options).validate({}, validate_role_argument_spec=True)
    assert result.error_messages == []
    # A default that Jinja computes is told in words ("Default - ..."): the
    # role's README and ansible-doc would show a spec default as written.
    for name, spec in options.items():
        description = " ".join(spec["description"]) if isinstance(spec["description"], list) else spec["description"]
        if "{{" in str(defaults[name]):
            assert "default" not in spec and "Default - " in description, name
        assert "{{" not in str(spec.get("default", "")), name


def fatal_results(out):
    """The JSON result of every fatal line of a run."""
    return [json.loads(match) for match in re.findall(r"^fatal: \[localhost\]: FAILED! => (\{.*?^\})", out, re.M | re.S)]


JOB = {"name": "report", "command": ["/usr/bin/report"], "schedule": "hourly"}


def test_the_jobs_preflight_refuses_a_once_per_longer_than_the_schedule(tmp_path):
    proc = run_preflight(tmp_path, "dlock_jobs", {"dlock_jobs_list": [dict(JOB, once_per="1d")]})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out
    [result] = fatal_results(proc.stdout)
    assert "dlock_jobs_list[0] (report): once_per (1d) is longer than the period of its schedule 'hourly' (1h, " \
        "the shortest time between two firings)" in result["msg"], result["msg"]


def test_bad_schedules_are_named_in_one_short_message(tmp_path):
    """systemd-analyze's verdict on each bad schedule, in one assertion whose
    result is the message: no registered result dumped before it."""
    jobs = [JOB, dict(JOB, name="typo", schedule="Fri..Mon 01:00"), dict(JOB, name="prose", schedule="every tuesday")]
    proc = run_preflight(tmp_path, "dlock_jobs", {"dlock_jobs_list": jobs})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    [result] = fatal_results(proc.stdout)
    assert sorted(result) == ["assertion", "changed", "evaluated_to", "msg"], result
    assert result["msg"] == (
        "dlock_jobs: job typo: schedule \"Fri..Mon 01:00\" is not a valid systemd OnCalendar expression (Failed "
        "to parse calendar specification 'Fri..Mon 01:00': Invalid argument); job prose: schedule \"every "
        "tuesday\" is not a valid systemd OnCalendar expression (Failed to parse calendar specification 'every "
        "tuesday': Invalid argument)")


# -- the runner's guard against fences that go back (docs/backends.md, Switching backends) --
ETCD3 = "etcd://dlock@10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/dlock"
REDIS = "redis://dlock@10.0.0.5:6379/0"
PG = "postgresql://dlock@10.0.0.6/dlock?sslmode=require"


def runner_guard(tmp_path, installed, url, epoch, check=False):
    """The runner's preflight on a node whose dlock.json is INSTALLED (a
    dict, or None for a fresh node), rolling out URL with fence epoch EPOCH:
    (return code, output, the fatal results)."""
    config_dir = tmp_path / "etc-dlock"
    config_dir.mkdir(exist_ok=True)
    if installed is not None:
        (config_dir / "dlock.json").write_text(json.dumps(installed))
        before = (config_dir / "dlock.json").read_text()
    variables = {"dlock_runner_backend_url": url, "dlock_runner_backend_password": SECRET,
                 "dlock_runner_config_dir": str(config_dir), "dlock_runner_fence_epoch": epoch}
    playbook = tmp_path / "preflight.yml"
    playbook.write_text(PLAY.format(role="dlock_runner"))
    extra = tmp_path / "vars.yml"
    extra.write_text(yaml.safe_dump(variables))
    argv = [os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local",
            "-e", "ansible_python_interpreter=" + sys.executable, "-e", "@" + str(extra), "-vvv", str(playbook)]
    proc = subprocess.run(argv + (["--check"] if check else []), env=ansible_env(), capture_output=True,
                          text=True, timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert SECRET not in out and "Traceback" not in out
    if installed is not None:
        assert (config_dir / "dlock.json").read_text() == before  # the guard only reads
    return proc.returncode, out, fatal_results(proc.stdout)


@pytest.mark.parametrize("check", [False, True], ids=["run", "check mode"])
def test_the_runner_refuses_a_switch_of_backend_without_a_higher_epoch(tmp_path, check):
    code, out, results = runner_guard(tmp_path, {"backend": REDIS, "jobs_dir": "/etc/dlock/jobs"}, PG, 0, check)
    assert code == 2, out
    [result] = results
    where = tmp_path / "etc-dlock" / "dlock.json"
    assert result["msg"] == (
        "dlock_runner: %s uses the backend %s with fence_epoch 0, and this rollout switches it to %s with "
        "fence_epoch 0: the new backend counts its fences from 1 again, and a resource that keeps the highest "
        "fence seen would refuse every write of its jobs. Set dlock_fence_epoch: 1 (site.yml; "
        "dlock_runner_fence_epoch for the role alone) after draining the jobs; the procedure: docs/backends.md, "
        "Switching backends. Nothing was changed." % (where, REDIS, PG)), result["msg"]


@pytest.mark.parametrize("installed, url, epoch", [
    ({"backend": REDIS}, PG, 1),                                   # the switch, with the epoch one higher
    ({"backend": REDIS, "fence_epoch": 2}, PG, "5"),              # any higher epoch (INI gives a string)
    ({"backend": REDIS, "fence_epoch": 2}, "redis://other@10.0.0.5/0", 2),  # same server, db, other user
    ({"backend": PG, "fence_epoch": 1}, "postgresql://dlock@10.0.0.6:5432/dlock", 1),  # default port, no options
    (None, PG, 0),                                                 # a fresh node
    ({"backend": "mysql://not-ours"}, PG, 0),                      # a file the runner would refuse: never ran
    ({"backend": ETCD3}, ETCD3.replace(":2379/dlock", ":2379,10.0.0.4:2379,10.0.0.5:2379/dlock"), 0),  # grown to 5 members
    ({"backend": ETCD3}, ETCD3.replace("10.0.0.3", "10.0.0.9"), 0),  # a member replaced
], ids=["switch epoch+1", "higher epoch", "same backend", "same backend other options", "fresh", "invalid",
        "etcd grown", "etcd member replaced"])
def test_the_runner_accepts_fences_that_go_forward(tmp_path, installed, url, epoch):
    code, out, _results = runner_guard(tmp_path, installed, url, epoch)
    assert code == 0, out


def test_the_runner_refuses_the_same_epoch_on_another_etcd_cluster(tmp_path):
    """Another cluster shares no member with the installed one: its
    revisions are its own, from 1."""
    other = ETCD3.replace("10.0.0.1", "10.0.1.1").replace("10.0.0.2", "10.0.1.2").replace("10.0.0.3", "10.0.1.3")
    code, out, _results = runner_guard(tmp_path, {"backend": ETCD3}, other, 0)
    assert code == 2 and "Set dlock_fence_epoch: 1" in out, out


def test_the_runner_refuses_a_lower_epoch_on_the_same_backend(tmp_path):
    code, out, results = runner_guard(tmp_path, {"backend": REDIS, "fence_epoch": 3}, "redis://dlock@10.0.0.5/0", 2)
    assert code == 2, out
    [result] = results
    assert "has fence_epoch 3 on the backend redis://dlock@10.0.0.5/0, and this rollout lowers it to 2: fences " \
        "would go back" in result["msg"] and "Keep dlock_fence_epoch at 3 or above" in result["msg"], result["msg"]
