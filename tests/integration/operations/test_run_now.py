"""`dlock run-now JOB`: a run asked for by hand goes through the normal
grant, in a slot of its own named by its id (slots.manual_slot_number): sent
twice, or from three nodes at once, it runs exactly once; it obeys the lock
and the job's contention policy, and a pause unless --force (which needs a
reason, logged); it leaves the job's schedule and its slots alone. On every
backend, checked against a ledger the job itself writes."""

import json
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runner_proc import last_log, run_dlock, start_dlock, wait_for
from servers import url_of

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.slots import manual_slot_number

REASON = "INC-4211: rebuild the report"


@pytest.fixture(params=["redis", "postgresql", "postgresql+advisory", "etcd", "file"])
def node(request, tmp_path, unique_key):
    return Node(url_of(request, request.param, tmp_path), unique_key, tmp_path)


class Node(object):
    """A node's files for one job, `billing` (its lock key the test's own),
    which appends a line to the ledger, then sleeps `hold` seconds."""

    def __init__(self, url, key, tmp_path, once_per=None):
        self.url, self.key, self.dir = url, key, tmp_path
        self.ledger = tmp_path / "ledger"
        (tmp_path / "jobs").mkdir()
        (tmp_path / "pauses").mkdir()
        self.write_job(once_per=once_per)

    def write_job(self, hold=0, once_per=None):
        script = "import sys, time; open(sys.argv[1], 'a').write('ran\\n'); time.sleep(float(sys.argv[2]))"
        job = {"command": [sys.executable, "-c", script, str(self.ledger), str(hold)], "key": self.key}
        if once_per:
            job["once_per"] = once_per
        (self.dir / "jobs" / "billing.json").write_text(json.dumps(job))

    def flags(self):
        return ("--backend", self.url, "--jobs-dir", str(self.dir / "jobs"), "--pauses-dir", str(self.dir / "pauses"))

    def run_now(self, *args):
        """(exit code, log line or None, the process) of `dlock run-now billing ARGS`."""
        done = run_dlock("run-now", "billing", *(args + self.flags()))
        lines = [line for line in done.stderr.splitlines() if line.startswith("{")]
        return done.returncode, json.loads(lines[-1]) if lines else None, done

    def ran(self):
        return self.ledger.read_text().count("ran") if self.ledger.exists() else 0


def test_an_id_runs_once_however_often_it_is_sent(node):
    code, record, done = node.run_now("--id", "INC-4211", "--reason", REASON)
    assert (code, record["result"], node.ran()) == (0, "success", 1), done.stderr
    assert (record["run_id"], record["manual_id"], record["manual_reason"]) == (
        "billing@manual:INC-4211", "INC-4211", REASON)
    code, record, done = node.run_now("--id", "INC-4211")
    assert (code, record["result"], node.ran()) == (74, "skipped_duplicate", 1), done.stderr
    assert "run-now id INC-4211 already ran" in record["refused"]
    assert node.run_now("--id", "INC-4212")[0] == 0 and node.ran() == 2  # another id is another run


def test_sent_from_three_nodes_at_once_it_runs_once(node):
    """Three runners with one id at once: one runs (holding the lock for a
    second), the others are refused, by the lock (73) or the slot (74)."""
    node.write_job(hold=1)
    runners = [start_dlock("run-now", "billing", "--id", "drill-1", *node.flags()) for _node in range(3)]
    codes = sorted(runner.wait(timeout=60) for runner in runners)
    for runner in runners:
        runner.communicate()
    assert codes[0] == 0 and set(codes[1:]) <= {73, 74}, codes
    assert node.ran() == 1
    assert node.run_now("--id", "drill-1")[0] == 74 and node.ran() == 1


def test_with_a_holder_running_it_is_refused_unless_forced_which_waits_for_it(node):
    """on_contention skip (the default): refused (73) while a run holds the
    lock; forced, it waits in line and runs once the holder has ended,
    never beside it (the ledger's lines are each run's start and end)."""
    script = ("import sys, time; open(sys.argv[1], 'a').write('start %.6f\\n' % time.time()); "
              "time.sleep(float(sys.argv[2])); open(sys.argv[1], 'a').write('end %.6f\\n' % time.time())")
    job = {"command": [sys.executable, "-c", script, str(node.ledger), "2"], "key": node.key}
    (node.dir / "jobs" / "billing.json").write_text(json.dumps(job))
    holder = start_dlock("run-now", "billing", "--id", "holder", *node.flags())
    try:
        wait_for(lambda: node.ledger.exists() and "start" in node.ledger.read_text(), 30, "the holder's start")
        code, record, _done = node.run_now("--id", "while-held")
        assert (code, record["result"]) == (73, "skipped_locked")
        code, record, done = node.run_now("--id", "while-held", "--force", "--reason", REASON)
        assert (code, record["result"], record["forced"]) == (0, "success", True), done.stderr
    finally:
        holder.communicate(timeout=60)
    assert holder.returncode == 0
    events = [line.split() for line in node.ledger.read_text().split("\n") if line]
    assert [kind for kind, _at in events] == ["start", "end", "start", "end"], events
    assert float(events[2][1]) >= float(events[1][1])  # the forced run began after the holder's end


def test_a_new_id_is_made_and_said_when_none_is_given(node):
    code, record, done = node.run_now()
    assert code == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("dlock run-now: id ")]
    manual = said[0].split()[3]
    assert record["manual_id"] == manual and "--id %s" % manual in said[0]
    assert node.run_now("--id", manual)[0] == 74 and node.ran() == 1


def test_a_pause_refuses_it_unless_forced_with_a_reason(node):
    paused = run_dlock("pause", "--key", node.key, "--reason", "CHG-118", "--until", "1h", *node.flags())
    assert paused.returncode == 0, paused.stderr
    try:
        code, record, _done = node.run_now("--id", "a")
        assert (code, record["result"], node.ran()) == (72, "skipped_paused", 0)
        code, _record, done = node.run_now("--id", "a", "--force")
        assert code == 78 and "--force needs --reason" in done.stderr and node.ran() == 0
        code, record, done = node.run_now("--id", "a", "--force", "--reason", REASON)
        assert (code, record["forced"], record["manual_reason"], node.ran()) == (0, True, REASON, 1), done.stderr
    finally:
        run_dlock("resume", "--key", node.key, *node.flags())


def test_it_leaves_the_schedule_s_slot_to_the_schedule(node):
    """Before and after the schedule's run of its slot: that slot runs once
    (file:// judged a slot done by the last slot granted alone, and so ran
    the schedule's slot again after a run-now's)."""
    node.write_job(once_per="1h")
    assert node.run_now("--id", "x")[0] == 0
    done = run_dlock("run", "--job", "billing", *node.flags())
    assert (done.returncode, last_log(done.stderr)["result"]) == (0, "success"), done.stderr
    assert node.run_now("--id", "y")[0] == 0
    done = run_dlock("run", "--job", "billing", *node.flags())
    assert (done.returncode, last_log(done.stderr)["result"]) == (74, "skipped_duplicate"), done.stderr
    assert node.ran() == 3


@pytest.mark.parametrize("value, message", [
    ("", "--id: must not be empty"),
    ("a\nb", "holds a control character"),
    ("../etc", "is not a valid run id"),
    ("x" * 101, "is longer than 100"),
    ("NaN ", "is not a valid run id"),
])
def test_a_bad_id_is_refused_and_nothing_runs(request, tmp_path, unique_key, value, message):
    node = Node(url_of(request, "file", tmp_path), unique_key, tmp_path)
    code, _record, done = node.run_now("--id=" + value)
    assert code == 78 and "--id" in done.stderr and message in done.stderr, done.stderr
    assert node.ran() == 0


def test_an_unknown_job_and_a_command_are_refused(request, tmp_path, unique_key):
    node = Node(url_of(request, "file", tmp_path), unique_key, tmp_path)
    done = run_dlock("run-now", "biling", *node.flags())
    assert done.returncode == 78 and "biling" in done.stderr, done.stderr
    done = run_dlock("run-now", "billing", *node.flags(), "--", "true")
    assert done.returncode == 78 and "takes none after '--'" in done.stderr, done.stderr
    assert node.ran() == 0


@pytest.mark.parametrize("value", ["a\x00b", None, 7, ["a"], float("nan"), 1e308, {"id": "a"}])
def test_an_id_that_is_no_text_is_refused_by_the_validation_core(value):
    """What no command line can carry (a NUL), and what a module's YAML can
    (a number, a list, a mapping)."""
    with pytest.raises(ConfigError, match="--id"):
        validate.manual_id(value, "--id")


@given(st.text(min_size=1, max_size=120))
def test_an_accepted_id_names_one_slot_below_every_schedule_s(text):
    """Every id the core accepts is plain text of the allowed characters, and
    its slot is the same each time and below every schedule's (>= 0); the
    core refuses the rest with a ConfigError, never another error."""
    try:
        manual = validate.manual_id(text, "--id")
    except ConfigError:
        return
    assert validate.MANUAL_ID.fullmatch(manual)
    assert manual_slot_number(manual) == manual_slot_number(manual) < 0
    assert manual_slot_number(manual) >= -(2 ** 60)
