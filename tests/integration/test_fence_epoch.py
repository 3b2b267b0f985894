"""Fence epochs across a backend switch (docs/backends.md, Switching backends).

Each backend counts its fences from 1. A fleet switched from backend A to
backend B with fence_epoch one higher must hand its jobs fences above all of
A's, or a resource that keeps the highest fence seen refuses every write of
B's runs. Checked end to end through `dlock run` (DLOCK_FENCING_TOKEN, the
log line, the `last` record), `dlock status`, `dlock metrics`, `dlock
release --force` and the module's operation, against real local backends.
"""

import json
import os
import re
import sys

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.dlock.fleet.plugins.module_utils import dlock_task
from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import Grant, open_backend
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.epoch import with_epoch
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends.redis_lease import _keys
from jobfixture import fenced_write
from runner_proc import last_log, run_dlock

JOBFIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobfixture.py")
EPOCH = 2 ** 40
RUNS_ON_A = 3  # A's counter ends above B's first fence: without epochs B's run would be refused


def backend_url(kind, request, tmp_path):
    if kind == "file":
        locks = tmp_path / "file-locks"
        locks.mkdir(exist_ok=True)
        return "file://%s" % locks
    if kind == "redis":
        return request.getfixturevalue("redis_server").url
    if kind == "etcd":
        return request.getfixturevalue("etcd_server").url
    return request.getfixturevalue("pg_server").url(scheme=kind)


class Node(object):
    """A node's files: dlock.json (the backend and its epoch), one job that
    dumps its DLOCK_* environment, a timer and a metrics directory."""

    def __init__(self, tmp_path, job, key):
        self.dir = tmp_path
        self.job = job
        for name in ("jobs", "units", "metrics"):
            (tmp_path / name).mkdir(exist_ok=True)
        self.env_file = tmp_path / "env.json"
        (tmp_path / "jobs" / (job + ".json")).write_text(json.dumps(
            {"command": [sys.executable, JOBFIXTURE, "env", str(self.env_file)], "key": key, "ttl": "20s"}))
        (tmp_path / "units" / ("dlock-%s.timer" % job)).write_text("[Timer]\nOnCalendar=*:0/5\n")

    def switch(self, url, epoch):
        """What the runner role writes on a switch: the new backend and epoch."""
        config = {"backend": url, "jobs_dir": str(self.dir / "jobs"), "metrics_dir": str(self.dir / "metrics")}
        if epoch is not None:
            config["fence_epoch"] = epoch
        (self.dir / "dlock.json").write_text(json.dumps(config))

    @property
    def config(self):
        return ["--config", str(self.dir / "dlock.json")]

    def run(self):
        """One run of the job: (DLOCK_FENCING_TOKEN as the job saw it, the log line)."""
        done = run_dlock("run", "--job", self.job, *self.config)
        assert done.returncode == 0, done.stderr
        token = json.loads(self.env_file.read_text())["DLOCK_FENCING_TOKEN"]
        return int(token), last_log(done.stderr)

    def status(self):
        done = run_dlock("status", "--job", self.job, "--json", *self.config)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)[0]

    def metric(self, name):
        done = run_dlock("metrics", *self.config, "--unit-dir", str(self.dir / "units"), "--output", "-")
        assert done.returncode == 0, done.stderr
        return sample(done.stdout, name, self.job)

    def run_metric(self, name):
        """A gauge of the runner's own file for the job (dlock_JOB.prom)."""
        return sample((self.dir / "metrics" / ("dlock_%s.prom" % self.job)).read_text(), name, self.job)


def sample(text, name, job):
    match = re.search(r'^%s\{[^}]*job="%s"[^}]*\} (\S+)$' % (name, re.escape(job)), text, re.M)
    assert match, "no sample %s in:\n%s" % (name, text)
    return int(float(match.group(1)))


@pytest.mark.parametrize("old, new", [("redis", "postgresql"), ("file", "etcd"), ("postgresql+advisory", "redis")])
def test_a_switch_with_the_epoch_one_higher_gives_fences_above_the_old_backends(
        old, new, request, tmp_path, unique_key):
    node = Node(tmp_path, "job-" + unique_key[-8:], unique_key)
    node.switch(backend_url(old, request, tmp_path), None)  # as installed before epochs: no key, epoch 0
    resource = tmp_path / "resource.jsonl"
    fences = []
    for _run in range(RUNS_ON_A):
        token, log = node.run()
        assert log["fence"] == token
        fenced_write(str(resource), token, "A")
        fences.append(token)
    assert fences == sorted(fences) and fences[-1] < EPOCH  # epoch 0: the backend's own counter, as before

    node.switch(backend_url(new, request, tmp_path), 1)
    # The new backend's lock is free and has never been granted: its fence is
    # already the epoch's floor, above every fence of the old backend.
    assert node.status()["fence"] == EPOCH
    token, log = node.run()
    assert fences[-1] < token == log["fence"] < 2 * EPOCH
    fenced_write(str(resource), token, "B")
    writes = [json.loads(line) for line in resource.read_text().splitlines()]
    assert [w["accepted"] for w in writes] == [True] * (RUNS_ON_A + 1)  # the resource took B's write at once
    row = node.status()
    assert row["fence"] == token and row["last"]["fence"] == token
    assert node.metric("dlock_lock_state_fencing_token") == token
    assert node.run_metric("dlock_fencing_token") == token
    again, _log = node.run()
    assert again > token  # the epoch keeps the backend's order


def test_force_release_reports_the_composed_fence(redis_server, tmp_path, unique_key):
    node = Node(tmp_path, "job-" + unique_key[-8:], unique_key)
    node.switch(redis_server.url, 7)
    holder = open_backend(redis_server.url, fence_epoch=7)
    try:
        grant = holder.acquire(unique_key, "someone", 20)
        assert grant.granted and grant.fence == 7 * EPOCH + 1
    finally:
        holder.close()
    done = run_dlock("release", "--job", node.job, "--force", "--reason", "test", *node.config)
    assert done.returncode == 0, done.stderr
    assert "fence %d" % (7 * EPOCH + 1) in done.stdout
    assert last_log(done.stderr)["fence"] == 7 * EPOCH + 1


def test_the_modules_fence_carries_the_epoch(redis_server, unique_key):
    params = dict(key=unique_key, state="acquired", ttl=20, wait=0, force=False, reason=None, owner="ansible-x",
                  hold=False, run_on="controller", backend_url=redis_server.url, backend_password=None,
                  backend_password_file=None, ca_file=None, op_timeout=2, fence_epoch=2)
    acquired = dlock_task.run(params)
    assert acquired["fence"] == 2 * EPOCH + 1
    queried = dlock_task.run(dict(params, state="query"))
    assert queried["fence"] == 2 * EPOCH + 1
    released = dlock_task.run(dict(params, state="released"))
    assert released["changed"]


def test_a_counter_that_reached_the_next_epoch_is_refused_and_its_grant_given_back(
        redis_server, tmp_path, unique_key):
    node = Node(tmp_path, "job-" + unique_key[-8:], unique_key)
    client = open_backend(redis_server.url)
    try:
        client.client.call("SET", _keys(unique_key)[1], EPOCH - 1)  # the next grant counts 2**40
    finally:
        client.close()
    node.switch(redis_server.url, 1)
    done = run_dlock("run", "--job", node.job, *node.config)
    assert done.returncode == 78, done.stderr  # a configuration error: never run, never wrapped
    assert "at or above 2**40" in done.stderr and "fence_epoch 1" in done.stderr
    assert not node.env_file.exists()  # the job never started
    assert not json.loads(run_dlock("status", "--key", unique_key, "--backend", redis_server.url,
                                    "--json").stdout)[0]["held"]  # the grant was given back
    refused = run_dlock("status", "--job", node.job, *node.config)
    assert refused.returncode == 78 and "at or above 2**40" in refused.stderr
    # Epoch 0 is no epoch: the counter is the fence, as before epochs.
    node.switch(redis_server.url, 0)
    token, _log = node.run()
    assert token == EPOCH + 1


# -- the composition, for every epoch and counter (a stand-in backend) ------------------
EPOCHS = st.integers(0, validate.MAX_FENCE_EPOCH)
COUNTERS = st.integers(0, 2 ** 40 - 1)


class Counter(object):
    """A backend whose grant issues the counter it is given."""

    name = "stand-in"

    def __init__(self, counter):
        self.counter = counter

    def acquire(self, key, owner, ttl, slot=None, pauses=()):
        return Grant("granted", self.counter)


def composed(epoch, counter):
    return with_epoch(Counter(counter), epoch).acquire("k", "o", 10).fence


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.integers(0, 3), EPOCHS), st.one_of(st.integers(0, 3), EPOCHS), COUNTERS, COUNTERS)
def test_a_higher_epoch_orders_every_fence_above_a_lower_ones(e1, e2, c1, c2):
    if e1 == e2:
        assert (composed(e1, c1) < composed(e2, c2)) == (c1 < c2)  # the backend's own order
    else:
        low, high = sorted((e1, e2))
        assert composed(low, c1) < composed(high, c2)


@settings(max_examples=300, deadline=None)
@given(EPOCHS, COUNTERS)
def test_every_accepted_epoch_keeps_fences_exact_in_json(epoch, counter):
    fence = composed(epoch, counter)
    assert 0 <= fence < 2 ** 53 and float(fence) == fence  # a double (JSON, JavaScript) holds it exactly
    assert json.loads(json.dumps(fence)) == fence and divmod(fence, 2 ** 40) == (epoch, counter)
