"""Lock options of a job: parsing, derived defaults and the safety rule.

The safety rule (the README states it for operators): a runner that cannot
renew must have killed its job before the lease can expire on the backend, so
    renew_every + op_timeout + kill_grace + clock margin < ttl,
where the clock margin, on a backend that counts the TTL on its server's wall
clock (Redis, PostgreSQL's lease table), includes 2 x max_clock_skew: see
clock_margin().
"""

from . import validate
from .blackout import check_blackout
from .errors import (EXIT_BACKEND, EXIT_CLOCK, EXIT_CONFIG, EXIT_DUPLICATE, EXIT_LOCK_LOST, EXIT_LOCKED, EXIT_PAUSED,
                     ConfigError)
from .validate import MAX_DURATION, format_duration

# Names of the overridable exit codes (job option `exit_codes`).
DEFAULT_EXIT_CODES = {
    "locked": EXIT_LOCKED,
    "duplicate": EXIT_DUPLICATE,
    "paused": EXIT_PAUSED,
    "backend_error": EXIT_BACKEND,
    "lock_lost": EXIT_LOCK_LOST,
    "clock_unsafe": EXIT_CLOCK,
    "config_error": EXIT_CONFIG,
}

MIN_TTL = 1.0
# etcd counts a lease's TTL in whole seconds (the backend rounds ttl up, which
# is safe: the lease then outlives the runner's deadline) and silently
# lengthens any TTL below its minimum, 1.5 election timeouts (1.5s with
# etcd's defaults): a ttl under 2s would promise a takeover after a crash
# that etcd does not give.
BACKEND_MIN_TTL = {"etcd": 2.0, "etcd+https": 2.0}
# Backends whose server counts a lease's TTL on its wall clock: Redis
# (PEXPIRE) and PostgreSQL's lease table (expires_at against
# clock_timestamp()). A step of that clock moves every live lease's expiry.
# etcd counts leases on its leader's monotonic clock, postgresql+advisory holds
# a session lock with no TTL on the server, file:// has no server clock.
WALL_CLOCK_SCHEMES = ("redis", "rediss", "postgresql")


def counts_on_wall_clock(scheme):
    """Whether a lease on `scheme` expires by its server's wall clock. None (the
    backend is not known yet, e.g. a job rendered without its URL) counts as
    yes: the stricter rule."""
    return scheme is None or scheme in WALL_CLOCK_SCHEMES


def clock_margin(ttl, max_clock_skew=0.0, wall_clock=False):
    """How much earlier than the lease's earliest expiry the job must be dead.

    2% of the TTL, at least 100ms: slack for rate differences between our
    monotonic clock and the backend's, and for the scheduling of the kill.
    Plus, on a backend counting on its wall clock, 2 x max_clock_skew: the
    clock check sees the server's clock only before the grant and accepts
    an offset up to max_clock_skew either way, so a correction from -skew to
    +skew while the lease lives passes every check and takes up to
    2 x max_clock_skew off the lease."""
    return max(0.1, ttl * 0.02) + (2 * max_clock_skew if wall_clock else 0.0)


def check_backend_ttl(ttl, scheme, field="ttl"):
    """A checked ttl (seconds) against the backend's own minimum, once both are known."""
    minimum = BACKEND_MIN_TTL.get(scheme, MIN_TTL)
    if ttl < minimum:
        raise ConfigError("%s: %s is below the minimum of %s for %s:// (its leases last whole seconds, "
                          "at least 1.5 election timeouts)" % (field, format_duration(ttl), format_duration(minimum),
                                                               scheme))
    return ttl


def check_exit_codes(codes, field):
    """The job option `exit_codes`: known names to codes 0-255."""
    validate.mapping(codes, field)
    for name, code in codes.items():
        if name not in DEFAULT_EXIT_CODES:
            raise ConfigError("%s: unknown name %s (known: %s)"
                              % (field, validate.shown(name), ", ".join(sorted(DEFAULT_EXIT_CODES))))
        if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
            raise ConfigError("%s.%s: %s is not an exit code (0-255)" % (field, name, validate.shown(code)))
    return codes


CONTENTION_MODES = ("skip", "wait")


class Option(object):
    """One lock option, as every source gives it: a flag of `dlock run`, a
    job file, the global file's `defaults` (and the roles, through
    LockOptions). `parse(raw, field)` checks a raw value on its own and
    returns it parsed; `default` is its value when not set (a function of
    the ttl for the derived ones); `flag`, the argparse keywords of its flag,
    None for an option the files alone set."""

    def __init__(self, name, parse, default, flag=None):
        self.name = name
        self.parse = parse
        self.default = default
        self.flag = flag

    def default_for(self, ttl):
        return self.default(ttl) if callable(self.default) else self.default


class DurationOption(Option):
    """A duration, in seconds: at least `minimum`, above 0 if `positive`, at
    most validate.MAX_DURATION (30 days); a whole number of seconds if
    `whole`."""

    def __init__(self, name, minimum, positive, default, flag, whole=False):
        Option.__init__(self, name, self._parse, default, flag)
        self.minimum = minimum
        self.positive = positive
        self.whole = whole

    def _parse(self, raw, field):
        seconds = validate.duration(raw, field, self.minimum, MAX_DURATION, self.positive)
        if self.whole and seconds != int(seconds):
            raise ConfigError("%s: %s is not a whole number of seconds" % (field, validate.shown(raw)))
        return seconds


def _contention(raw, field):
    return validate.choice(raw, field, CONTENTION_MODES)


# The fleet-wide history (backends/base.py): how many of a job's entries the
# backend keeps; 0 keeps none (and writes none).
HISTORY_DEFAULT = 50
HISTORY_MAX = 1000


def _history(raw, field):
    return validate.integer(raw, field, 0, HISTORY_MAX)


# What a job does with the slots a fleet missed (history.py): skip them
# (the default), run the latest of them, or all of them, oldest first; only
# those that ended within `window` of now, at most `max`. The window is at
# most 7 days: the slots' markers then live window + 1.5 x once_per
# (slots.marker_ttl, at most MAX_MARKER_TTL), so a slot that ran is never
# run again by a catch-up.
CATCH_UP_POLICIES = ("skip", "latest", "all")
MAX_MARKER_TTL = 1.5 * MAX_DURATION  # the longest a backend keeps a slot's marker (base.lease_ms's bound)
CATCH_UP_KEYS = ("policy", "window", "max")
MAX_CATCH_UP_WINDOW = 7 * 86400.0
MAX_CATCH_UP_RUNS = 100


def check_catch_up(raw, field):
    """The job option `catch_up`: {policy, window (default 1d), max (default 1
    for latest, 10 for all)}, normalised to those three keys."""
    validate.mapping(raw, field)
    for name in raw:
        if name not in CATCH_UP_KEYS:
            raise ConfigError("%s: unknown key %s (known: %s)" % (field, validate.shown(name), ", ".join(CATCH_UP_KEYS)))
    policy = validate.choice(raw.get("policy", "skip"), "%s.policy" % field, CATCH_UP_POLICIES)
    window = validate.duration(raw.get("window", "1d"), "%s.window" % field, 1.0, MAX_CATCH_UP_WINDOW, positive=True)
    most = validate.integer(raw.get("max", 1 if policy == "latest" else 10), "%s.max" % field, 1, MAX_CATCH_UP_RUNS)
    if policy == "latest" and most != 1:
        raise ConfigError("%s.max: latest runs one slot, the newest; %d slots is policy all" % (field, most))
    return {"policy": policy, "window": window, "max": most}


# Every lock option, the one list of them, in the order `dlock run --help`
# shows their flags. Derived defaults keep short TTLs valid without extra
# settings, on every backend (with the 2 x max_clock_skew of a wall-clock
# backend: 1/3 + 1/5 + 1/10 + 2/20 of the ttl, plus the 2% margin).
LOCK_OPTIONS = (
    DurationOption("ttl", MIN_TTL, True, 60.0,
                   {"metavar": "DUR", "help": "lease length on the backend (default 60s)"}),
    DurationOption("renew_every", 0.0, True, lambda ttl: ttl / 3,
                   {"metavar": "DUR", "help": "renewal interval (default ttl/3)"}),
    Option("on_contention", _contention, "skip",
           {"choices": CONTENTION_MODES, "help": "when the lock is busy (default skip)"}),
    DurationOption("wait_timeout", 0.0, False, 300.0,
                   {"metavar": "DUR", "help": "with wait: give up after (default 5m)"}),
    DurationOption("min_hold", 0.0, False, 0.0,
                   {"metavar": "DUR", "help": "keep the lock at least this long after start"}),
    # Whole seconds: slots start on whole seconds since the epoch, as their
    # run ids (slots.boundary) and the backends' millisecond arithmetic say.
    DurationOption("once_per", 1.0, True, None,
                   {"metavar": "DUR", "help": "run at most once per slot of this width (whole seconds)"}, whole=True),
    DurationOption("max_runtime", 0.0, True, None,
                   {"metavar": "DUR", "help": "terminate the job after this long"}),
    DurationOption("kill_grace", 0.0, False, lambda ttl: min(10.0, ttl / 5),
                   {"metavar": "DUR", "help": "SIGTERM to SIGKILL delay (default min(10s, ttl/5))"}),
    DurationOption("max_clock_skew", 0.0, False, lambda ttl: min(2.0, ttl / 20),
                   {"metavar": "DUR", "help": "refuse beyond this offset (default min(2s, ttl/20))"}),
    DurationOption("op_timeout", 0.0, True, lambda ttl: min(2.0, ttl / 10),
                   {"metavar": "DUR", "help": "one backend call's bound (default min(2s, ttl/10))"}),
    Option("fail_open", validate.boolean, False,
           {"action": "store_const", "const": True,
            "help": "run WITHOUT a lock when the backend or clock fails (loud; default: fail closed)"}),
    Option("history", _history, HISTORY_DEFAULT,
           {"metavar": "N", "help": "entries of the job's fleet-wide history the backend keeps "
                                    "(default %d, at most %d; 0: none)" % (HISTORY_DEFAULT, HISTORY_MAX)}),
    # Job files and `defaults` only (a mapping).
    Option("catch_up", check_catch_up, None),
    # The windows whose slots do not run (blackout.py); job files and `defaults` only (a list).
    Option("blackout", check_blackout, None),
    # Merged over DEFAULT_EXIT_CODES; job files and `defaults` only.
    Option("exit_codes", check_exit_codes, None),
)
OPTIONS_BY_NAME = dict((option.name, option) for option in LOCK_OPTIONS)
# The durations first, as the files' error messages have always listed them.
DURATION_OPTIONS = tuple(o.name for o in LOCK_OPTIONS if isinstance(o, DurationOption))
OPTION_NAMES = DURATION_OPTIONS + tuple(o.name for o in LOCK_OPTIONS if o.name not in DURATION_OPTIONS)


def parse_option(name, raw, field):
    """One option's raw value checked on its own (type and bounds), parsed."""
    option = OPTIONS_BY_NAME.get(name)
    if option is None:
        raise ConfigError("%s: unknown option" % field)
    return option.parse(raw, field)


class LockOptions(object):
    """Validated lock options, all durations in seconds (None = not set).

    Built from raw values (numbers or text such as 90s): each is parsed once,
    by its option's check, then the options are checked together (the
    safety rule). `scheme`: the backend's URL scheme, None when not known:
    see counts_on_wall_clock()."""

    def __init__(self, scheme=None, **values):
        # Every value given is parsed here, whatever built this object: a NaN
        # compares false with everything and would slip through the budget rule.
        parsed = {}
        for name, raw in values.items():
            if raw is not None:
                parsed[name] = parse_option(name, raw, name)
        ttl = parsed.get("ttl", 60.0)
        for option in LOCK_OPTIONS:
            setattr(self, option.name, parsed.get(option.name, option.default_for(ttl)))
        self.scheme = scheme
        self.exit_codes = dict(DEFAULT_EXIT_CODES)
        self.exit_codes.update(parsed.get("exit_codes") or {})
        self.check_budget()
        self.check_catch_up()
        if self.blackout is not None and self.once_per is None:
            raise ConfigError("blackout: a window blacks out slots, judged by their boundaries on the backend's "
                              "clock (blackout.py); give the job once_per")

    @property
    def wall_clock(self):
        return counts_on_wall_clock(self.scheme)

    @property
    def margin(self):
        """The whole margin of the deadline (deadline.py) and of the budget rule."""
        return clock_margin(self.ttl, self.max_clock_skew, self.wall_clock)

    def check_budget(self):
        """The safety rule, the one place it is written (module docstring)."""
        budget = self.renew_every + self.op_timeout + self.kill_grace + self.margin
        if budget < self.ttl:
            return
        terms = [("renew_every", self.renew_every), ("op_timeout", self.op_timeout),
                 ("kill_grace", self.kill_grace), ("clock margin", clock_margin(self.ttl))]
        why = ""
        if self.wall_clock:
            terms.append(("2 x max_clock_skew", 2 * self.max_clock_skew))
            who = ("%s:// counts" % self.scheme if self.scheme else
                   "the backend is not known here, so the rule of Redis and PostgreSQL applies: they count")
            why = (" (%s the lease on the server's wall clock, and a step of that clock within max_clock_skew "
                   "either way takes up to 2 x max_clock_skew off a live lease)" % who)
        raise ConfigError(
            "%s = %s must be below ttl (%s): a runner that cannot renew could not stop its job before the lease "
            "expires%s; raise ttl or lower the others"
            % (" + ".join("%s (%s)" % (name, format_duration(value)) for name, value in terms),
               format_duration(budget), format_duration(self.ttl), why))

    @property
    def catches_up(self):
        """Whether missed slots are run (catch_up's policy latest or all)."""
        return self.catch_up is not None and self.catch_up["policy"] != "skip"

    def check_catch_up(self):
        if not self.catches_up:
            return
        if self.once_per is None:
            raise ConfigError("catch_up: policy %s needs once_per: the slots it catches up are once_per's"
                              % self.catch_up["policy"])
        window = self.catch_up["window"]
        if window + 1.5 * self.once_per > MAX_MARKER_TTL:
            raise ConfigError("catch_up.window: %s with once_per %s would keep each slot's marker %s (window + "
                              "1.5 x once_per, so that a slot that ran is never caught up), above the %s a "
                              "backend keeps one; shorten the window" % (
                                  format_duration(window), format_duration(self.once_per),
                                  format_duration(window + 1.5 * self.once_per), format_duration(MAX_MARKER_TTL)))

    @classmethod
    def from_mapping(cls, values, where, scheme=None):
        """Options from a dict of raw values (JSON file or flags; None: not
        given); `where` prefixes errors; `scheme`, the backend's, None when
        not known (the stricter rule)."""
        try:
            return cls(scheme=scheme, **values)
        except ConfigError as exc:
            raise ConfigError("%s: %s" % (where, exc) if where else str(exc))

    @staticmethod
    def parse_values(values, where):
        """Each option checked on its own (type and bounds), not yet together:
        the parsed values of those given."""
        return dict((name, parse_option(name, raw, "%s: %s" % (where, name) if where else name))
                    for name, raw in values.items() if raw is not None)
