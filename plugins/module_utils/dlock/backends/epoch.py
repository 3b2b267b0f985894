"""Fence epochs: the one place where a backend's counter becomes the fence
every consumer sees (the job's DLOCK_FENCING_TOKEN, the log line and the
`last` record, `dlock status`, `dlock release --force`, the metrics, the
module's `fence`).

fence = epoch * 2**40 + counter, the counter being what the backend's grant
issued. Each backend counts from 1; a fleet that switches backends sets
fence_epoch one higher, so that the new backend's fences are above all of
the old one's and a resource that keeps the highest fence seen accepts them
at once. A counter of 2**40 or more would reach into the next epoch's fences
and is refused, never wrapped. Epoch 0 is no epoch: open_backend() returns
the backend itself, and every fence is its counter, exactly as before epochs.
"""

from .. import validate
from ..errors import ConfigError, DlockError
from ..validate import FENCE_COUNTER_BITS, fence_epoch

COUNTER_LIMIT = 2 ** FENCE_COUNTER_BITS


class EpochBackend(object):
    """A backend whose grants and lock views carry composed fences. Everything
    else is the backend's own (attributes and methods are delegated)."""

    def __init__(self, backend, epoch):
        self._backend = backend
        self._epoch = epoch

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def compose(self, counter, key):
        """The fence of the backend's counter for key. A ConfigError, not a
        BackendError: the operator must act (and fail_open must not run the
        job without its lock because of it)."""
        if counter is None:
            return None
        if not 0 <= counter < COUNTER_LIMIT:
            raise ConfigError(
                "%s: the %s backend's fence counter is %d, at or above 2**40: with fence_epoch %d it would give "
                "the fences of epoch %d, so it is refused. Switch to a fresh backend (or key) with fence_epoch "
                "(dlock_fence_epoch) one higher: docs/backends.md, Switching backends"
                % (key, self._backend.name, counter, self._epoch, self._epoch + counter // COUNTER_LIMIT))
        return self._epoch * COUNTER_LIMIT + counter

    def _view(self, view):
        if view is not None:
            view.fence = self.compose(view.fence, view.key)
        return view

    def acquire(self, key, owner, ttl, slot=None, pauses=()):
        grant = self._backend.acquire(key, owner, ttl, slot, pauses)
        try:
            grant.fence = self.compose(grant.fence, key)
            self._view(grant.holder)
        except ConfigError:
            if grant.granted:
                # Refused after the backend granted it: give the lease back
                # (owner-checked), else it would block every runner until its TTL.
                try:
                    self._backend.release(key, owner)
                except DlockError:
                    pass  # the lease ends at its TTL
            raise
        return grant

    def query(self, key):
        return self._view(self._backend.query(key))

    def query_many(self, keys):
        return [self._view(view) for view in self._backend.query_many(keys)]

    def force_release(self, key):
        return self._view(self._backend.force_release(key))


def with_epoch(backend, epoch):
    """The backend as open_backend returns it: itself at epoch 0. The epoch
    is checked either way (False is no 0)."""
    return EpochBackend(backend, epoch) if fence_epoch(epoch) else backend


# -- a switch of backend on a node (the runner role's preflight) -----------------
# The port a URL without one means (each server's default): the backends and
# the switch's identity read it here.
DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "postgresql": 5432, "postgresql+advisory": 5432,
                 "etcd": 2379, "etcd+https": 2379}


def backend_identity(url):
    """What makes two URLs the same fence counters (same_backend): the
    scheme, the hosts (names compared without case, the default port filled
    in) and the database (Redis: its number, 0 when the URL names none), key
    prefix (etcd) or directory (file). Not the user, the password or the
    query's options: the same server, reached another way, still counts on.
    redis:// and rediss:// differ, as every scheme does: a false difference
    only asks for an epoch one higher, which is always safe."""
    parts = validate.backend_url(url, "backend")
    path = parts.path
    if parts.scheme in ("redis", "rediss"):
        path = path.strip("/") or "0"
    default_port = DEFAULT_PORTS.get(parts.scheme)
    hosts = frozenset((host.lower(), port or default_port) for host, port in parts.hosts)
    return parts.scheme, hosts, path


def same_backend(old_url, new_url):
    """Whether NEW_URL still reaches the fence counters of OLD_URL: the same
    scheme and database, and hosts in common. A cluster whose URL names its
    members (etcd, a Patroni cluster's multi-host URL) keeps its counters
    through a change of members, which the README's procedures make one or
    two at a time: grown from 3 to 5, or a member replaced, it shares hosts
    with the URL before. (A cluster rebuilt on the same hosts looks the same
    and is not caught here: docs/backends.md.)"""
    old_scheme, old_hosts, old_path = backend_identity(old_url)
    new_scheme, new_hosts, new_path = backend_identity(new_url)
    shared = bool(old_hosts & new_hosts) or not (old_hosts or new_hosts)  # file:// names no host
    return (old_scheme, old_path) == (new_scheme, new_path) and shared


def switch_problems(installed, where, url, epoch):
    """[] when a node whose dlock.json holds `installed` (its text, or None
    when there is none) may switch to backend `url` with fence epoch `epoch`
    (both already checked); else the message. Fences must never go back:
    another backend needs an epoch above the installed one (its counters
    start again from 1), the same backend an epoch at least as high. An
    installed file that does not hold a valid backend and epoch was never
    run by this runner (it refuses such a file): nothing to keep."""
    if installed is None:
        return []
    try:
        config = validate.parse_json(installed)
        old_url = config["backend"]
        backend_identity(old_url)  # a valid URL, else the file was never the runner's
        old_epoch = fence_epoch(config.get("fence_epoch", 0))
    except (ValueError, TypeError, KeyError, AttributeError, ConfigError):
        return []
    epoch = fence_epoch(epoch)
    procedure = "the procedure: docs/backends.md, Switching backends. Nothing was changed."
    if not same_backend(old_url, url):
        if epoch > old_epoch:
            return []
        return ["dlock_runner: %s uses the backend %s with fence_epoch %d, and this rollout switches it to %s with "
                "fence_epoch %d: the new backend counts its fences from 1 again, and a resource that keeps the "
                "highest fence seen would refuse every write of its jobs. Set dlock_fence_epoch: %d (site.yml; "
                "dlock_runner_fence_epoch for the role alone) after draining the jobs; %s"
                % (where, validate.redact_url(old_url), old_epoch, validate.redact_url(url), epoch, old_epoch + 1,
                   procedure)]
    if epoch < old_epoch:
        return ["dlock_runner: %s has fence_epoch %d on the backend %s, and this rollout lowers it to %d: fences "
                "would go back, and a resource that keeps the highest fence seen would refuse every write. Keep "
                "dlock_fence_epoch at %d or above; %s"
                % (where, old_epoch, validate.redact_url(url), epoch, old_epoch, procedure)]
    return []
