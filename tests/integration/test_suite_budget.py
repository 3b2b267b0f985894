"""The suite's budget table (scripts/budget.py) and the callback that counts
its playbook runs (tests/budget/callback_plugins), with real
ansible-playbook runs: a table that miscounted rollouts would hide the cost
it exists to show."""

import json
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import budget  # noqa: E402

PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Fail when asked
      ansible.builtin.fail:
        msg: asked to fail
      when: fail | default(false) | bool
"""


def playbook_run(tmp_path, count_file, stage, *args):
    path = tmp_path / "site.yml"
    path.write_text(PLAY)
    env = dict(os.environ, DLOCK_SUITE_COUNT=str(count_file), DLOCK_SUITE_STAGE=stage,
               ANSIBLE_CALLBACK_PLUGINS=os.path.join(ROOT, "tests", "budget", "callback_plugins"),
               ANSIBLE_CALLBACKS_ENABLED="dlock_suite_count", ANSIBLE_LOCALHOST_WARNING="false",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="false", ANSIBLE_NOCOLOR="1")
    bin_dir = os.path.dirname(sys.executable)
    return subprocess.run([os.path.join(bin_dir, "ansible-playbook"), "-i", "localhost,", str(path)] + list(args),
                          env=env, capture_output=True, text=True, timeout=120, check=False)


def test_the_callback_counts_rollouts_check_mode_and_failures_per_stage(tmp_path, capsys):
    count_file = tmp_path / "count.jsonl"
    done = [playbook_run(tmp_path, count_file, "lab one"),
            playbook_run(tmp_path, count_file, "lab one", "--check"),
            playbook_run(tmp_path, count_file, "lab two", "-e", "fail=true")]
    assert [d.returncode for d in done] == [0, 0, 2], [d.stdout[-2000:] for d in done]
    assert not any("[WARNING]" in d.stdout + d.stderr for d in done), done[0].stderr  # the callback loaded
    records = budget.read(str(count_file))
    assert [(r["stage"], r["check"], r["failed"]) for r in records] == [
        ("lab one", False, False), ("lab one", True, False), ("lab two", False, True)]

    os.environ["DLOCK_SUITE_COUNT"] = str(count_file)
    try:
        assert budget.main(["cpu"]) == 0
        sum(range(3 * 10 ** 6))  # some CPU time between the marks
        assert budget.main(["cpu"]) == 0
        for name, seconds, cpu in (("lab one", 12, "30.5"), ("lab two", 3, "2")):
            output = tmp_path / "out.txt"
            output.write_text('==== 4 passed, 1 skipped in 3.20s ====\nRunning sanity test "pep8"\n')
            assert budget.main(["stage", "--name", name, "--lane", "l", "--seconds", str(seconds), "--rc", "0",
                                "--output", str(output), "--cpu-seconds", cpu]) == 0
        with open(str(count_file), "a") as handle:
            handle.write(json.dumps({"event": "up", "lab": "x", "new_lab": True, "booted": 4, "stage": "lab two"}) + "\n")
            for node, seconds in (("x-n1", 4.5), ("x-n2", 3.0)):
                handle.write(json.dumps({"event": "node_cpu", "node": node, "seconds": seconds, "stage": "lab two"}) + "\n")
        assert budget.main(["table"]) == 0
    finally:
        del os.environ["DLOCK_SUITE_COUNT"]
    table = capsys.readouterr().out
    assert "site.yml rollouts: 1 full, 1 in check mode, 1 failing" in table, table
    assert "labs booted: 1 (4 nodes)" in table, table
    busy = re.search(r"cores busy while the lanes ran: ([\d.]+) of (\d+)", table)
    assert busy and 0 < float(busy.group(1)) <= int(busy.group(2)), table
    assert "4 passed, 1 skipped, 1 sanity tests" in table, table
    # CPU: the stage's own (host) and its nodes', each stage's row and the sum.
    rows = dict((line[:14].strip(), line[14:].split()[1:5]) for line in table.splitlines() if line.startswith("lab "))
    assert rows == {"lab one": ["12", "0", "30", "0"], "lab two": ["3", "0", "2", "7"]}, table
    assert "CPU time: 40 s in all, 7 s of it in lab nodes" in table, table


@pytest.mark.parametrize("text,expected", [
    ("=========== 887 passed, 3 skipped in 712.31s (0:11:52) ===========", {"passed": 887, "skipped": 3}),
    ("==== 2 failed, 5 passed, 1 error in 1.00s ====\n===== 3 passed in 0.5s =====",
     {"failed": 2, "passed": 8, "error": 1}),
    ("Passed: 0 failure(s), 0 warning(s) on 212 files. Last profile that met the validation criteria was "
     "'production'.", {"lint files": 212}),
    ("\x1b[32mPassed\x1b[0m: 0 failure(s), 0 warning(s) in 251 files processed of 279 encountered.",
     {"lint files": 251}),
    ("135 passed in 2.83s", {"passed": 135}),  # pytest -q
    # molecule: its verify framed and coloured, its idempotence said twice (the step, the summary)
    ("  \x1b[2m\u2502\x1b[0m ======================== 78 passed in 151.74s (0:02:31)\n"
     "\x1b[36mINFO    \x1b[0m \x1b[32mredis\x1b[0m \u279c \x1b[33midempotence\x1b[0m: \x1b[32mExecuted: Successful\x1b[0m\n"
     "\x1b[32mredis\x1b[0m \u279c \x1b[33midempotence\x1b[0m: \x1b[32mExecuted: Successful\x1b[0m",
     {"passed": 78, "idempotence": 1}),
    ("  SUCCESS: 12 rules found", {"rule files": 1}),
    # molecule syntax of two scenarios: each said twice (the step, the summary)
    ("\x1b[36mINFO    \x1b[0m \x1b[32mredis\x1b[0m \u279c \x1b[33msyntax\x1b[0m: \x1b[32mExecuted: Successful\x1b[0m\n"
     "INFO     etcd \u279c syntax: Executed: Successful\n"
     "redis \u279c syntax: Executed: Successful\netcd \u279c syntax: Executed: Successful",
     {"molecule syntax": 2}),
    ("collected 0 items\n=== no tests ran in 0.01s ===", {}),
])
def test_the_checks_a_stage_ran_are_read_from_its_output(text, expected):
    assert budget.checks_in(text) == expected


@pytest.mark.parametrize("text,expected", [
    # pytest -q's short summary: the failed tests named (CI's last matrix failure showed only "3 failed")
    ("....F\nE   assert 50 < 36.988\nFAILED tests/m.py::test_query[redis] - assert 50 < 36.988\n"
     "1 failed, 4 passed in 3.0s", ["FAILED tests/m.py::test_query[redis] - assert 50 < 36.988"]),
    # ansible's failed task, inside molecule's coloured frame
    ("  \x1b[2m\u2502\x1b[0m \x1b[31mfatal: [mlr-n1]: FAILED! => {\"msg\": \"boom\"}\x1b[0m\nPLAY RECAP",
     ["fatal: [mlr-n1]: FAILED! => {\"msg\": \"boom\"}"]),
    ("ERROR: Found 1 pylint issue(s) which need to be resolved:\nok", ["ERROR: Found 1 pylint issue(s) which need "
                                                                       "to be resolved:"]),
    # nothing says what failed: the stage's last lines
    ("\n".join("line %d" % i for i in range(40)), ["line %d" % i for i in range(40 - budget.LAST_LINES, 40)]),
])
def test_what_failed_is_read_from_a_failed_stages_output(text, expected):
    assert budget.failures_in(text) == expected


def test_the_table_ends_with_what_failed_in_each_failed_stage(tmp_path, capsys, monkeypatch):
    count_file = tmp_path / "count.jsonl"
    monkeypatch.setenv("DLOCK_SUITE_COUNT", str(count_file))
    output = tmp_path / "out.txt"
    output.write_text("FAILED tests/a.py::test_one - AssertionError\n" * (budget.FAILURES_KEPT + 3)
                      + "28 failed in 1.0s\n")
    assert budget.main(["stage", "--name", "matrix", "--lane", "checks", "--seconds", "9", "--rc", "1",
                        "--output", str(output)]) == 0
    output.write_text("FAILED tests/b.py::test_not_this_one\n3 passed, 1 failed in 1.0s\n")
    assert budget.main(["stage", "--name", "units", "--lane", "checks", "--seconds", "9", "--rc", "0",
                        "--output", str(output)]) == 0
    assert budget.main(["table"]) == 0
    table = capsys.readouterr().out
    what_failed = table.split("=== what failed in matrix (exit 1):\n")[1]
    assert what_failed.count("FAILED tests/a.py::test_one") == budget.FAILURES_KEPT
    assert "... and 3 more" in what_failed
    assert "what failed in units" not in table and "test_not_this_one" not in table
    # No CPU time measured (no cgroup2): a dash, not a zero.
    assert [line.split()[4] for line in table.splitlines() if line.startswith(("matrix ", "units "))] == ["-", "-"], table
