"""The job nodes of every scenario: the runner's commands against the
backend, a forced release ending its holder's run, the textfile metrics over
HTTP (clean under promtool), the units' exposure, the generated password in
use (pytest-testinfra; the scenarios' shared checks, by path, as
test_every_host.py says)."""

import json
import os
import re
import shlex
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # fleet_checks, pg_checks

from fleet_checks import (  # noqa: E402
    EPHEMERAL,
    JOB,
    METRICS_DIR,
    PASSWORD_FILE,
    REFRESH_MAX_EXPOSURE,
    address,
    secrets,
    wait_for,
)

testinfra_hosts = ["ansible://dlock_nodes"]


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


# Each engine module's compiled file, fresh for its source (the header's
# source mtime, as Python checks it) and readable by the job users, who cannot
# write it themselves: the role compiles only when it wrote the engine or a
# module has none, so a stale or missing one would go unnoticed by the
# idempotence run.
COMPILED = """import glob, importlib.util, os, sys
bad = []
for source in sorted(glob.glob(sys.argv[1] + "/**/*.py", recursive=True)):
    compiled = importlib.util.cache_from_source(source)
    try:
        with open(compiled, "rb") as handle:
            header = handle.read(16)
        readable = os.stat(compiled).st_mode & 0o444 == 0o444
    except OSError:
        header, readable = b"", False
    if not readable or int.from_bytes(header[8:12], "little") != int(os.stat(source).st_mtime) & 0xFFFFFFFF:
        bad.append(source)
print(len(glob.glob(sys.argv[1] + "/**/*.py", recursive=True)), bad)
sys.exit(1 if bad else 0)
"""


def test_the_engine_is_compiled_fresh_and_readable(host):
    out = host.run("python3 -I -c %s /usr/local/lib/dlock/dlock" % shlex.quote(COMPILED))
    assert out.rc == 0, out.stdout + out.stderr
    assert int(out.stdout.split()[0]) >= 20, out.stdout  # the engine's modules were found
