"""The input boundary: one strict validator for each kind of value.

Every value that reaches a lock, a rendered file (units, job files, backend
configurations, pg_hba) or a message passes one of these functions first:
the runner's flags and files, the module's arguments, the job-list filter
and the roles' preflights all call them, so each rule lives here only.

Rules shared by all of them:
- types are strict: a string where a list belongs, a bool where a number
  belongs, a float where an integer belongs are refused, never coerced;
- numbers are finite and bounded (NaN, infinity and 1e308 are refused);
- text never holds a control character (a newline, a NUL, an escape, the
  Unicode line separators), and patterns match the whole string;
- an error names the field and shows the value escaped and shortened, or
  not at all when it is a secret.

Each function returns the value in its canonical form or raises ConfigError.
"""

import json
import math
import posixpath
import re

from .errors import ConfigError

# ipaddress is imported by the validators that need it, when they run: a
# `dlock run` on file:// never does, and every start would pay for it.

# The longest duration any option accepts (documented): a lease, a wait or a
# slot longer than this is a typo, and a bounded value keeps every backend's
# arithmetic (milliseconds in Lua, intervals in SQL) far from overflow.
MAX_DURATION = 30 * 86400.0
MAX_TEXT = 200
MAX_PATH = 1024

# C0, DEL, C1, and the Unicode line and paragraph separators: anything a
# terminal, a log reader or a line-oriented config format could take for a
# line break or an escape.
# Control characters, line and paragraph separators, and the bidirectional
# overrides and isolates (a reason shown in a log or a status table must read
# as it was written).
CONTROL = re.compile(u"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# What Python makes of bytes that are not UTF-8 in argv or a file name
# (surrogateescape): text no backend can store.
NOT_UTF8 = re.compile(u"[\ud800-\udfff]")

JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
LOCK_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,199}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# POSIX user and group names as useradd and systemd accept them, or a numeric id.
UNIX_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]{1,10}")
# A systemd unit name (systemd.unit(5)): at most 255 characters of ASCII
# letters, digits and : - _ . \\, an optional @instance, and its type suffix.
UNIT_NAME = re.compile(r"[A-Za-z0-9:_.\\-]+(?:@[A-Za-z0-9:_.\\-]*)?\.(?:service|socket|timer|target|path|mount|"
                       r"automount|swap|slice|scope|device)")
HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
# Path characters: printable ASCII without white space, quotes, backslash or
# the characters configuration formats treat specially (%, $, ;, #, `).
PATH_CHARS = re.compile(r"[A-Za-z0-9_.,:+@=/~-]+")
_DURATION = re.compile(r" *([0-9]{1,12})(?:\.([0-9]{1,9}))? *(ms|s|m|h|d)? *")
_UNITS = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def shown(value, limit=60):
    """A value for a message: escaped (no control character reaches a log) and short."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _fail(field, value, problem, secret=False):
    if secret:
        raise ConfigError("%s: %s" % (field, problem))
    raise ConfigError("%s: %s %s" % (field, shown(value), problem))


# -- text ---------------------------------------------------------------------
def text(value, field, max_len=MAX_TEXT, pattern=None, hint=None, allow_empty=False, secret=False,
         kind="value"):
    """A string of at most max_len characters, no control character; with
    `pattern`, the whole string must match it (hint says what is allowed)."""
    if not isinstance(value, str):
        _fail(field, value, "must be a string", secret)
    if not value and not allow_empty:
        raise ConfigError("%s: must not be empty%s" % (field, "" if kind == "value" else " (not a valid %s)" % kind))
    if len(value) > max_len:
        _fail(field, value, "is longer than %d characters" % max_len, secret)
    if CONTROL.search(value):
        _fail(field, value, "holds a control character (a line break, tab, NUL, escape or direction override)",
              secret)
    if NOT_UTF8.search(value):
        _fail(field, value, "is not valid UTF-8", secret)
    if pattern is not None and value and not pattern.fullmatch(value):
        _fail(field, value, "is not a valid %s%s" % (kind, " (%s)" % hint if hint else ""), secret)
    return value


def unit_value(value, field, max_len=MAX_TEXT):
    """Text for a systemd unit line: one line, and no trailing backslash,
    which systemd reads as a line continuation."""
    text(value, field, max_len, allow_empty=True)
    if value.endswith("\\"):
        _fail(field, value, "ends with a backslash, which systemd reads as a line continuation")
    return value


def job_name(value, field="job"):
    return text(value, field, 64, JOB_NAME,
                "1-64 characters: letters, digits and _ . -, starting with a letter or digit; it becomes "
                "the unit name dlock-NAME.service, so no '@', '/' or spaces, which systemd would treat "
                "specially or escape", kind="job name")


# A key the backends keep for themselves: the fleet's pause log
# (backends/base.py, log_pause), a history of its own that no job may share.
PAUSE_LOG_KEY = "pauses@dlock"


def lock_key(value, field="key"):
    key = text(value, field, 200, LOCK_KEY,
               "1-200 characters: letters, digits and _ . : @ -, starting with a letter or digit",
               kind="lock key")
    if key == PAUSE_LOG_KEY:
        _fail(field, value, "is the key of the backend's pause log, which no job may use")
    return key


# The id of a run asked for by hand (`dlock run-now --id`, dlock_run_now):
# the key that makes it run once, whoever sends it and however often.
MANUAL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,99}")


def manual_id(value, field="--id"):
    return text(value, field, 100, MANUAL_ID,
                "1-100 characters: letters, digits and _ . : @ -, starting with a letter or digit",
                kind="run id")


# A group of jobs (a job's `groups`, `dlock pause --group`): a name as a
# job's, which becomes part of a pause's key or file name on the backend.
GROUP_NAME = JOB_NAME
MAX_GROUPS = 16


def group_name(value, field="group"):
    return text(value, field, 64, GROUP_NAME,
                "1-64 characters: letters, digits and _ . -, starting with a letter or digit", kind="group name")


def groups(value, field="groups"):
    """A job's groups: a list (never a string) of distinct group names, at most MAX_GROUPS."""
    if isinstance(value, str):
        _fail(field, value, "must be a list of group names, such as [billing] (the Unix group a job runs as "
                            "is `group`)")
    names = items(value, field, group_name, max_items=MAX_GROUPS)
    repeated = sorted(set(name for name in names if names.count(name) > 1))
    if repeated:
        raise ConfigError("%s: names %s more than once" % (field, ", ".join(repeated)))
    return names


def unit_name(value, field):
    return text(value, field, 255, UNIT_NAME,
                "a systemd unit's full name: letters, digits and : - _ . \\, an optional @instance, and its "
                "type (.service, .timer, .socket, .target, ...)", kind="unit name")


def env_name(value, field):
    return text(value, field, 128, ENV_NAME, "letters, digits and _, not starting with a digit",
                kind="environment variable name")


def unix_name(value, field):
    return text(value, field, 32, UNIX_NAME,
                "a user or group name: letters, digits and _ . -, not starting with . or -, "
                "at most 32 characters; or a numeric id", kind="user or group name")


def argv(value, field):
    """A command as an argv list: non-empty strings, no NUL (exec would refuse
    it only after the lock was taken)."""
    if not isinstance(value, list) or not value:
        _fail(field, value, "must be a non-empty list of strings (argv, no shell); "
                            "for a shell line use [\"/bin/sh\", \"-c\", \"...\"]")
    for index, arg in enumerate(value):
        item = "%s[%d]" % (field, index)
        if not isinstance(arg, str):
            _fail(item, arg, "must be a string")
        if "\x00" in arg:
            raise ConfigError("%s: holds a NUL character, which no program can receive" % item)
        if len(arg) > 131072:
            raise ConfigError("%s: is longer than 131072 characters (the kernel's limit)" % item)
    if not value[0]:
        raise ConfigError("%s[0]: the program must not be empty" % field)
    return value


def environment(value, field):
    """Variables for the job: names as env_name, values strings without NUL."""
    value = mapping(value, field)
    for name, val in value.items():
        env_name(name, "%s: name" % field)
        if not isinstance(val, str):
            _fail("%s.%s" % (field, name), val, "must be a string")
        if "\x00" in val:
            raise ConfigError("%s.%s: holds a NUL character" % (field, name))
    return value


# -- numbers ------------------------------------------------------------------
def boolean(value, field):
    if not isinstance(value, bool):
        _fail(field, value, "must be true or false")
    return value


def integer(value, field, minimum, maximum):
    """An int in [minimum, maximum]; a string of ASCII digits is read as one
    (inventory files in INI form give every value as a string)."""
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,18}", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(field, value, "must be a whole number")
    if not minimum <= value <= maximum:
        _fail(field, value, "is out of range (%d-%d)" % (minimum, maximum))
    return value


def port(value, field):
    return integer(value, field, 1, 65535)


# Fence epochs: every fence a consumer sees is epoch * 2**40 + the backend's
# counter (backends/epoch.py), so a switch to a new backend with the epoch one
# higher gives fences above all of the old backend's. The bound keeps every
# such fence below 2**53, the integers a JSON consumer (JavaScript, a double)
# holds exactly: (2**13 - 1) * 2**40 + (2**40 - 1) = 2**53 - 1. 40 bits of
# counter, not 32: etcd's counter is the cluster's revision, one per write
# of any key, and a busy lock cluster (a thousand runs a minute, a few
# writes each) passes 2**32 within two years, after which every grant of
# an epoch would be refused; 2**40 lasts centuries. 8191 switches remain.
FENCE_COUNTER_BITS = 40
MAX_FENCE_EPOCH = 2 ** 13 - 1


def fence_epoch(value, field="fence_epoch"):
    """A fence epoch: a whole number from 0 to MAX_FENCE_EPOCH (a string of
    digits is read as one, as for every integer)."""
    return integer(value, field, 0, MAX_FENCE_EPOCH)


def number(value, field, minimum, maximum):
    """A finite real number in [minimum, maximum]."""
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,12}(\.[0-9]{1,9})?", value):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(field, value, "must be a number")
    if not math.isfinite(value) or not minimum <= value <= maximum:
        _fail(field, value, "is out of range (%g-%g)" % (minimum, maximum))
    return float(value)


def duration(value, field, minimum=0.0, maximum=MAX_DURATION, positive=False):
    """Seconds (float) from 500ms, 90, 90s, 5m, 1h, 1d or a JSON number:
    ASCII digits only, finite, at least `minimum` (above 0 with `positive`),
    at most `maximum`."""
    hint = "is not a duration (use e.g. 500ms, 90, 90s, 5m, 1h)"
    if isinstance(value, bool):
        _fail(field, value, hint)
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            _fail(field, value, "is not a finite duration")
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.fullmatch(value)
        if not match:
            _fail(field, value, hint)
        whole, fraction, unit = match.groups()
        seconds = float(whole + "." + (fraction or "0")) * _UNITS[unit]
    else:
        _fail(field, value, hint)
    if seconds < 0:
        _fail(field, value, "is negative")
    if positive and seconds <= 0:
        _fail(field, value, "must be greater than 0")
    if seconds < minimum:
        _fail(field, value, "is below the minimum of %s" % format_duration(minimum))
    if seconds > maximum:
        _fail(field, value, "is above the maximum of %s" % format_duration(maximum))
    return seconds


# A slot's boundary as run ids show it (slots.run_id): UTC, whole seconds.
_BOUNDARY = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})Z")


def reason(value, field="--reason"):
    """Why an operator did something by hand (logged): text that says something."""
    text(value, field, 500)
    if not value.strip():
        raise ConfigError("%s: must say why" % field)
    return value


def moment(value, field):
    """Epoch seconds of a UTC moment written as 2026-11-27T05:00:00Z."""
    match = _BOUNDARY.fullmatch(value) if isinstance(value, str) else None
    if not match:
        _fail(field, value, "is not a moment such as 2026-11-27T05:00:00Z (UTC)")
    import datetime  # only a rerun and a pause read a date
    try:
        return datetime.datetime(*[int(part) for part in match.groups()], tzinfo=datetime.timezone.utc).timestamp()
    except ValueError:  # no February 30, no 25:00
        return _fail(field, value, "is not a valid date and time")


def pause_length(value, field, now):
    """How long a pause lasts, in seconds from `now` (the backend's clock,
    epoch seconds): a duration (2h), or the moment it ends
    (2026-11-27T05:00:00Z), at most 30 days ahead and in the future."""
    text(value, field, 64)
    if "T" in value:
        seconds = moment(value, field) - now
        if seconds <= 0:
            _fail(field, value, "is not in the future on the backend's clock")
        if seconds > MAX_DURATION:
            _fail(field, value, "is more than %s ahead: a pause lasts at most that" % format_duration(MAX_DURATION))
        return max(1.0, seconds)
    return duration(value, field, 1.0, MAX_DURATION, positive=True)


def rerun_slot(value, field, job, width):
    """The number of the slot `dlock run --rerun` names: its boundary as the
    run id writes it (2026-11-27T05:00:00Z), or the whole run id
    (JOB@2026-11-27T05:00:00Z, of this job), on a boundary of once_per
    (`width`, seconds; None: the job has none, and no slots to rerun)."""
    text(value, field, 64 + 1 + 20)
    if width is None:
        _fail(field, value, "names a slot, but job %s has no once_per: it has no slots to rerun" % job)
    name, at, stamp = value.rpartition("@")
    if at and name != job:
        _fail(field, value, "is a run id of another job (this is %s)" % job)
    if not _BOUNDARY.fullmatch(stamp):
        _fail(field, value, "is not a slot boundary such as 2026-11-27T05:00:00Z, or a run id %s@..." % job)
    seconds = moment(stamp, field)
    number = int(round(seconds / width))
    if abs(number * width - seconds) > 1e-6:
        _fail(field, value, "is not a boundary of the job's once_per (%s): a slot's boundary is a multiple of "
                            "it since 1970-01-01T00:00:00Z" % format_duration(width))
    return number


def format_duration(seconds):
    """Short human form used in messages: 250ms, 20s, 1.5s, 5m, 2h."""
    if seconds < 1:
        return "%dms" % round(seconds * 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return "%d%s" % (seconds // size, unit)
    return ("%.3f" % seconds).rstrip("0").rstrip(".") + "s"


# -- containers ---------------------------------------------------------------
def mapping(value, field):
    if not isinstance(value, dict):
        _fail(field, value, "must be a mapping")
    for key in value:
        if not isinstance(key, str):
            _fail(field, key, "has a key that is not a string")
    return value


def items(value, field, each, max_items=256, min_items=0):
    """A list (never a string) whose items each pass `each(item, field[i])`."""
    if not isinstance(value, list):
        _fail(field, value, "must be a list")
    if len(value) < min_items:
        raise ConfigError("%s: needs at least %d item%s" % (field, min_items, "" if min_items == 1 else "s"))
    if len(value) > max_items:
        raise ConfigError("%s: has more than %d items" % (field, max_items))
    return [each(item, "%s[%d]" % (field, index)) for index, item in enumerate(value)]


MAX_FILE_TEXT = 1024 * 1024


def file_text(value, field):
    """The text of a configuration file a role writes: a string (newlines and
    tabs allowed), at most 1 MiB, no NUL (no text format carries one)."""
    if not isinstance(value, str):
        _fail(field, value, "must be a string")
    if len(value) > MAX_FILE_TEXT:
        raise ConfigError("%s: is longer than %d characters" % (field, MAX_FILE_TEXT))
    if "\x00" in value:
        raise ConfigError("%s: holds a NUL character" % field)
    return value


FILE_MODE = re.compile(r"0?[0-7]{3}")


def file_mode(value, field):
    """A file's permission bits, written in octal as a string ("0644", "750"):
    never an int, which YAML would have read as decimal (644 is not 0o644).
    Set-id and sticky bits are refused: no file a role writes needs them but a
    directory's setgid, which is asked for in four digits ("2775")."""
    if isinstance(value, str) and re.fullmatch(r"2[0-7]{3}", value):
        return int(value, 8)
    text(value, field, 4, FILE_MODE, 'a mode in octal, as a quoted string such as "0644"', kind="mode")
    return int(value, 8)


def choice(value, field, choices):
    if not isinstance(value, str) or value not in choices:
        _fail(field, value, "must be one of %s" % ", ".join(choices))
    return value


# -- paths and addresses ------------------------------------------------------
def path(value, field):
    """An absolute, normalised path of plain characters (no white space,
    quotes, backslash, %, $ or ;): safe in every file format we render."""
    text(value, field, MAX_PATH)
    if not value.startswith("/"):
        _fail(field, value, "must be an absolute path")
    if not PATH_CHARS.fullmatch(value):
        _fail(field, value, "may hold only letters, digits and _ . , : + @ = / ~ - (no spaces, quotes, "
                            "backslash, %, $ or ;)")
    if posixpath.normpath(value) != value or value.startswith("//"):
        _fail(field, value, "is not normalised (no //, /./, /../ or trailing /)")
    return value


def _no_zone(value, field):
    """An IPv6 zone (fe80::1%eth0) names an interface of one host: it means
    nothing elsewhere, and its % is a specifier in systemd units."""
    if "%" in value:
        _fail(field, value, "holds a % (an IPv6 zone such as %eth0 is not allowed)")


def address(value, field):
    """An IPv4 or IPv6 address, in canonical form."""
    import ipaddress
    text(value, field, 64)
    _no_zone(value, field)
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        _fail(field, value, "is not an IP address")


def network(value, field):
    """An address or a network in CIDR form; a bare address means that host
    only (/32 or /128). Host bits set in a network are refused (a typo)."""
    import ipaddress
    text(value, field, 64)
    _no_zone(value, field)
    try:
        if "/" in value:
            return str(ipaddress.ip_network(value, strict=True))
        return str(ipaddress.ip_network(ipaddress.ip_address(value)))
    except ValueError as exc:
        _fail(field, value, "is not an address or network (%s)" % exc)


def hostname(value, field):
    """A DNS name (RFC 1123 labels), or an IP address."""
    import ipaddress
    text(value, field, 253)
    _no_zone(value, field)
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    labels = value[:-1].split(".") if value.endswith(".") else value.split(".")
    if not all(HOST_LABEL.fullmatch(label) for label in labels) or value.replace(".", "").isdigit():
        _fail(field, value, "is not a host name or IP address")
    return value


def host_or_network(value, field):
    """pg_hba's address column: an address, a CIDR network or a host name."""
    text(value, field, 253)
    if re.fullmatch(r"[0-9.]+(/[0-9]+)?|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(/[0-9]+)?", value):
        return network(value, field)
    return hostname(value, field)


# -- backend URLs -------------------------------------------------------------
SCHEMES = ("redis", "rediss", "postgresql", "postgresql+advisory", "etcd", "etcd+https", "file")
URL_HINT = "redis://, rediss://, postgresql://, postgresql+advisory://, etcd://, etcd+https:// or file://"
# Schemes whose URL may name several hosts (host1:port,host2:port): libpq
# tries them in turn, and the etcd backend tries the next member when one is down.
MULTI_HOST_SCHEMES = ("postgresql", "postgresql+advisory", "etcd", "etcd+https")
# Query parameters a URL may carry. Redis takes none (the usual client
# parameters would set timeouts and TLS checks, which are the runner's:
# op_timeout, ca_file). libpq's are limited to these.
PG_PARAMS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl", "target_session_attrs",
             "application_name", "channel_binding", "gssencmode", "passfile")
# etcd+https:// may name a TLS client certificate and its key (absolute paths,
# both or neither); the CA comes from ca_file as for every backend.
ETCD_PARAMS = ("cert", "key")
QUERY_PARAMS = {"postgresql": PG_PARAMS, "postgresql+advisory": PG_PARAMS, "etcd": (), "etcd+https": ETCD_PARAMS}
# The etcd key prefix (the URL's path) every lock key goes under: an etcd
# role's permission covers it. Plain path segments, no trailing slash.
ETCD_PREFIX = re.compile(r"(?:/[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}){1,8}")
ETCD_DEFAULT_PREFIX = "/dlock"
_SECRET_PARAM = re.compile(r"(?i)(?:^|[?&;])[a-z_]*pass(?:word|wd)?[a-z_]*=")


class BackendURL(object):
    """A checked backend URL: scheme, [(host, port)], path, query, user.
    path is the database (postgresql, without the /), the key prefix (etcd,
    /dlock when the URL has none) or the directory (file)."""

    def __init__(self, url, scheme, user, hosts, path_, query):
        self.url = url
        self.scheme = scheme
        self.user = user
        self.hosts = hosts
        self.path = path_
        self.query = query


def _split_url(url):
    """(scheme, netloc, path, query) by plain string splitting: nothing is
    decoded or interpreted before the credential check."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None, "", url, ""
    rest, _hash, _fragment = rest.partition("#")
    rest, _q, query = rest.partition("?")
    slash = rest.find("/")
    netloc, path_ = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    return scheme.lower(), netloc, path_, query


def _password_span(url):
    """(start, end) of a password in the URL's user part (user:PASSWORD@host),
    or None. Looked for on the raw string up to its last '@', before the URL
    is split: a password may hold '/', '?', '#' or '@' unencoded, and the
    split would then put it in the path or the query, where no check looks
    and every later message would show it. A ':' after a '/', '?', '#' or
    '@' is not a user's (user@host:port/db?sslrootcert=/a@b has none); the
    split netloc's user part is checked as well (backend_url, redact_url)."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, _host = rest.rpartition("@")
    user, colon, _password = userinfo.partition(":")
    if not (sep and at and colon) or re.search(r"[/?#@]", user):
        return None
    start = len(scheme) + len(sep) + len(user) + len(colon)
    return start, len(scheme) + len(sep) + len(userinfo)


def redact_url(url):
    """The URL with any password removed, for messages and logs."""
    if not isinstance(url, str):
        return shown(url)
    span = _password_span(url)
    if span:
        url = url[:span[0]] + "<redacted>" + url[span[1]:]
    scheme, netloc, path_, query = _split_url(url)
    if scheme is None:
        return shown(url) if ":" not in url and "@" not in url else "<not a URL>"
    userinfo, at, hostpart = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = userinfo.split(":", 1)[0] + ":<redacted>@" + hostpart
    if query:
        query = "&".join(p.split("=", 1)[0] + "=<redacted>" if _SECRET_PARAM.match("?" + p) else p
                         for p in re.split(r"[&;]", query))
    result = "%s://%s%s%s" % (scheme, netloc, path_, "?" + query if query else "")
    result = CONTROL.sub(lambda m: repr(m.group())[1:-1], result)
    return result if len(result) <= 200 else result[:197] + "..."


def backend_url(url, field="backend"):
    """Check a backend URL. Credentials are looked for first, on the raw
    string, so no later error can echo a password; errors show the URL with
    any password removed."""
    if not isinstance(url, str) or not url:
        raise ConfigError("%s: no backend: a backend URL is required (%s)" % (field, URL_HINT))
    scheme, netloc, path_, query = _split_url(url)
    userinfo, at, hostpart = netloc.rpartition("@")
    if _password_span(url) or (at and ":" in userinfo) or _SECRET_PARAM.search("?" + query):
        raise ConfigError("%s: the URL contains a password; put it in a password file "
                          "(password_file / --password-file) or a systemd credential instead" % field)
    shown_url = redact_url(url)
    if len(url) > 2048 or CONTROL.search(url) or " " in url:
        raise ConfigError("%s: %s holds a control character or space, or is too long" % (field, shown_url))
    if scheme is None:
        raise ConfigError("%s: %s is not a URL (use %s)" % (field, shown_url, URL_HINT))
    if scheme not in SCHEMES:
        raise ConfigError("%s: unsupported scheme %s (use one of %s)" % (field, shown(scheme), URL_HINT))
    if scheme == "file":
        if netloc or query:
            raise ConfigError("%s: %s must be file:///absolute/directory" % (field, shown_url))
        path(path_, "%s: path" % field)
        return BackendURL(url, scheme, None, [], path_, {})
    user, hosts = _user_and_hosts(scheme, userinfo if at else None, hostpart, field, shown_url)
    params = _query(query, scheme, field)
    return BackendURL(url, scheme, user, hosts, _server_path(scheme, path_, params, field, shown_url), params)


def _user_and_hosts(scheme, userinfo, hostpart, field, shown_url):
    """(the user, None if not named; the [(host, port)] list) of a server URL."""
    if not hostpart:
        raise ConfigError("%s: %s has no host" % (field, shown_url))
    user = None
    if userinfo is not None:
        user = text(userinfo, "%s: user" % field, 63, re.compile(r"[A-Za-z0-9_.-]+"),
                    "letters, digits and _ . -")
    entries = hostpart.split(",")
    if len(entries) > 1 and scheme not in MULTI_HOST_SCHEMES:
        raise ConfigError("%s: %s names several hosts; only postgresql:// and etcd:// take a list"
                          % (field, shown_url))
    return user, [_host_port(entry, "%s: host" % field, shown_url) for entry in entries]


def _server_path(scheme, path_, params, field, shown_url):
    """The URL's path as the backend reads it: Redis' database (the path as
    given), etcd's key prefix, PostgreSQL's database name (without the /)."""
    if scheme in ("redis", "rediss"):
        if path_ not in ("", "/") and not re.fullmatch(r"/[0-9]{1,5}", path_):
            raise ConfigError("%s: %s: the database must be a number (redis://host:port/0)" % (field, shown_url))
        if path_ not in ("", "/"):
            integer(path_[1:], "%s: database" % field, 0, 65535)
        return path_[1:]
    if scheme.startswith("etcd"):
        if path_ in ("", "/"):
            path_ = ETCD_DEFAULT_PREFIX
        if not ETCD_PREFIX.fullmatch(path_):
            raise ConfigError("%s: %s: the key prefix must be a path such as /dlock (segments of letters, "
                              "digits, _ . -; no trailing /)" % (field, shown_url))
        _etcd_client_cert(params, field)
        return path_
    if not re.fullmatch(r"/[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}", path_):
        raise ConfigError("%s: %s: name the database (postgresql://user@host/DATABASE; "
                          "letters, digits, _ . -)" % (field, shown_url))
    return path_[1:]


def _host_port(entry, field, shown_url):
    import ipaddress
    if entry.startswith("["):
        host, bracket, rest = entry[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ConfigError("%s: %s: bad IPv6 form (use [address]:port)" % (field, shown_url))
        _no_zone(host, field)
        try:
            host = str(ipaddress.IPv6Address(host))
        except ValueError:
            raise ConfigError("%s: %s: %s is not an IPv6 address" % (field, shown_url, shown(host)))
        port_text = rest[1:] if rest else None
    else:
        host, colon, port_text = entry.partition(":")
        if not colon:
            port_text = None
        if not host:
            raise ConfigError("%s: %s has no host" % (field, shown_url))
        host = hostname(host, field)
    if port_text is not None:
        if not re.fullmatch(r"[0-9]{1,5}", port_text):
            raise ConfigError("%s: %s: the port must be a number from 1 to 65535" % (field, shown_url))
        port(int(port_text), "%s: port" % field)
        return host, int(port_text)
    return host, None


def _query(query, scheme, field):
    if not query:
        return {}
    if scheme in ("redis", "rediss"):
        raise ConfigError("%s: redis URLs take no query parameters (timeouts and TLS checks are the runner's: "
                          "op_timeout, ca_file); use --ca-file for TLS" % field)
    allowed = QUERY_PARAMS[scheme]
    if not allowed:
        raise ConfigError("%s: %s:// URLs take no query parameters (a TLS client certificate needs "
                          "etcd+https://)" % (field, scheme))
    params = {}
    for part in re.split(r"&", query):
        name, eq, value = part.partition("=")
        if name not in allowed:
            raise ConfigError("%s: query parameter %s is not allowed (allowed: %s)"
                              % (field, shown(name), ", ".join(allowed)))
        if name in params:
            raise ConfigError("%s: query parameter %s is given twice" % (field, name))
        params[name] = text(value, "%s: %s" % (field, name), 1024, re.compile(r"[A-Za-z0-9_./:,-]+"),
                            "letters, digits and _ . / : , -")
    # A lock needs a server that takes writes: the engine always connects
    # with target_session_attrs=read-write (a multi-host URL then lands on the
    # primary), so a URL asking for anything else is refused, not overridden.
    if params.get("target_session_attrs", "read-write") != "read-write":
        raise ConfigError("%s: target_session_attrs=%s: dlock only uses a read-write server "
                          "(target_session_attrs=read-write, the default)" % (field, params["target_session_attrs"]))
    return params


def _etcd_client_cert(params, field):
    """cert and key of etcd+https://: absolute normalised paths, both or neither."""
    for name in ETCD_PARAMS:
        if name in params:
            path(params[name], "%s: %s" % (field, name))
    if len(params) == 1:
        raise ConfigError("%s: a TLS client certificate needs both cert= and key=" % field)


# -- JSON ---------------------------------------------------------------------
def _refuse_constant(name):
    raise ValueError("%s is not a number JSON allows" % name)


def _unique_keys(pairs):
    result = {}
    for key, value in pairs:
        if key in result:
            raise ValueError("the key %s appears twice" % shown(key))
        result[key] = value
    return result


# Our files nest four levels at most (a job's environment in a job file);
# Python's parser recurses, and '[' x 100000 ended in a RecursionError.
MAX_JSON_DEPTH = 32


def _depth(value):
    """How deep lists and objects nest in a parsed JSON value (walked
    without recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_json(text_):
    """json.loads, refusing duplicate keys, NaN/Infinity and nesting deeper
    than MAX_JSON_DEPTH (ValueError naming the problem)."""
    too_deep = "lists and objects nest deeper than %d levels" % MAX_JSON_DEPTH
    try:
        data = json.loads(text_, object_pairs_hook=_unique_keys, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError(too_deep) from None
    if _depth(data) > MAX_JSON_DEPTH:
        raise ValueError(too_deep)
    return data
