"""Reading files without ever blocking, and replacing them without ever
writing through a link.

A FIFO, a device or a socket given as a config or password file would make
a plain open() or read() wait forever (a FIFO with no writer) or read
without end (/dev/zero). Files are opened with O_NONBLOCK, checked with
fstat to be regular files, and read up to a size limit.

The runner writes into directories that others may write to as well (the
metrics directory, a file:// lock directory, shared by the jobs of several
users). A file is replaced through a new one of a random name, made with
O_EXCL and O_NOFOLLOW: a link planted at a predictable temporary name would
have made a runner started as root write (and chmod) the link's target.
"""

import binascii
import errno
import os
import stat

from .errors import ConfigError

MAX_CONFIG_BYTES = 1024 * 1024
MAX_SECRET_BYTES = 4096


def read_regular(path, what, max_bytes=MAX_CONFIG_BYTES, follow=True):
    """The text of the regular file `path` (UTF-8); ConfigError naming `what`
    and the path otherwise. Raises FileNotFoundError when it does not exist.
    follow=False: a symbolic link at `path` is refused, not followed (files
    of a directory others may write to)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except (IOError, OSError) as exc:
        if not follow and exc.errno == errno.ELOOP:
            raise ConfigError("%s %s: is a symbolic link (refused: it could point anywhere)" % (what, path))
        raise ConfigError("%s %s: cannot read (%s)" % (what, path, exc.strerror or exc))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError("%s %s: is not a regular file (a FIFO, device, socket or directory "
                              "would block or never end)" % (what, path))
        if info.st_size > max_bytes:
            raise ConfigError("%s %s: is larger than %d bytes" % (what, path, max_bytes))
        data = os.read(fd, max_bytes + 1)
    except (IOError, OSError) as exc:
        raise ConfigError("%s %s: cannot read (%s)" % (what, path, exc.strerror or exc))
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ConfigError("%s %s: is larger than %d bytes" % (what, path, max_bytes))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("%s %s: is not UTF-8 text" % (what, path))


def require_regular(path, what):
    """A file a driver opens itself (a TLS CA bundle) must be a regular file:
    a FIFO there would block the driver, and no timeout of ours covers that."""
    try:
        info = os.stat(path)
    except (IOError, OSError) as exc:
        raise ConfigError("%s %s: cannot read (%s)" % (what, path, exc.strerror or exc))
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError("%s %s: is not a regular file (a FIFO, device, socket or directory "
                          "would block or never end)" % (what, path))
    return path


def replace_file(path, text, mode=0o644, durable=False, owner=None):
    """Replace `path` with a file holding `text` (UTF-8), in one rename: a
    reader sees the old file or the new one, never half of one. The new file
    is made under a random name that did not exist (O_EXCL, O_NOFOLLOW) and
    its owner (a (uid, gid) pair; a gid of -1 leaves it) and mode set on the
    file itself (fchown, fchmod), never through a path. durable: its data is
    on disk before the rename. OSError when it cannot be done; the new file is
    removed then."""
    tmp = "%s.%s.tmp" % (path, binascii.hexlify(os.urandom(8)).decode())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        try:
            if owner is not None:
                os.fchown(fd, owner[0], owner[1])  # before fchmod: a chown clears set-id bits
            os.fchmod(fd, mode)
            data = text.encode("utf-8")
            while data:
                data = data[os.write(fd, data):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass  # the error being raised says what went wrong
        raise
