"""`dlock pause` and `dlock resume`, end to end through the runner: a paused
job's runs exit 72 (skipped_paused) without starting the job, the log line
says which pause refused it and why, the backend ends the pause at --until
by itself, and bad values are refused before anything is written."""

import contextlib
import json
import os
import re
import sys
import time

import pytest
import runner_proc
from runner_proc import last_log, wait_for
from servers import url_of

REASON = "INC-4211: storage migration"
MIRROR = {}


@pytest.fixture(autouse=True)
def pauses_dir(tmp_path):
    """This node's mirror of the pauses (pause_files.py), the test's own:
    `dlock pause` writes it, and no test here may write the mirror of the
    machine the suite runs on, which every other run there would read."""
    path = tmp_path / "node-pauses"
    path.mkdir()
    MIRROR["dir"] = str(path)
    yield path
    MIRROR.clear()


def with_mirror(args, pauses=None):
    """ARGS (a subcommand first) with this test's --pauses-dir, or PAUSES's."""
    return (args[0], "--pauses-dir", str(pauses or MIRROR["dir"])) + tuple(args[1:])


def run_dlock(*args, pauses=None, **kwargs):
    return runner_proc.run_dlock(*with_mirror(args, pauses), **kwargs)


def start_dlock(*args, **kwargs):
    return runner_proc.start_dlock(*with_mirror(args), **kwargs)


@pytest.fixture(params=["redis"])
def url(request, tmp_path):
    """Redis: what the commands check before the backend is the same on every backend."""
    return url_of(request, request.param, tmp_path)


@pytest.fixture(params=["redis", "postgresql", "etcd", "file"])
def any_url(request, tmp_path):
    return url_of(request, request.param, tmp_path)


class Fleet(object):
    """One job's `dlock run`, and the operator's commands, on one backend."""

    def __init__(self, url, key, ledger):
        self.url, self.key, self.ledger = url, key, ledger

    def run(self, pauses=None):
        """(exit code, log line) of one run of a job that appends a line to
        the ledger, on this node (PAUSES: its mirror, else the test's)."""
        script = "import sys; open(sys.argv[1], 'a').write('ran\\n')"
        done = run_dlock("run", "--job", "billing", "--key", self.key, "--backend", self.url, "--",
                         sys.executable, "-c", script, self.ledger, pauses=pauses)
        return done.returncode, last_log(done.stderr)

    def ran(self):
        return open(self.ledger).read().count("ran") if os.path.exists(self.ledger) else 0

    def command(self, *args, pauses=None):
        return run_dlock(*(args + ("--backend", self.url)), pauses=pauses)


@pytest.fixture
def fleet(url, unique_key, tmp_path):
    return Fleet(url, unique_key, str(tmp_path / "ledger"))


def test_a_paused_job_is_refused_until_resumed(any_url, unique_key, tmp_path):
    fleet = Fleet(any_url, unique_key, str(tmp_path / "ledger"))
    done = fleet.command("pause", "--key", fleet.key, "--reason", REASON, "--until", "1h")
    assert done.returncode == 0, done.stderr
    assert "paused job:%s until " % fleet.key in done.stdout and REASON in done.stdout
    code, record = fleet.run()
    assert (code, record["result"]) == (72, "skipped_paused")
    assert record["paused"] == "job:" + fleet.key and record["pause_reason"] == REASON
    # etcd: the lease's whole seconds and its Date header's (at = the second's middle) add up to 1.5 s
    assert "@" in record["paused_by"] and 3500 < record["paused_until"] - time.time() <= 3601.5
    assert record.get("fence") is None and fleet.ran() == 0
    status = fleet.command("status", "--key", fleet.key, "--json")
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)[0]["paused"]
    assert (shown["scope"], shown["reason"], shown["until"]) == ("job:" + fleet.key, REASON, record["paused_until"])
    assert "until " in fleet.command("status", "--key", fleet.key).stdout

    done = fleet.command("resume", "--key", fleet.key, "--reason", "migration done")
    assert done.returncode == 0 and "resumed job:%s" % fleet.key in done.stdout, done.stderr
    code, record = fleet.run()
    assert (code, record["result"]) == (0, "success") and fleet.ran() == 1
    assert "was not paused" in fleet.command("resume", "--key", fleet.key).stdout


def test_a_pause_of_every_lock_refuses_this_one_too(fleet):
    done = fleet.command("pause", "--all", "--reason", REASON, "--until", "1h")
    assert done.returncode == 0, done.stderr
    try:
        code, record = fleet.run()
        assert (code, record["result"], record["paused"]) == (72, "skipped_paused", "all")
    finally:
        assert fleet.command("resume", "--all").returncode == 0
    assert fleet.run()[0] == 0


def write_job(jobs_dir, name, key, ledger, groups=None):
    """A job file as the dlock_jobs role writes it: a job that appends its name to the ledger."""
    content = {"command": [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')",
                           ledger, name], "key": key}
    if groups is not None:
        content["groups"] = groups
    (jobs_dir / (name + ".json")).write_text(json.dumps(content))


def test_a_pause_of_a_group_refuses_its_jobs_and_no_other(any_url, unique_key, tmp_path):
    jobs_dir, ledger = tmp_path / "jobs", tmp_path / "ledger"
    jobs_dir.mkdir()
    group = "g-" + unique_key[-6:]
    write_job(jobs_dir, "billing", unique_key, str(ledger), [group, "nightly"])
    write_job(jobs_dir, "report", unique_key + "-report", str(ledger))

    def dlock(*args):
        return run_dlock(*(args + ("--backend", any_url, "--jobs-dir", str(jobs_dir))))

    done = dlock("pause", "--group", group, "--reason", REASON, "--until", "1h")
    assert done.returncode == 0 and "paused group:%s until " % group in done.stdout, done.stderr
    billing, report = dlock("run", "--job", "billing"), dlock("run", "--job", "report")
    assert (billing.returncode, last_log(billing.stderr)["paused"]) == (72, "group:" + group), billing.stderr
    assert report.returncode == 0, report.stderr
    assert ledger.read_text() == "report\n"
    rows = dict((row["job"], row["paused"]) for row in json.loads(dlock("status", "--json").stdout))
    assert rows["billing"]["scope"] == "group:" + group and rows["report"] is None
    assert "(group:%s): %s" % (group, REASON) in dlock("status").stdout

    done = dlock("resume", "--group", group)
    assert done.returncode == 0 and "resumed group:%s" % group in done.stdout, done.stderr
    assert dlock("run", "--job", "billing").returncode == 0
    assert ledger.read_text() == "report\nbilling\n"


def test_a_group_no_job_is_in_is_refused_as_a_typo_unless_asked_for(fleet, tmp_path):
    jobs_dir = tmp_path / "jobs"
    jobs_dir.mkdir()
    write_job(jobs_dir, "billing", fleet.key, fleet.ledger, ["ledger"])
    args = ("--jobs-dir", str(jobs_dir), "--reason", REASON, "--until", "1h")
    done = fleet.command("pause", "--group", "legder", *args)
    assert done.returncode == 78, done.stderr
    assert "--group: no job in %s is in group legder" % jobs_dir in done.stderr and "--any-group" in done.stderr
    done = fleet.command("pause", "--group", "legder-" + fleet.key[-6:], "--any-group", *args)
    assert done.returncode == 0, done.stderr
    assert fleet.command("resume", "--group", "legder-" + fleet.key[-6:]).returncode == 0
    for bad, message in (("led/ger", "is not a valid group name"), ("", "must not be empty"),
                         ("led\nger", "holds a control character")):
        done = fleet.command("pause", "--group", bad, "--any-group", *args)
        assert done.returncode == 78 and "--group" in done.stderr and message in done.stderr, done.stderr
    assert fleet.run()[0] == 0


def test_a_job_file_s_bad_groups_stop_its_runs_with_a_config_error(fleet, tmp_path):
    jobs_dir = tmp_path / "jobs"
    jobs_dir.mkdir()
    write_job(jobs_dir, "billing", fleet.key, fleet.ledger, "ledger")
    done = run_dlock("run", "--job", "billing", "--jobs-dir", str(jobs_dir), "--backend", fleet.url)
    assert done.returncode == 78 and "groups: 'ledger' must be a list of group names" in done.stderr
    assert fleet.ran() == 0


@pytest.fixture(params=["redis", "postgresql", "postgresql+advisory", "etcd"])
def lease_url(request, tmp_path):
    return url_of(request, request.param, tmp_path)


@contextlib.contextmanager
def holding(url, key, tmp_path):
    """A run that holds key until killed (its runner); at the end it is
    killed if still going, and the key's pause ended."""
    started = tmp_path / "started"
    runner = start_dlock("run", "--job", "billing", "--key", key, "--backend", url, "--ttl", "6s", "--",
                         "sh", "-c", 'touch "$0"; exec sleep 120', str(started))
    try:
        wait_for(started.exists, 30, "the job to start")
        yield runner
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.communicate()
        run_dlock("resume", "--key", key, "--backend", url)


def pause_key(url, key, *extra):
    return run_dlock("pause", "--key", key, "--reason", REASON, "--until", "1h", "--backend", url, *extra)


def test_drain_kill_fences_the_run_going_on_and_its_runner_kills_it(lease_url, unique_key, tmp_path):
    """The pause first, then the lock broken: its runner learns at its next
    renewal (every ttl/3, 2s here) that the lease is gone and kills its job
    (lock_lost); no run starts in between, paused."""
    with holding(lease_url, unique_key, tmp_path) as runner:
        done = pause_key(lease_url, unique_key, "--drain", "kill")
        assert done.returncode == 0, done.stderr
        assert "drained %s: the run of " % unique_key in done.stdout
        broken = [line for line in map(json_or_none, done.stderr.splitlines()) if line and
                  line.get("result") == "force_released"]
        assert [(line["key"], line["reason"]) for line in broken] == [(unique_key, "drain: " + REASON)]
        _out, err = runner.communicate(timeout=30)
        assert (runner.returncode, last_log(err)["result"]) == (76, "lock_lost"), err
        waiting = run_dlock("run", "--job", "billing", "--key", unique_key, "--backend", lease_url, "--", "true")
        assert waiting.returncode == 72, waiting.stderr


def test_drain_wait_lets_the_run_going_on_finish(unique_key, tmp_path, request):
    url = url_of(request, "redis", tmp_path)
    with holding(url, unique_key, tmp_path) as runner:
        done = pause_key(url, unique_key)
        assert done.returncode == 0 and "drained" not in done.stdout, done.stderr
        assert run_dlock("status", "--key", unique_key, "--json", "--backend", url).stdout.count('"owner": "') == 1
        assert runner.poll() is None


def test_drain_kill_on_a_flock_says_the_run_goes_on_and_keeps_the_pause(unique_key, tmp_path, request):
    url = url_of(request, "file", tmp_path)
    with holding(url, unique_key, tmp_path) as runner:
        done = pause_key(url, unique_key, "--drain", "kill")
        assert done.returncode == 75, done.stderr
        assert "is paused, but its run going on was not drained" in done.stderr
        assert "a flock cannot be broken" in done.stderr and runner.poll() is None
        status = json.loads(run_dlock("status", "--key", unique_key, "--json", "--backend", url).stdout)[0]
        assert status["paused"]["reason"] == REASON


def json_or_none(line):
    try:
        return json.loads(line)
    except ValueError:
        return None


def test_a_pause_ends_by_itself_at_its_end(fleet):
    assert fleet.command("pause", "--key", fleet.key, "--reason", REASON, "--until", "2s").returncode == 0
    assert fleet.run()[0] == 72
    wait_for(lambda: fleet.run()[0] == 0, 15, "the pause to end at --until")
    assert fleet.ran() == 1


@pytest.mark.parametrize("until, message", [
    ("NaN", "--until: 'NaN' is not a duration"),
    ("1e308", "--until: '1e308' is not a duration"),
    ("31d", "--until: '31d' is above the maximum of 30d"),
    ("-5m", "--until: '-5m' is not a duration"),
    ("0", "--until: '0' must be greater than 0"),
    ("500ms", "--until: '500ms' is below the minimum of 1s"),
    ("2020-01-01T00:00:00Z", "is not in the future on the backend's clock"),
    ("2999-01-01T00:00:00Z", "is more than 30d ahead: a pause lasts at most that"),
    ("2026-02-30T00:00:00Z", "is not a valid date and time"),
    ("tomorrow", "is not a duration"),
])
def test_a_bad_end_is_refused_and_nothing_is_paused(fleet, until, message):
    done = fleet.command("pause", "--key", fleet.key, "--reason", REASON, "--until=" + until)
    assert done.returncode == 78 and message in done.stderr, done.stderr
    assert fleet.run()[0] == 0


@pytest.mark.parametrize("reason, message", [
    ("line\nbreak", "holds a control character"), ("\u202eevil", "holds a control character"),
    ("   ", "--reason: must say why"), (os.fsdecode(b"\xff\xfe"), "is not valid UTF-8"),
])
def test_a_bad_reason_is_refused_and_nothing_is_paused(fleet, reason, message):
    done = fleet.command("pause", "--key", fleet.key, "--reason", reason, "--until", "1h")
    assert done.returncode == 78 and "--reason" in done.stderr and message in done.stderr, done.stderr
    assert fleet.run()[0] == 0


@pytest.mark.parametrize("args, message", [
    (("--key", ""), "--key: must not be empty"),
    (("--job", "no-such-job"), "no-such-job"),
])
def test_a_bad_scope_is_refused_and_nothing_is_paused(fleet, tmp_path, args, message):
    done = fleet.command("pause", *(args + ("--jobs-dir", str(tmp_path), "--reason", REASON, "--until", "1h")))
    assert done.returncode == 78 and message in done.stderr, done.stderr
    assert fleet.run()[0] == 0


def test_the_scope_is_required_and_single(fleet):
    done = fleet.command("pause", "--reason", REASON, "--until", "1h")
    assert done.returncode == 78 and "one of the arguments --job --key --group --all is required" in done.stderr
    done = fleet.command("pause", "--all", "--key", fleet.key, "--reason", REASON, "--until", "1h")
    assert done.returncode == 78 and "not allowed with" in done.stderr


# -- the node's mirror of the pauses (pause_files.py) -------------------------

def test_a_pause_the_backend_lost_still_refuses_on_the_nodes_that_mirror_it(any_url, unique_key, tmp_path):
    """Paused from node A (its mirror written), then ended in the backend
    from node B (whose own mirror it removes), as a backend restarted empty
    or restored from an older backup would lose it: A still refuses, from
    its mirror, and says so; B runs; A's resume ends it there too."""
    fleet = Fleet(any_url, unique_key, str(tmp_path / "ledger"))
    node_b = tmp_path / "node-b-pauses"
    node_b.mkdir()
    assert fleet.command("pause", "--key", fleet.key, "--reason", REASON, "--until", "1h").returncode == 0
    done = fleet.command("resume", "--key", fleet.key, pauses=node_b)
    assert done.returncode == 0 and "resumed job:%s" % fleet.key in done.stdout, done.stderr
    assert "other nodes still refuses their runs" in done.stdout

    code, record = fleet.run()
    assert (code, record["result"], record["pause_source"]) == (72, "skipped_paused", "node")
    assert (record["paused"], record["pause_reason"]) == ("job:" + fleet.key, REASON)
    row = json.loads(fleet.command("status", "--key", fleet.key, "--json").stdout)[0]
    assert (row["paused"]["reason"], row["mirror_only"]) == (REASON, True)
    assert "this node's mirror only" in fleet.command("status", "--key", fleet.key).stdout
    assert fleet.run(pauses=node_b)[0] == 0 and fleet.ran() == 1

    done = fleet.command("resume", "--key", fleet.key)
    assert done.returncode == 0 and "removed this node's mirror" in done.stdout, done.stderr
    assert fleet.run()[0] == 0 and fleet.ran() == 2


def test_a_mirrored_pause_refuses_while_the_backend_is_away(fleet, pauses_dir):
    """A node paused by its mirror answers paused (72), not backend error (75),
    without asking the backend: the operator paused it for the outage."""
    assert fleet.command("pause", "--key", fleet.key, "--reason", REASON, "--until", "1h").returncode == 0
    gone = Fleet("redis://127.0.0.1:9", fleet.key, fleet.ledger)  # discard port: nothing listens
    code, record = gone.run()
    assert (code, record["result"], record["pause_source"]) == (72, "skipped_paused", "node")
    assert fleet.command("resume", "--key", fleet.key).returncode == 0
    assert gone.run()[0] == 75 and fleet.ran() == 0


@pytest.mark.parametrize("record, reason", [
    ("{not json", "(unreadable pause record)"),
    (json.dumps({"reason": "r", "until": "NaN", "by": "b", "at": 0}), "r"),
    (json.dumps({"reason": "r", "until": 1e308, "by": "b", "at": 0}), "r"),
    (json.dumps(["a string where a mapping belongs"]), "(unreadable pause record)"),
])
def test_a_mirror_record_no_module_wrote_pauses_at_most_the_longest_pause(fleet, pauses_dir, record, reason):
    """A record that does not read, or ends past what a pause can (NaN,
    1e308), pauses until the longest pause written with its file would end
    (its mtime + 30 days): never for good, never not at all."""
    (pauses_dir / ("job:%s.pause" % fleet.key)).write_text(record)
    code, line = fleet.run()
    assert (code, line["result"], line["pause_reason"]) == (72, "skipped_paused", reason)
    assert 30 * 86400 - 60 < line["paused_until"] - time.time() <= 30 * 86400


def test_a_fifo_in_the_mirror_is_a_config_error_not_a_hang(fleet, pauses_dir):
    os.mkfifo(str(pauses_dir / "all.pause"))
    done = run_dlock("run", "--job", "billing", "--key", fleet.key, "--backend", fleet.url, "--", "true", timeout=30)
    assert done.returncode == 78, done.stderr
    assert "pause mirror %s" % (pauses_dir / "all.pause") in done.stderr and "not a regular file" in done.stderr
    assert fleet.ran() == 0


def test_a_mirrored_pause_ends_on_the_node_at_its_end(fleet, pauses_dir):
    assert fleet.command("pause", "--key", fleet.key, "--reason", REASON, "--until", "2s").returncode == 0
    assert fleet.run()[1]["result"] == "skipped_paused"
    wait_for(lambda: fleet.run()[0] == 0, 15, "the mirrored pause to end at --until")
    assert (pauses_dir / ("job:%s.pause" % fleet.key)).exists() and fleet.ran() == 1


def test_a_refused_run_says_when_a_pause_skipped_its_slot(fleet, tmp_path):
    """dlock_last_paused_timestamp_seconds: set by a run a pause refused,
    left alone by a run that ran (DlockJobNotRun counts from the later)."""
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    run = ("run", "--job", "billing", "--key", fleet.key, "--backend", fleet.url, "--metrics-dir", str(metrics),
           "--", "true")

    def paused_at():
        found = re.search(r'^dlock_last_paused_timestamp_seconds\{job="billing"\} (\S+)$',
                          (metrics / "dlock_billing.prom").read_text(), re.M)
        return float(found.group(1)) if found else None

    assert run_dlock(*run).returncode == 0 and paused_at() is None
    assert fleet.command("pause", "--key", fleet.key, "--reason", REASON, "--until", "1h").returncode == 0
    before = time.time()
    assert run_dlock(*run).returncode == 72
    refused = paused_at()
    assert before - 1 <= refused <= time.time() + 1
    assert fleet.command("resume", "--key", fleet.key).returncode == 0
    assert run_dlock(*run).returncode == 0 and paused_at() == refused
