"""The point of the collection, on a real fleet: 3 nodes carry the same timer
with a randomized delay; over 20+ slots every slot ran exactly once, no two
runs overlapped, and fencing tokens strictly increase. Plus the roles' bad
input: refused in preflight, nothing written on any node."""

import json
import time
import uuid

import pytest
from rollout import ansible_playbook, redis_backend

pytestmark = pytest.mark.lab

SLOT = 5  # seconds
SLOTS = 20


@pytest.fixture(scope="module")
def backend(lab):
    return redis_backend(lab, "lab-" + uuid.uuid4().hex)


def snapshot(lab):
    """What the roles manage on every node: paths with checksums."""
    listing = {}
    for node in lab.group("dlock_nodes"):
        out = lab.ssh(node, "find /etc/dlock /etc/systemd/system /usr/local/bin/dlock -name '*dlock*' "
                            "-type f -exec md5sum {} + 2>/dev/null | sort", check=False)
        listing[node] = out.stdout
    return listing


BAD_JOBS = [
    ("malformed schedule", [{"name": "bad-sched", "command": ["true"], "schedule": "every tuesday-ish"}],
     "is not a valid systemd OnCalendar expression"),
    ("bad job name", [{"name": "bad name", "command": ["true"], "schedule": "hourly"}], "not a valid job name"),
    ("string command without shell", [{"name": "str-cmd", "command": "rm -rf /tmp/x", "schedule": "hourly"}],
     "set shell: true"),
    ("duplicate job name", [{"name": "twice", "command": ["true"], "schedule": "hourly"},
                            {"name": "twice", "command": ["false"], "schedule": "daily"}], "duplicate job name"),
    ("unsafe timing", [{"name": "unsafe", "command": ["true"], "schedule": "hourly", "ttl": "10s",
                        "renew_every": "9s"}], "must be below ttl"),
]


@pytest.mark.parametrize("name,jobs,message", BAD_JOBS, ids=[c[0] for c in BAD_JOBS])
def test_bad_jobs_fail_preflight_and_write_nothing(lab, backend, name, jobs, message):
    before = snapshot(lab)
    done = ansible_playbook(lab, "playbooks/site.yml", {"dlock_backend": backend, "dlock_jobs_list": jobs}, check=False)
    assert done.returncode != 0
    assert message in done.stdout, done.stdout[-3000:]
    assert snapshot(lab) == before


def test_missing_backend_fails_preflight_and_writes_nothing(lab):
    before = snapshot(lab)
    done = ansible_playbook(lab, "playbooks/site.yml",
                            {"dlock_jobs_list": [{"name": "ok", "command": ["true"], "schedule": "hourly"}]}, check=False)
    assert done.returncode != 0 and "no backend" in done.stdout
    assert snapshot(lab) == before


@pytest.mark.slow
def test_every_slot_runs_exactly_once_across_the_fleet(lab, backend):
    import redis
    host = backend["url"].split("//")[1].split(":")[0]
    ledger = redis.Redis(host=host, password=backend["password"], decode_responses=True)
    ledger.delete("dlock:lab-ledger")
    for node in lab.group("dlock_nodes"):
        lab.ssh(node, "install -m 0644 /dev/stdin /usr/local/lib/dlock-lab-ledger.py", check=True,
                input=open(__file__.replace("test_fleet.py", "ledger_job.py")).read())
    job = {
        "name": "fleet-ledger", "command": ["/usr/bin/python3", "/usr/local/lib/dlock-lab-ledger.py"], "schedule": "*:*:0/%d" % SLOT,
        "randomized_delay": "1s", "accuracy": "100ms", "once_per": "%ds" % SLOT, "ttl": "4s",
        "max_clock_skew": "500ms", "environment": {"LEDGER_HOST": host},
    }
    ansible_playbook(lab, "playbooks/site.yml", {"dlock_backend": backend, "dlock_jobs_list": [job]})
    try:
        time.sleep(SLOT * (SLOTS + 2))
    finally:
        ansible_playbook(lab, "playbooks/site.yml",
                         {"dlock_backend": backend, "dlock_jobs_list": [{"name": "fleet-ledger", "state": "absent"}]})
    runs = sorted((json.loads(r) for r in ledger.lrange("dlock:lab-ledger", 0, -1)), key=lambda r: r["start"])
    slots = [r["run_id"] for r in runs]
    assert len(runs) >= SLOTS, "only %d runs in %ds" % (len(runs), SLOT * (SLOTS + 2))
    assert len(set(slots)) == len(slots), "a slot ran twice: %s" % sorted(s for s in slots if slots.count(s) > 1)
    # Consecutive runs are consecutive slots: no slot was skipped.
    starts = [time.mktime(time.strptime(s.split("@")[1], "%Y-%m-%dT%H:%M:%SZ")) for s in slots]
    assert all(b - a == SLOT for a, b in zip(starts, starts[1:])), slots
    for before, after in zip(runs, runs[1:]):
        assert before["end"] <= after["start"], "runs overlapped: %r %r" % (before, after)
        assert after["fence"] > before["fence"]
    assert len({r["host"] for r in runs}) > 1, "one node won every slot: randomized delay not exercised"
    # The other nodes skipped each slot (exit 74) rather than failing.
    for node in lab.group("dlock_nodes"):
        log = lab.ssh(node, "journalctl -u dlock-fleet-ledger -o cat --no-pager | grep '^{'", check=False).stdout
        results = {json.loads(line)["result"] for line in log.splitlines()}
        assert results <= {"success", "skipped_duplicate", "skipped_locked"}, results
