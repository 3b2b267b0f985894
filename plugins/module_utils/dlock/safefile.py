"""Reading configuration and secret files without ever blocking.

A FIFO, a device or a socket given as a config or password file would make
a plain open() or read() wait forever (a FIFO with no writer) or read
without end (/dev/zero). Files are opened with O_NONBLOCK, checked with
fstat to be regular files, and read up to a size limit.
"""

import os
import stat

from .errors import ConfigError

MAX_CONFIG_BYTES = 1024 * 1024
MAX_SECRET_BYTES = 4096


def read_regular(path, what, max_bytes=MAX_CONFIG_BYTES):
    """The text of the regular file `path` (UTF-8); ConfigError naming `what`
    and the path otherwise. Raises FileNotFoundError when it does not exist."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except (IOError, OSError) as exc:
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
