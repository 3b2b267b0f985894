"""Command line of the node runner: dlock run | status | release | check-clock | metrics."""

import argparse
import json
import socket
import sys
import time

from . import __version__, clock, lockstate, report, validate
from .backends import open_backend
from .config import load_settings
from .validate import format_duration
from .errors import EXIT_CLOCK, EXIT_CONFIG, BackendError, ConfigError, DlockError
from .runner import run

DESCRIPTION = """\
Run scheduled jobs at most once across a fleet: each run takes a lease lock on
a shared backend (Redis, PostgreSQL, or a local file lock), keeps it alive while
the job runs, kills the job before the lease could expire if it cannot renew,
and releases it with an owner check.

Settings come from /etc/dlock/dlock.json and /etc/dlock/jobs/NAME.json; every
setting is also a flag, and flags alone suffice. Durations read 500ms, 90, 90s,
5m, 1h, 1d.
"""

RUN_EPILOG = """\
exit codes:
  the job's own   the job ran (killed by signal N: 128+N)
  73              skipped: another owner holds the lock
  74              skipped: this slot already ran elsewhere (--once-per)
  75              backend unavailable or erroring (fail closed)
  76              lock lost while running; the job was terminated
  77              clock unsafe (skew over --max-clock-skew)
  78              configuration error

the job's environment gets DLOCK_JOB, DLOCK_KEY, DLOCK_OWNER,
DLOCK_FENCING_TOKEN and DLOCK_RUN_ID (stable per slot: an idempotency key).

examples:
  dlock run --job nightly-report
  dlock run --job backup --backend redis://dlock@10.0.0.5:6379/0 \\
      --password-file /etc/dlock/backend.password --ttl 2m --once-per 1h -- /usr/local/bin/backup --full
"""


class Parser(argparse.ArgumentParser):
    """argparse that exits 78 (configuration error) on bad flags."""

    def error(self, message):
        self.print_usage(sys.stderr)
        sys.stderr.write("%s: error: %s\n" % (self.prog, message))
        raise SystemExit(EXIT_CONFIG)


def _backend_flags(parser):
    group = parser.add_argument_group("backend and files")
    group.add_argument("--config", metavar="FILE", help="global config (default /etc/dlock/dlock.json)")
    group.add_argument("--jobs-dir", metavar="DIR", help="job files (default /etc/dlock/jobs)")
    group.add_argument("--backend", metavar="URL",
                       help="redis://[user@]host[:port][/db], rediss://..., postgresql://user@host/db, "
                            "postgresql+advisory://..., file:///run/dlock")
    group.add_argument("--password-file", metavar="FILE",
                       help="backend password (default: the systemd credential 'dlock-backend', if any); "
                            "never put it in the URL")
    group.add_argument("--ca-file", metavar="FILE", help="CA bundle for TLS (rediss://, sslmode=verify-full)")


def build_parser():
    parser = Parser(prog="dlock", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version="dlock " + __version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True

    run_p = sub.add_parser("run", help="run a job under the lock",
                           usage="dlock run --job NAME [options] [-- CMD ARG...]",
                           description="Run a job under its lock. The command is taken from after '--', "
                                       "or from the job file's \"command\" (argv list, no shell).",
                           epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    run_p.add_argument("--job", required=True, help="job name (also the default lock key)")
    _backend_flags(run_p)
    lock = run_p.add_argument_group("lock options (override the job file)")
    lock.add_argument("--key", help="lock key (default: the job name)")
    lock.add_argument("--ttl", metavar="DUR", help="lease length on the backend (default 60s)")
    lock.add_argument("--renew-every", metavar="DUR", help="renewal interval (default ttl/3)")
    lock.add_argument("--on-contention", choices=("skip", "wait"), help="when the lock is busy (default skip)")
    lock.add_argument("--wait-timeout", metavar="DUR", help="with wait: give up after (default 5m)")
    lock.add_argument("--min-hold", metavar="DUR", help="keep the lock at least this long after start")
    lock.add_argument("--once-per", metavar="DUR", help="run at most once per slot of this width")
    lock.add_argument("--max-runtime", metavar="DUR", help="terminate the job after this long")
    lock.add_argument("--kill-grace", metavar="DUR", help="SIGTERM to SIGKILL delay (default min(10s, ttl/5))")
    lock.add_argument("--max-clock-skew", metavar="DUR", help="refuse beyond this offset (default 2s)")
    lock.add_argument("--op-timeout", metavar="DUR", help="one backend call's bound (default min(2s, ttl/10))")
    lock.add_argument("--fail-open", action="store_const", const=True,
                      help="run WITHOUT a lock when the backend or clock fails (loud; default: fail closed)")
    run_p.add_argument("--metrics-dir", metavar="DIR", help="node_exporter textfile directory")

    status_p = sub.add_parser("status", help="holder, age, ttl left, fence and last result of locks",
                              description="Show the lock of one job, or of every job in the jobs dir.")
    status_p.add_argument("--job", help="only this job")
    status_p.add_argument("--key", help="a lock key that has no job file")
    status_p.add_argument("--json", action="store_true", help="JSON output")
    _backend_flags(status_p)

    release_p = sub.add_parser("release", help="break a stale lock (logged)",
                               description="Break a lock whoever holds it. A live holder is fenced: "
                                           "its next renew fails and it kills its job.")
    release_p.add_argument("--job", help="job whose lock to break")
    release_p.add_argument("--key", help="lock key (default: the job's)")
    release_p.add_argument("--force", action="store_true", required=True, help="required: yes, break it")
    release_p.add_argument("--reason", required=True, help="why (logged)")
    _backend_flags(release_p)

    clock_p = sub.add_parser("check-clock", help="local clock vs backend clock, chrony state",
                             description="Exit 0 when the clock is safe, 77 when it is not.")
    clock_p.add_argument("--max-skew", metavar="DUR", help="bound (default: the configured max_clock_skew)")
    clock_p.add_argument("--json", action="store_true", help="JSON output")
    _backend_flags(clock_p)

    metrics_p = sub.add_parser(
        "metrics", help="write the lock state of this node's jobs for node_exporter",
        description="Write, for node_exporter's textfile collector, the lock state of every job in the jobs "
                    "dir (held, holder, age, ttl left, fence, last run on any node, the timer's period) and "
                    "this node's clock check. The file is replaced atomically; it is written even when the "
                    "backend cannot be queried (dlock_lock_state_refresh_success 0, exit 75).",
        epilog="example (what the dlock_metrics role's timer runs):\n"
               "  dlock metrics --output /var/lib/prometheus/node-exporter/dlock-lock-state.prom",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    metrics_p.add_argument("--output", metavar="FILE",
                           help="file to write, '-' for stdout (default: METRICS_DIR/dlock-lock-state.prom)")
    metrics_p.add_argument("--unit-dir", metavar="DIR", default="/etc/systemd/system",
                           help="where the jobs' timers are, for their periods (default %(default)s)")
    _backend_flags(metrics_p)
    return parser


def _flags(args):
    names = ("config", "jobs_dir", "backend", "password_file", "ca_file", "key", "ttl", "renew_every",
             "on_contention", "wait_timeout", "min_hold", "once_per", "max_runtime", "kill_grace",
             "max_clock_skew", "op_timeout", "fail_open", "metrics_dir")
    return dict((name, getattr(args, name, None)) for name in names)


def _jobs_to_show(settings, args):
    import os
    if getattr(args, "key", None):
        return [(args.job or "-", args.key)]
    if getattr(args, "job", None):
        return [(args.job, settings.key)]
    try:
        names = sorted(f[:-5] for f in os.listdir(settings.jobs_dir) if f.endswith(".json"))
    except OSError as exc:
        raise ConfigError("jobs dir %s: cannot list (%s); name a --job or --key" % (settings.jobs_dir, exc.strerror))
    return [(name, load_settings(_flags(args), job=name).key) for name in names]


def _ttl_cell(row):
    if not row["held"]:
        return "-"
    if row["ttl_remaining"] is None:
        return "session"  # an advisory lock or flock: held as long as its holder lives
    return format_duration(row["ttl_remaining"])


def _open(settings):
    return open_backend(settings.backend_url, settings.password, settings.options.op_timeout, settings.ca_file)


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
            for job, key in jobs:
                row = backend.query(key).as_dict()
                row["job"] = job
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


def cmd_status(args):
    # A job named without --key must exist: a typo is not "free".
    settings = load_settings(_flags(args), job=args.job, job_must_exist=bool(args.job and not args.key))
    rows, info, failure = _status_rows(settings, _jobs_to_show(settings, args))
    if failure is not None:
        _write_backend(info, sys.stderr)
        raise failure
    if args.json:
        for row in rows:
            row["backend"] = info
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    table = [("JOB", "KEY", "HOLDER", "AGE", "TTL LEFT", "FENCE", "LAST RESULT")]
    for row in rows:
        last = row["last"] or {}
        table.append((
            row["job"], row["key"], row["owner"] or "-",
            "-" if row["age"] is None else format_duration(row["age"]),
            _ttl_cell(row),
            str(row["fence"]),
            "-" if not last else "%s (exit %s) on %s" % (last.get("result"), last.get("exit_code"), last.get("host")),
        ))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")
    sys.stdout.write("\n")
    _write_backend(info, sys.stdout)
    return 0


def _write_backend(info, stream):
    stream.write("backend: %s, answered by %s\n" % (info["backend"], _member_text(info["member"])))
    if info["cluster"] is not None:
        stream.write("cluster: %s\n" % _cluster_text(info["cluster"]))


def cmd_release(args):
    if not args.job and not args.key:
        raise ConfigError("release: name the lock with --job or --key")
    validate.text(args.reason, "--reason", 500)
    if not args.reason.strip():
        raise ConfigError("release: --reason must say why")
    settings = load_settings(_flags(args), job=args.job)
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


def cmd_check_clock(args):
    settings = load_settings(_flags(args))
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


def cmd_metrics(args):
    settings = load_settings(_flags(args))
    if args.output not in (None, "-"):
        validate.path(args.output, "--output")
    validate.path(args.unit_dir, "--unit-dir")
    output = args.output or (settings.metrics_dir and settings.metrics_dir.rstrip("/") + "/dlock-lock-state.prom")
    if not output:
        raise ConfigError("metrics: give --output FILE, or set metrics_dir in the config")
    jobs = _jobs_to_show(settings, args)  # from the job files: known even when the backend is down
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
    periods = dict((job, lockstate.schedule_period(args.unit_dir, job)) for job, _key in jobs)
    text = report.render_families(lockstate.families(
        rows, dict((job, p) for job, p in periods.items() if p), clock_check, time.time(), info))
    if output == "-":
        sys.stdout.write(text)
    else:
        report.write_textfile(output, text)
    if failure is not None:
        raise failure  # the file says so too (dlock_lock_state_refresh_success 0)
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    command = None
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1:]
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            settings = load_settings(_flags(args), job=args.job, command=command, need_command=True)
            return run(settings)
        if command:
            raise ConfigError("%s: takes no command after '--'" % args.command)
        commands = {"status": cmd_status, "release": cmd_release, "check-clock": cmd_check_clock,
                    "metrics": cmd_metrics}
        return commands[args.command](args)
    except DlockError as exc:
        sys.stderr.write("dlock: error: %s\n" % exc)
        return exc.exit_code
