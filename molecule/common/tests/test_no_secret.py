"""No generated password anywhere it should not be, on every host of every
scenario, nor in the -vvv --diff idempotence run's output (pytest-testinfra;
the scenarios' shared checks, by path, as test_every_host.py says). Listed
last in additional_files_or_dirs, so that its searches of the journals and
logs also cover what the other checks did."""

import os
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # fleet_checks, pg_checks

from fleet_checks import EPHEMERAL, PASSWORD_FILE, PATRONI_CONFIG, SCENARIO_DIR, secrets  # noqa: E402

testinfra_hosts = ["ansible://all"]

IDEMPOTENCE_LOG = "idempotence.log"  # tests/lab/scenario.py writes it: "exit N" then the output


@pytest.fixture(scope="session")
def verbose_run():
    """A -vvv --diff run of the rollout on the converged fleet, captured
    whole: it must change nothing and print no password.

    Where a lab session converged the scenario (tests/lab/scenario.py), the
    run is its idempotence run, at -vvv --diff, on every host: read from the
    ephemeral directory. Under `molecule test` (whose own idempotence run is
    not verbose), a -vvv run of converge.yml in check and diff mode, on the
    backend and one node (every node runs the same tasks; two hosts keep it
    quick on a small machine; all the backend hosts where there are several,
    the etcd members). The journals of all hosts are searched anyway."""
    log = os.path.join(EPHEMERAL, IDEMPOTENCE_LOG)
    if os.path.exists(log):
        with open(log) as handle:
            status, output = handle.read().split("\n", 1)
        return subprocess.CompletedProcess(["ansible-playbook"], int(status.split()[1]), output, "")
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-vvv", "--check", "--diff",
         "--limit", "dlock_backend:dlock_nodes[0]",
         "-i", os.environ["MOLECULE_INVENTORY_FILE"], os.path.join(SCENARIO_DIR, "converge.yml")],
        capture_output=True, text=True, timeout=900, check=False,
        env=dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1"))  # molecule forces colour
    return done


def test_verbose_run_changes_nothing_and_prints_no_password(verbose_run):
    output = verbose_run.stdout + verbose_run.stderr
    tail = output[-3000:]
    for value in secrets():
        tail = tail.replace(value, "********")
    assert verbose_run.returncode == 0, tail
    assert "ESTABLISH SSH CONNECTION" in output, "not a -vvv run"
    recap = re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=0", output, re.M)
    assert len(recap) >= 2 and all(changed == "0" for _host, changed in recap), recap
    # Booleans first: pytest must not print a password when explaining a failure.
    leaked = any(value in output for value in secrets())
    assert not leaked, "a backend password is in the -vvv output"


def test_no_password_on_the_hosts(host, verbose_run):
    """Unit files, configuration, processes, journals and logs hold no password.

    The text is fetched and searched here, on the controller, so the search
    itself never puts a password on a host's command line."""
    places = {
        "unit files": "find /etc/systemd /lib/systemd/system -type f -print0 | xargs -0 cat",
        "configuration": "find /etc -type f -not -path %s -not -path %s -size -256k -exec grep -IlZ '' {} + "
                         "| xargs -0 cat" % (PASSWORD_FILE, PATRONI_CONFIG),
        "process list": "ps -eo args",
        "journal": "journalctl --no-pager -o cat",
        "logs": "find /var/log -type f -size -4M -exec grep -IlZ '' {} + | xargs -0 cat",
        "environment of processes": "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'",
    }
    values = secrets()
    for what, command in places.items():
        text = host.run(command).stdout
        assert len(text) > 0, what
        leaked = any(value in text for value in values)
        assert not leaked, "a backend password is in the %s of %s" % (what, host.backend.get_hostname())
