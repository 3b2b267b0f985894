"""Configuration: /etc/dlock/dlock.json, /etc/dlock/jobs/NAME.json, flags.

Precedence: flags > job file > the global file's `defaults` > built-in
defaults. Files are JSON (Ansible writes them with to_nice_json). Unknown
keys, bad values and missing files are ConfigErrors naming the file and field.
"""

import json
import os
import re

from .backends import parse_url, validate_key
from .errors import ConfigError
from .options import OPTION_NAMES, LockOptions

DEFAULT_CONFIG = "/etc/dlock/dlock.json"
DEFAULT_JOBS_DIR = "/etc/dlock/jobs"
CREDENTIAL_NAME = "dlock-backend"  # systemd LoadCredential= name of the password

GLOBAL_KEYS = ("backend", "password_file", "ca_file", "jobs_dir", "metrics_dir", "defaults")
JOB_KEYS = ("command", "key", "environment", "working_directory", "description") + OPTION_NAMES
# Job names become unit names (dlock-NAME.service) and file names: no '@'
# (template units), no '/', nothing systemd would escape.
JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def validate_job_name(name):
    if not isinstance(name, str) or not JOB_NAME.match(name):
        raise ConfigError(
            "job: %r is not a valid job name (1-64 characters: letters, digits and _ . -, starting "
            "with a letter or digit; it becomes the unit name dlock-NAME.service, so no '@', '/' "
            "or spaces, which systemd would treat specially or escape)" % (name,))
    return name


def load_json(path, what, required):
    """The JSON object in `path`; {} when absent and not required."""
    try:
        with open(path) as handle:
            text = handle.read()
    except (IOError, OSError) as exc:
        if not required and not os.path.exists(path):
            return {}
        raise ConfigError("%s %s: cannot read (%s)" % (what, path, exc.strerror or exc))
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError("%s %s: not valid JSON (%s)" % (what, path, exc))
    if not isinstance(data, dict):
        raise ConfigError("%s %s: must hold a JSON object" % (what, path))
    return data


def _check_keys(data, allowed, where):
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ConfigError("%s: unknown field %s (allowed: %s)"
                          % (where, ", ".join(repr(k) for k in unknown), ", ".join(allowed)))


def read_secret(path, where):
    try:
        with open(path) as handle:
            secret = handle.read().rstrip("\r\n")
    except (IOError, OSError) as exc:
        raise ConfigError("%s: cannot read password file %s (%s)" % (where, path, exc.strerror or exc))
    if not secret:
        raise ConfigError("%s: password file %s is empty" % (where, path))
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
        self.jobs_dir = DEFAULT_JOBS_DIR
        self.metrics_dir = None
        self.options = None
        self.config_path = None
        self.job_path = None


def load_settings(flags, job=None, command=None, need_command=False):
    """Settings from files and flags. `flags` maps option names to raw values
    (None when not given); `command` is the argv given after --, if any."""
    settings = Settings()
    explicit = flags.get("config") is not None
    settings.config_path = flags.get("config") or DEFAULT_CONFIG
    global_cfg = load_json(settings.config_path, "config", required=explicit)
    where = "config %s" % settings.config_path
    _check_keys(global_cfg, GLOBAL_KEYS, where)
    defaults = global_cfg.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ConfigError("%s: defaults: must be a JSON object" % where)
    _check_keys(defaults, OPTION_NAMES, "%s: defaults" % where)
    for name in ("backend", "password_file", "ca_file", "jobs_dir", "metrics_dir"):
        if name in global_cfg and not isinstance(global_cfg[name], str):
            raise ConfigError("%s: %s: must be a string" % (where, name))

    settings.jobs_dir = flags.get("jobs_dir") or global_cfg.get("jobs_dir") or DEFAULT_JOBS_DIR
    job_cfg = {}
    if job is not None:
        settings.job = validate_job_name(job)
        settings.job_path = os.path.join(settings.jobs_dir, job + ".json")
        job_cfg = load_json(settings.job_path, "job file", required=need_command and not command)
        _check_keys(job_cfg, JOB_KEYS, "job file %s" % settings.job_path)
    job_where = "job file %s" % settings.job_path

    settings.backend_url = flags.get("backend") or global_cfg.get("backend")
    parse_url(settings.backend_url, "backend (--backend or %s)" % where if not flags.get("backend") else "--backend")
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
    settings.metrics_dir = flags.get("metrics_dir") or global_cfg.get("metrics_dir")

    if job is None:
        settings.options = LockOptions.from_mapping(_options_of(defaults, {}, flags), where)
        settings.key = validate_key(flags.get("key")) if flags.get("key") else None
        return settings

    settings.key = validate_key(flags.get("key") or job_cfg.get("key") or job)
    settings.options = LockOptions.from_mapping(_options_of(defaults, job_cfg, flags), job_where)
    settings.command = command or job_cfg.get("command")
    if need_command:
        settings.command = _check_command(settings.command, job_where, bool(command))
    env = job_cfg.get("environment") or {}
    if not isinstance(env, dict) or not all(ENV_NAME.match(str(k)) and isinstance(v, str) for k, v in env.items()):
        raise ConfigError("%s: environment: must map variable names to strings" % job_where)
    settings.environment = env
    settings.working_directory = job_cfg.get("working_directory")
    return settings


def _options_of(defaults, job_cfg, flags):
    merged = dict(defaults)
    merged.update((k, v) for k, v in job_cfg.items() if k in OPTION_NAMES)
    merged.update((k, v) for k, v in flags.items() if k in OPTION_NAMES and v is not None)
    return merged


def _check_command(command, where, from_argv):
    if not command:
        raise ConfigError("%s: no command: give one after '--' or set \"command\" in the job file" % where)
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
        raise ConfigError("%s: command: must be a list of strings (argv, no shell); "
                          "for a shell line use [\"/bin/sh\", \"-c\", \"...\"]" % ("argv" if from_argv else where))
    return command
