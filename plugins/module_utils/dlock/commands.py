"""`dlock status | history | backfill | release | pause | resume | check-clock | metrics`: the
commands other than `run`, imported only when one of them is used
(cli.COMMANDS)."""

import json
import os
import socket
import sys
import time

from . import clock, lockstate, report, validate
from .backends import (ALL_SCOPE, GROUP_SCOPE, group_scope, job_scope, log_pause, open_backend, pause_scopes,
                       scope_parts)
from .config import load_job_settings, load_settings
from .errors import EXIT_BACKEND, EXIT_CLOCK, EXIT_CONFIG, BackendError, ConfigError, DlockError
from .options import HISTORY_MAX
from .owner import operator
from .pause_files import mirror_pause, mirrored_pauses, unmirror_pause
from .slots import BOUNDARY_FORMAT, slot_lead, slot_number
from .validate import format_duration


def _jobs_to_show(settings, args, flags):
    """([(job, key, its groups)], [(job, why its file does not load)]): the
    job or key named, else every job of the jobs directory. A job file that
    does not load hides that job only: the others are still shown and exported."""
    if getattr(args, "key", None):
        return [(args.job or "-", args.key, settings.groups)], []
    if getattr(args, "job", None):
        return [(args.job, settings.key, settings.groups)], []
    return _node_jobs(settings, flags)


def _node_jobs(settings, flags):
    """Every job of the jobs directory, as _jobs_to_show gives them, each
    loaded on top of `settings` (the global file is read once)."""
    try:
        names = sorted(f[:-5] for f in os.listdir(settings.jobs_dir) if f.endswith(".json"))
    except OSError as exc:
        raise ConfigError("jobs dir %s: cannot list (%s); name a --job or --key" % (settings.jobs_dir, exc.strerror))
    jobs, invalid = [], []
    for name in names:
        try:
            loaded = load_job_settings(settings, flags, name)
            jobs.append((name, loaded.key, loaded.groups))
        except ConfigError as exc:
            invalid.append((name, str(exc)))
    return jobs, invalid


def _report_invalid(command, invalid):
    for name, why in invalid:
        sys.stderr.write("dlock %s: job %s left out: %s\n" % (command, name, why))


def _ttl_cell(row):
    if not row["held"]:
        return "-"
    if row["ttl_remaining"] is None:
        return "session"  # an advisory lock or flock: held as long as its holder lives
    return format_duration(row["ttl_remaining"])


def _open(settings):
    return open_backend(settings.backend_url, settings.password, settings.options.op_timeout, settings.ca_file,
                        settings.fence_epoch)


def _status_rows(settings, jobs):
    """[(job, key)] -> (the backend's view of each lock, as dicts, or None
    when they cannot be read; the member and cluster health,
    Backend.describe; the BackendError that kept the locks from being read,
    or None). The cluster is asked either way: an etcd cluster that lost its
    quorum serves no read, yet its members still say so."""
    backend = _open(settings)
    rows, failure = [], None
    try:
        try:
            # One batch, not a round trip per lock (Backend.query_many).
            views = backend.query_many([key for _job, key, _groups in jobs])
            # Each scope once, in order: a dict, not a list's linear search, for a node's 1000 jobs.
            scopes = list(dict.fromkeys(scope for _job, key, groups in jobs for scope in pause_scopes(key, groups)))
            pauses = _by_scope(backend.read_pauses(scopes))
            mirrored = _by_scope(mirrored_pauses(settings.pauses_dir, scopes))
            for (job, key, groups), view in zip(jobs, views):
                row = view.as_dict()
                # The pause that refuses its grants: the first of its scopes that is paused,
                # in the backend, else in this node's mirror (pause_files.py).
                scopes = pause_scopes(key, groups)
                pause = next((pauses[scope] for scope in scopes if scope in pauses), None)
                mirror = next((mirrored[scope] for scope in scopes if scope in mirrored), None)
                row.update(job=job, paused=(pause or mirror).as_dict() if pause or mirror else None,
                           mirror_only=pause is None and mirror is not None)
                rows.append(row)
        except BackendError as exc:
            rows, failure = None, exc
        try:
            info = backend.describe(cluster=True)
        except DlockError as exc:
            info = dict(backend.describe(), cluster={"error": str(exc)})
    finally:
        backend.close()
    return rows, info, failure


def _by_scope(pauses):
    """{scope: Pause} of live pauses, the backend's or the node's mirror's."""
    return dict((pause.scope, pause) for pause in pauses)


def _pause_cell(row):
    pause = row.get("paused")
    if not pause:
        return "-"
    scope = pause["scope"]
    whose = " (all)" if scope == ALL_SCOPE else " (%s)" % scope if scope.startswith(GROUP_SCOPE) else ""
    return "until %s%s: %s%s" % (_utc(pause["until"]) if pause["until"] else "?", whose, pause["reason"],
                                 " [this node's mirror only: not in the backend]" if row.get("mirror_only") else "")


def _member_text(member):
    if not member:
        return "-"
    extra = (["id " + member["id"]] if member.get("id") else []) + ([member["role"]] if member.get("role") else [])
    return "%s%s%s" % (member["name"] + " " if member.get("name") else "", member["endpoint"],
                       " (%s)" % ", ".join(extra) if extra else "")


def _cluster_text(cluster):
    """One line of what Backend.describe(cluster=True) found."""
    if "error" in cluster:
        return "cannot tell: %s" % cluster["error"]
    if "members" in cluster:  # etcd
        leader = cluster["leader"] or cluster["leader_id"]
        down = ["%s%s" % (row["name"] + " " if row.get("name") else "", row["endpoint"])
                for row in cluster["endpoints"] if row.get("error") or not row.get("leader")]
        return "%s members, %d of the URL's %d healthy, leader %s%s" % (
            "?" if cluster["members"] is None else cluster["members"], cluster["healthy"], len(cluster["endpoints"]),
            leader or "NONE (no quorum)", "; not healthy: " + ", ".join(down) if down else "")
    sync = cluster["sync_standbys"]
    return "synchronous replication %s, %d standby connection(s), %s" % (
        "on (%s)" % cluster["synchronous_standby_names"] if cluster["sync_replication"] else "off",
        cluster["standbys_connected"],
        "not visible which are synchronous (needs pg_monitor)" if sync is None else "%d synchronous" % sync)


def status(args, flags):
    # A job named without --key must exist: a typo is not "free".
    settings = load_settings(flags, job=args.job, job_must_exist=bool(args.job and not args.key))
    jobs, invalid = _jobs_to_show(settings, args, flags)
    rows, info, failure = _status_rows(settings, jobs)
    _report_invalid("status", invalid)
    if failure is not None:
        _write_backend(info, sys.stderr)
        raise failure
    # Every job that loads is shown; a job file that does not makes the exit
    # code a configuration error's, so that a script notices.
    outcome = EXIT_CONFIG if invalid else 0
    if args.json:
        for row in rows:
            row["backend"] = info
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return outcome
    table = [("JOB", "KEY", "HOLDER", "AGE", "TTL LEFT", "FENCE", "LAST RESULT", "PAUSED")]
    for row in rows:
        last = row["last"] or {}
        table.append((
            row["job"], row["key"], row["owner"] or "-",
            "-" if row["age"] is None else format_duration(row["age"]),
            _ttl_cell(row),
            str(row["fence"]),
            "-" if not last else "%s (exit %s) on %s" % (last.get("result"), last.get("exit_code"), last.get("host")),
            _pause_cell(row),
        ))
    _write_table(table)
    sys.stdout.write("\n")
    _write_backend(info, sys.stdout)
    return outcome


# A column of `dlock history` for what an entry says beside its result.
def _history_note(entry):
    notes = []
    if entry.get("paused"):
        notes.append("paused (%s): %s" % (entry["paused"], entry.get("pause_reason")))
    if entry.get("holder"):
        notes.append("held by %s" % entry["holder"])
    if entry.get("manual_id"):
        notes.append("run-now %s%s: %s" % (entry["manual_id"], " forced" if entry.get("forced") else "",
                                           entry.get("manual_reason") or "-"))
    if entry.get("rerun"):
        notes.append("rerun: %s" % entry.get("rerun_reason"))
    if entry.get("blackout"):
        notes.append("blackout: %s" % entry["blackout"])
    if entry.get("catch_up"):
        notes.append("caught up")
    if entry.get("backfill"):
        notes.append("backfill: %s" % (entry.get("backfill_reason") or "-"))
    if entry.get("unrecorded_before"):
        notes.append("%d entries of this node missing before it" % entry["unrecorded_before"])
    return "; ".join(notes) or "-"


def _moment(seconds):
    return "-" if not isinstance(seconds, (int, float)) else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds))


def history(args, flags):
    limit = validate.integer(args.n, "-n", 1, HISTORY_MAX)
    settings = load_settings(flags, job=args.job, job_must_exist=True)
    backend = _open(settings)
    try:
        entries = backend.read_history(settings.key, limit)
    finally:
        backend.close()
    if args.json:
        sys.stdout.write(json.dumps(entries, indent=2, sort_keys=True) + "\n")
        return 0
    if not entries:
        sys.stdout.write("no history of %s (key %s) in the backend%s\n"
                         % (settings.job, settings.key, "" if settings.options.history else
                            ": the job's option history is 0"))
        return 0
    table = [("FINISHED (UTC)", "RESULT", "EXIT", "NODE", "FENCE", "RUN", "TOOK", "NOTE")]
    for entry in entries:
        took = entry.get("finished_at", 0) - entry.get("started_at", 0) if entry.get("started_at") else None
        table.append((_moment(entry.get("finished_at")), str(entry.get("result")), str(entry.get("exit_code", "-")),
                      str(entry.get("host", "-")), str(entry.get("fence") or "-"),
                      str(entry.get("run_id") or entry.get("once") or "-"),
                      "-" if not isinstance(took, (int, float)) else format_duration(max(0.0, round(took, 3))),
                      _history_note(entry)))
    _write_table(table)
    return 0


MAX_BACKFILL_SLOTS = 1000


def backfill(args, flags):
    """`dlock backfill JOB --from --to`: runner.backfill over the slots named."""
    from .runner import backfill as run_slots
    settings = load_settings(flags, job=args.job, need_command=True, job_must_exist=True)
    if args.reason is not None:
        settings.reason = validate.reason(args.reason)
    first, last = validate.moment(args.first, "--from"), validate.moment(args.last, "--to")
    width = settings.options.once_per
    if width is None or not settings.every_slot:
        raise ConfigError("backfill: %s needs once_per and a schedule that fires in every slot (every_slot), else "
                          "it would run slots that were never due" % settings.job)
    if first > last:
        raise ConfigError("--from: %s is after --to (%s)" % (args.first, args.last))
    slots = list(range(int(-(-first // width)), int(last // width) + 1))
    current = slot_number(time.time(), width, slot_lead(width, settings.options.max_clock_skew))
    if slots and slots[-1] >= current:
        raise ConfigError("--to: %s is not before the current slot (%s): the schedule runs that one"
                          % (args.last, _utc(current * width)))
    if not slots:
        raise ConfigError("--from, --to: no slot of %s (once_per %s) begins from %s to %s"
                          % (settings.job, format_duration(width), args.first, args.last))
    if len(slots) > MAX_BACKFILL_SLOTS:
        raise ConfigError("--from, --to: %d slots, above %d at once; backfill in parts"
                          % (len(slots), MAX_BACKFILL_SLOTS))
    return run_slots(settings, slots, sys.stdout)


def _write_table(table):
    """Rows of text cells on stdout, each column as wide as its widest cell
    (`dlock status`, `dlock history`)."""
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")


def _write_backend(info, stream):
    stream.write("backend: %s, answered by %s\n" % (info["backend"], _member_text(info["member"])))
    if info["cluster"] is not None:
        stream.write("cluster: %s\n" % _cluster_text(info["cluster"]))


def release(args, flags):
    if not args.job and not args.key:
        raise ConfigError("release: name the lock with --job or --key")
    validate.reason(args.reason)
    settings = load_settings(flags, job=args.job)
    backend = _open(settings)
    try:
        holder = backend.force_release(settings.key)
    finally:
        backend.close()
    report.log_line({"job": settings.job, "key": settings.key, "result": "force_released",
                     "previous_owner": holder.owner, "fence": holder.fence, "reason": args.reason,
                     "by": socket.gethostname()})
    sys.stdout.write("released %s (was held by %s, fence %s)\n"
                     % (settings.key, holder.owner or "nobody", holder.fence))
    return 0


def _pause_target(args, flags):
    """(settings, the scope a pause or resume names: a job's key, a group's
    jobs, or every key)."""
    if args.all:
        return load_settings(flags), ALL_SCOPE
    if args.group is not None:
        validate.group_name(args.group, "--group")
        settings = load_settings(flags)
        if args.command == "pause" and not args.any_group:
            # A group no job of this node is in is a typo as likely as not:
            # its pause would stop nothing (every node has the same jobs).
            jobs, _invalid = _node_jobs(settings, flags)
            if not any(args.group in groups for _job, _key, groups in jobs):
                raise ConfigError("--group: no job in %s is in group %s (a job's `groups` list); "
                                  "--any-group pauses it anyway" % (settings.jobs_dir, args.group))
        return settings, group_scope(args.group)
    if args.key is not None:  # '' too: no key is not "the job's"
        validate.lock_key(args.key, "--key")
    # A job named must exist: a typo would pause a key no job uses.
    settings = load_settings(flags, job=args.job, job_must_exist=bool(args.job))
    return settings, job_scope(settings.key)


def _utc(seconds):
    """A moment as run ids and --until write it (slots.BOUNDARY_FORMAT)."""
    return time.strftime(BOUNDARY_FORMAT, time.gmtime(seconds))


def _keys_in_scope(settings, flags, scope):
    """The lock keys whose runs a pause of `scope` refuses, as far as this
    node knows: the key named, else the keys of the jobs of its jobs
    directory in the group, or of all of them."""
    kind, name = scope_parts(scope)
    if kind == "job":
        return [name]
    jobs, _invalid = _node_jobs(settings, flags)
    return sorted(set(key for _job, key, groups in jobs if kind == "all" or name in groups))


def _log_drained(drained, scope, paused):
    """One force_released log line for each run a --drain kill broke."""
    for key, holder in drained:
        report.log_line({"key": key, "scope": scope, "result": "force_released", "previous_owner": holder.owner,
                         "fence": holder.fence, "reason": "drain: %s" % paused.reason, "by": paused.by})


def pause(args, flags):
    validate.reason(args.reason)
    settings, scope = _pause_target(args, flags)
    keys = _keys_in_scope(settings, flags, scope) if args.drain == "kill" else []
    backend = _open(settings)
    try:
        seconds = validate.pause_length(args.until, "--until", backend.server_time())
        paused = backend.pause(scope, args.reason, seconds, operator())
        unlogged = log_pause(backend, scope, paused)
        report.log_line({"job": settings.job, "scope": scope, "result": "paused", "reason": paused.reason,
                         "until": paused.until, "by": paused.by, "drain": args.drain, "pause_log_error": unlogged})
        sys.stdout.write("paused %s until %s (%s on the backend's clock), by %s: %s\n"
                         % (scope, _utc(paused.until), format_duration(round(paused.until - paused.at)), paused.by,
                            paused.reason))
        _mirror_here(settings, paused)
        drained, failed = backend.drain(keys)
        _log_drained(drained, scope, paused)
    finally:
        backend.close()
    for key, holder in drained:
        sys.stdout.write("drained %s: the run of %s (fence %s) is killed at its runner's next renewal\n"
                         % (key, holder.owner, holder.fence))
    for key, why in failed:
        sys.stderr.write("dlock pause: %s is paused, but its run going on was not drained: %s\n" % (key, why))
    return EXIT_BACKEND if failed else 0


def resume(args, flags):
    if args.reason is not None:
        validate.reason(args.reason)
    settings, scope = _pause_target(args, flags)
    backend = _open(settings)
    try:
        ended = backend.resume(scope)
        unlogged = log_pause(backend, scope) if ended else None
    finally:
        backend.close()
    report.log_line({"job": settings.job, "scope": scope, "result": "resumed" if ended else "not_paused",
                     "reason": args.reason, "by": operator(),
                     "pause_reason": ended.reason if ended else None, "pause_log_error": unlogged})
    sys.stdout.write("resumed %s (paused by %s: %s)\n" % (scope, ended.by, ended.reason) if ended
                     else "%s was not paused in the backend\n" % scope)
    _unmirror_here(settings, scope, ended is not None)
    return 0


# `dlock pause` and `dlock resume` keep this node's mirror (pause_files.py)
# in step with the backend; the other nodes' mirrors are the module's
# (dlock.fleet.dlock_pause on every node), so a resume says they may remain.
def _mirror_here(settings, paused):
    try:
        mirror_pause(settings.pauses_dir, paused)
    except OSError as exc:
        sys.stderr.write("dlock pause: not mirrored on this node (%s): %s\n"
                         % (settings.pauses_dir, exc.strerror or exc))


def _unmirror_here(settings, scope, ended):
    try:
        removed = unmirror_pause(settings.pauses_dir, scope)
    except OSError as exc:
        sys.stderr.write("dlock resume: this node's mirror of the pause (%s) was not removed: %s\n"
                         % (settings.pauses_dir, exc.strerror or exc))
        return
    if removed:
        sys.stdout.write("removed this node's mirror of the pause of %s\n" % scope)
    if removed or ended:
        sys.stdout.write("a mirror of it on other nodes still refuses their runs until it ends; "
                         "dlock.fleet.dlock_pause with state=resumed ends it on every node\n")


def check_clock(args, flags):
    settings = load_settings(flags)
    bound = settings.options.max_clock_skew
    if args.max_skew:
        bound = validate.duration(args.max_skew, "--max-skew")
    backend = _open(settings)
    try:
        result = clock.assess(backend, bound)
    finally:
        backend.close()
    chrony, problems = result["chrony"], result["problems"]
    offset, rtt = result["offset_seconds"], result["rtt_seconds"]
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        sys.stdout.write("backend clock offset: %+.6fs (rtt %.6fs, bound %s)\n" % (offset, rtt, format_duration(bound)))
        if chrony is None:
            sys.stdout.write("chrony: chronyc not found\n")
        elif "error" in chrony:
            sys.stdout.write("chrony: %s\n" % chrony["error"])
        else:
            sys.stdout.write("chrony: %s, stratum %d, reference %s, system time offset %+.6fs\n"
                             % (chrony["leap_status"], chrony["stratum"], chrony["reference"],
                                chrony["system_time_offset"]))
        sys.stdout.write("clock: %s\n" % ("safe" if not problems else "UNSAFE: " + "; ".join(problems)))
    return 0 if not problems else EXIT_CLOCK


def _check_output_file(path, field):
    """Before any work: the file to write is not a directory, and its
    directory exists (the file is written beside it and renamed over it)."""
    if os.path.isdir(path):
        raise ConfigError("%s %s: is a directory; name the file to write (%s/dlock-lock-state.prom)"
                          % (field, path, path.rstrip("/")))
    if not os.path.isdir(os.path.dirname(path) or "."):
        raise ConfigError("%s %s: its directory %s does not exist" % (field, path, os.path.dirname(path)))


def metrics(args, flags):
    settings = load_settings(flags)
    if args.output not in (None, "-"):
        validate.path(args.output, "--output")
    validate.path(args.unit_dir, "--unit-dir")
    output = args.output or (settings.metrics_dir and settings.metrics_dir.rstrip("/") + "/dlock-lock-state.prom")
    if not output:
        raise ConfigError("metrics: give --output FILE, or set metrics_dir in the config")
    if output != "-":
        _check_output_file(output, "--output" if args.output else "metrics_dir")
    # From the job files: known even when the backend is down. A job file that
    # does not load is exported as such (dlock_job_file_invalid), not skipped
    # in silence, and does not keep the other jobs' state from the file.
    jobs, invalid = _jobs_to_show(settings, args, flags)
    _report_invalid("metrics", invalid)
    rows, info, failure = _status_rows(settings, jobs)
    clock_check = None
    if failure is None:
        backend = _open(settings)
        try:
            clock_check = clock.assess(backend, settings.options.max_clock_skew)
        except BackendError as exc:
            rows, failure = None, exc
        finally:
            backend.close()
    periods = lockstate.schedule_periods(args.unit_dir, [job for job, _key, _groups in jobs])
    text = report.render_families(lockstate.families(
        rows, periods, clock_check, time.time(), info,
        invalid_jobs=[name for name, _why in invalid]))
    if output == "-":
        sys.stdout.write(text)
    else:
        report.write_textfile(output, text)
    if failure is not None:
        raise failure  # the file says so too (dlock_lock_state_refresh_success 0)
    return 0
