"""dlock_node_files: a directory planned absent and made by another process
before the change is applied (two tasks mirroring one pause into one
directory; CI caught the race), and what is still refused then."""

import os
import stat

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock_node_files import plan_directory


def _planned(tmp_path):
    path = str(tmp_path / "pauses")
    change = plan_directory(path, os.getuid(), os.getgid(), 0o750)
    assert change is not None and change.current is None  # absent when planned
    return path, change


def test_a_directory_made_meanwhile_is_taken_and_given_its_mode(tmp_path):
    path, change = _planned(tmp_path)
    os.mkdir(path, 0o777)  # the other task, first
    change.apply()
    info = os.lstat(path)
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o750


def test_its_missing_parents_made_meanwhile_are_taken_too(tmp_path):
    path = str(tmp_path / "a" / "b" / "pauses")
    change = plan_directory(path, os.getuid(), os.getgid(), 0o750)
    os.makedirs(os.path.dirname(path))
    change.apply()
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o750


@pytest.mark.parametrize("made", ["a regular file", "a symlink to a directory"])
def test_anything_else_made_meanwhile_is_still_an_error(tmp_path, made):
    path, change = _planned(tmp_path)
    if made == "a regular file":
        with open(path, "w") as handle:
            handle.write("x")
    else:
        os.symlink(str(tmp_path), path)
    with pytest.raises(FileExistsError):
        change.apply()
    assert stat.S_ISREG(os.lstat(path).st_mode) or os.path.islink(path)  # left as it was
