# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""What AnsiballZ packs for dlock.fleet.dlock: every module_utils file that
plugins/modules/dlock.py imports, directly or through another, at any depth.
Ansible's finder also follows an import inside a function, so this walk does."""

from __future__ import annotations

import ast
import os

PLUGINS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "plugins")
PREFIX = "ansible_collections.dlock.fleet.plugins."

# Engine parts the node runner and the controller use, never the module.
NOT_THE_MODULES = {"runner.py", "child.py", "cli.py", "commands.py", "report.py", "heartbeat.py", "clock.py",
                   "deadline.py", "hold.py", "lockstate.py"}


def source_file(name):
    """plugins/... file of the dotted NAME (module or package), None if there is none."""
    if not name.startswith(PREFIX):
        return None
    base = os.path.join(PLUGINS, *name[len(PREFIX):].split("."))
    for path in (os.path.join(base, "__init__.py"), base + ".py"):
        if os.path.isfile(path):
            return os.path.normpath(path)
    return None


def imports(path, name):
    """Dotted names of the collection's modules that the file PATH (module NAME) imports."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    with open(path) as handle:
        tree = ast.parse(handle.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]) if node.level else ""
            module = ".".join(part for part in (base, node.module) if part)
            for alias in node.names:
                yield module + "." + alias.name if source_file(module + "." + alias.name) else module


def payload_files():
    """Paths (relative to plugins/module_utils) of the module_utils files the module's payload carries."""
    todo, seen = [PREFIX + "modules.dlock"], set()
    while todo:
        name = todo.pop()
        path = source_file(name)
        if path is None or path in seen:
            continue
        seen.add(path)
        todo.extend(imports(path, name))
    module_utils = os.path.normpath(os.path.join(PLUGINS, "module_utils"))
    return {os.path.relpath(path, module_utils) for path in seen if path.startswith(module_utils)}


def test_the_module_payload_carries_no_runner_code():
    packed = payload_files()
    # The walk follows the backends' imports, made inside open_backend.
    assert {"dlock_task.py", "dlock/backends/redis_lease.py", "dlock/backends/etcd_lease.py"} <= packed, packed
    assert not {os.path.basename(path) for path in packed if path.startswith("dlock/")} & NOT_THE_MODULES, packed
