"""The three uses of dlock.fleet.dlock, with real ansible / ansible-playbook runs
against real Redis and PostgreSQL (lease table):

1. ad-hoc inspection and repair (query, force release);
2. a lock around part of a playbook (acquire, wait, release in a later task, run_once);
3. a lock held for the rest of the run (hold): concurrent runs never interleave,
   a SIGKILLed run's lock expires by itself, a finished run's lock is released.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from ansible_cli import ROOT, Ansible, assert_ok

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import open_backend

OTHER = "node9:4242:0123456789abcdef01234567"
# Another owner's lease that outlives any test here, however loaded the machine: under CI's
# load one ansible-playbook run has taken 25 s, and three of them outlived a 60 s lease.
HELD_TTL = 3600


def ledger_runs(path):
    """[(run, fence)] in ledger order, checking each start is followed by its own end."""
    with open(path) as handle:
        lines = [line.split() for line in handle if line.strip()]
    runs = []
    for start, end in zip(lines[::2], lines[1::2]):
        assert start[0] == "start" and end[0] == "end" and start[1:] == end[1:], "interleaved: %r" % lines
        runs.append((start[1], int(start[2])))
    assert len(lines) == 2 * len(runs), "unfinished run in the ledger: %r" % lines
    return runs


def wait_for(predicate, timeout, step=0.1):
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


# -- 1. ad-hoc inspection and repair --------------------------------------------------------
def test_adhoc_query_shows_holder_age_ttl_and_fence(ansible, engine, unique_key, lease_url):
    grant = engine.acquire(unique_key, OTHER, HELD_TTL)
    granted_at = time.monotonic()
    time.sleep(1.0)
    rc, result, out = ansible.adhoc("key=%s state=query backend_url=%s" % (unique_key, lease_url))
    elapsed = time.monotonic() - granted_at
    assert rc == 0, out
    assert result["changed"] is False and result["acquired"] is False
    assert result["holder"]["owner"] == OTHER
    assert 0.9 <= result["holder"]["age"] <= elapsed + 0.5  # 0.5: the servers' clock against ours
    assert HELD_TTL - elapsed - 0.5 <= result["ttl_remaining"] <= HELD_TTL
    assert result["fence"] == grant.fence
    assert result["msg"].startswith("%s is held by %s for " % (unique_key, OTHER))


def test_query_returns_the_fleet_wide_history_newest_first(ansible, engine, unique_key, lease_url):
    for result in ("success", "failed", "lock_lost"):
        engine.add_history(unique_key, {"result": result, "host": "node1"}, 50)
    rc, result, out = ansible.adhoc("key=%s state=query history=2 backend_url=%s" % (unique_key, lease_url))
    assert rc == 0, out
    assert result["changed"] is False
    assert [entry["result"] for entry in result["history"]] == ["lock_lost", "failed"]
    rc, result, out = ansible.adhoc("key=%s state=query backend_url=%s" % (unique_key, lease_url))
    assert rc == 0 and "history" not in result, out


def test_adhoc_force_release_says_whose_lock_it_broke(ansible, engine, unique_key):
    engine.acquire(unique_key, OTHER, HELD_TTL)
    rc, result, out = ansible.adhoc('key=%s state=released force=true reason="holder crashed"' % unique_key, "--diff")
    assert rc == 0, out
    assert result["changed"] is True
    assert "broke the lock of %s held by %s" % (unique_key, OTHER) in result["msg"]
    assert result["msg"].endswith("reason: holder crashed")
    assert result["previous_holder"]["owner"] == OTHER
    assert "-owner: %s" % OTHER in out  # the diff
    assert engine.query(unique_key).owner is None
    # Without a reason, nothing is broken.
    engine.acquire(unique_key, OTHER, HELD_TTL)
    rc, result, out = ansible.adhoc("key=%s state=released force=true" % unique_key)
    assert rc != 0 and "reason" in result["msg"]
    assert engine.query(unique_key).owner == OTHER


def test_adhoc_release_of_another_owners_lock_fails(ansible, engine, unique_key):
    engine.acquire(unique_key, OTHER, HELD_TTL)
    rc, result, _out = ansible.adhoc("key=%s state=released" % unique_key)
    assert rc != 0 and "held by another owner" in result["msg"]
    assert engine.query(unique_key).owner == OTHER


def test_runbooks_status_and_break_lock(ansible, engine, unique_key):
    engine.acquire(unique_key, OTHER, HELD_TTL)
    status = ansible.playbook(os.path.join(ROOT, "playbooks", "status.yml"), {"dlock_keys": unique_key})
    assert_ok(status)
    assert "%s is held by %s" % (unique_key, OTHER) in status.stdout
    refused = ansible.playbook(os.path.join(ROOT, "playbooks", "break_lock.yml"), {"dlock_key": unique_key})
    assert refused.returncode != 0 and "say why" in refused.stdout
    would = ansible.playbook(os.path.join(ROOT, "playbooks", "break_lock.yml"),
                             {"dlock_key": unique_key, "dlock_reason": "stale"}, "--check")
    assert_ok(would)
    assert "would break the lock: %s is held by %s" % (unique_key, OTHER) in would.stdout
    assert engine.query(unique_key).owner == OTHER
    broke = ansible.playbook(os.path.join(ROOT, "playbooks", "break_lock.yml"),
                             {"dlock_key": unique_key, "dlock_reason": "stale"})
    assert_ok(broke)
    assert "broke the lock of %s held by %s" % (unique_key, OTHER) in broke.stdout
    assert engine.query(unique_key).owner is None


def test_runbook_history_shows_the_fleet_s_runs_newest_first(ansible, engine, unique_key):
    engine.add_history(unique_key, {"result": "success", "run_id": unique_key + "@2026-11-28T02:00:00Z",
                                    "host": "node1", "fence": 7, "exit_code": 0, "finished_at": 1795831205.0}, 50)
    engine.add_history(unique_key, {"result": "skipped_paused", "run_id": unique_key + "@2026-11-29T02:00:00Z",
                                    "host": "node2", "exit_code": 72, "pause_reason": "CHG-118"}, 50)
    shown = ansible.playbook(os.path.join(ROOT, "playbooks", "history.yml"), {"dlock_key": unique_key})
    assert_ok(shown)
    first = shown.stdout.index("%s@2026-11-29T02:00:00Z skipped_paused (exit 72) on node2, fence -, CHG-118" % unique_key)
    second = shown.stdout.index("%s@2026-11-28T02:00:00Z success (exit 0) on node1, fence 7" % unique_key)
    assert first < second and time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(1795831205)) in shown.stdout, \
        shown.stdout
    none = ansible.playbook(os.path.join(ROOT, "playbooks", "history.yml"), {"dlock_key": unique_key + "-none"})
    assert_ok(none)
    assert "no history of %s-none in the backend" % unique_key in none.stdout
    refused = ansible.playbook(os.path.join(ROOT, "playbooks", "history.yml"))
    assert refused.returncode != 0 and "Name the job's lock" in refused.stdout


# -- 2. a lock around part of a playbook ------------------------------------------------------
def test_lock_around_part_of_a_play_waits_for_a_busy_lock(ansible, engine, unique_key, tmp_path):
    ledger = tmp_path / "ledger"
    # Another holder, gone in 20 s: ansible starts in about 2 s, but a loaded
    # CI machine once took more than the 8 s this was, and found it free (CI4).
    other = engine.acquire(unique_key, OTHER, 20)
    run = ansible.playbook("section.yml", {"lock_key": unique_key, "lock_wait": 40, "ledger": str(ledger)})
    assert_ok(run)
    lines = sorted(ledger.read_text().split("\n")[:-1])
    assert [line.split()[0] for line in lines] == ["h1", "h2"]
    assert "fence=%d " % (other.fence + 1) in lines[0]
    waited = float(lines[0].split("waited=")[1])
    assert 0.5 < waited < 20 + 1.0  # woken by the holder's lease end (it never releases), not by retries
    assert engine.query(unique_key).owner is None


def test_busy_lock_fails_fast_with_wait_zero(ansible, engine, unique_key, tmp_path):
    engine.acquire(unique_key, OTHER, HELD_TTL)
    run = ansible.playbook("section.yml", {"lock_key": unique_key, "lock_wait": 0, "ledger": str(tmp_path / "l")})
    assert run.returncode != 0
    assert "%s is held by %s" % (unique_key, OTHER) in run.stdout and "not acquired" in run.stdout
    assert not (tmp_path / "l").exists()


def test_check_and_diff_mode_change_nothing(ansible, engine, unique_key, tmp_path):
    run = ansible.playbook("hold.yml", {"lock_key": unique_key, "lock_ttl": 30, "lock_wait": 0, "work_seconds": 0,
                                        "run_name": "check", "ledger": str(tmp_path / "l")}, "--check", "--diff")
    assert_ok(run)
    assert "+owner: ansible@" in run.stdout and "-held: false" in run.stdout  # the diff
    assert engine.query(unique_key).owner is None


# -- 3. a lock held for the rest of the run ------------------------------------------------------
def hold_vars(key, tmp_path, run_name, **extra):
    values = {"lock_key": key, "lock_ttl": 3, "lock_wait": 60, "work_seconds": 4, "run_name": run_name,
              "ledger": str(tmp_path / "ledger")}
    values.update(extra)
    return values


@pytest.mark.slow
def test_concurrent_runs_holding_the_lock_never_interleave(ansible, engine, unique_key, tmp_path):
    runs = [ansible.start_playbook("hold.yml", hold_vars(unique_key, tmp_path, name, lock_ttl=9, work_seconds=10))
            for name in ("A", "B")]
    outputs = [proc.communicate(timeout=120)[0] for proc in runs]
    for proc, out in zip(runs, outputs):
        assert proc.returncode == 0, out
    order = ledger_runs(str(tmp_path / "ledger"))
    assert sorted(name for name, _fence in order) == ["A", "B"]
    assert order[0][1] < order[1][1]  # fences grow
    # Each run held the lock past its 9s ttl (work: 10s), renewed every 3s,
    # so at any moment at least 6s of lease were left; its renewer released
    # it when ansible-playbook ended (it polls every 0.25s): gone within 5s
    # is a release, not an expiry, with a second to spare on a loaded host
    # (a 3s ttl left no margin: a renewer 2s late failed CI once).
    assert wait_for(lambda: engine.query(unique_key).owner is None, 5.0)


@pytest.mark.slow
def test_concurrent_runs_with_wait_zero_one_fails_fast(ansible, engine, unique_key, tmp_path):
    # One try each: a ttl of 20 s gives it op_timeout's 2 s. With 3 s (0.3 s
    # for a request) both tries failed on PostgreSQL in a loaded CI run (CI15;
    # the output was cut before the reason, now kept: the tails below).
    runs = [ansible.start_playbook("hold.yml", hold_vars(unique_key, tmp_path, name, lock_wait=0, lock_ttl=20))
            for name in ("A", "B")]
    outputs = [proc.communicate(timeout=120)[0] for proc in runs]
    assert sorted(proc.returncode for proc in runs) == [0, 2], [output[-2500:] for output in outputs]
    failed = outputs[[proc.returncode for proc in runs].index(2)]
    assert "is held by ansible@" in failed and "not acquired" in failed
    assert len(ledger_runs(str(tmp_path / "ledger"))) == 1
    # The loser's renewer, started before its try, left without "go"; the
    # winner's released the lock and left when its run ended.
    assert wait_for(lambda: not renewer_pids(unique_key), 10.0), renewer_pids(unique_key)
    assert engine.query(unique_key).owner is None


@pytest.mark.slow
def test_a_killed_run_leaves_its_lock_to_expire(ansible, engine, unique_key, tmp_path):
    # A short ttl: the renewer is started before the lock is taken, so its
    # start (which took a loaded CI machine longer than 3 s, then 6 s, CI18)
    # no longer counts against the ttl.
    ttl = 4
    proc = ansible.start_playbook("hold.yml", hold_vars(unique_key, tmp_path, "K", lock_ttl=ttl, work_seconds=60))
    try:
        assert wait_for((tmp_path / "ledger").exists, 60), proc.stdout.read()
        holder = engine.query(unique_key).owner
        assert holder.startswith("ansible@") and ":%d:" % proc.pid in holder
        time.sleep(ttl)  # renewed past its ttl while ansible-playbook lives
        assert engine.query(unique_key).owner == holder
        proc.kill()
        killed_at = time.monotonic()
        proc.wait()
        time.sleep(0.5)
        assert engine.query(unique_key).owner == holder  # not released: it expires
        assert wait_for(lambda: engine.query(unique_key).owner is None, ttl + 2)
        assert time.monotonic() - killed_at <= ttl + 1.5
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the orphaned workers
        except OSError:
            pass
    # The next run gets the lock at once. Its connection gets 5 s, not the
    # inventory's 1 s (CI7: a loaded machine's PostgreSQL took longer to
    # connect); a ttl of 30 s allows it (hold: op_timeout at most ttl/3).
    again = ansible.playbook("hold.yml", hold_vars(unique_key, tmp_path, "N", lock_wait=0, work_seconds=0,
                                                   lock_ttl=30, lock_op_timeout=5))
    assert_ok(again)


def test_held_lock_is_released_at_the_end_and_renewer_exits(ansible, engine, unique_key, tmp_path):
    proc = ansible.start_playbook("hold.yml", hold_vars(unique_key, tmp_path, "E", lock_ttl=30, work_seconds=2))
    assert wait_for((tmp_path / "ledger").exists, 60)
    renewers = renewer_pids(unique_key)
    assert len(renewers) == 1
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    assert wait_for(lambda: engine.query(unique_key).owner is None, 2.0)  # released, not expired (ttl 30s)
    assert wait_for(lambda: not renewer_pids(unique_key), 2.0)


def renewer_pids(key):
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if b"dlock.hold" in argv and key.encode() in argv:
            pids.append(int(pid))
    return pids


# -- errors and secrets --------------------------------------------------------------------------
def test_errors_have_their_own_messages(ansible, unique_key, pg_server, redis_server):
    rc, result, _out = ansible.adhoc("key=%s state=query backend_url=redis://127.0.0.1:1/0" % unique_key)
    assert rc != 0 and "lock backend redis://127.0.0.1:1/0 is unreachable or failing" in result["msg"]
    rc, result, _out = ansible.adhoc("key=%s state=query backend_url=%s backend_password=wrong-one"
                                     % (unique_key, pg_server.url(user="locker")))
    assert rc != 0 and "authentication to the lock backend" in result["msg"]
    rc, result, _out = ansible.adhoc("key=%s backend_url=%s" % (unique_key, pg_server.url(scheme="postgresql+advisory")))
    assert rc != 0 and "the postgresql+advisory backend keeps its lock only as long as" in result["msg"]
    assert ansible.adhoc("key=%s state=query backend_url=%s" % (unique_key, redis_server.url))[0] == 0
    # hold: the renewer, started before the lock is taken, cannot log in: the
    # task's own message, nothing taken, no renewer left.
    rc, result, _out = ansible.adhoc("key=%s hold=true backend_url=%s backend_password=wrong-one"
                                     % (unique_key, pg_server.url(user="locker")))
    assert rc != 0 and "authentication to the lock backend" in result["msg"], result
    assert renewer_pids(unique_key) == []


def test_secrets_stay_out_of_output_argv_and_environment(tmp_path, pg_server, unique_key):
    secret = pg_server.password
    # The password role 'locker' uses the lease tables that other tests' superuser made.
    superuser = open_backend(pg_server.url())
    superuser.query(unique_key)
    superuser.close()
    pg_server.sql("GRANT ALL ON ALL TABLES IN SCHEMA public TO locker", db="dlock")
    password_file = tmp_path / "pw"
    password_file.write_text(secret + "\n")
    ansible = Ansible(tmp_path, {"url": pg_server.url(user="locker"), "password": secret, "op_timeout": 1})
    proc = ansible.start_playbook("hold.yml", hold_vars(unique_key, tmp_path, "S", lock_ttl=30, work_seconds=3),
                                  "-vvv", "--diff")
    assert wait_for(lambda: renewer_pids(unique_key), 60), proc.communicate()[0]
    for pid in renewer_pids(unique_key):
        for name in ("cmdline", "environ"):
            with open("/proc/%d/%s" % (pid, name), "rb") as handle:
                assert secret.encode() not in handle.read()
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    section = ansible.playbook("section.yml", {"lock_key": unique_key, "lock_wait": 5, "ledger": str(tmp_path / "l")},
                               "-vvv", "--diff")
    assert_ok(section)
    rc, result, adhoc = ansible.adhoc("key=%s state=query backend_password_file=%s run_on=target"
                                      % (unique_key, password_file), "-vvv")
    assert rc == 0 and result["changed"] is False, adhoc
    # (A password given with -a shows in ps, and ansible-core echoes -a when a task fails: never do that.)
    wrong = ansible.adhoc("key=%s state=query backend_password=not-the-password" % unique_key, "-vvv")
    assert wrong[0] != 0 and "authentication" in wrong[1]["msg"]
    for text in (out, section.stdout, section.stderr, adhoc, wrong[2]):
        assert secret not in text
    assert "dlock:" in out and "from the controller as ansible@" in out  # -vvv did show our lines
