"""The dlock_job_units module's work on a node, in a temporary directory:
the job files and units written once and then left alone, check mode and
diff, removed jobs, the timers through a fake systemctl, hostile entries
refused before anything is written. The renderer itself:
tests/unit/plugins/module_utils/test_dlock_job_files.py."""

from __future__ import annotations

import grp
import os
import stat

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_changes import Failure
from ansible_collections.dlock.fleet.plugins.module_utils import dlock_units as units
from ansible_collections.dlock.fleet.plugins.modules import dlock_job_units as module

GROUP = grp.getgrgid(os.getgid()).gr_name
JOB = {"name": "report", "command": ["/usr/bin/report"], "schedule": "hourly"}
OTHER = {"name": "other", "command": ["/usr/bin/other"], "schedule": "daily"}


class FakeSystemctl(object):
    """systemctl show / enable --now / stop / disable / daemon-reload on a
    table of timers: {timer: (ActiveState, UnitFileState)}; a timer not in
    the table is not found, and one in `gone` is not found but still runs
    (its unit file removed behind systemd's back). `stale`: the units whose
    NeedDaemonReload is yes until the next daemon-reload."""

    def __init__(self):
        self.timers = {}
        self.gone = set()
        self.stale = set()
        self.calls = []

    def __call__(self, argv):
        assert argv[0] == "systemctl"
        self.calls.append(argv[1:])
        if argv[1:4] == ["show", "--property=NeedDaemonReload", "--value"]:
            return 0, "".join("yes\n" if unit in self.stale else "no\n" for unit in argv[5:]), ""
        if argv[1] == "show":
            assert argv[2] == units.PROPERTIES and argv[3] == "--"
            blocks = []
            for timer in argv[4:]:
                if timer in self.timers:
                    active, enabled = self.timers[timer]
                    blocks.append("Id=%s\nLoadState=loaded\nActiveState=%s\nUnitFileState=%s\n" % (timer, active, enabled))
                elif timer in self.gone:
                    blocks.append("Id=%s\nLoadState=not-found\nActiveState=active\nUnitFileState=\n" % timer)
                else:
                    blocks.append("Id=%s\nLoadState=not-found\nActiveState=inactive\nUnitFileState=\n" % timer)
            return 0, "\n".join(blocks), ""
        if argv[1:3] == ["enable", "--now"]:
            for timer in argv[4:]:
                self.timers[timer] = ("active", "enabled")
        elif argv[1] == "stop":
            for timer in argv[3:]:
                self.gone.discard(timer)
                if timer in self.timers:
                    self.timers[timer] = ("inactive", self.timers[timer][1])
        elif argv[1] == "disable":
            for timer in argv[3:]:
                self.timers[timer] = (self.timers[timer][0], "disabled")
        elif argv[1] == "daemon-reload":
            self.stale.clear()
        return 0, "", ""

    def changes(self):
        """The calls that change something (not the reads)."""
        return [call for call in self.calls if call[0] != "show"]


@pytest.fixture
def node(tmp_path):
    """call(jobs, check=False, diff=False, systemd=True, **params) -> result, on a node in tmp_path."""
    (tmp_path / "jobs").mkdir()
    (tmp_path / "units").mkdir()
    (tmp_path / "run-systemd").mkdir()
    (tmp_path / "dlock").write_text("#!/bin/sh\n")
    systemctl = FakeSystemctl()

    def call(jobs, check=False, diff=False, systemd=True, **params):
        values = dict((name, spec.get("default")) for name, spec in module.ARGUMENT_SPEC.items())
        values.update(jobs=jobs, jobs_dir=str(tmp_path / "jobs"), unit_dir=str(tmp_path / "units"), group=GROUP,
                      password_path=str(tmp_path / "backend.password"), metrics_dir="",
                      runner_bin=str(tmp_path / "dlock"))
        values.update(params)
        systemd_dir = str(tmp_path / ("run-systemd" if systemd else "no-systemd"))
        return module.JobUnits(values, check, diff, systemctl, systemd_dir).run()

    call.dir = tmp_path
    call.systemctl = systemctl
    return call


def paths(node, name):
    return [str(node.dir / "jobs" / ("%s.json" % name)), str(node.dir / "units" / ("dlock-%s.service" % name)),
            str(node.dir / "units" / ("dlock-%s.timer" % name))]


def on_disk(node):
    """{path: (content, uid, gid, mode)} of every file written."""
    found = {}
    for sub in ("jobs", "units"):
        for name in sorted(os.listdir(str(node.dir / sub))):
            path = str(node.dir / sub / name)
            info = os.lstat(path)
            with open(path) as handle:
                found[path] = (handle.read(), info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode))
    return found


def test_every_file_is_written_once_then_left_alone(node):
    first = node([JOB, OTHER])
    assert first["changed"] and first["daemon_reload"]
    assert first["jobs"]["report"] == {"changed": True, "files": paths(node, "report"), "timer": "unchanged"}
    files = on_disk(node)
    gid = grp.getgrnam(GROUP).gr_gid
    assert files[paths(node, "report")[0]][1:] == (0, gid, 0o640)
    assert files[paths(node, "report")[1]][1:] == (0, 0, 0o644)
    assert files[paths(node, "report")[2]][1:] == (0, 0, 0o644)
    assert "ExecStart=%s run --job report\n" % (node.dir / "dlock") in files[paths(node, "report")[1]][0]
    assert node.systemctl.changes() == [["daemon-reload"]]
    second = node([JOB, OTHER])
    assert not second["changed"] and not second["daemon_reload"]
    assert all(job == {"changed": False, "files": [], "timer": "unchanged"} for job in second["jobs"].values())
    assert on_disk(node) == files
    assert node.systemctl.changes() == [["daemon-reload"]]


def test_check_mode_reports_and_changes_nothing(node):
    result = node([JOB], check=True, diff=True)
    assert result["changed"] and result["jobs"]["report"]["files"] == paths(node, "report")
    assert on_disk(node) == {} and node.systemctl.changes() == []
    assert not result["daemon_reload"]
    # The diff holds what would be written.
    node([JOB])
    written = on_disk(node)
    assert [(d["before"], d["after"]) for d in result["diff"]] == [("", written[p][0]) for p in paths(node, "report")]


def test_a_changed_schedule_rewrites_only_that_timer_and_shows_it_in_the_diff(node):
    node([JOB, OTHER])
    before = on_disk(node)
    inodes = dict((path, os.stat(path).st_ino) for path in before)
    result = node([dict(JOB, schedule="daily"), OTHER], diff=True)
    timer = paths(node, "report")[2]
    assert result["jobs"]["report"]["files"] == [timer] and not result["jobs"]["other"]["changed"]
    assert [d["before_header"] for d in result["diff"]] == [timer]
    assert "OnCalendar=hourly\n" in result["diff"][0]["before"] and "OnCalendar=daily\n" in result["diff"][0]["after"]
    assert [path for path in before if os.stat(path).st_ino != inodes[path]] == [timer]
    assert result["daemon_reload"]


def test_only_a_mode_that_differs_is_fixed(node):
    node([JOB])
    service = paths(node, "report")[1]
    os.chmod(service, 0o600)
    result = node([JOB], diff=True)
    assert result["jobs"]["report"]["files"] == [service]
    assert stat.S_IMODE(os.stat(service).st_mode) == 0o644
    assert result["diff"][0]["before"] == "owner 0, group 0, mode 0600\n"
    assert result["diff"][0]["after"] == "owner 0, group 0, mode 0644\n"
    assert not result["daemon_reload"]  # the unit's text is the same


def test_a_removed_job_has_its_timer_stopped_then_its_files_removed(node):
    node([JOB, OTHER])
    node.systemctl.timers.update({"dlock-report.timer": ("active", "enabled"),
                                  "dlock-other.timer": ("active", "enabled")})
    check = node([dict(name="report", state="absent"), OTHER], check=True)
    assert check["jobs"]["report"] == {"changed": True, "files": paths(node, "report"), "timer": "stopped"}
    assert len(on_disk(node)) == 6 and node.systemctl.changes() == [["daemon-reload"]]
    node.systemctl.calls = []
    result = node([dict(name="report", state="absent"), dict(name="gone", state="absent"), OTHER], diff=True)
    assert result["jobs"]["report"] == {"changed": True, "files": paths(node, "report"), "timer": "stopped"}
    assert result["jobs"]["gone"] == {"changed": False, "files": [], "timer": "unchanged"}
    assert sorted(on_disk(node)) == sorted(paths(node, "other"))
    # One read of both timers, a stop and a disable of the one systemd knows, one reload.
    assert node.systemctl.calls == [["show", units.PROPERTIES, "--", "dlock-gone.timer", "dlock-report.timer"],
                                    ["stop", "--", "dlock-report.timer"], ["disable", "--", "dlock-report.timer"],
                                    ["daemon-reload"]]
    assert [d["after"] for d in result["diff"]] == ["", "", ""] and "[Timer]" in result["diff"][2]["before"]
    assert not node([dict(name="report", state="absent"), OTHER])["changed"]


def test_a_removed_job_s_timer_whose_unit_file_is_already_gone_is_stopped(node):
    node.systemctl.gone.add("dlock-report.timer")
    result = node([dict(name="report", state="absent")])
    assert result["jobs"]["report"] == {"changed": True, "files": [], "timer": "stopped"}
    # Stopped, not disabled: systemd cannot disable a unit whose file it no longer has.
    assert node.systemctl.changes() == [["stop", "--", "dlock-report.timer"]]
    assert not node([dict(name="report", state="absent")])["changed"]


def test_a_unit_systemd_still_holds_in_an_older_text_is_reloaded_even_with_no_file_to_write(node):
    node([JOB])
    node.systemctl.calls = []
    node.systemctl.stale.add("dlock-report.timer")  # a former call wrote it, and its reload failed
    result = node([JOB])
    assert result["changed"] and result["daemon_reload"] and not result["jobs"]["report"]["changed"]
    assert node.systemctl.changes() == [["daemon-reload"]]
    assert not node([JOB])["daemon_reload"]


def test_a_path_that_cannot_be_written_fails_the_call_before_any_file_is_written(node):
    os.mkfifo(paths(node, "other")[2])
    with pytest.raises(Failure, match="dlock-other.timer is not a regular file"):
        node([JOB, OTHER])
    # Only the FIFO is there (on_disk would open it, and wait for a writer).
    assert os.listdir(str(node.dir / "jobs")) == [] and os.listdir(str(node.dir / "units")) == ["dlock-other.timer"]
    assert node.systemctl.calls == []


def test_a_job_whose_user_or_group_does_not_exist_is_refused_by_name(node):
    with pytest.raises(Failure, match="job report: user no-such-user does not exist on this node"):
        node([dict(JOB, user="no-such-user")])
    with pytest.raises(Failure, match="job report: group no-such-group does not exist on this node"):
        node([dict(JOB, group="no-such-group")])
    assert on_disk(node) == {}
    # In check mode another role of the same run may create it: a warning.
    check = node([dict(JOB, user="no-such-user")], check=True)
    assert check["changed"] and check["warnings"] == ["job report: user no-such-user does not exist on this node (yet)"]


def test_without_systemd_the_files_go_and_systemctl_is_not_called(node):
    node([JOB], systemd=False)
    result = node([dict(name="report", state="absent")], systemd=False, timers="started")
    assert result["jobs"]["report"]["files"] == paths(node, "report") and on_disk(node) == {}
    assert node.systemctl.calls == [] and not result["daemon_reload"]


def test_timers_not_enabled_and_active_are_started_in_one_call(node):
    node([JOB, OTHER, dict(OTHER, name="third")])
    node.systemctl.timers.update({"dlock-report.timer": ("active", "enabled"),
                                  "dlock-other.timer": ("inactive", "disabled")})
    node.systemctl.calls = []
    jobs = [JOB, OTHER, dict(OTHER, name="third")]
    check = node(jobs, check=True, write=False, timers="started")
    # In check mode a timer systemd does not know yet (third) would be started too.
    assert [name for name, job in check["jobs"].items() if job["timer"] == "started"] == ["other", "third"]
    assert node.systemctl.changes() == []
    result = node(jobs, write=False, timers="started")
    assert node.systemctl.changes() == [["enable", "--now", "--", "dlock-other.timer", "dlock-third.timer"]]
    assert result["jobs"]["report"] == {"changed": False, "files": [], "timer": "unchanged"}
    assert result["jobs"]["third"] == {"changed": True, "files": [], "timer": "started"}
    assert not node(jobs, write=False, timers="started")["changed"]


def test_the_credential_is_loaded_only_when_the_password_file_exists(node):
    node([JOB])
    service = paths(node, "report")[1]
    assert "LoadCredential=" not in on_disk(node)[service][0]
    (node.dir / "backend.password").write_text("pw")
    result = node([JOB])
    assert result["jobs"]["report"]["files"] == [service]
    assert "LoadCredential=dlock-backend:%s\n" % (node.dir / "backend.password") in on_disk(node)[service][0]


def test_a_missing_group_fails_but_check_mode_reports_the_files_without_it(node):
    with pytest.raises(Failure, match="group no-such-group does not exist on this node: apply the dlock.fleet.dlock_runner role"):
        node([JOB], group="no-such-group")
    assert on_disk(node) == {}
    assert node([JOB], group="no-such-group", check=True)["jobs"]["report"]["files"] == paths(node, "report")
    node([JOB])
    # The job file is compared without the group: only the unit naming the group differs.
    check = node([JOB], group="no-such-group", check=True)
    assert check["jobs"]["report"]["files"] == [paths(node, "report")[1]]


def test_a_missing_runner_fails_before_anything_is_written_but_check_mode_reports(node):
    (node.dir / "dlock").unlink()
    with pytest.raises(Failure, match="dlock is missing: apply the dlock.fleet.dlock_runner role first"):
        node([JOB], timers="started")
    assert on_disk(node) == {} and node.systemctl.calls == []
    assert node([JOB], check=True)["jobs"]["report"]["files"] == paths(node, "report")


def test_a_missing_jobs_directory_fails_and_is_not_made(node):
    # The runner reads its own jobs_dir: a directory made here, under another
    # name than the runner's, would hold jobs no run ever finds.
    with pytest.raises(OSError):
        node([JOB], jobs_dir=str(node.dir / "elsewhere" / "jobs"))
    assert not (node.dir / "elsewhere").exists()


# The filter's hostile cases, through the module: refused with the field named, nothing written.
HOSTILE = [
    ([dict(JOB, name="report\nExecStartPre=/bin/id")], "dlock_jobs_list[0]: name"),
    ([dict(JOB, schedule="hourly\x00")], "(report): schedule"),
    ([dict(JOB, randomized_delay="NaN")], "(report): randomized_delay"),
    ([dict(JOB, once_per="1e308")], "(report): once_per"),
    ([dict(JOB, once_per=1e308)], "(report): once_per"),
    ([dict(JOB, read_write_paths="/srv")], "(report): read_write_paths"),
    ("report,other", "dlock_jobs_list"),
    ([dict(JOB, unit_settings={"MemoryMax": "1G\nExecStartPre=/bin/id"})], "(report): unit_settings.MemoryMax"),
    ([dict(JOB, description="a\\")], "(report): description"),
]


@pytest.mark.parametrize("jobs, field", HOSTILE)
def test_hostile_entries_are_refused_with_the_field_named(node, jobs, field):
    with pytest.raises(ConfigError) as raised:
        node(jobs + [OTHER] if isinstance(jobs, list) else jobs)  # a good job after it: not written either
    assert field in str(raised.value)
    assert on_disk(node) == {}


@pytest.mark.parametrize("param, value", [("randomized_delay", float("nan")), ("group", "dlock\nUser=root"),
                                          ("unit_dir", "/etc/systemd/../x"), ("managed", "x\ny"),
                                          ("hardening", "no"), ("accuracy", 1e308), ("runner_bin", "/usr/bin/dl\x00ock"),
                                          ("jobs_dir", ["/etc/dlock/jobs"]), ("user", ["root"])])
def test_hostile_settings_are_refused_with_the_setting_named(node, param, value):
    with pytest.raises(ConfigError, match=param):
        node([JOB], **{param: value})
    assert on_disk(node) == {}


def test_a_fifo_at_a_file_s_path_is_refused_not_waited_on(node):
    os.mkfifo(paths(node, "report")[2])
    with pytest.raises(Failure, match="dlock-report.timer is not a regular file"):
        node([JOB])
    assert stat.S_ISFIFO(os.lstat(paths(node, "report")[2]).st_mode)
    # A removed job's FIFO is simply removed.
    assert node([dict(name="report", state="absent")])["jobs"]["report"]["changed"]
    assert not os.path.lexists(paths(node, "report")[2])
    # A directory there is not removed: the module says so.
    os.mkdir(paths(node, "report")[2])
    with pytest.raises(Failure, match="dlock-report.timer is a directory"):
        node([dict(name="report", state="absent")])
    assert os.path.isdir(paths(node, "report")[2])


def test_the_examples_pass_the_argument_spec_and_the_job_rules(node):
    tasks = yaml.safe_load(module.EXAMPLES)
    assert len(tasks) == 2
    for task in tasks:
        args = dict(task["dlock.fleet.dlock_job_units"])
        args = dict((k, [JOB] if k == "jobs" and isinstance(v, str) else v) for k, v in args.items())  # a variable
        args.pop("managed", None)  # a lookup on the controller
        result = ArgumentSpecValidator(module.ARGUMENT_SPEC).validate(args)
        assert not result.error_messages, (task["name"], result.error_messages)
        params = dict(result.validated_parameters, jobs_dir=str(node.dir / "jobs"), unit_dir=str(node.dir / "units"),
                      group=GROUP)
        assert module.JobUnits(params, True, False, node.systemctl, str(node.dir / "run-systemd")).run()["changed"]
