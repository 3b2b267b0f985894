#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2025, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: dlock_files
short_description: Write a role's files and directories on a node in one call
version_added: 0.3.0
description:
  - Makes each entry of O(files) as it says, in order - a regular file with this text, a directory, or nothing -
    each with its owner, group and mode. One call does what a C(file), C(copy) or C(template) task per path would,
    at the cost of one module run instead of one or two per path (each such task is a run on the node, and the
    collection's roles write ten to twenty paths a node).
  - Every entry is judged before any is changed. A path that holds something else than its entry asks for (a FIFO,
    a link or a directory where a file belongs, a file where a directory belongs) fails the module, naming it, and
    nothing is written.
  - A file is written only when its text, owner, group or mode differ, through a new file in the same directory
    renamed over the old one, its data on disk first (a reader sees the old file or the new one).
  - The collection's roles render their templates on the controller (C(ansible.builtin.template) lookup) and pass the
    text here; a secret belongs in a task of its own with C(no_log), not in O(files), whose text the diff and C(-vvv)
    show.
author:
  - dlock.fleet developers (@dlock-fleet)
options:
  files:
    description:
      - The paths to make, in order (a directory before the files in it).
      - Each is a mapping with C(path) (absolute, normalised); C(state) - V(file) (the default), V(directory) or
        V(absent); for a file C(content), its text (at most 1 MiB, no NUL), and C(diff), V(false) to leave its text
        out of the diff (a change is still named in RV(paths)); for a file or directory C(mode), in octal
        as a quoted string (V("0644"); a directory may have the setgid bit, V("2775")), and C(owner) and C(group),
        names or ids (default V(root)).
      - The owner must exist. The group too, except in check mode, where a file or directory is then compared without
        it (the run that creates the group would also set it).
      - V(absent) removes a file, link, FIFO or socket; a directory there fails the module.
      - A path named twice counts once when both entries say the same; differently, it fails the module.
      - Missing directories above a new file or directory are made, C(root)'s and V("0755") whatever the umask; an
        existing directory is left as it is.
    type: raw
    required: true
attributes:
  check_mode:
    support: full
    description: Judges every entry as a real run does; writes, creates and removes nothing.
  diff_mode:
    support: full
    description: Each path changed, before and after (a change of owner, group or mode only, as its attributes).
  platform:
    support: full
    platforms: posix
    description: Runs on the node, with Python's standard library.
"""

EXAMPLES = r"""
- name: Write chrony's configuration
  dlock.fleet.dlock_files:
    files:
      - path: /etc/chrony/chrony.conf
        content: "{{ lookup('ansible.builtin.template', 'chrony.conf.j2') }}"
        mode: "0644"
      - path: /etc/systemd/system/chrony.service.d
        state: directory
        mode: "0755"
      - path: /etc/systemd/system/chrony.service.d/old.conf
        state: absent
  register: chrony_files
  notify: Restart chrony
"""

RETURN = r"""
paths:
  description: The paths changed (or, in check mode, that would be), in the order of O(files).
  returned: always
  type: list
  elements: str
  sample: ["/etc/chrony/chrony.conf"]
"""


from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dlock.fleet.plugins.module_utils import dlock_node_files as node_files
from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate
from ansible_collections.dlock.fleet.plugins.module_utils.dlock.errors import ConfigError
from ansible_collections.dlock.fleet.plugins.module_utils.dlock_changes import Failure, failure_message

STATES = ("file", "directory", "absent")
KEYS = {"file": ("path", "state", "content", "owner", "group", "mode", "diff"),
        "directory": ("path", "state", "owner", "group", "mode"),
        "absent": ("path", "state")}
MAX_FILES = 256


def parse_entry(entry, field):
    """One entry of `files`, checked: {path, state, content, owner, group, mode}."""
    validate.mapping(entry, field)
    state = validate.choice(entry.get("state", "file"), field + ".state", STATES)
    allowed = KEYS[state]
    for key in sorted(entry):
        if key not in allowed:
            raise ConfigError("%s: %s is not an option of state %s (it takes %s)"
                              % (field, validate.shown(key), state, ", ".join(allowed)))
    if "path" not in entry:
        raise ConfigError("%s: path is required" % field)
    parsed = {"path": validate.path(entry["path"], field + ".path"), "state": state}
    if state == "absent":
        return parsed
    if "mode" not in entry:
        raise ConfigError("%s: mode is required for state %s" % (field, state))
    parsed["mode"] = validate.file_mode(entry["mode"], field + ".mode")
    parsed["owner"] = validate.unix_name(entry.get("owner", "root"), field + ".owner")
    parsed["group"] = validate.unix_name(entry.get("group", "root"), field + ".group")
    if state == "file":
        if "content" not in entry:
            raise ConfigError("%s: content is required for state file" % field)
        parsed["content"] = validate.file_text(entry["content"], field + ".content")
        parsed["diff"] = validate.boolean(entry.get("diff", True), field + ".diff")
    return parsed


def parse_files(files):
    """The whole list, checked; a path named twice the same way counts once
    (two settings of a role may name one directory), differently is refused."""
    entries = validate.items(files, "files", parse_entry, max_items=MAX_FILES)
    seen = {}
    unique = []
    for index, entry in enumerate(entries):
        if entry["path"] in seen:
            if seen[entry["path"]] != entry:
                raise ConfigError("files[%d].path: %s is named twice, differently" % (index, entry["path"]))
            continue
        seen[entry["path"]] = entry
        unique.append(entry)
    return unique


def plan(entries, check, diff):
    """(change, shown in the diff) of each entry that needs one, in order; reads only."""
    changes = []
    for entry in entries:
        if entry["state"] == "absent":
            change = node_files.plan_removal(entry["path"], with_text=diff)
        else:
            uid, gid = node_files.owner_id(entry["owner"]), node_files.group_id(entry["group"], check)
            if entry["state"] == "directory":
                change = node_files.plan_directory(entry["path"], uid, gid, entry["mode"])
            else:
                change = node_files.plan_file(entry["path"], entry["content"], uid, gid, entry["mode"],
                                              make_parents=True)
        if change is not None:
            changes.append((change, entry.get("diff", True)))
    return changes


def run(params, check, diff):
    changes = plan(parse_files(params["files"]), check, diff)
    if not check:
        for change, _shown in changes:
            change.apply()
    result = {"changed": bool(changes), "paths": [change.path for change, _shown in changes]}
    if diff:
        result["diff"] = [change.diff() for change, shown in changes if shown]
    return result


ARGUMENT_SPEC = dict(files=dict(type="raw", required=True))


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = run(module.params, module.check_mode, module._diff)
    except (Failure, ConfigError, OSError) as exc:
        module.fail_json(msg=failure_message("dlock_files: ", exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
