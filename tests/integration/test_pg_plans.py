"""The PostgreSQL statements of the engine, as PostgreSQL plans them on lease
tables large enough for a sequential scan to matter.

Every statement the lease and advisory backends send (grant, renew,
release, the line of waiters, slots, pauses, force release) is EXPLAINed
against the real local PostgreSQL with its real parameters, on 20000 leases,
20000 tickets, 20000 slot markers and 20000 pauses, and must reach its rows
of dlock_lease, dlock_wait, dlock_slot and dlock_pause by an index: no
sequential scan of any of them.
A fleet's lock database holds one row per lock key and grows with the keys;
a statement that reads a whole table would slow every grant as it grows.
"""

import psycopg
import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import open_backend
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import pg_advisory, pg_common, pg_lease

ROWS = 20000
TABLES = ("dlock_lease", "dlock_wait", "dlock_slot", "dlock_pause")
INDEX_NODES = ("Index Scan", "Index Only Scan", "Bitmap Heap Scan")

KEY, OWNER = "k-777", "owner-777-0"
SCOPES = {"scopes": ["job:" + KEY, "all"]}
GRANT = dict(SCOPES, key=KEY, owner=OWNER, ttl_ms=30000, session=False)
RELEASE = {"key": KEY, "owner": OWNER, "min_hold_ms": 5000, "last": None}
SLOT = {"key": KEY, "owner": OWNER, "slot": 5, "marker_ms": 60000, "width_ms": None, "lead_ms": 2000}
STATEMENTS = {
    "grant, nobody in line": (pg_common.UPSERT_LEASE_NO_LINE, GRANT),
    "grant by the line": (pg_common.UPSERT_LEASE, GRANT),
    "grant of a session holder": (pg_common.UPSERT_LEASE, dict(GRANT, ttl_ms=None, session=True)),
    "renew": (pg_lease.RENEW, (30000, KEY, OWNER)),
    "release": (pg_common.RELEASE, RELEASE),
    "release at once": (pg_common.RELEASE_AT_ONCE, dict(RELEASE, min_hold_ms=0)),
    "release at once, recording the run": (pg_common.RELEASE_AT_ONCE_LAST,
                                           dict(RELEASE, min_hold_ms=0, last='{"result": "success"}')),
    "wake the first waiter": (pg_common.WAKE_FIRST, {"key": KEY}),
    "unlock, advisory": (pg_advisory.UNLOCK, {"id": 1, "key": KEY}),
    "query": (pg_common.QUERY, ([KEY],)),
    "waiters": (pg_common.WAITERS, (KEY,)),
    "join the line": (pg_common.JOIN_QUEUE, {"key": KEY, "owner": OWNER, "ttl_ms": 3000}),
    "leave the line": (pg_common.LEAVE_QUEUE, {"key": KEY, "owner": OWNER}),
    "claim a slot": (pg_common.CLAIM_SLOT, dict(SLOT, exact=False, blackout=False)),
    "claim the server's slot": (pg_common.CLAIM_SLOT, dict(SLOT, width_ms=60000, exact=False, blackout=False)),
    "claim the slot asked for (blackout windows)": (pg_common.CLAIM_SLOT, dict(SLOT, width_ms=60000, exact=True,
                                                                               blackout=False)),
    "slot owner": (pg_common.SLOT_OWNER, (KEY, 5)),
    "the server's slot's owner": (pg_common.CURRENT_SLOT_OWNER, dict(SLOT, width_ms=60000)),
    "prune slots": (pg_common.PRUNE_SLOTS, (KEY,)),
    "undo a slot": (pg_common.UNDO_SLOT, (KEY, 5, OWNER)),
    "a rerun's slot": (pg_common.RERUN_SLOT, dict(SLOT, width_ms=60000)),
    "set a slot's marker": (pg_common.SET_SLOT_OWNER, dict(SLOT, marker="done " + OWNER, expected=OWNER)),
    "lock the row": (pg_lease.LOCK_ROW, (KEY,)),
    "force release": (pg_common.FORCE_RELEASE, {"key": KEY}),
    "a grant's pause": (pg_common.FIRST_PAUSE, SCOPES),
    "read pauses": (pg_common.LIVE_PAUSES, SCOPES),
    "pause": (pg_common.PAUSE, {"scope": "job:" + KEY, "reason": "r", "by": "b", "ms": 60000}),
    "resume": (pg_common.RESUME, {"scope": "job:" + KEY}),
}


@pytest.fixture(scope="module")
def plans_db(pg_server):
    """A database of its own, its tables made by the engine on first use, and filled."""
    pg_server.sql("DROP DATABASE IF EXISTS dlock_plans")
    pg_server.sql("CREATE DATABASE dlock_plans")
    url = pg_server.url().rsplit("/", 1)[0] + "/dlock_plans"
    engine = open_backend(url)
    try:
        assert engine.query(KEY).owner is None  # creates the missing tables, then asks again
    finally:
        engine.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO dlock_lease (key, owner, fence, acquired_at, expires_at) "
                     "SELECT 'k-' || n, 'owner-' || n, n, now(), now() + interval '1 minute' "
                     "FROM generate_series(1, %s) AS n", (ROWS,))
        conn.execute("INSERT INTO dlock_wait (key, owner, arrived, expires_at) "
                     "SELECT 'k-' || (n / 2), 'owner-' || (n / 2) || '-' || (n %% 2), now(), now() + interval '3 s' "
                     "FROM generate_series(1, %s) AS n", (ROWS,))
        conn.execute("INSERT INTO dlock_slot (key, slot, owner, expires_at) "
                     "SELECT 'k-' || (n / 4), n %% 4, 'owner-' || n, now() + interval '1 hour' "
                     "FROM generate_series(1, %s) AS n", (ROWS,))
        conn.execute("INSERT INTO dlock_pause (scope, record, until) "
                     "SELECT 'job:k-' || n, '{}', now() + interval '1 hour' FROM generate_series(1, %s) AS n", (ROWS,))
        conn.execute("ANALYZE dlock_lease, dlock_wait, dlock_slot, dlock_pause")
        counts = dict(conn.execute("SELECT relname, reltuples FROM pg_class WHERE relname = ANY(%s)",
                                   (list(TABLES),)).fetchall())
    assert all(counts[table] >= ROWS for table in TABLES), counts
    return url


def _nodes(plan):
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def plan_of(url, statement, params):
    """The nodes of the statement's plan with its parameters, as the engine
    sends it: autocommit, no prepared statement."""
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        return list(_nodes(conn.execute("EXPLAIN (FORMAT JSON) " + statement, params).fetchone()[0][0]["Plan"]))


def problems(url, statement, params):
    """What in the plan reads one of the lease tables without an index."""
    nodes = plan_of(url, statement, params)
    found = ["%s on %s" % (node["Node Type"], node["Relation Name"]) for node in nodes
             if node.get("Relation Name") in TABLES and node["Node Type"] not in INDEX_NODES
             and node["Node Type"] != "ModifyTable"]
    for table in TABLES:
        if table not in statement:
            continue
        # An insert reads no rows but through its unique index (the primary
        # key); an upsert finds the row it updates by its conflict arbiter.
        inserts = [node for node in nodes if node.get("Operation") == "Insert" and node.get("Relation Name") == table]
        if any(node.get("Conflict Resolution") == "UPDATE"
               and "%s_pkey" % table not in node.get("Conflict Arbiter Indexes", ()) for node in inserts):
            found.append("an upsert into %s without its primary key as the conflict arbiter" % table)
        if not inserts and not any(node.get("Relation Name") == table and node["Node Type"] in INDEX_NODES
                                   for node in nodes):
            found.append("no index scan of %s" % table)
    return found


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_every_statement_reaches_its_rows_by_an_index(plans_db, name):
    statement, params = STATEMENTS[name]
    assert problems(plans_db, statement, params) == []


def test_a_statement_that_reads_a_whole_table_is_caught(plans_db):
    """The check itself: a lease looked up by owner alone has no index to use."""
    found = problems(plans_db, "SELECT key FROM dlock_lease WHERE owner = %s", (OWNER,))
    assert "Seq Scan on dlock_lease" in found and "no index scan of dlock_lease" in found
