"""Backend.query_many (what `dlock status` and `dlock metrics` read) against
real servers: for every kind of lock, the same view as query() of its key,
in the order the keys were asked, over more keys than one etcd transaction
holds."""

import pytest
from runner_proc import wait_for
from servers import url_of

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import open_backend
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.epoch import COUNTER_LIMIT
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.etcd_lease import KEYS_PER_TXN

# Apart from these, query() and query_many() read a lock at different
# moments: its time left, its age and the server's clock move on between
# them (etcd's time left is in whole seconds).
MOVING = ("ttl_remaining", "server_time")
DRIFT = 3.0


@pytest.fixture(params=["file", "redis", "postgresql", "postgresql+advisory", "etcd"])
def any_backend_url(request, tmp_path):
    return url_of(request, request.param, tmp_path)


def fields(view):
    return dict((name, value) for name, value in vars(view).items() if name not in MOVING)


def assert_same_view(single, batched):
    assert fields(batched) == fields(single)
    assert (batched.ttl_remaining is None) == (single.ttl_remaining is None), (single.key, vars(batched))
    if single.ttl_remaining is not None:
        assert abs(batched.ttl_remaining - single.ttl_remaining) < DRIFT
    assert abs(batched.server_time - single.server_time) < DRIFT


def test_query_many_gives_each_key_the_view_query_gives(any_backend_url, unique_key):
    """A held lock, one released with its last run, one released without
    (only its fence is left), and keys never used, around the bounds of
    the etcd transactions; read through a fence epoch, as a node with one
    reads them."""
    holder, other = open_backend(any_backend_url), open_backend(any_backend_url)
    reader = open_backend(any_backend_url, fence_epoch=1)
    held, ran, fence_only = unique_key + "-held", unique_key + "-ran", unique_key + "-fence"
    unused = [unique_key + "-unused-%d" % number for number in range(KEYS_PER_TXN + 4)]
    keys = unused[:KEYS_PER_TXN - 2] + [held, ran, fence_only] + unused[KEYS_PER_TXN - 2:]
    try:
        grants = {held: holder.acquire(held, "owner-held", 30), ran: other.acquire(ran, "owner-ran", 30)}
        record = {"result": "success", "exit_code": 0, "owner": "owner-ran", "host": "node01"}
        assert other.release(ran, "owner-ran", 0.0, dict(record))
        grants[fence_only] = other.acquire(fence_only, "owner-fence", 30)
        assert other.release(fence_only, "owner-fence")
        assert all(grant.granted for grant in grants.values())
        before = reader.server_time()
        batched = reader.query_many(keys)
        after = reader.server_time()
        singles = [reader.query(key) for key in keys]
        again = reader.query_many(list(reversed(keys)))
    finally:
        for backend in (holder, other, reader):
            backend.close()
    assert len(keys) > KEYS_PER_TXN + 2
    assert [view.key for view in batched] == keys
    assert [view.key for view in again] == list(reversed(keys))
    for single, view, view_again in zip(singles, batched, reversed(again)):
        assert_same_view(single, view)
        assert_same_view(single, view_again)
        # The backend's clock (etcd's comes in whole seconds, a Date header).
        assert before - DRIFT < view.server_time < after + DRIFT
    # What each lock is, whichever way it is read: fences in epoch 1.
    views = dict((view.key, view) for view in batched)
    for key, grant in grants.items():
        assert views[key].fence == COUNTER_LIMIT + grant.fence
    assert views[held].owner == "owner-held" and views[held].acquired_at is not None
    assert views[held].ttl_remaining is None or 0 < views[held].ttl_remaining <= 30
    assert (views[ran].owner, views[ran].last) == (None, record)
    assert (views[fence_only].owner, views[fence_only].last) == (None, None)
    assert all((views[key].owner, views[key].fence, views[key].last) == (None, COUNTER_LIMIT, None) for key in unused)


def test_query_many_of_no_key_is_empty(any_backend_url):
    """An empty jobs directory: nothing to read."""
    backend = open_backend(any_backend_url)
    try:
        assert backend.query_many([]) == []
    finally:
        backend.close()


def test_advisory_lock_whose_session_ended_reads_free(pg_server, unique_key):
    """The advisory backend's row names a session holder: held only while
    a session holds the advisory lock, for query_many as for query."""
    url = pg_server.url(scheme="postgresql+advisory")
    holder, reader = open_backend(url), open_backend(url)
    try:
        assert holder.acquire(unique_key, "owner-gone", 30).granted
        assert [view.owner for view in reader.query_many([unique_key, unique_key + "-unused"])] == ["owner-gone", None]
        holder.close()  # its session ends, the lock with it; the row still names the owner
        wait_for(lambda: reader.query(unique_key).owner is None, 10, "the holder's session to end")
        assert pg_server.sql("SELECT owner FROM dlock_lease WHERE key = '%s'" % unique_key, db="dlock") \
            == [("owner-gone",)]
        assert [view.owner for view in reader.query_many([unique_key, unique_key + "-unused"])] == [None, None]
    finally:
        holder.close()
        reader.close()
