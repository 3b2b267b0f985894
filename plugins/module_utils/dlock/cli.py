"""Command line of the node runner: dlock run | status | release | check-clock | metrics."""

import os
import sys

from . import __version__
from .errors import EXIT_CONFIG, ConfigError, DlockError
from .options import LOCK_OPTIONS

# Every command's modules (the backend drivers, argparse itself) are imported
# by the command that needs them, when it runs: `dlock run` is started by
# every timer of every node, and an import it does not use costs each start.

DESCRIPTION = """\
Run scheduled jobs at most once across a fleet: each run takes a lease lock on
a shared backend (Redis, PostgreSQL, or a local file lock), keeps it alive while
the job runs, kills the job before the lease could expire if it cannot renew,
and releases it with an owner check.

Settings come from /etc/dlock/dlock.json and /etc/dlock/jobs/NAME.json; every
setting is also a flag, and flags alone suffice. Durations read 500ms, 90, 90s,
5m, 1h, 1d.

A once-per slot whose run failed can be run again, once, while its marker
lives: dlock run --job NAME --rerun SLOT --reason TEXT (see dlock run --help).
"""

RUN_EPILOG = """\
exit codes:
  the job's own   the job ran (killed by signal N: 128+N)
  72              skipped: paused (dlock pause; dlock status says why),
                  by the backend or by this node's mirror of the pauses
  73              skipped: another owner holds the lock
  74              skipped: this slot already ran elsewhere (--once-per);
                  with --rerun: the slot succeeded, nothing to rerun
  75              backend unavailable or erroring (fail closed)
  76              lock lost while running; the job was terminated
  77              clock unsafe (skew over --max-clock-skew)
  78              configuration error; with --rerun: the slot has no marker
                  (never ran, or its marker expired) or has not begun

the job's environment gets DLOCK_JOB, DLOCK_KEY, DLOCK_OWNER,
DLOCK_FENCING_TOKEN and DLOCK_RUN_ID (stable per slot: an idempotency key).

examples:
  dlock run --job nightly-report
  dlock run --job backup --backend redis://dlock@10.0.0.5:6379/0 \\
      --password-file /etc/dlock/backend.password --ttl 2m --once-per 1h -- /usr/local/bin/backup --full
  dlock run --job billing --rerun 2026-11-27T05:00:00Z --reason "provider outage, ticket 4711"

re-running a failed slot (--rerun, with --once-per): a slot whose run failed,
was lost or whose runner died can be run again while its marker lives
(1.5 x once_per from the slot's claim); the backend grants it only while the
lock is free, and never for a slot that succeeded (exit 74: a success is
final). SLOT is the slot's boundary as DLOCK_RUN_ID shows it, or the whole
run id; the rerun's DLOCK_RUN_ID is the slot's, as the first run's.
"""


def _parser_class():
    """argparse, imported when a command line is parsed (not when this module is)."""
    import argparse

    class Parser(argparse.ArgumentParser):
        """argparse that exits 78 (configuration error) on bad flags."""

        def error(self, message):
            self.print_usage(sys.stderr)
            sys.stderr.write("%s: error: %s\n" % (self.prog, message))
            raise SystemExit(EXIT_CONFIG)
    return Parser, argparse.RawDescriptionHelpFormatter


# Flags as data, (flag, argparse keywords) in the order --help lists them:
# the parsers are built from these tables, and `dlock run`'s fast path
# (_fast_run) reads its flags from the same ones.
BACKEND_FLAGS = ("backend and files", (
    ("--config", {"metavar": "FILE", "help": "global config (default /etc/dlock/dlock.json)"}),
    ("--jobs-dir", {"metavar": "DIR", "help": "job files (default /etc/dlock/jobs)"}),
    ("--pauses-dir", {"metavar": "DIR",
                      "help": "this node's mirror of the fleet's pauses: a pause there refuses runs as the "
                              "backend's does (default /var/lib/dlock/pauses)"}),
    ("--backend", {"metavar": "URL",
                   "help": "redis://[user@]host[:port][/db], rediss://..., postgresql://user@host/db, "
                           "postgresql+advisory://..., file:///run/dlock"}),
    ("--password-file", {"metavar": "FILE",
                         "help": "backend password (default: the systemd credential 'dlock-backend', if any); "
                                 "never put it in the URL"}),
    ("--ca-file", {"metavar": "FILE", "help": "CA bundle for TLS (rediss://, sslmode=verify-full)"}),
))
RUN_JOB = ("--job", {"required": True, "help": "job name (also the default lock key)"})
RUN_LOCK_FLAGS = ("lock options (override the job file)", (
    (("--key", {"help": "lock key (default: the job name)"}),)
    + tuple(("--" + option.name.replace("_", "-"), option.flag) for option in LOCK_OPTIONS if option.flag)))
RUN_METRICS_DIR = ("--metrics-dir", {"metavar": "DIR", "help": "node_exporter textfile directory"})
# The settings' flags (all but --job and --rerun's): what _flags passes on
# to config.load_settings.
SETTING_FLAGS = BACKEND_FLAGS[1] + RUN_LOCK_FLAGS[1] + (RUN_METRICS_DIR,)
RUN_RERUN_FLAGS = ("re-running a failed slot", (
    ("--rerun", {"metavar": "SLOT", "help": "run the slot SLOT again (2026-11-27T05:00:00Z, or the run id "
                                            "JOB@2026-11-27T05:00:00Z) if its run did not succeed"}),
    ("--reason", {"metavar": "TEXT", "help": "why (required with --rerun; logged)"}),
))


def _group(parser, flags):
    title, entries = flags
    group = parser.add_argument_group(title)
    for flag, keywords in entries:
        group.add_argument(flag, **keywords)


def _backend_flags(parser):
    _group(parser, BACKEND_FLAGS)


def _add_run(sub, raw):
    run_p = sub.add_parser("run", help="run a job under the lock",
                           usage="dlock run --job NAME [options] [-- CMD ARG...]",
                           description="Run a job under its lock. The command is taken from after '--', "
                                       "or from the job file's \"command\" (argv list, no shell).",
                           epilog=RUN_EPILOG, formatter_class=raw)
    run_p.add_argument(RUN_JOB[0], **RUN_JOB[1])
    _backend_flags(run_p)
    _group(run_p, RUN_LOCK_FLAGS)
    run_p.add_argument(RUN_METRICS_DIR[0], **RUN_METRICS_DIR[1])
    _group(run_p, RUN_RERUN_FLAGS)


def _fast_run(argv):
    """The flags of `dlock run ARGV` (up to '--') as a dict, read as argparse
    reads them, but without argparse: importing it (with gettext and shutil)
    and building the parser cost a start ~3 ms. Only the plain forms are
    read here: --flag VALUE and --flag=VALUE with the flags' exact names, a
    value that does not start with '-' (and is one of the choices, where
    there are), and --fail-open; --job given. Anything else (-h, an
    abbreviation, a missing or odd value, an unknown flag) returns None, and
    argparse reads the command line: its help, its errors, its exit codes."""
    known = dict([RUN_JOB, RUN_METRICS_DIR] + list(BACKEND_FLAGS[1]) + list(RUN_LOCK_FLAGS[1])
                 + list(RUN_RERUN_FLAGS[1]))
    values = {"command": "run"}
    tokens = iter(argv)
    for token in tokens:
        flag, equals, value = token.partition("=")
        keywords = known.get(flag)
        if keywords is None:
            return None
        if keywords.get("action") == "store_const":
            if equals:
                return None
            value = keywords["const"]
        else:
            if not equals:
                value = next(tokens, None)
            if value is None or value.startswith("-") or value not in keywords.get("choices", (value,)):
                return None
        values[_name(flag)] = value
    return values if "job" in values else None


def _add_status(sub, raw):
    status_p = sub.add_parser("status", help="holder, age, ttl left, fence and last result of locks",
                              description="Show the lock of one job, or of every job in the jobs dir.")
    status_p.add_argument("--job", help="only this job")
    status_p.add_argument("--key", help="a lock key that has no job file")
    status_p.add_argument("--json", action="store_true", help="JSON output")
    _backend_flags(status_p)


def _add_release(sub, raw):
    release_p = sub.add_parser("release", help="break a stale lock (logged)",
                               description="Break a lock whoever holds it. A live holder is fenced: "
                                           "its next renew fails and it kills its job.")
    release_p.add_argument("--job", help="job whose lock to break")
    release_p.add_argument("--key", help="lock key (default: the job's)")
    release_p.add_argument("--force", action="store_true", required=True, help="required: yes, break it")
    release_p.add_argument("--reason", required=True, help="why (logged)")
    _backend_flags(release_p)


def _pause_scope(parser, verb):
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument("--job", help="the job whose lock to %s" % verb)
    scope.add_argument("--key", help="a lock key (a job's is its name unless its file says otherwise)")
    scope.add_argument("--group", metavar="NAME", help="the jobs whose `groups` list NAME")
    scope.add_argument("--all", action="store_true", help="every lock of the backend, whatever its job")


def _add_pause(sub, raw):
    pause_p = sub.add_parser(
        "pause", help="refuse a job's runs, or every job's, on every node until a set time",
        description="Pause the grants of a job's lock (of a group's jobs, --group; of every lock, --all) on the "
                    "backend, so that on every node the job's runs exit 72 (skipped_paused) until the pause ends. The backend refuses the "
                    "grant itself, on its own clock, and ends the pause at --until by itself; `dlock resume` ends "
                    "it sooner. Pausing again replaces the pause. A run already going is not stopped unless "
                    "--drain kill.",
        epilog="examples:\n"
               "  dlock pause --job backup --reason 'INC-4211: storage migration' --until 2h\n"
               "  dlock pause --group billing --reason 'ledger freeze, CHG-118' --until 6h --drain kill\n"
               "  dlock pause --all --reason 'DC failover drill' --until 2026-11-27T05:00:00Z\n"
               "  dlock resume --job backup",
        formatter_class=raw)
    _pause_scope(pause_p, "pause")
    pause_p.add_argument("--reason", required=True, metavar="TEXT",
                         help="why (required; every run it refuses logs it)")
    pause_p.add_argument("--until", required=True, metavar="DUR|TIME",
                         help="when it ends: a duration (2h; at most 30d) or a UTC moment (2026-11-27T05:00:00Z)")
    pause_p.add_argument("--drain", choices=("wait", "kill"), default="wait",
                         help="the runs going on: wait lets them finish (the default); kill breaks their locks, "
                              "so that each runner kills its job at its next renewal (the keys of the jobs of "
                              "this node's jobs directory in the scope)")
    pause_p.add_argument("--any-group", action="store_true",
                         help="with --group: pause it although no job of this node is in it (else refused: a typo)")
    _backend_flags(pause_p)


def _add_resume(sub, raw):
    resume_p = sub.add_parser("resume", help="end a pause now",
                              description="End the pause of a job's lock (of a group, --group; of every lock, "
                                          "--all). A job paused by several needs each ended.")
    _pause_scope(resume_p, "resume")
    resume_p.add_argument("--reason", metavar="TEXT", help="why (logged)")
    _backend_flags(resume_p)


def _add_check_clock(sub, raw):
    clock_p = sub.add_parser("check-clock", help="local clock vs backend clock, chrony state",
                             description="Exit 0 when the clock is safe, 77 when it is not.")
    clock_p.add_argument("--max-skew", metavar="DUR", help="bound (default: the configured max_clock_skew)")
    clock_p.add_argument("--json", action="store_true", help="JSON output")
    _backend_flags(clock_p)


def _add_metrics(sub, raw):
    metrics_p = sub.add_parser(
        "metrics", help="write the lock state of this node's jobs for node_exporter",
        description="Write, for node_exporter's textfile collector, the lock state of every job in the jobs "
                    "dir (held, holder, age, ttl left, fence, last run on any node, the timer's period) and "
                    "this node's clock check. The file is replaced atomically; it is written even when the "
                    "backend cannot be queried (dlock_lock_state_refresh_success 0, exit 75).",
        epilog="example (what the dlock_metrics role's timer runs):\n"
               "  dlock metrics --output /var/lib/prometheus/node-exporter/dlock-lock-state.prom",
        formatter_class=raw)
    metrics_p.add_argument("--output", metavar="FILE",
                           help="file to write, '-' for stdout (default: METRICS_DIR/dlock-lock-state.prom)")
    metrics_p.add_argument("--unit-dir", metavar="DIR", default="/etc/systemd/system",
                           help="where the jobs' timers are, for their periods (default %(default)s)")
    _backend_flags(metrics_p)


def _job_parser(sub, raw, name, **texts):
    """The parser of a command that names one job first (run-now, history, backfill)."""
    parser = sub.add_parser(name, formatter_class=raw, **texts)
    parser.add_argument("job", metavar="JOB", help="the job, by its name")
    return parser


def _add_run_now(sub, raw):
    now_p = _job_parser(
        sub, raw, "run-now", help="run a job once now, on whichever node asks first",
        usage="dlock run-now JOB [--id ID] [--reason TEXT] [--force] [options]",
        description="Run the job once now, under its lock, in the foreground, as `dlock run` would, in a slot of its "
                    "own named by --id: sent again with the same id, from this node or any other, it does not run "
                    "again (exit 74) for 7 days. The job's own schedule and its slots are left as they are. While "
                    "another run holds the lock, the job's on_contention applies (skip: exit 73; wait), unless "
                    "--force, which waits in line (up to wait_timeout). A pause refuses it (72) unless --force.",
        epilog="examples:\n"
               "  dlock run-now nightly-report --reason 'INC-4211: rebuild the report'\n"
               "  dlock run-now nightly-report --id INC-4211    # from every node at once: it runs once\n"
               "  dlock run-now billing --force --reason 'CHG-118: test the migration while paused'")
    now_p.add_argument("--id", metavar="ID",
                       help="what makes it run once, however often and from wherever it is sent (default: a new "
                            "one, printed; 1-100 letters, digits and _ . : @ -)")
    now_p.add_argument("--reason", metavar="TEXT", help="why (logged; required with --force)")
    now_p.add_argument("--force", action="store_true",
                       help="run it although a pause refuses the job, and wait for a run that holds its lock (up "
                            "to wait_timeout) rather than skip: never beside another run")
    _backend_flags(now_p)


def _add_history(sub, raw):
    history_p = _job_parser(
        sub, raw, "history", help="the job's last runs on every node, as the backend keeps them",
        usage="dlock history JOB [-n N] [--json] [options]",
        description="Show the job's fleet-wide history, newest first: each run on any node (slot, fence, node, "
                    "start, end, exit code, result) and each slot a pause or a run still going skipped, once per "
                    "slot. The backend keeps the newest `history` entries of each job (a job option, default 50). "
                    "Each runner writes its own entry after its run; an entry it could not write is counted on "
                    "that node (dlock_history_writes_total{outcome=\"failed\"}) and its next entry says how many "
                    "are missing before it.",
        epilog="examples:\n"
               "  dlock history nightly-report\n"
               "  dlock history nightly-report -n 200 --json | jq '.[] | select(.result != \"success\")'")
    history_p.add_argument("-n", metavar="N", default="20",
                           help="entries to show, newest first (default 20, at most 1000)")
    history_p.add_argument("--json", action="store_true", help="JSON output: a list of the entries")
    _backend_flags(history_p)


def _add_backfill(sub, raw):
    backfill_p = _job_parser(
        sub, raw, "backfill", help="run a job's past slots that never ran, once each, across the fleet",
        usage="dlock backfill JOB --from TIME --to TIME [--reason TEXT] [options]",
        description="Run each slot of the job whose boundary is from --from to --to (UTC, both included, before "
                    "the current slot), oldest first, in the foreground, as a catch-up runs one: each a run of its "
                    "own under the lock, whose grant claims the slot's marker (refused, 74, while a marker says it "
                    "ran or is being run; kept 7 days). A slot the fleet-wide history shows a success of is left "
                    "alone. Sent again, or from another node, it runs nothing twice: it resumes where it stopped. "
                    "The job needs once_per and a schedule that fires in every slot (every_slot); at most 1000 "
                    "slots at once.",
        epilog="example:\n"
               "  dlock backfill settle-ledger --from 2026-11-27T00:00:00Z --to 2026-11-27T23:00:00Z "
               "--reason 'INC-4211: ledger outage'")
    backfill_p.add_argument("--from", dest="first", metavar="TIME", required=True,
                            help="the first slot's boundary, e.g. 2026-11-27T00:00:00Z")
    backfill_p.add_argument("--to", dest="last", metavar="TIME", required=True, help="the last slot's boundary")
    backfill_p.add_argument("--reason", metavar="TEXT", help="why (logged with each run)")
    _backend_flags(backfill_p)


def _run(values, command):
    # The job's guard and process start first, and get ready (the cgroup
    # move) while the runner loads its modules and takes the lock (child.py).
    from .child import Child
    # DLOCK_CGROUP is checked (auto or off) by load_settings below, before
    # the job can start: a bad value ends the run (exit 78) and dismisses this.
    job = Child.prepare(cgroup=os.environ.get("DLOCK_CGROUP", "auto") != "off")
    try:
        from .config import load_settings
        from .runner import run
        if values["command"] == "run-now":
            settings = load_settings(_flags(values), job=values["job"], need_command=True, job_must_exist=True,
                                     reason=values["reason"], manual=_manual_id(values), forced=values["force"])
        else:
            settings = load_settings(_flags(values), job=values["job"], command=command, need_command=True,
                                     rerun=values.get("rerun"), reason=values.get("reason"))
        return run(settings, job=job)
    finally:
        job.dismiss()  # when no job was started: skipped, refused, an error


def _manual_id(values):
    """run-now's --id, else a new one, said on stderr: sent again with it, the run does not repeat."""
    if values["id"] is not None:
        return values["id"]
    from .slots import new_manual_id
    manual = new_manual_id()
    sys.stderr.write("dlock run-now: id %s (send it again with --id %s: it runs once)\n" % (manual, manual))
    return manual


# The commands, in the order --help lists them, and what adds each one's
# parser. Each command imports its own modules when it runs: `dlock run`
# (runner.py) never loads what status, release, check-clock or metrics need
# (commands.py), nor the reverse.
COMMANDS = {
    "run": _add_run,
    "run-now": _add_run_now,
    "backfill": _add_backfill,
    "status": _add_status,
    "history": _add_history,
    "release": _add_release,
    "pause": _add_pause,
    "resume": _add_resume,
    "check-clock": _add_check_clock,
    "metrics": _add_metrics,
}


def build_parser(command=None):
    """The parser of `dlock`, with only the subparser of `command` when one
    is named (parsing its flags needs no other; help and errors read the
    same), else with all of them (dlock --help, a mistyped command)."""
    parser_class, raw = _parser_class()
    parser = parser_class(prog="dlock", description=DESCRIPTION, formatter_class=raw)
    parser.add_argument("--version", action="version", version="dlock " + __version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=parser_class)
    sub.required = True
    for name, add_parser in COMMANDS.items():
        if command in (None, name):
            add_parser(sub, raw)
    return parser


def _flags(values):
    """The settings of a parsed command line (a dict), None where not given."""
    return dict((_name(flag), values.get(_name(flag))) for flag, _keywords in SETTING_FLAGS)


def _name(flag):
    """The setting a flag gives, as argparse names it: --max-runtime, max_runtime."""
    return flag[2:].replace("-", "_")


def main(argv=None):
    """Run the command line and end the process with its exit code (_exit)."""
    _exit(_main(argv))


def _exit(code):
    """End the process at once. Everything a command opened is closed by now
    (the job and its guard ended, the backend's connections closed, the log
    line and the metrics written); what the interpreter would still do,
    module by module, does nothing for them and costs a start of `dlock
    run` ~7 ms with a driver loaded (the bare `python3 -c "import psycopg"`
    pays it too)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken pipe: nothing more can be said there
    os._exit(code)


def _main(argv):
    argv = list(sys.argv[1:] if argv is None else argv)
    command = None
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1:]
    args, values = None, _fast_run(argv[1:]) if argv[:1] == ["run"] else None
    if values is None:
        args = build_parser(argv[0] if argv and argv[0] in COMMANDS else None).parse_args(argv)
        values = vars(args)
    name = values["command"]
    try:
        if name in ("run", "run-now"):
            if command and name == "run-now":
                raise ConfigError("run-now: runs the job's own command; it takes none after '--'")
            return _run(values, command)
        if command:
            raise ConfigError("%s: takes no command after '--'" % name)
        from . import commands
        return getattr(commands, name.replace("-", "_"))(args, _flags(values))
    except DlockError as exc:
        sys.stderr.write("dlock: error: %s\n" % exc)
        return exc.exit_code
