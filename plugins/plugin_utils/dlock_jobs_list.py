# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dlock.fleet developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""A host's job list, dlock_jobs_list (the dlock_jobs role's), as the
controller-side action plugins look jobs up in it: a job or group named in a
task must be one of the host's, or the task is refused as a typo."""

from __future__ import annotations

from ansible_collections.dlock.fleet.plugins.module_utils.dlock import validate

JOBS_VAR = "dlock_jobs_list"


def present_jobs(jobs):
    """{name: (lock key, groups)} of the present jobs of a dlock_jobs_list, or
    None when the host has none; every value through the validation core."""
    if jobs is None:
        return None
    entries = {}
    for index, job in enumerate(validate.items(jobs, JOBS_VAR, validate.mapping, max_items=100000)):
        where = "%s[%d]" % (JOBS_VAR, index)
        if job.get("state", "present") == "absent":
            continue
        name = validate.job_name(job.get("name"), "%s: name" % where)
        key = validate.lock_key(job["key"], "%s: key" % where) if job.get("key") is not None else name
        entries[name] = (key, validate.groups(job.get("groups") or [], "%s: groups" % where))
    return entries
