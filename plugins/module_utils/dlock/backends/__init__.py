"""Backend selection by URL; drivers are imported only for the backend in use."""

from ..validate import SCHEMES, backend_url
from .base import (ALL_SCOPE, GROUP_SCOPE, PAUSE_LOG_KEEP, Backend, Grant, LockView, Pause,  # noqa: F401
                   Slot, group_scope, job_scope, log_pause, pause_path, pause_scopes, paused_spans,  # (re-exported)
                   scope_parts, validate_key)
from .epoch import with_epoch


def parse_url(url, field="backend"):
    """Check a backend URL (validate.backend_url: credentials first, nothing
    echoed with a password) and return its parts."""
    return backend_url(url, field)


def open_backend(url, password=None, op_timeout=2.0, ca_file=None, fence_epoch=0):
    """A Backend for the URL, its fences in fence_epoch (epoch.py). Connections
    are opened lazily, on first use."""
    return with_epoch(_open(url, password, op_timeout, ca_file), fence_epoch)


def _open(url, password, op_timeout, ca_file):
    parts = parse_url(url)
    scheme = parts.scheme
    url = parts.url
    if scheme in ("redis", "rediss"):
        from .redis_lease import RedisBackend
        return RedisBackend(url, password=password, op_timeout=op_timeout, ca_file=ca_file)
    if scheme == "postgresql":
        from .pg_lease import PgLeaseBackend
        return PgLeaseBackend(url, password=password, op_timeout=op_timeout, ca_file=ca_file)
    if scheme == "postgresql+advisory":
        from .pg_advisory import PgAdvisoryBackend
        return PgAdvisoryBackend("postgresql" + url[len(scheme):], password=password,
                                 op_timeout=op_timeout, ca_file=ca_file)
    if scheme in ("etcd", "etcd+https"):
        from .etcd_lease import EtcdBackend
        return EtcdBackend(url, password=password, op_timeout=op_timeout, ca_file=ca_file)
    from .file_lock import FileBackend
    path = parts.path
    if "%" in path:  # percent-encoded; urllib.parse is imported only then (a start without it is ~0.6ms shorter)
        from urllib.parse import unquote
        path = unquote(path)
    return FileBackend(path)
