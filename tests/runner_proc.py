"""Start the node runner as `python -m dlock` from the checkout, as a node would."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE_UTILS = os.path.join(ROOT, "plugins", "module_utils")


def runner_env(extra=None):
    env = dict(os.environ, PYTHONPATH=MODULE_UTILS, PYTHONDONTWRITEBYTECODE="1")
    env.pop("CREDENTIALS_DIRECTORY", None)
    env.update(extra or {})
    return env


def dlock_argv(*args):
    return [sys.executable, "-m", "dlock"] + list(args)


def run_dlock(*args, env=None, timeout=60, **kwargs):
    """Run `python -m dlock ARGS` to completion; returns CompletedProcess (text)."""
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
