"""Checks the backend scenarios (molecule/redis, molecule/postgresql, molecule/etcd,
molecule/postgresql-ha) share.

A scenario's test modules import these tests by name, and pytest collects
them there; each module's testinfra_hosts says which hosts they run on:
test_fleet.py (every host), test_backend.py (dlock_backend), test_nodes.py
(dlock_nodes), test_secrets.py (every host; alphabetically last, so its
searches also cover what the other tests did).

The backend password is the one site.yml generated on the controller (in the
scenario's ephemeral directory); the tests read it there and check that it is
in use and that it appears nowhere it should not: unit files, configuration,
process lists, journals, logs, and the output of a -vvv run of the playbook.
"""

import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import pytest

EPHEMERAL = os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "")
SCENARIO_DIR = os.environ.get("MOLECULE_SCENARIO_DIRECTORY", "")
JOB = "sample"  # once_per 5m, every 5 minutes
PASSWORD_FILE = "/etc/dlock/backend.password"
# Patroni's configuration holds its own passwords (0600 postgres): the one
# other file under /etc where a generated password belongs.
PATRONI_CONFIG = "/etc/patroni/config.yml"
GENERATED = ("backend.password", "redis-admin.password", "backend-admin.password", "dlock-patroni-etcd.password",
             "dlock-patroni-replication.password", "dlock-patroni-rewind.password", "dlock-patroni-restapi.password")
METRICS_DIR = "/var/lib/prometheus/node-exporter"
# systemd-analyze security: exposure 0 (best) to 10; levels PERFECT, SAFE, OK,
# MEDIUM, EXPOSED, UNSAFE. Job units must stay OK or better; the refresh unit
# (dlock_metrics) at or under this score.
REFRESH_MAX_EXPOSURE = 2.0


def secret(name):
    """A password the lookup plugin generated for the run (file: password [salt=...])."""
    with open(os.path.join(EPHEMERAL, name)) as handle:
        return handle.read().split(" salt=")[0].strip()


def secrets():
    found = [secret(name) for name in GENERATED if os.path.exists(os.path.join(EPHEMERAL, name))]
    assert found and all(len(s) >= 16 for s in found), "no generated backend password to look for"
    return found


def groups(host):
    return host.ansible.get_variables()["group_names"]


def address(host):
    return host.ansible.get_variables()["ansible_host"]


def is_node(host):
    return "dlock_nodes" in groups(host)


def first_node(host):
    return host.ansible.get_variables()["groups"]["dlock_nodes"][0]


def backend_name(host):
    return host.ansible.get_variables()["groups"]["dlock_backend"][0]


def group_addresses(host, group):
    """The addresses of a group's hosts, in inventory order (the scenarios name
    no address: a lab session runs them on its own nodes, tests/lab/scenario.py)."""
    inventory = os.environ["MOLECULE_INVENTORY_FILE"]
    return [address(host.get_host("ansible://" + name, ansible_inventory=inventory))
            for name in host.ansible.get_variables()["groups"][group]]


def ssh_with_stdin(host, command, stdin):
    """Run a shell command on the host over plain ssh, feeding stdin: how a
    secret reaches a host command without being on any command line."""
    hostvars = host.ansible.get_variables()
    argv = ["ssh", "-i", hostvars["ansible_private_key_file"], "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes",
            "%s@%s" % (hostvars.get("ansible_user", "root"), hostvars["ansible_host"]), command]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60, check=False)


# ----------------------------------------------------------------- every host (test_fleet.py)


def test_services_run(host):
    assert host.service("chrony.service").is_enabled and host.service("chrony.service").is_running
    # The boot gate only where there is a source to wait for: the job nodes. The
    # backend serves its own clock; a gate there would hold its boot 180 s.
    assert host.service("chrony-wait.service").is_enabled == is_node(host)
    if is_node(host):
        for unit in ("prometheus-node-exporter.service", "dlock-%s.timer" % JOB,
                     "prometheus-node-exporter-dlock.timer"):
            assert host.service(unit).is_enabled, unit
            assert host.service(unit).is_running, unit


def test_chrony_tracking_reports_a_state(host):
    out = host.run("chronyc tracking")
    assert out.rc == 0, out.stderr
    assert re.search(r"^Leap status\s+: Normal$", out.stdout, re.M), out.stdout
    if is_node(host):
        backend = backend_name(host)
        assert re.search(r"^Reference ID\s+: \S+ \(%s\)$" % re.escape(backend), out.stdout, re.M), out.stdout


def test_chrony_container_mode_never_adjusts_the_clock(host):
    """Container mode (chronyd -x); the job nodes step only at start, the
    backend hosts (Redis and PostgreSQL count leases on their clock) never:
    no makestep at all, and a bounded slew rate."""
    assert "-x" in host.check_output("ps -o args= -C chronyd").split()
    conf = host.file("/etc/chrony/chrony.conf").content_string
    assert conf.startswith("# Ansible managed")
    directives = [line.split()[0] for line in conf.splitlines() if line.strip() and not line.startswith("#")]
    if is_node(host):
        assert "makestep 1.0 3" in conf and "maxslewrate" not in directives
    else:
        assert "makestep" not in directives and "maxslewrate 5000" in conf, conf


# ----------------------------------------------------------------- job nodes (test_nodes.py)


def test_runner_commands_work_with_the_backend(host):
    # The job's timer may start a run on any node at any moment: waiting for
    # the lock (not skipping) means that run has ended, and recorded its
    # result, before ours is granted. 74: it already ran this slot.
    run = host.run("dlock run --job %s --on-contention wait --wait-timeout 2m", JOB)
    assert run.rc in (0, 74), run.stderr
    status = host.run("dlock status --job %s --json", JOB)
    assert status.rc == 0, status.stderr
    row = json.loads(status.stdout)[0]
    assert row["key"] == JOB and row["fence"] >= 1 and row["last"]["result"] == "success", row
    clock = host.run("dlock check-clock --json")
    assert clock.rc == 0, clock.stdout + clock.stderr
    report = json.loads(clock.stdout)
    assert report["safe"] and report["chrony"]["synchronised"], report


def wait_for(predicate, attempts=60):
    """Poll a condition every half second, at most attempts times."""
    for _attempt in range(attempts):
        if predicate():
            return True
        time.sleep(0.5)
    return predicate()


def test_force_release_ends_the_holders_run(host):
    """A held key of its own (not the job's: a force release of a scheduled run
    would cost that slot its recorded result): released by force, its holder
    sees the loss at its next renewal (every 2 s), kills its job and exits 76.
    The job's own ttl (1m), so op_timeout (2 s) is the job's too: a shorter
    ttl's would not cover a TLS connection to a loaded etcd."""
    key, unit = "molecule-force-%s" % host.backend.get_hostname(), "dlock-force-hold"
    started = host.run("systemd-run --unit %s dlock run --job molecule-force --key %s --ttl 1m --renew-every 2s "
                       "-- sleep 300", unit, key)
    assert started.rc == 0, started.stderr
    try:
        assert wait_for(lambda: '"held": true' in host.run("dlock status --key %s --json", key).stdout), \
            host.run("journalctl -u %s --no-pager -n 20", unit).stdout
        out = host.run("dlock release --key %s --force --reason 'molecule verify'", key)
        assert out.rc == 0 and out.stdout.startswith("released %s" % key), out.stdout + out.stderr
        assert wait_for(lambda: host.run("systemctl is-active %s", unit).stdout.strip() != "active")
        status = host.check_output("systemctl show -P ExecMainStatus %s", unit)
        assert status == "76", (status, host.run("journalctl -u %s --no-pager -n 20", unit).stdout)
    finally:
        host.run("systemctl stop %s; systemctl reset-failed %s", unit, unit)


def _scrape(host):
    """node_exporter's page, fetched over HTTP from the controller."""
    with urllib.request.urlopen("http://%s:9100/metrics" % address(host), timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def _dlock_families(page):
    """The dlock_* families of a scrape, as exposition text."""
    return "".join(line + "\n" for line in page.splitlines()
                   if re.match(r"^(# (HELP|TYPE) )?dlock_", line))


def _value(page, pattern):
    match = re.search(r"^%s (\S+)$" % pattern, page, re.M)
    assert match, "no sample matching %s" % pattern
    return float(match.group(1))


def test_textfile_metrics_served_over_http_and_clean(host):
    # A run of the job writes dlock_sample.prom; the refresh writes dlock-lock-state.prom.
    assert host.run("systemctl start dlock-%s.service", JOB).rc == 0
    refresh = host.run("systemctl start prometheus-node-exporter-dlock.service")
    assert refresh.rc == 0, host.run("journalctl -u prometheus-node-exporter-dlock.service -n 20 --no-pager").stdout
    for name in ("dlock_%s.prom" % JOB, "dlock-lock-state.prom"):
        assert host.file("%s/%s" % (METRICS_DIR, name)).mode == 0o644
    page = _scrape(host)
    assert _value(page, "node_textfile_scrape_error") == 0
    for name in ("dlock_%s.prom" % JOB, "dlock-lock-state.prom"):
        _value(page, r'node_textfile_mtime_seconds\{file="[^"]*%s"\}' % re.escape(name))
    families = _dlock_families(page)
    check = subprocess.run(["promtool", "check", "metrics"], input=families, capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert _value(page, r'dlock_runs_total\{job="%s",result="success"\}' % JOB) >= 0
    assert _value(page, "dlock_lock_state_refresh_success") == 1
    assert _value(page, "dlock_clock_check_safe") == 1
    assert _value(page, "dlock_clock_chrony_synchronised") == 1
    assert _value(page, r'dlock_job_schedule_period_seconds\{job="%s"\}' % JOB) == 300
    assert _value(page, r'dlock_lock_state_fencing_token\{job="%s",key="%s"\}' % (JOB, JOB)) >= 1
    assert _value(page, r'dlock_lock_state_last_run_timestamp_seconds\{job="%s",key="%s"\}' % (JOB, JOB)) > 0


def test_job_unit_exposure(host, record_property):
    scores = {}
    for unit in ("dlock-%s.service" % JOB, "prometheus-node-exporter-dlock.service",
                 "prometheus-node-exporter.service"):
        out = host.run("systemd-analyze security --no-pager %s", unit)
        match = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", out.stdout)
        assert match, out.stdout + out.stderr
        scores[unit] = "%s %s" % match.groups()
        record_property(unit, scores[unit])
    print("\nsystemd-analyze security on %s: %s" % (host.backend.get_hostname(), scores))
    with open(os.path.join(EPHEMERAL, "exposure.json"), "a") as report:
        report.write(json.dumps({"host": host.backend.get_hostname(), "scores": scores}) + "\n")
    assert scores["dlock-%s.service" % JOB].split()[1] in ("PERFECT", "SAFE", "OK"), scores
    assert float(scores["prometheus-node-exporter-dlock.service"].split()[0]) <= REFRESH_MAX_EXPOSURE, scores


def test_password_is_in_use(host):
    password = secrets()[0]
    held = host.file(PASSWORD_FILE)
    assert (held.user, held.mode) == ("root", 0o600)
    matches = held.content_string.rstrip("\n") == password
    assert matches, "the node's password file does not hold the generated password"
    assert host.run("dlock check-clock").rc == 0  # connects with it
    # Another password is refused: the backend really checks this one.
    host.run("umask 077 && echo wrong-password-0123456789 > /run/dlock-wrong-password")
    wrong = host.run("dlock check-clock --password-file /run/dlock-wrong-password")
    host.run("rm -f /run/dlock-wrong-password")
    assert wrong.rc == 75 and "authentication failed" in wrong.stderr, wrong.stderr


# ----------------------------------------------------------------- secrets (test_secrets.py)


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
