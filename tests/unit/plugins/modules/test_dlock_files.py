"""The dlock_files module's work on a node, in a temporary directory: files
and directories made once and then left alone, owner, group and mode set,
check mode and diff, removals, and every entry judged before anything is
written (a hostile entry or a FIFO in the way leaves the node as it was).
The property over any text and mode: tests/integration/test_files_property.py
(Hypothesis is not in the unit tests' environments)."""

from __future__ import annotations

import grp
import os
import pwd
import stat

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_changes import Failure
from ansible_collections.dlock.fleet.plugins.modules import dlock_files as module

USER = pwd.getpwuid(os.getuid()).pw_name
GROUP = grp.getgrgid(os.getgid()).gr_name
MISSING_GROUP = "dlock-no-such-group"


@pytest.fixture
def node(tmp_path):
    """call(files, check=False, diff=False) -> result; entries' paths are relative to tmp_path."""

    def call(files, check=False, diff=False):
        rooted = [dict(entry, path=str(tmp_path / entry["path"])) if isinstance(entry, dict) and "path" in entry
                  else entry for entry in files] if isinstance(files, list) else files
        return module.run({"files": rooted}, check, diff)

    call.dir = tmp_path
    return call


def tree(root):
    """{relative path: (kind, text or None, uid, gid, mode)} of everything under root."""
    found = {}
    for base, dirs, files in os.walk(str(root)):
        for name in dirs + files:
            path = os.path.join(base, name)
            info = os.lstat(path)
            text = None
            if stat.S_ISREG(info.st_mode):
                with open(path) as handle:
                    text = handle.read()
            kind = "dir" if stat.S_ISDIR(info.st_mode) else "file" if stat.S_ISREG(info.st_mode) else "other"
            found[os.path.relpath(path, str(root))] = (kind, text, info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode))
    return found


def entries(user=USER, group=GROUP):
    return [
        {"path": "conf.d", "state": "directory", "owner": user, "group": group, "mode": "0750"},
        {"path": "conf.d/a.conf", "content": "a = 1\n", "owner": user, "group": group, "mode": "0640"},
        {"path": "b.conf", "content": "b = 2\n", "mode": "0644", "owner": user, "group": group},
    ]


def test_files_and_directories_are_made_once_then_left_alone(node):
    first = node(entries())
    assert first == {"changed": True, "paths": [str(node.dir / p) for p in ("conf.d", "conf.d/a.conf", "b.conf")]}
    uid, gid = os.getuid(), os.getgid()
    made = tree(node.dir)
    assert made == {"conf.d": ("dir", None, uid, gid, 0o750), "conf.d/a.conf": ("file", "a = 1\n", uid, gid, 0o640),
                    "b.conf": ("file", "b = 2\n", uid, gid, 0o644)}
    assert node(entries()) == {"changed": False, "paths": []}
    assert tree(node.dir) == made


def test_only_what_differs_is_changed_and_shown(node):
    node(entries())
    os.chmod(str(node.dir / "b.conf"), 0o600)
    with open(str(node.dir / "conf.d/a.conf"), "w") as handle:
        handle.write("a = 0\n")
    result = node(entries(), diff=True)
    assert result["paths"] == [str(node.dir / "conf.d/a.conf"), str(node.dir / "b.conf")]
    assert [(d["before"], d["after"]) for d in result["diff"]] == [
        ("a = 0\n", "a = 1\n"),
        ("owner %d, group %d, mode 0600\n" % (os.getuid(), os.getgid()),
         "owner %d, group %d, mode 0644\n" % (os.getuid(), os.getgid()))]
    assert tree(node.dir)["b.conf"][4] == 0o644 and tree(node.dir)["conf.d/a.conf"][1] == "a = 1\n"


def test_check_mode_reports_the_diff_and_changes_nothing(node):
    result = node(entries(), check=True, diff=True)
    assert result["changed"] and len(result["paths"]) == 3
    assert tree(node.dir) == {}
    assert [d["after"] for d in result["diff"]][1:] == ["a = 1\n", "b = 2\n"]
    assert result["diff"][0]["before_header"].endswith("conf.d (absent)")


def test_a_missing_group_is_compared_without_in_check_mode_only(node):
    files = [{"path": "c.conf", "content": "c\n", "mode": "0640", "owner": USER, "group": MISSING_GROUP}]
    assert node(files, check=True)["paths"] == [str(node.dir / "c.conf")]
    with pytest.raises(Failure, match="group %s does not exist" % MISSING_GROUP):
        node(files)
    assert tree(node.dir) == {}
    new_dir = [{"path": "d", "state": "directory", "mode": "0750", "owner": USER, "group": MISSING_GROUP}]
    assert node(new_dir, check=True, diff=True)["diff"][0]["after"] == \
        "directory, owner %d, group (not created yet), mode 0750\n" % os.getuid()
    with pytest.raises(Failure, match="user nobody-here does not exist"):
        node([dict(files[0], owner="nobody-here", group=GROUP)], check=True)


def test_removal_takes_files_links_and_fifos_not_directories(node):
    node(entries())
    os.mkfifo(str(node.dir / "fifo"))
    os.symlink("b.conf", str(node.dir / "link"))
    result = node([{"path": p, "state": "absent"} for p in ("b.conf", "fifo", "link", "never")], diff=True)
    assert result["paths"] == [str(node.dir / p) for p in ("b.conf", "fifo", "link")]
    assert result["diff"][0]["before"] == "b = 2\n" and result["diff"][0]["after_header"].endswith("(absent)")
    assert sorted(tree(node.dir)) == ["conf.d", "conf.d/a.conf"]
    with pytest.raises(Failure, match="conf.d is a directory"):
        node([{"path": "conf.d", "state": "absent"}])
    assert os.path.isdir(str(node.dir / "conf.d"))


@pytest.mark.parametrize("make", [os.mkfifo, os.mkdir, lambda path: os.symlink("/etc/passwd", path)])
def test_something_else_at_a_file_s_path_fails_with_nothing_written(node, make):
    make(str(node.dir / "b.conf"))
    with pytest.raises(Failure, match="b.conf"):
        node(entries())
    assert "conf.d" not in tree(node.dir)  # the entries before it were not made either


def test_a_file_where_a_directory_belongs_fails_with_nothing_written(node):
    with open(str(node.dir / "conf.d"), "w") as handle:
        handle.write("x")
    with pytest.raises(Failure, match="conf.d is not a directory"):
        node(entries())
    assert tree(node.dir) == {"conf.d": ("file", "x", os.getuid(), os.getgid(), tree(node.dir)["conf.d"][4])}


def test_a_directory_s_missing_parents_are_made_0755_whatever_the_umask(node):
    old = os.umask(0o077)
    try:
        node([{"path": "x/y/z", "state": "directory", "mode": "2775", "owner": USER, "group": GROUP}])
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(str(node.dir / "x/y/z")).st_mode) == 0o2775
    assert [stat.S_IMODE(os.stat(str(node.dir / p)).st_mode) for p in ("x", "x/y")] == [0o755, 0o755]


def test_a_file_s_missing_parents_are_made_0755_and_an_existing_one_is_left_as_it_is(node):
    os.mkdir(str(node.dir / "bin"), 0o700)
    old = os.umask(0o077)
    try:
        node([{"path": "usr/local/bin/dlock", "content": "#!/bin/sh\n", "mode": "0755"},
              {"path": "bin/dlock", "content": "#!/bin/sh\n", "mode": "0755"}])
    finally:
        os.umask(old)
    assert [stat.S_IMODE(os.stat(str(node.dir / p)).st_mode) for p in ("usr", "usr/local", "usr/local/bin")] == \
        [0o755, 0o755, 0o755]
    assert stat.S_IMODE(os.stat(str(node.dir / "bin")).st_mode) == 0o700


def test_a_file_with_diff_false_is_named_in_paths_but_its_text_stays_out_of_the_diff(node):
    entries = [{"path": "engine.py", "content": "secretless but long\n", "mode": "0644", "diff": False},
               {"path": "dlock", "content": "#!/bin/sh\n", "mode": "0755"}]
    result = node(entries, diff=True)
    assert result["paths"] == [str(node.dir / "engine.py"), str(node.dir / "dlock")]
    assert [change["after"] for change in result["diff"]] == ["#!/bin/sh\n"]
    with pytest.raises(ConfigError, match=r"files\[0\]\.diff"):
        node([dict(entries[0], diff="no")])


def test_a_path_named_twice_the_same_way_counts_once(node):
    twice = [{"path": "d", "state": "directory", "mode": "0750", "owner": USER, "group": GROUP}] * 2
    assert node(twice)["paths"] == [str(node.dir / "d")]
    assert node(twice) == {"changed": False, "paths": []}


HOSTILE = [
    ("a string", "files"),
    ({"path": "a"}, "files"),
    ([{"path": "/etc/x\n", "content": "", "mode": "0644"}], "files[0].path"),
    ([{"path": "/etc/x\x00y", "content": "", "mode": "0644"}], "files[0].path"),
    ([{"path": "/etc/../x", "content": "", "mode": "0644"}], "files[0].path"),
    ([{"path": "relative", "content": "", "mode": "0644"}], "files[0].path"),
    ([{"path": ["/etc/x"], "content": "", "mode": "0644"}], "files[0].path"),
    ([{"path": "/etc/x", "content": "a\x00b", "mode": "0644"}], "files[0].content"),
    ([{"path": "/etc/x", "content": ["a"], "mode": "0644"}], "files[0].content"),
    ([{"path": "/etc/x", "content": "a" * (1024 * 1024 + 1), "mode": "0644"}], "files[0].content"),
    ([{"path": "/etc/x", "content": "", "mode": 644}], "files[0].mode"),
    ([{"path": "/etc/x", "content": "", "mode": float("nan")}], "files[0].mode"),
    ([{"path": "/etc/x", "content": "", "mode": 1e308}], "files[0].mode"),
    ([{"path": "/etc/x", "content": "", "mode": "4755"}], "files[0].mode"),
    ([{"path": "/etc/x", "content": "", "mode": "0644", "owner": "root\nUser=x"}], "files[0].owner"),
    ([{"path": "/etc/x", "content": "", "mode": "0644", "group": ["root"]}], "files[0].group"),
    ([{"path": "/etc/x", "content": "", "mode": "0644", "state": "link"}], "files[0].state"),
    ([{"path": "/etc/x", "content": "", "mode": "0644", "force": True}], "files[0]"),
    ([{"path": "/etc/x", "state": "absent", "content": ""}], "files[0]"),
    ([{"path": "/etc/x", "mode": "0644"}], "content is required"),
    ([{"path": "/etc/x", "content": ""}], "mode is required"),
    ([{"content": "", "mode": "0644"}], "path is required"),
    ([{"path": "/etc/x", "state": "absent"}, {"path": "/etc/x", "content": "", "mode": "0644"}], "named twice"),
]


@pytest.mark.parametrize("files, field", HOSTILE)
def test_hostile_entries_are_refused_with_the_field_named_and_nothing_written(tmp_path, files, field):
    good = {"path": str(tmp_path / "good.conf"), "content": "g\n", "mode": "0644", "owner": USER, "group": GROUP}
    with pytest.raises(ConfigError) as raised:
        module.run({"files": [good] + files if isinstance(files, list) else files}, False, False)
    assert field.replace("files[0]", "files[1]") in str(raised.value) if isinstance(files, list) \
        else field in str(raised.value)
    assert os.listdir(str(tmp_path)) == []
