"""Configuration: /etc/dlock/dlock.json, /etc/dlock/jobs/NAME.json, flags.

Precedence: flags > job file > the global file's `defaults` > built-in
defaults. Files are JSON (Ansible writes them with to_nice_json). Unknown
keys, bad values and missing files are ConfigErrors naming the file and field.
"""

import os

from . import validate
from .errors import ConfigError
from .options import OPTION_NAMES, LockOptions, check_backend_ttl
from .safefile import MAX_SECRET_BYTES, read_regular, require_regular

DEFAULT_CONFIG = "/etc/dlock/dlock.json"
DEFAULT_JOBS_DIR = "/etc/dlock/jobs"
CREDENTIAL_NAME = "dlock-backend"  # systemd LoadCredential= name of the password

GLOBAL_KEYS = ("backend", "password_file", "ca_file", "fence_epoch", "jobs_dir", "metrics_dir", "defaults")
GLOBAL_PATHS = ("password_file", "ca_file", "jobs_dir", "metrics_dir")
JOB_KEYS = ("command", "key", "environment", "working_directory", "description") + OPTION_NAMES


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
        self.command = None
        self.environment = {}
        self.working_directory = None
        self.backend_url = None
        self.password = None
        self.ca_file = None
        self.fence_epoch = 0
        self.jobs_dir = DEFAULT_JOBS_DIR
        self.metrics_dir = None
        self.options = None
        self.config_path = None
        self.job_path = None
        self.cgroup = True  # a cgroup of its own for the job where one can be made (DLOCK_CGROUP)
        self.rerun = None  # `dlock run --rerun`: the number of the slot to run again
        self.reason = None  # and why (--reason)


# DLOCK_CGROUP: "auto" (the default) gives each job a cgroup v2 of its own
# where the runner may make one; "off" leaves containment to the guard alone.
CGROUP_MODES = ("auto", "off")


def load_settings(flags, job=None, command=None, need_command=False, job_must_exist=False, rerun=None, reason=None):
    """Settings from files and flags. `flags` maps option names to raw values
    (None when not given); `command` is the argv given after --, if any;
    `rerun` and `reason`, `dlock run`'s --rerun and --reason.
    Everything is checked here, before any backend is contacted."""
    settings = Settings()
    # Checked with the rest, before any backend is contacted: a typo here
    # ("of", "false") must not quietly leave the job's tree less contained.
    settings.cgroup = validate.choice(os.environ.get("DLOCK_CGROUP", "auto"), "DLOCK_CGROUP (environment)",
                                      CGROUP_MODES) == "auto"
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
    for name in ("jobs_dir", "password_file", "ca_file", "metrics_dir"):
        if flags.get(name) is not None:
            validate.path(flags[name], "--" + name.replace("_", "-"))

    settings.jobs_dir = flags.get("jobs_dir") or global_cfg.get("jobs_dir") or DEFAULT_JOBS_DIR
    job_cfg = {}
    if job is not None:
        settings.job = validate_job_name(job)
        settings.job_path = os.path.join(settings.jobs_dir, job + ".json")
        job_cfg = load_json(settings.job_path, "job file",
                            required=job_must_exist or (need_command and not command))
        _check_keys(job_cfg, JOB_KEYS, "job file %s" % settings.job_path)
    job_where = "job file %s" % settings.job_path

    if flags.get("backend"):
        parts = validate.backend_url(flags["backend"], "--backend")
    else:
        parts = validate.backend_url(global_cfg.get("backend"), "backend (--backend or %s)" % where)
    settings.backend_url = parts.url
    # A flag wins; then the systemd credential (how job units running as any
    # user get it); then the config's password_file (root at a terminal).
    credentials = os.environ.get("CREDENTIALS_DIRECTORY")
    credential = os.path.join(credentials, CREDENTIAL_NAME) if credentials else None
    if flags.get("password_file"):
        settings.password = read_secret(flags["password_file"], "--password-file")
    elif credential and os.path.exists(credential):
        settings.password = read_secret(credential, "systemd credential %s" % CREDENTIAL_NAME)
    elif global_cfg.get("password_file"):
        settings.password = read_secret(global_cfg["password_file"], where)
    settings.ca_file = flags.get("ca_file") or global_cfg.get("ca_file")
    if settings.ca_file:
        require_regular(settings.ca_file, "CA file")
    settings.metrics_dir = flags.get("metrics_dir") or global_cfg.get("metrics_dir")
    # The backend's fences are offset by it (backends/epoch.py); one epoch
    # for the whole node, as the backend is (no flag: a run given another
    # epoch than the fleet's would hand out fences out of order).
    settings.fence_epoch = validate.fence_epoch(global_cfg.get("fence_epoch", 0), "%s: fence_epoch" % where)

    if job is None:
        settings.options = LockOptions.from_mapping(_options_of(defaults, {}, flags), where, parts.scheme)
        check_backend_ttl(settings.options.ttl, parts.scheme, "%s: ttl" % where)
        settings.key = validate.lock_key(flags["key"], "--key") if flags.get("key") else None
        return settings

    if flags.get("key"):
        settings.key = validate.lock_key(flags["key"], "--key")
    elif job_cfg.get("key") is not None:
        settings.key = validate.lock_key(job_cfg["key"], "%s: key" % job_where)
    else:
        settings.key = validate.lock_key(job, "key (the job name)")
    settings.options = LockOptions.from_mapping(_options_of(defaults, job_cfg, flags), job_where, parts.scheme)
    check_backend_ttl(settings.options.ttl, parts.scheme, "%s: ttl" % job_where)
    if "description" in job_cfg:
        validate.text(job_cfg["description"], "%s: description" % job_where, allow_empty=True)
    if rerun is not None or reason is not None:
        if rerun is None or reason is None:
            raise ConfigError("--rerun and --reason go together: name the slot to run again, and say why")
        settings.rerun = validate.rerun_slot(rerun, "--rerun", job, settings.options.once_per)
        settings.reason = validate.reason(reason)
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
    return settings


def _options_of(defaults, job_cfg, flags):
    merged = dict(defaults)
    merged.update((k, v) for k, v in job_cfg.items() if k in OPTION_NAMES)
    merged.update((k, v) for k, v in flags.items() if k in OPTION_NAMES and v is not None)
    return merged
