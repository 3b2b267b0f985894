"""Typed errors of the engine; each knows the runner's exit code and log result."""

# Exit codes of `dlock run`: a contract with the timers and alerts that read
# them (the README's "Exit codes" table lists them for operators).
EXIT_PAUSED = 72
EXIT_LOCKED = 73
EXIT_DUPLICATE = 74
EXIT_BACKEND = 75
EXIT_LOCK_LOST = 76
EXIT_CLOCK = 77
EXIT_CONFIG = 78


class DlockError(Exception):
    """Base class: message for humans, exit code and result for the runner."""

    exit_code = EXIT_BACKEND
    result = "backend_error"


class ConfigError(DlockError):
    """Bad configuration, flag or input; nothing was done."""

    exit_code = EXIT_CONFIG
    result = "config_error"


class MissingDriver(ConfigError):
    """The backend's Python driver is not installed."""

    def __init__(self, package, distro_package, url_scheme):
        self.package = package
        self.distro_package = distro_package
        super().__init__(
            "the %s backend needs the Python package '%s' (Debian/Ubuntu: apt install %s)"
            % (url_scheme, package, distro_package)
        )


class BackendError(DlockError):
    """The backend is unreachable or answered with an error."""


class AuthError(BackendError):
    """The backend refused our credentials."""


class OutcomeUnknown(BackendError):
    """A request whose outcome nobody can tell: it may have taken effect or
    not (sent with no answer: a timeout, a lost connection; or a PostgreSQL
    commit not known to be replicated). Each backend raises its own kind;
    the runner tells by this class a release that may have happened
    ("uncertain") from one that did not ("failed")."""


class ClockUnsafe(DlockError):
    """The local clock is too far from the backend's clock."""

    exit_code = EXIT_CLOCK
    result = "clock_unsafe"
