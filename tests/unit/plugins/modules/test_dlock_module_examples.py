"""The module's EXAMPLES: valid YAML, and every dlock task's options pass the
argument spec and the lock operation's own checks (durations, key)."""

from __future__ import annotations

import re

import yaml

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.dlock.fleet.plugins.module_utils.dlock_args import MUTUALLY_EXCLUSIVE, REQUIRED_IF, argument_spec
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_task import Request
from ansible_collections.dlock.fleet.plugins.modules import dlock as module


def test_examples_use_valid_options():
    tasks = yaml.safe_load(module.EXAMPLES)
    assert len([task for task in tasks if "dlock.fleet.dlock" in task]) >= 6
    for task in tasks:
        if "dlock.fleet.dlock" not in task:  # e.g. the meta task that ends the play
            continue
        args = dict(task["dlock.fleet.dlock"])
        args = dict((k, re.sub(r"\{\{.*?\}\}", "x", v) if isinstance(v, str) else v) for k, v in args.items())
        args.setdefault("backend_url", "redis://127.0.0.1:6379/0")  # from dlock_backend in real use
        args.pop("backend_password_file", None)  # a path on the target
        args.setdefault("owner", "ansible@ctl:1:0123")  # set by the action plugin
        result = ArgumentSpecValidator(argument_spec(), mutually_exclusive=MUTUALLY_EXCLUSIVE,
                                       required_if=REQUIRED_IF).validate(args)
        assert not result.error_messages, (task["name"], result.error_messages)
        Request(result.validated_parameters)
