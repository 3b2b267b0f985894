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

import grp
import os
import pwd
import stat

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.safefile import replace_file
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_changes import Failure

ROOT = 0
CREATE_IT_FIRST = "create it first"


def owner_id(name):
    """The uid of a user name or id; the user must exist."""
    if name.isdigit():
        return int(name)
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        raise Failure("user %s does not exist on this node: %s" % (name, CREATE_IT_FIRST))


def group_id(name, check, remedy=CREATE_IT_FIRST):
    """The gid of a group name or id; None in check mode when the group does
    not exist yet (the run that creates it would set it). REMEDY: what the
    failure tells to do otherwise."""
    if name.isdigit():
        return int(name)
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        if check:
            return None
        raise Failure("group %s does not exist on this node: %s" % (name, remedy))


def read_current(path):
    """(content as bytes, stat) of the regular file at `path`, or None when
    nothing is there. Anything else there (a FIFO, a link, a directory) is
    refused: it is never opened, so never waited on."""
    try:
        # Looked at before it is opened: a device there is never opened (a
        # link is refused below, by O_NOFOLLOW, with its own message).
        kind = os.lstat(path).st_mode
        if not (stat.S_ISREG(kind) or stat.S_ISLNK(kind)):
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


def _have(info):
    """(owner, group, mode) of what is at a path."""
    return info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)


def _want(info, uid, gid, mode):
    """(owner, group, mode) wanted of it; gid None (check mode, the group not
    there yet) keeps its own group."""
    return uid, info.st_gid if gid is None else gid, mode


def _set_attributes(path, uid, gid, mode):
    os.chown(path, uid, -1 if gid is None else gid, follow_symlinks=False)
    os.chmod(path, mode)


class WriteFile(object):
    """A regular file to write (its text differs, or it is missing) or whose
    owner, group or mode only are to be set. gid None: the group does not
    exist yet (check mode), so the file's own is kept in the comparison.
    make_parents: a new file's missing directories are made (else its
    directory must exist)."""

    def __init__(self, path, content, uid, gid, mode, current, make_parents=False):
        self.path = path
        self.content = content
        self.uid = uid
        self.gid = gid
        self.mode = mode
        self.current = current  # (bytes, stat) or None
        self.make_parents = make_parents
        self.text_differs = current is None or current[0] != content.encode("utf-8")

    def diff(self):
        if self.text_differs:
            before = None if self.current is None else self.current[0].decode("utf-8", "replace")
            return _diff(self.path, before, self.content)
        info = self.current[1]
        return _diff(self.path, _attributes(*_have(info)), _attributes(*_want(info, self.uid, self.gid, self.mode)))

    def apply(self):
        if self.current is None and self.make_parents:
            _make_parents(os.path.dirname(self.path))
        if self.text_differs:
            replace_file(self.path, self.content, self.mode, durable=True,
                         owner=(self.uid, -1 if self.gid is None else self.gid))
            return
        _set_attributes(self.path, self.uid, self.gid, self.mode)


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
        if info is not None:
            return _diff(self.path, "directory, " + _attributes(*_have(info)),
                         "directory, " + _attributes(*_want(info, self.uid, self.gid, self.mode)))
        if self.gid is None:  # check mode, the group not there yet
            return _diff(self.path, None, "directory, owner %d, group (not created yet), mode %04o\n"
                         % (self.uid, self.mode))
        return _diff(self.path, None, "directory, " + _attributes(self.uid, self.gid, self.mode))

    def apply(self):
        if self.current is None:
            _make_parents(os.path.dirname(self.path))
            _make_directory(self.path)  # its mode is set below, whatever the umask
        _set_attributes(self.path, self.uid, self.gid, self.mode)


def _make_directory(path):
    """mkdir PATH 0700; a directory that another process made meanwhile (two
    tasks mirroring one pause into a shared directory, a package's
    postinst) is taken as it is, its owner and mode set after; anything
    else there, a symlink included, is still an error."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise


def _make_parents(path):
    """The missing directories above a new file or directory, root's and 0755 whatever the
    umask (as `mkdir -p` would leave them under umask 022): a root umask of
    027 would otherwise close them to the job users and node_exporter, and
    one of 0 would leave them writable by all."""
    if os.path.isdir(path):
        return
    _make_parents(os.path.dirname(path))
    _make_directory(path)
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


def plan_file(path, content, uid, gid, mode, make_parents=False):
    """None when the regular file at `path` holds `content` with this owner,
    group and mode; else the WriteFile that makes it so."""
    current = read_current(path)
    change = WriteFile(path, content, uid, gid, mode, current, make_parents)
    if change.text_differs:
        return change
    return None if _have(current[1]) == _want(current[1], uid, gid, mode) else change


def plan_directory(path, uid, gid, mode):
    """None when `path` is a directory with this owner, group and mode; else
    the MakeDirectory that makes it so. Anything else at `path` is refused."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return MakeDirectory(path, uid, gid, mode, None)
    if not stat.S_ISDIR(info.st_mode):
        raise Failure("%s is not a directory: remove it, the role makes the directory itself" % path)
    return None if _have(info) == _want(info, uid, gid, mode) else MakeDirectory(path, uid, gid, mode, info)


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
