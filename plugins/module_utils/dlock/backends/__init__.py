"""Backend selection by URL; drivers are imported only for the backend in use."""

from urllib.parse import unquote, urlsplit

from ..errors import ConfigError
from .base import Backend, Grant, Holder, Slot, validate_key  # noqa: F401  (re-exported)

SCHEMES = ("redis", "rediss", "postgresql", "postgresql+advisory", "file")


def parse_url(url, field="backend"):
    """Split and check a backend URL; refuse passwords in it (they go in a file)."""
    if not isinstance(url, str) or not url:
        raise ConfigError("%s: a backend URL is required (redis://, rediss://, postgresql://, "
                          "postgresql+advisory:// or file://)" % field)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as exc:
        raise ConfigError("%s: %r is not a valid URL (%s)" % (field, url, exc))
    if parts.scheme not in SCHEMES:
        raise ConfigError("%s: unsupported scheme %r (use one of %s)"
                          % (field, parts.scheme, ", ".join(s + "://" for s in SCHEMES)))
    if parts.password is not None:
        raise ConfigError("%s: the URL contains a password; put it in a password file "
                          "(password_file / --password-file) or a systemd credential instead" % field)
    if parts.scheme == "file":
        if parts.netloc or not parts.path.startswith("/"):
            raise ConfigError("%s: %r must be file:///absolute/directory" % (field, url))
    elif not parts.hostname:
        raise ConfigError("%s: %r has no host" % (field, url))
    return parts


def open_backend(url, password=None, op_timeout=2.0, ca_file=None):
    """A Backend for the URL. Connections are opened lazily, on first use."""
    parts = parse_url(url)
    scheme = parts.scheme
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
    from .file_lock import FileBackend
    return FileBackend(unquote(parts.path))
