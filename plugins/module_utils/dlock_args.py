# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""Argument spec of dlock.fleet.dlock, shared by the module and its action plugin."""

from __future__ import annotations

# Fields of the inventory variable `dlock_backend` and the options they fill.
BACKEND_VAR = "dlock_backend"
BACKEND_FIELDS = {
    "url": "backend_url",
    "password": "backend_password",
    "password_file": "backend_password_file",
    "ca_file": "ca_file",
    "op_timeout": "op_timeout",
    "fence_epoch": "fence_epoch",
}


def backend_argument_spec():
    """The options of the doc fragment dlock.fleet.backend: every module that talks to a lock backend."""
    return dict(
        backend_url=dict(type="str"),
        backend_password=dict(type="str", no_log=True),
        backend_password_file=dict(type="path", no_log=False),
        ca_file=dict(type="path"),
        # Durations: seconds, or text such as 500ms or 5s (parsed by the engine).
        op_timeout=dict(type="raw", default=2),
        # Checked by the engine's validation core (a bool or 1.5 is refused, not coerced).
        fence_epoch=dict(type="raw", default=0),
    )


def argument_spec():
    return dict(
        backend_argument_spec(),
        key=dict(type="str", required=True, no_log=False),
        state=dict(type="str", default="acquired", choices=["acquired", "released", "query"]),
        # Durations: seconds, or text such as 500ms, 90s, 5m, 1h (parsed by the engine).
        ttl=dict(type="raw", default=60),
        wait=dict(type="raw", default=0),
        force=dict(type="bool", default=False),
        reason=dict(type="str"),
        owner=dict(type="str"),
        hold=dict(type="bool", default=False),
        run_on=dict(type="str", default="controller", choices=["controller", "target"]),
        # A count, checked by the engine's validation core (a bool or 1.5 is refused, not coerced).
        history=dict(type="raw", default=0),
    )


MUTUALLY_EXCLUSIVE = [("backend_password", "backend_password_file")]
REQUIRED_IF = [("force", True, ("reason",))]
