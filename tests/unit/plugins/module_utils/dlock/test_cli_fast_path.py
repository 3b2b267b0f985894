"""`dlock run`'s fast path reads its flags as argparse does, or leaves them to it."""

import contextlib
import io
import random

import pytest

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import cli

# Flags and values of every kind: exact and abbreviated names, the =
# form, help, choices in and out, values argparse reads specially
# (a leading '-', a negative number, empty), unknown words.
FLAGS = ["--job", "--backend", "--key", "--ttl", "--on-contention", "--fail-open", "--metrics-dir", "--jobs-dir",
         "--config", "--password-file", "--ca-file", "--once-per", "--op-timeout", "--jo", "--back", "--bogus", "-h",
         "--help", "-x", "--fail-open=1", "--job=", "--ttl=-5", "--job=a=b", "--on-contention=wait",
         "--on-contention=maybe", "--rerun", "--reason", "--rerun=2026-11-27T05:00:00Z", "--reason=a b"]
VALUES = ["x", "nightly", "wait", "skip", "maybe", "-5", "-x", "", "30s", "a b", "file:///run/dlock", "--ttl", "-"]


def _argparse(argv):
    """vars() of argparse's reading, or None where it exits (help, an error)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return vars(cli.build_parser("run").parse_args(["run"] + argv))
        except SystemExit:
            return None


def _command_lines(count, seed=1414):
    rng = random.Random(seed)
    for _line in range(count):
        argv = []
        for _token in range(rng.randint(0, 7)):
            argv.append(rng.choice(FLAGS) if rng.random() < 0.6 else rng.choice(VALUES))
        if rng.random() < 0.7:
            argv = ["--job", rng.choice(VALUES)] + argv
        yield argv


def test_the_fast_path_reads_what_argparse_reads():
    read = 0
    for argv in _command_lines(4000):
        fast = cli._fast_run(argv)
        if fast is None:
            continue  # argparse reads it (help, error or not)
        read += 1
        slow = _argparse(argv)
        assert slow is not None, argv
        assert cli._flags(fast) == cli._flags(slow) and fast["job"] == slow["job"], argv
        assert (fast.get("rerun"), fast.get("reason")) == (slow["rerun"], slow["reason"]), argv
    assert read > 200  # the common forms do take the fast path


@pytest.mark.parametrize("argv", [
    ["--job", "x", "--backend", "file:///run/dlock"],
    ["--job=x", "--ttl", "30s", "--fail-open", "--on-contention", "wait"],
    ["--job", "x", "--rerun", "x@2026-11-27T05:00:00Z", "--reason", "provider outage"],
])
def test_the_plain_forms_take_the_fast_path(argv):
    assert cli._fast_run(argv) is not None


@pytest.mark.parametrize("argv", [
    [], ["--backend", "file:///x"], ["--job", "x", "-h"], ["--job", "x", "--help"], ["--jo", "x"],
    ["--job", "-x"], ["--job"], ["--job", "x", "--on-contention", "maybe"], ["--job", "x", "--fail-open=1"],
    ["--job", "x", "stray"],
])
def test_everything_else_is_left_to_argparse(argv):
    assert cli._fast_run(argv) is None
