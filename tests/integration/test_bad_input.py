"""Each malformed config or flag gets its own clear error (exit 78) and nothing
is written: no metrics file, no lock taken, the job never starts."""

import json
import os

import pytest
from runner_proc import run_dlock

from ansible_collections.dlock.fleet.plugins.module_utils.dlock.backends import open_backend

CASES = [
    # (name, global config or None, job file or None, extra flags, expected message fragment)
    ("bad json", "{not json", None, [], "not valid JSON"),
    ("config not an object", "[1, 2]", None, [], "must hold a JSON object"),
    ("unknown global key", {"backend": "@URL@", "metrics": "/tmp"}, None, [], "unknown field 'metrics'"),
    ("unknown job key", {"backend": "@URL@"}, {"command": ["true"], "tll": "5s"}, [], "unknown field 'tll'"),
    ("bad duration in job", {"backend": "@URL@"}, {"command": ["true"], "ttl": "10 minutes"}, [],
     "ttl: '10 minutes' is not a duration"),
    ("bad duration flag", {"backend": "@URL@"}, {"command": ["true"]}, ["--ttl", "5x"], "ttl: '5x' is not a duration"),
    ("unsafe timing", {"backend": "@URL@"}, {"command": ["true"], "ttl": "10s", "renew_every": "9s"}, [],
     "must be below ttl (10s)"),
    ("string command", {"backend": "@URL@"}, {"command": "rm -rf /tmp/x"}, [], "list of strings (argv, no shell)"),
    ("no command", {"backend": "@URL@"}, {"ttl": "30s"}, [], "no command"),
    ("bad scheme", {"backend": "mysql://db/locks"}, {"command": ["true"]}, [], "unsupported scheme 'mysql'"),
    ("password in url", {"backend": "redis://u:secret@127.0.0.1:6379"}, {"command": ["true"]}, [],
     "contains a password"),
    ("bad port", {"backend": "redis://127.0.0.1:99999"}, {"command": ["true"]}, [], "out of range (1-65535)"),
    ("no backend", {}, {"command": ["true"]}, [], "a backend URL is required"),
    ("missing password file", {"backend": "@URL@", "password_file": "/nonexistent/pw"}, {"command": ["true"]}, [],
     "cannot read password file /nonexistent/pw"),
    ("bad environment", {"backend": "@URL@"}, {"command": ["true"], "environment": {"1BAD": "x"}}, [],
     "environment"),
    ("bad exit code", {"backend": "@URL@"}, {"command": ["true"], "exit_codes": {"locked": 999}}, [],
     "exit_codes.locked"),
    ("bad on_contention flag", {"backend": "@URL@"}, {"command": ["true"]}, ["--on-contention", "queue"],
     "invalid choice"),
    ("unknown flag", {"backend": "@URL@"}, {"command": ["true"]}, ["--tll", "5s"], "unrecognized arguments"),
    ("bad key", {"backend": "@URL@"}, {"command": ["true"], "key": "has space"}, [], "not a valid lock key"),
]


@pytest.mark.parametrize("name,global_cfg,job_cfg,flags,fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_cleanly(name, global_cfg, job_cfg, flags, fragment, redis_server, tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    config = tmp_path / "dlock.json"
    marker = tmp_path / "job-ran"
    if isinstance(global_cfg, dict):
        global_cfg = dict(global_cfg, metrics_dir=str(metrics))
    text = global_cfg if isinstance(global_cfg, str) else json.dumps(global_cfg)
    config.write_text(text.replace("@URL@", redis_server.url))
    if job_cfg is not None:
        if job_cfg.get("command") == ["true"]:
            job_cfg = dict(job_cfg, command=["touch", str(marker)])
        (jobs / "nightly.json").write_text(json.dumps(job_cfg))
    done = run_dlock("run", "--job", "nightly", "--config", str(config), "--jobs-dir", str(jobs), *flags)
    assert done.returncode == 78, done.stderr
    assert fragment in done.stderr
    assert "Traceback" not in done.stderr
    assert not marker.exists()
    assert os.listdir(metrics) == []
    assert open_backend(redis_server.url).query("nightly").owner is None


def test_errors_name_the_file(redis_server, tmp_path):
    config = tmp_path / "dlock.json"
    config.write_text(json.dumps({"backend": redis_server.url}))
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "report.json").write_text(json.dumps({"command": ["true"], "once_per": "soon"}))
    done = run_dlock("run", "--job", "report", "--config", str(config), "--jobs-dir", str(jobs))
    assert "job file %s: once_per: 'soon'" % (jobs / "report.json") in done.stderr


@pytest.mark.parametrize("name", ["bad name", "svc@1", "../etc", "-dash", ""])
def test_job_names_systemd_would_mangle_are_refused(name, redis_server):
    done = run_dlock("run", "--job=" + name, "--backend", redis_server.url, "--", "true")
    assert done.returncode == 78 and "not a valid job name" in done.stderr


def test_flags_alone_suffice_and_password_comes_from_a_file(tmp_path):
    import servers
    server = servers.RedisServer(password="s3cret-pw")
    try:
        pw = tmp_path / "pw"
        pw.write_text("s3cret-pw\n")
        done = run_dlock("run", "--job", "adhoc", "--config", str(tmp_path / "absent.json"),
                         "--backend", server.url, "--password-file", str(pw), "--", "true")
        # An explicitly named config that is missing is an error...
        assert done.returncode == 78 and "absent.json" in done.stderr
        done = run_dlock("run", "--job", "adhoc", "--jobs-dir", str(tmp_path),
                         "--backend", server.url, "--password-file", str(pw), "--", "true")
        assert done.returncode == 0, done.stderr  # ...but no config file at all is fine
        assert "s3cret-pw" not in done.stderr
        creds = tmp_path / "creds"
        creds.mkdir()
        (creds / "dlock-backend").write_text("s3cret-pw")
        done = run_dlock("run", "--job", "adhoc", "--jobs-dir", str(tmp_path), "--backend", server.url,
                         "--", "true", env={"CREDENTIALS_DIRECTORY": str(creds)})
        assert done.returncode == 0, done.stderr  # systemd LoadCredential=dlock-backend:...
        wrong = run_dlock("run", "--job", "adhoc", "--jobs-dir", str(tmp_path), "--backend", server.url, "--", "true")
        assert wrong.returncode == 75 and "authentication" in wrong.stderr.lower()
    finally:
        server.stop()
