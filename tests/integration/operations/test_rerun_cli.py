"""`dlock run --job J --rerun SLOT --reason TEXT`, end to end through the
runner: exit codes, the log line, the last run's record and the job's
DLOCK_RUN_ID (the slot's, as the first run's: the job's idempotency key)."""

import json
import sys
import time

import pytest
from runner_proc import last_log, lines, run_dlock
from servers import url_of

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.slots import boundary

HOUR = 3600
REASON = "provider outage, ticket 4711"


@pytest.fixture(params=["redis", "file", "postgresql"])
def url(request, tmp_path):
    return url_of(request, request.param, tmp_path)


def job(ledger, code):
    """A job that records its DLOCK_* environment in ledger and exits `code`."""
    script = ("import json, os, sys; open(sys.argv[1], 'a').write(json.dumps(dict((k, v) for k, v in "
              "os.environ.items() if k.startswith('DLOCK_'))) + '\\n'); sys.exit(int(sys.argv[2]))")
    return ["--", sys.executable, "-c", script, ledger, str(code)]


class Job(object):
    """`dlock run` of one job with once_per 1h on one backend."""

    def __init__(self, url, key, ledger):
        self.args = ["run", "--job", "billing", "--key", key, "--backend", url, "--once-per", "1h"]
        self.ledger = ledger

    def run(self, code, *extra):
        done = run_dlock(*(self.args + list(extra) + job(self.ledger, code)))
        return done.returncode, last_log(done.stderr)

    def rerun(self, slot, code, *extra, reason=REASON):
        return self.run(code, "--rerun", slot, "--reason", reason, *extra)

    def last(self):
        done = run_dlock("status", "--key", self.args[4], "--backend", self.args[6], "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)[0]["last"]


def test_a_failed_slot_is_rerun_once_then_refused(url, unique_key, tmp_path):
    ledger = str(tmp_path / "ledger")
    billing = Job(url, unique_key, ledger)
    code, first = billing.run(3)
    assert (code, first["result"]) == (3, "failed") and "rerun" not in first
    run_id = first["run_id"]
    stamp = run_id.split("@", 1)[1]
    assert run_id == "billing@" + boundary(first["slot"], HOUR)

    # The slot is used up for the job's own runs...
    code, again = billing.run(0)
    if again.get("slot") != first["slot"]:
        pytest.skip("crossed a slot edge (the hour, less its lead) between the runs")
    assert (code, again["result"]) == (74, "skipped_duplicate")

    # ...but not for a rerun, named by the whole run id, that fails once more...
    code, second = billing.rerun(run_id, 4)
    assert (code, second["result"]) == (4, "failed")
    assert second["rerun"] is True and second["rerun_reason"] == REASON
    assert second["run_id"] == run_id and second["fence"] > first["fence"]
    assert billing.last()["rerun"] is True and billing.last()["rerun_reason"] == REASON

    # ...nor for one named by its boundary, which succeeds.
    code, third = billing.rerun(stamp, 0)
    assert (code, third["result"], third["run_id"]) == (0, "success", run_id)
    assert third["fence"] > second["fence"]
    assert [record["DLOCK_RUN_ID"] for record in lines(ledger)] == [run_id] * 3
    assert lines(ledger)[-1]["DLOCK_FENCING_TOKEN"] == str(third["fence"])

    # A success is final.
    code, refused = billing.rerun(stamp, 0)
    assert (code, refused["result"]) == (74, "skipped_duplicate")
    assert refused["refused"] == "slot %s of billing succeeded; nothing to rerun" % stamp
    assert refused["rerun"] is True and refused.get("fence") is None
    assert len(lines(ledger)) == 3
    assert billing.last()["result"] == "success" and billing.last()["owner"] == third["owner"]


def test_a_slot_with_no_marker_or_not_begun_is_refused(url, unique_key, tmp_path):
    ledger = str(tmp_path / "ledger")
    billing = Job(url, unique_key, ledger)
    now = int(time.time()) // HOUR * HOUR
    never = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 3 * HOUR))
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    page = metrics / "dlock_billing.prom"
    assert billing.run(0, "--metrics-dir", str(metrics))[0] == 0  # this hour's slot, not the one rerun below
    # A series from the first run on, at 0 (report.RESULTS): increase() over it is right from the start.
    assert 'dlock_runs_total{job="billing",result="rerun_refused"} 0' in page.read_text(), page.read_text()
    code, log = billing.rerun(never, 0, "--metrics-dir", str(metrics))
    assert (code, log["result"]) == (78, "rerun_refused")
    assert 'dlock_runs_total{job="billing",result="rerun_refused"} 1' in page.read_text(), page.read_text()
    assert log["refused"].startswith("slot %s of billing has no marker on the backend" % never)
    assert "markers live 90m" in log["refused"]
    ahead = "billing@" + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 2 * HOUR))
    code, log = billing.rerun(ahead, 0)
    assert (code, log["result"]) == (78, "rerun_refused") and "has not begun" in log["refused"]
    assert len(lines(ledger)) == 1  # the first run's: no refused rerun ran the job


def test_a_rerun_of_a_slot_held_by_a_run_is_locked(redis_server, unique_key, tmp_path):
    """A rerun needs the lock free, as any grant: while a run of the job
    holds it (here a run holding the lock with min_hold), the rerun is
    skipped as locked (73)."""
    ledger = str(tmp_path / "ledger")
    billing = Job(redis_server.url, unique_key, ledger)
    code, first = billing.run(1, "--min-hold", "1m")
    assert code == 1
    code, log = billing.rerun(first["run_id"], 0)
    assert (code, log["result"]) == (73, "skipped_locked")
    assert len(lines(ledger)) == 1
