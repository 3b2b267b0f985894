"""Lock options of a job: parsing, derived defaults and the safety rule.

The safety rule (the README states it for operators): a runner that cannot
renew must have killed its job before the lease can expire on the backend, so
    renew_every + op_timeout + kill_grace + clock margin < ttl,
where the clock margin, on a backend that counts the TTL on its server's wall
clock (Redis, PostgreSQL's lease table), includes 2 x max_clock_skew: see
clock_margin().
"""

from . import validate
from .errors import EXIT_BACKEND, EXIT_CLOCK, EXIT_CONFIG, EXIT_DUPLICATE, EXIT_LOCK_LOST, EXIT_LOCKED, ConfigError
from .validate import MAX_DURATION, format_duration

DURATION_OPTIONS = (
    "ttl", "renew_every", "wait_timeout", "min_hold", "once_per",
    "max_runtime", "kill_grace", "max_clock_skew", "op_timeout",
)
OPTION_NAMES = DURATION_OPTIONS + ("on_contention", "fail_open", "exit_codes")

# Names of the overridable exit codes (job option `exit_codes`).
DEFAULT_EXIT_CODES = {
    "locked": EXIT_LOCKED,
    "duplicate": EXIT_DUPLICATE,
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
# Bounds of each duration option: (minimum, must be above 0). Every one is at
# most validate.MAX_DURATION (30 days).
DURATION_BOUNDS = {
    "ttl": (MIN_TTL, True),
    "renew_every": (0.0, True),
    "op_timeout": (0.0, True),
    "kill_grace": (0.0, False),
    "wait_timeout": (0.0, False),
    "min_hold": (0.0, False),
    "once_per": (1.0, True),
    "max_runtime": (0.0, True),
    "max_clock_skew": (0.0, False),
}


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


class LockOptions(object):
    """Validated lock options, all durations in seconds (None = not set)."""

    def __init__(self, ttl=60.0, renew_every=None, on_contention="skip", wait_timeout=None,
                 min_hold=0.0, once_per=None, max_runtime=None, kill_grace=None,
                 max_clock_skew=None, op_timeout=None, fail_open=False, exit_codes=None, scheme=None):
        self.ttl = ttl
        # Derived defaults keep short TTLs valid without extra settings, on
        # every backend (with the 2 x max_clock_skew of a wall-clock backend:
        # 1/3 + 1/5 + 1/10 + 2/20 of the ttl, plus the 2% margin).
        self.renew_every = renew_every if renew_every is not None else ttl / 3
        self.kill_grace = kill_grace if kill_grace is not None else min(10.0, ttl / 5)
        self.op_timeout = op_timeout if op_timeout is not None else min(2.0, ttl / 10)
        self.max_clock_skew = max_clock_skew if max_clock_skew is not None else min(2.0, ttl / 20)
        # The backend's URL scheme, None when not known: see counts_on_wall_clock().
        self.scheme = scheme
        self.on_contention = on_contention
        self.wait_timeout = wait_timeout if wait_timeout is not None else 300.0
        self.min_hold = min_hold
        self.once_per = once_per
        self.max_runtime = max_runtime
        self.fail_open = fail_open
        self.exit_codes = dict(DEFAULT_EXIT_CODES)
        self.exit_codes.update(exit_codes or {})
        self.validate()

    @property
    def wall_clock(self):
        return counts_on_wall_clock(self.scheme)

    @property
    def margin(self):
        """The whole margin of the deadline (deadline.py) and of the budget rule."""
        return clock_margin(self.ttl, self.max_clock_skew, self.wall_clock)

    def validate(self):
        # Every duration again, whatever built this object: a NaN compares
        # false with everything and would slip through the budget rule below.
        for name, (minimum, positive) in DURATION_BOUNDS.items():
            value = getattr(self, name)
            if value is not None:
                validate.duration(value, name, minimum, MAX_DURATION, positive)
        validate.choice(self.on_contention, "on_contention", ("skip", "wait"))
        validate.boolean(self.fail_open, "fail_open")
        self.check_budget()
        check_exit_codes(self.exit_codes, "exit_codes")

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

    @classmethod
    def from_mapping(cls, values, where, scheme=None):
        """Options from a dict of raw values (JSON file or flags); `where` prefixes
        errors; `scheme`, the backend's, None when not known (the stricter rule)."""
        kwargs = cls.parse_values(values, where)
        try:
            return cls(scheme=scheme, **kwargs)
        except ConfigError as exc:
            raise ConfigError("%s: %s" % (where, exc) if where else str(exc))

    @staticmethod
    def parse_values(values, where):
        """Each option checked on its own (type and bounds), not yet together."""
        kwargs = {}
        for name, raw in values.items():
            if raw is None:
                continue
            field = "%s: %s" % (where, name) if where else name
            if name in DURATION_BOUNDS:
                minimum, positive = DURATION_BOUNDS[name]
                kwargs[name] = validate.duration(raw, field, minimum, MAX_DURATION, positive)
            elif name == "fail_open":
                kwargs[name] = validate.boolean(raw, field)
            elif name == "on_contention":
                kwargs[name] = validate.choice(raw, field, ("skip", "wait"))
            elif name == "exit_codes":
                kwargs[name] = check_exit_codes(raw, field)
            else:
                raise ConfigError("%s: unknown option" % field)
        return kwargs
