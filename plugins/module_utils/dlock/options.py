"""Lock options of a job: parsing, derived defaults and the safety rule.

The safety rule (DESIGN.md section 5): a runner that cannot renew must have
killed its job before the lease can expire on the backend, so
    renew_every + op_timeout + kill_grace + clock margin < ttl.
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


def clock_margin(ttl):
    """Slack for rate differences between our monotonic clock and the backend's
    clock, and for scheduling delay of the kill: 2% of the TTL, at least 100ms."""
    return max(0.1, ttl * 0.02)


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
                 max_clock_skew=2.0, op_timeout=None, fail_open=False, exit_codes=None):
        self.ttl = ttl
        # Derived defaults keep short TTLs valid without extra settings.
        self.renew_every = renew_every if renew_every is not None else ttl / 3
        self.kill_grace = kill_grace if kill_grace is not None else min(10.0, ttl / 5)
        self.op_timeout = op_timeout if op_timeout is not None else min(2.0, ttl / 10)
        self.on_contention = on_contention
        self.wait_timeout = wait_timeout if wait_timeout is not None else 300.0
        self.min_hold = min_hold
        self.once_per = once_per
        self.max_runtime = max_runtime
        self.max_clock_skew = max_clock_skew
        self.fail_open = fail_open
        self.exit_codes = dict(DEFAULT_EXIT_CODES)
        self.exit_codes.update(exit_codes or {})
        self.validate()

    @property
    def margin(self):
        return clock_margin(self.ttl)

    def validate(self):
        # Every duration again, whatever built this object: a NaN compares
        # false with everything and would slip through the budget rule below.
        for name, (minimum, positive) in DURATION_BOUNDS.items():
            value = getattr(self, name)
            if value is not None:
                validate.duration(value, name, minimum, MAX_DURATION, positive)
        validate.choice(self.on_contention, "on_contention", ("skip", "wait"))
        validate.boolean(self.fail_open, "fail_open")
        budget = self.renew_every + self.op_timeout + self.kill_grace + self.margin
        if budget >= self.ttl:
            raise ConfigError(
                "renew_every (%s) + op_timeout (%s) + kill_grace (%s) + clock margin (%s) = %s "
                "must be below ttl (%s): a runner that cannot renew could not stop its job "
                "before the lease expires; raise ttl or lower the others"
                % tuple(format_duration(v) for v in (
                    self.renew_every, self.op_timeout, self.kill_grace, self.margin, budget, self.ttl))
            )
        check_exit_codes(self.exit_codes, "exit_codes")

    @classmethod
    def from_mapping(cls, values, where):
        """Options from a dict of raw values (JSON file or flags); `where` prefixes errors."""
        kwargs = cls.parse_values(values, where)
        try:
            return cls(**kwargs)
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
