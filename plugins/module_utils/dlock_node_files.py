# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How the node modules (dlock_files, dlock_job_units) change a file on a
node: every file is judged first (plan_file, plan_directory, plan_removal:
reads only), and only then is any change made (Change.apply). A path that
cannot be written (a FIFO, a link, a directory where a file belongs) so fails
the call with nothing written. A file is replaced in one rename, its data on
disk first; a reader sees the old file or the new one."""

from __future__ import annotations

import os
import stat

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.safefile import replace_file
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_changes import Failure

ROOT = 0


def read_current(path):
    """(content as bytes, stat) of the regular file at `path`, or None when
    nothing is there. Anything else there (a FIFO, a link, a directory) is
    refused: it is never opened, so never waited on."""
    try:
        # Looked at before it is opened: a device there is never opened.
        if not stat.S_ISREG(os.lstat(path).st_mode) and not os.path.islink(path):
            raise Failure("%s is not a regular file (a FIFO, device, socket or directory): remove it, the role "
                          "writes the file itself" % path)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os.path.islink(path):
            raise Failure("%s is a symbolic link, not a regular file: remove it, the role writes the file itself"
                          % path)
        raise Failure("%s: cannot read (%s)" % (path, exc.strerror or exc))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Failure("%s is not a regular file (a FIFO, device, socket or directory): remove it, the role "
                          "writes the file itself" % path)
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks), info
    finally:
        os.close(fd)


def _attributes(uid, gid, mode):
    return "owner %d, group %d, mode %04o\n" % (uid, gid, mode)


class WriteFile(object):
    """A regular file to write (its text differs, or it is missing) or whose
    owner, group or mode only are to be set. gid None: the group does not
    exist yet (check mode), so the file's own is kept in the comparison."""

    def __init__(self, path, content, uid, gid, mode, current):
        self.path = path
        self.content = content
        self.uid = uid
        self.gid = gid
        self.mode = mode
        self.current = current  # (bytes, stat) or None
        self.text_differs = current is None or current[0] != content.encode("utf-8")

    def diff(self):
        if self.text_differs:
            before = None if self.current is None else self.current[0].decode("utf-8", "replace")
            return _diff(self.path, before, self.content)
        info = self.current[1]
        return _diff(self.path, _attributes(info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)),
                     _attributes(self.uid, info.st_gid if self.gid is None else self.gid, self.mode))

    def apply(self):
        if self.text_differs:
            replace_file(self.path, self.content, self.mode, durable=True,
                         owner=(self.uid, -1 if self.gid is None else self.gid))
            return
        os.chown(self.path, self.uid, -1 if self.gid is None else self.gid, follow_symlinks=False)
        os.chmod(self.path, self.mode)


class MakeDirectory(object):
    """A directory to create, or whose owner, group or mode are to be set."""

    def __init__(self, path, uid, gid, mode, current):
        self.path = path
        self.uid = uid
        self.gid = gid
        self.mode = mode
        self.current = current  # os.stat_result or None
        self.text_differs = False

    def diff(self):
        info = self.current
        if self.gid is not None:
            want = "directory, " + _attributes(self.uid, self.gid, self.mode)
        elif info is not None:
            want = "directory, " + _attributes(self.uid, info.st_gid, self.mode)
        else:  # check mode, the group not there yet
            want = "directory, owner %d, group (not created yet), mode %04o\n" % (self.uid, self.mode)
        if info is None:
            return _diff(self.path, None, want)
        return _diff(self.path, "directory, " + _attributes(info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)),
                     want)

    def apply(self):
        if self.current is None:
            _make_parents(os.path.dirname(self.path))
            os.mkdir(self.path, 0o700)  # its mode is set below, whatever the umask
        os.chown(self.path, self.uid, -1 if self.gid is None else self.gid, follow_symlinks=False)
        os.chmod(self.path, self.mode)


def _make_parents(path):
    """The missing directories above a new one, root's and 0755 whatever the
    umask (as `mkdir -p` would leave them under umask 022): a root umask of
    027 would otherwise close them to the job users and node_exporter, and
    one of 0 would leave them writable by all."""
    if os.path.isdir(path):
        return
    _make_parents(os.path.dirname(path))
    os.mkdir(path, 0o700)
    os.chown(path, ROOT, ROOT, follow_symlinks=False)
    os.chmod(path, 0o755)


class Removal(object):
    """A file (or link, FIFO, socket) to remove; it is never opened unless regular."""

    text_differs = True

    def __init__(self, path, before):
        self.path = path
        self.before = before

    def diff(self):
        return _diff(self.path, self.before, None)

    def apply(self):
        os.unlink(self.path)


def _diff(path, before, after):
    return {"before_header": path if before is not None else "%s (absent)" % path,
            "after_header": path if after is not None else "%s (absent)" % path,
            "before": before or "", "after": after or ""}


def plan_file(path, content, uid, gid, mode):
    """None when the regular file at `path` holds `content` with this owner,
    group and mode; else the WriteFile that makes it so."""
    current = read_current(path)
    change = WriteFile(path, content, uid, gid, mode, current)
    if change.text_differs:
        return change
    info = current[1]
    if (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (uid, info.st_gid if gid is None else gid, mode):
        return None
    return change


def plan_directory(path, uid, gid, mode):
    """None when `path` is a directory with this owner, group and mode; else
    the MakeDirectory that makes it so. Anything else at `path` is refused."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return MakeDirectory(path, uid, gid, mode, None)
    if not stat.S_ISDIR(info.st_mode):
        raise Failure("%s is not a directory: remove it, the role makes the directory itself" % path)
    if (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (uid, info.st_gid if gid is None else gid, mode):
        return None
    return MakeDirectory(path, uid, gid, mode, info)


def plan_removal(path, with_text=True):
    """None when nothing is at `path`; else the Removal of what is there (its
    text in the diff when it is a regular file and with_text). A directory
    is refused: it is never a file the role wrote."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(info.st_mode):
        raise Failure("%s is a directory, not a file the role wrote: remove it yourself" % path)
    before = ""
    if with_text and stat.S_ISREG(info.st_mode):
        before = read_current(path)[0].decode("utf-8", "replace")
    return Removal(path, before)
