"""Start the node runner from the checkout, as a node's /usr/local/bin/dlock does.

The command line is the one of roles/dlock_runner/templates/dlock.sh.j2,
`python -c '... from dlock.cli import main; raise SystemExit(main())' ARGS`,
with the checkout's engine found through PYTHONPATH (the wrapper runs
`python -I` and puts the install dir on sys.path itself; the wrapper as
rendered is tested in tests/integration/test_release.py).
"""

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE_UTILS = os.path.join(ROOT, "plugins", "module_utils")


def runner_env(extra=None):
    env = dict(os.environ, PYTHONPATH=MODULE_UTILS, PYTHONDONTWRITEBYTECODE="1")
    env.pop("CREDENTIALS_DIRECTORY", None)
    env.update(extra or {})
    return env


ENTRY = "import sys; sys.argv[0] = 'dlock'; from dlock.cli import main; raise SystemExit(main())"


def dlock_argv(*args):
    return [sys.executable, "-c", ENTRY] + list(args)


def run_dlock(*args, env=None, timeout=60, **kwargs):
    """Run `dlock ARGS` to completion; returns CompletedProcess (text)."""
    return subprocess.run(dlock_argv(*args), env=runner_env(env), capture_output=True, text=True,
                          timeout=timeout, check=False, **kwargs)


def start_dlock(*args, env=None, **kwargs):
    return subprocess.Popen(dlock_argv(*args), env=runner_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def last_log(stderr):
    """The run's JSON log line from the runner's stderr."""
    lines = [line for line in stderr.splitlines() if line.startswith("{")]
    assert lines, "no JSON log line in stderr: %r" % stderr
    return json.loads(lines[-1])


def lines(path):
    """The JSON records a job of jobfixture.py appended to path (none yet: [])."""
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def wait_for(predicate, timeout, what):
    """Poll predicate() until it is true; fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)
