# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""The backend of a controller task of dlock.fleet.dlock: the task's own
options, completed from the inventory variable dlock_backend, or, when
neither names a backend, from the record that playbooks/site.yml writes of
the backend it provisioned (backend_record)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.utils.display import Display

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.safefile import read_regular
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_args import BACKEND_FIELDS, BACKEND_VAR

display = Display()


def merge_backend(args, backend, where=BACKEND_VAR):
    """Task args completed from the dlock_backend variable (a mapping, or a
    URL), or from site.yml's record (WHERE names it in errors)."""
    if backend is None:
        return dict(args)
    if isinstance(backend, str):
        backend = {"url": backend}
    if not isinstance(backend, Mapping):
        raise ConfigError("%s: must be a mapping (url, password, password_file, ca_file, op_timeout, fence_epoch) "
                          "or a URL"
                          % where)
    # Shown as the validation core shows any value: a key that is no string,
    # or holds a line break, is named, never sorted against str or echoed raw.
    unknown = sorted(validate.shown(key) for key in backend if key not in BACKEND_FIELDS)
    if unknown:
        raise ConfigError("%s: unknown key(s) %s (allowed: %s)"
                          % (where, ", ".join(unknown), ", ".join(sorted(BACKEND_FIELDS))))
    merged = dict(args)
    # A password or password file on the task replaces both of the inventory's.
    own_credentials = args.get("backend_password") is not None or args.get("backend_password_file") is not None
    for field, option in BACKEND_FIELDS.items():
        if own_credentials and field in ("password", "password_file"):
            continue
        if merged.get(option) is None and backend.get(field) is not None:
            merged[option] = backend[field]
    return merged


# site.yml's record of the backend it provisioned (dlock_backend_type): the
# file, in the credentials directory beside the inventory of the first host
# of dlock_backend, where site.yml also generates the backend's password by
# default; and the fields it may hold (never a password).
RECORD_DIR = "credentials"
RECORD_NAME = "dlock-backend.json"
RECORD_FIELDS = ("url", "password_file", "ca_file", "fence_epoch")
RECORD_MAX_BYTES = 64 * 1024


def record_path(task_vars):
    """(path of site.yml's backend record, None), or (None, why there is
    none): the one rule for where the controller looks; site.yml writes its
    record at the same place (its __dlock_site_credentials)."""
    backend_hosts = (task_vars.get("groups") or {}).get("dlock_backend") or []
    if not backend_hosts:
        return None, "the inventory has no dlock_backend group, beside whose first host site.yml records its backend"
    try:
        inventory_dir = task_vars["hostvars"][backend_hosts[0]]["inventory_dir"]
    except (KeyError, TypeError):
        inventory_dir = None
    if not isinstance(inventory_dir, str) or not os.path.isabs(inventory_dir):
        return None, "%s, the first host of dlock_backend, comes from no inventory file" % backend_hosts[0]
    return os.path.join(inventory_dir, RECORD_DIR, RECORD_NAME), None


def backend_record(path):
    """The backend options in site.yml's record at PATH (url, and
    password_file, ca_file and fence_epoch when it has them), checked by the validation
    core; None when there is no file. A bad record is a ConfigError naming
    the file, never a traceback."""
    what = "site.yml's backend record"
    try:
        text = read_regular(path, what, RECORD_MAX_BYTES)
    except FileNotFoundError:
        return None
    where = "%s %s" % (what, path)
    try:
        data = validate.parse_json(text)
    except ValueError as exc:
        raise ConfigError("%s: not valid JSON (%s)" % (where, exc))
    if not isinstance(data, dict):
        raise ConfigError("%s: must hold a JSON object (url, password_file, ca_file, fence_epoch)" % where)
    unknown = sorted(set(data) - set(RECORD_FIELDS))
    if unknown:
        raise ConfigError("%s: unknown field %s (allowed: %s)"
                          % (where, ", ".join(validate.shown(key) for key in unknown), ", ".join(RECORD_FIELDS)))
    if "url" not in data:
        raise ConfigError("%s: has no url" % where)
    record = {"url": validate.backend_url(data["url"], "%s: url" % where).url}
    for field in ("password_file", "ca_file"):
        if data.get(field) is not None:
            record[field] = validate.path(data[field], "%s: %s" % (where, field))
    # The fleet's epoch (dlock_fence_epoch), so that the controller's fences
    # are the nodes' fences.
    if data.get("fence_epoch") is not None:
        record["fence_epoch"] = validate.fence_epoch(data["fence_epoch"], "%s: fence_epoch" % where)
    return record


def task_parameters(action, task_vars, hidden, spec, on_controller=True, **rules):
    """(the task's args with the backend filled in, its parameters validated
    against SPEC and RULES: ArgumentSpecValidator's mutually_exclusive,
    required_if...) of ACTION, an action plugin. The password goes into
    HIDDEN as soon as it is known. A task that runs on its target names its
    own backend: the record names files on the controller."""
    args = merge_backend(action._task.args, action._templar.template(task_vars.get(BACKEND_VAR)))
    if not args.get("backend_url") and on_controller:
        args = backend_from_record(args, task_vars)
    if args.get("backend_password"):
        hidden.add(args["backend_password"])
    validation = ArgumentSpecValidator(spec, **rules).validate(args)
    if validation.error_messages:
        raise ConfigError("; ".join(validation.error_messages))
    return args, validation.validated_parameters


def backend_from_record(args, task_vars):
    """ARGS completed from site.yml's record, when neither the task nor
    dlock_backend named a backend; a ConfigError that says where the
    controller looked and what to set when there is no record."""
    path, why_none = record_path(task_vars)
    record = backend_record(path) if path else None
    if record is None:
        raise ConfigError(
            "backend_url: required, and none was found: not on the task, not in the inventory variable %s, "
            "and %s. Set %s (url: redis://..., postgresql://..., etcd://...; password_file or a vaulted password) "
            "in the inventory, or roll out playbooks/site.yml with dlock_backend_type, which records the backend "
            "it provisions there." % (BACKEND_VAR, why_none or "no record of site.yml's backend at %s" % path, BACKEND_VAR))
    where = "site.yml's backend record %s" % path
    merged = merge_backend(args, record, where)
    if merged.get("backend_password") is None and merged.get("backend_password_file") is None:
        # site.yml writes a password given as a variable nowhere.
        raise ConfigError(
            "%s: names no password file: site.yml was given the backend password as the variable "
            "dlock_backend_password, which it writes nowhere. Give the controller's tasks that password as "
            "dlock_backend.password (in group_vars/all: the same vaulted value) or backend_password on the task."
            % where)
    if record.get("ca_file") and merged.get("ca_file") == record["ca_file"] and not os.path.isfile(record["ca_file"]):
        raise ConfigError(
            "%s: ca_file %s: is not a file on the controller. site.yml records dlock_backend_controller_ca_file, "
            "else dlock_backend_ca_file (the nodes' path): set dlock_backend_controller_ca_file to the CA's path on "
            "the controller and roll out site.yml again, or set dlock_backend.ca_file." % (where, record["ca_file"]))
    display.vvv("dlock: the backend of %s" % where)
    return merged
