"""Fence epochs: the one place where a backend's counter becomes the fence
every consumer sees (the job's DLOCK_FENCING_TOKEN, the log line and the
`last` record, `dlock status`, `dlock release --force`, the metrics, the
module's `fence`).

fence = epoch * 2**32 + counter, the counter being what the backend's grant
issued. Each backend counts from 1; a fleet that switches backends sets
fence_epoch one higher, so that the new backend's fences are above all of
the old one's and a resource that keeps the highest fence seen accepts them
at once. A counter of 2**32 or more would reach into the next epoch's fences
and is refused, never wrapped. Epoch 0 is no epoch: open_backend() returns
the backend itself, and every fence is its counter, exactly as before epochs.
"""

from ..errors import ConfigError, DlockError
from ..validate import FENCE_COUNTER_BITS, fence_epoch

COUNTER_LIMIT = 2 ** FENCE_COUNTER_BITS


class EpochBackend(object):
    """A backend whose grants and holders carry composed fences. Everything
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
                "%s: the %s backend's fence counter is %d, at or above 2**32: with fence_epoch %d it would give "
                "the fences of epoch %d, so it is refused. Switch to a fresh backend (or key) with fence_epoch "
                "(dlock_fence_epoch) one higher: docs/runner.md, Switching backends"
                % (key, self._backend.name, counter, self._epoch, self._epoch + counter // COUNTER_LIMIT))
        return self._epoch * COUNTER_LIMIT + counter

    def _holder(self, holder):
        if holder is not None:
            holder.fence = self.compose(holder.fence, holder.key)
        return holder

    def acquire(self, key, owner, ttl, slot=None):
        grant = self._backend.acquire(key, owner, ttl, slot)
        try:
            grant.fence = self.compose(grant.fence, key)
            self._holder(grant.holder)
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
        return self._holder(self._backend.query(key))

    def force_release(self, key):
        return self._holder(self._backend.force_release(key))


def with_epoch(backend, epoch):
    """The backend as open_backend returns it: itself at epoch 0. The epoch
    is checked either way (False is no 0)."""
    return EpochBackend(backend, epoch) if fence_epoch(epoch) else backend
