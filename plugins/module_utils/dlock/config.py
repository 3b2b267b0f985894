"""Configuration: /etc/dlock/dlock.json, /etc/dlock/jobs/NAME.json, flags.

Precedence: flags > job file > the global file's `defaults` > built-in
defaults. Files are JSON (Ansible writes them with to_nice_json). Unknown
keys, bad values and missing files are ConfigErrors naming the file and field.
"""

import copy
import os

from . import validate
from .errors import ConfigError
from .options import OPTION_NAMES, LockOptions, check_backend_ttl
from .pause_files import DEFAULT_PAUSES_DIR
from .safefile import MAX_SECRET_BYTES, read_regular, require_regular

DEFAULT_CONFIG = "/etc/dlock/dlock.json"
DEFAULT_JOBS_DIR = "/etc/dlock/jobs"
CREDENTIAL_NAME = "dlock-backend"  # systemd LoadCredential= name of the password

GLOBAL_KEYS = ("backend", "password_file", "ca_file", "fence_epoch", "jobs_dir", "metrics_dir", "pauses_dir", "defaults")
GLOBAL_PATHS = ("password_file", "ca_file", "jobs_dir", "metrics_dir", "pauses_dir")
PATH_FLAGS = ("jobs_dir", "pauses_dir", "password_file", "ca_file", "metrics_dir")  # checked in the order --help lists them
JOB_KEYS = ("command", "key", "groups", "environment", "working_directory", "description", "every_slot") + OPTION_NAMES


def validate_job_name(name):
    # Job names become unit names (dlock-NAME.service) and file names.
    return validate.job_name(name, "job")


def load_json(path, what, required):
    """The JSON object in `path`; {} when absent and not required. Duplicate
    keys, NaN and Infinity are refused, and so is anything but a regular file."""
    try:
        text = read_regular(path, what)
    except FileNotFoundError:
        if not required:
            return {}
        raise ConfigError("%s %s: cannot read (No such file or directory)" % (what, path))
    try:
        data = validate.parse_json(text)
    except ValueError as exc:
        raise ConfigError("%s %s: not valid JSON (%s)" % (what, path, exc))
    if not isinstance(data, dict):
        raise ConfigError("%s %s: must hold a JSON object" % (what, path))
    return data


def _check_keys(data, allowed, where):
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ConfigError("%s: unknown field %s (allowed: %s)"
                          % (where, ", ".join(validate.shown(k) for k in unknown), ", ".join(allowed)))


def read_secret(path, where):
    """The password in the regular file `path` (one line); never shown."""
    try:
        secret = read_regular(path, "%s: password file" % where, MAX_SECRET_BYTES)
    except FileNotFoundError:
        raise ConfigError("%s: cannot read password file %s (No such file or directory)" % (where, path))
    secret = secret[:-1] if secret.endswith("\n") else secret
    secret = secret[:-1] if secret.endswith("\r") else secret
    if not secret:
        raise ConfigError("%s: password file %s is empty" % (where, path))
    if validate.CONTROL.search(secret):
        raise ConfigError("%s: password file %s holds more than one line or a control character" % (where, path))
    return secret


class Settings(object):
    """Everything a subcommand needs; `job` fields are None when no job is named."""

    def __init__(self):
        self.job = None
        self.key = None
        self.groups = []  # the job's groups: a pause of any of them pauses it (dlock pause --group)
        self.every_slot = False  # the job's schedule fires in every once_per slot (history.py: missed slots)
        self.command = None
        self.environment = {}
        self.working_directory = None
        self.backend_url = None
        self.password = None
        self.ca_file = None
        self.fence_epoch = 0
        self.jobs_dir = DEFAULT_JOBS_DIR
        self.pauses_dir = DEFAULT_PAUSES_DIR  # this node's mirror of the fleet's pauses (pause_files.py)
        self.metrics_dir = None
        self.options = None
        self.defaults = {}  # the global file's `defaults`, under every job's options
        self.scheme = None  # the backend URL's scheme, whose rules the options follow
        self.config_path = None
        self.job_path = None
        self.cgroup = True  # a cgroup of its own for the job where one can be made (DLOCK_CGROUP)
        self.rerun = None  # `dlock run --rerun`: the number of the slot to run again
        self.manual = None  # `dlock run-now`: the id of the run asked for by hand
        self.forced = False  # and --force: run it although a pause refuses the job
        self.reason = None  # why (--reason), for either
        self.catch_up_slot = None  # a missed slot this run catches up (history.py), or `dlock backfill`'s
        self.backfill = False  # that slot is `dlock backfill`'s


# DLOCK_CGROUP: "auto" (the default) gives each job a cgroup v2 of its own
# where the runner may make one; "off" leaves containment to the guard alone.
CGROUP_MODES = ("auto", "off")


def load_settings(flags, job=None, command=None, need_command=False, job_must_exist=False, rerun=None, reason=None,
                  manual=None, forced=False):
    """Settings from files and flags. `flags` maps option names to raw values
    (None when not given); `command` is the argv given after --, if any;
    `rerun` and `reason`, `dlock run`'s --rerun and --reason; `manual`,
    `forced` and `reason`, `dlock run-now`'s --id, --force and --reason.
    Everything is checked here, before any backend is contacted."""
    settings = Settings()
    # Checked with the rest, before any backend is contacted: a typo here
    # ("of", "false") must not quietly leave the job's tree less contained.
    settings.cgroup = validate.choice(os.environ.get("DLOCK_CGROUP", "auto"), "DLOCK_CGROUP (environment)",
                                      CGROUP_MODES) == "auto"
    global_cfg, where = _load_global(settings, flags)
    settings.defaults = global_cfg.get("defaults") or {}
    settings.jobs_dir = flags.get("jobs_dir") or global_cfg.get("jobs_dir") or DEFAULT_JOBS_DIR
    settings.pauses_dir = flags.get("pauses_dir") or global_cfg.get("pauses_dir") or DEFAULT_PAUSES_DIR
    job_cfg = _load_job(settings, job, job_must_exist or (need_command and not command))
    settings.scheme = _load_backend(settings, flags, global_cfg, where)
    if job is None:
        settings.options = _lock_options(settings.defaults, {}, flags, where, settings.scheme)
        settings.key = validate.lock_key(flags["key"], "--key") if flags.get("key") else None
        return settings
    if manual is None:
        _load_job_fields(settings, flags, job_cfg, command, need_command, rerun, reason)
    else:
        _load_job_fields(settings, flags, job_cfg, command, need_command)
        _load_manual(settings, manual, forced, reason)
    return settings


def load_job_settings(node, flags, job):
    """The settings of `job` on top of `node`, what load_settings(flags)
    gave: as load_settings(flags, job=job) would give them, without reading
    and checking the global file, the password and the CA file again for
    each job (`dlock status` and `dlock metrics` load every job of the jobs
    directory). The job file's checks are the same."""
    settings = copy.copy(node)
    job_cfg = _load_job(settings, job, required=False)
    _load_job_fields(settings, flags, job_cfg)
    return settings


def _load_job_fields(settings, flags, job_cfg, command=None, need_command=False, rerun=None, reason=None):
    """What the job file decides: the key, the lock options, the rerun and
    what the job runs (settings holds the global file's part)."""
    job_where = "job file %s" % settings.job_path
    settings.key = _job_key(flags, job_cfg, settings.job, job_where)
    settings.groups = validate.groups(job_cfg.get("groups", []), "%s: groups" % job_where)
    settings.options = _lock_options(settings.defaults, job_cfg, flags, job_where, settings.scheme)
    # Set by the dlock_jobs role when the job's schedule fires in every once_per slot (history.py: missed slots).
    settings.every_slot = validate.boolean(job_cfg.get("every_slot", False), "%s: every_slot" % job_where)
    if settings.options.catches_up and not settings.every_slot:
        raise ConfigError("%s: catch_up: policy %s needs every_slot: a schedule that fires in every once_per slot "
                          "(the dlock_jobs role sets it where the schedule tells it), else it would run slots "
                          "that were never due" % (job_where, settings.options.catch_up["policy"]))
    if "description" in job_cfg:
        validate.text(job_cfg["description"], "%s: description" % job_where, allow_empty=True)
    _load_rerun(settings, rerun, reason)
    _load_job_run(settings, job_cfg, command, need_command, job_where)


def _load_global(settings, flags):
    """The global file (checked: its keys, its `defaults` each on its own,
    its paths) and the path flags; (its content, how errors name it)."""
    explicit = flags.get("config") is not None
    settings.config_path = validate.path(flags.get("config") or DEFAULT_CONFIG, "--config")
    global_cfg = load_json(settings.config_path, "config", required=explicit)
    where = "config %s" % settings.config_path
    _check_keys(global_cfg, GLOBAL_KEYS, where)
    defaults = global_cfg.get("defaults") or {}
    validate.mapping(defaults, "%s: defaults" % where)
    _check_keys(defaults, OPTION_NAMES, "%s: defaults" % where)
    LockOptions.parse_values(defaults, "%s: defaults" % where)  # a bad default is named where it is
    for name in GLOBAL_PATHS:
        if global_cfg.get(name) is not None:
            validate.path(global_cfg[name], "%s: %s" % (where, name))
    for name in PATH_FLAGS:
        if flags.get(name) is not None:
            validate.path(flags[name], "--" + name.replace("_", "-"))
    return global_cfg, where


def _load_job(settings, job, required):
    """The job file's content ({} with no job named, or none there and not `required`)."""
    if job is None:
        return {}
    settings.job = validate_job_name(job)
    settings.job_path = os.path.join(settings.jobs_dir, job + ".json")
    job_cfg = load_json(settings.job_path, "job file", required=required)
    _check_keys(job_cfg, JOB_KEYS, "job file %s" % settings.job_path)
    return job_cfg


def _load_backend(settings, flags, global_cfg, where):
    """The backend's URL, password, CA file, metrics dir and fence epoch;
    returns the URL's scheme, which the lock options' rules depend on."""
    if flags.get("backend"):
        parts = validate.backend_url(flags["backend"], "--backend")
    else:
        parts = validate.backend_url(global_cfg.get("backend"), "backend (--backend or %s)" % where)
    settings.backend_url = parts.url
    settings.password = _password(flags, global_cfg, where)
    settings.ca_file = flags.get("ca_file") or global_cfg.get("ca_file")
    if settings.ca_file:
        require_regular(settings.ca_file, "CA file")
    settings.metrics_dir = flags.get("metrics_dir") or global_cfg.get("metrics_dir")
    # The backend's fences are offset by it (backends/epoch.py); one epoch
    # for the whole node, as the backend is (no flag: a run given another
    # epoch than the fleet's would hand out fences out of order).
    settings.fence_epoch = validate.fence_epoch(global_cfg.get("fence_epoch", 0), "%s: fence_epoch" % where)
    return parts.scheme


def _password(flags, global_cfg, where):
    # A flag wins; then the systemd credential (how job units running as any
    # user get it); then the config's password_file (root at a terminal).
    credentials = os.environ.get("CREDENTIALS_DIRECTORY")
    credential = os.path.join(credentials, CREDENTIAL_NAME) if credentials else None
    if flags.get("password_file"):
        return read_secret(flags["password_file"], "--password-file")
    if credential and os.path.exists(credential):
        return read_secret(credential, "systemd credential %s" % CREDENTIAL_NAME)
    if global_cfg.get("password_file"):
        return read_secret(global_cfg["password_file"], where)
    return None


def _job_key(flags, job_cfg, job, job_where):
    if flags.get("key"):
        return validate.lock_key(flags["key"], "--key")
    if job_cfg.get("key") is not None:
        return validate.lock_key(job_cfg["key"], "%s: key" % job_where)
    return validate.lock_key(job, "key (the job name)")


def _lock_options(defaults, job_cfg, flags, where, scheme):
    """The lock options: flags over the job file over the global `defaults`,
    each parsed once and then checked together, under the backend's rules."""
    merged = dict(defaults)
    merged.update((k, v) for k, v in job_cfg.items() if k in OPTION_NAMES)
    merged.update((k, v) for k, v in flags.items() if k in OPTION_NAMES and v is not None)
    options = LockOptions.from_mapping(merged, where, scheme)
    check_backend_ttl(options.ttl, scheme, "%s: ttl" % where)
    return options


def _load_manual(settings, manual, forced, reason):
    """`dlock run-now`: its id, why (optional), and --force, which needs a reason (logged)."""
    settings.manual = validate.manual_id(manual, "--id")
    settings.reason = None if reason is None else validate.reason(reason)
    if forced and settings.reason is None:
        raise ConfigError("--force needs --reason: a run that overrides a pause says why")
    settings.forced = bool(forced)


def _load_rerun(settings, rerun, reason):
    if rerun is None and reason is None:
        return
    if rerun is None or reason is None:
        raise ConfigError("--rerun and --reason go together: name the slot to run again, and say why")
    settings.rerun = validate.rerun_slot(rerun, "--rerun", settings.job, settings.options.once_per)
    settings.reason = validate.reason(reason)


def _load_job_run(settings, job_cfg, command, need_command, job_where):
    """What the job runs: its command, environment and working directory."""
    settings.command = command or job_cfg.get("command")
    if need_command:
        if not settings.command:
            raise ConfigError("%s: no command: give one after '--' or set \"command\" in the job file" % job_where)
        settings.command = validate.argv(settings.command, "argv" if command else "%s: command" % job_where)
    settings.environment = validate.environment(job_cfg.get("environment") or {}, "%s: environment" % job_where)
    if job_cfg.get("working_directory") is not None:
        settings.working_directory = validate.path(job_cfg["working_directory"], "%s: working_directory" % job_where)
        wd = settings.working_directory
        if need_command and not (os.path.isdir(wd) and os.access(wd, os.X_OK)):
            # Before the grant: the job could not start there, and the failure
            # would name the command, not the directory.
            raise ConfigError("%s: working_directory %s: is not a directory the job can enter "
                              "(missing, a file, or out of reach)" % (job_where, wd))
