"""Durations as operators write them: 500ms, 90, 90s, 5m, 1h, 1d.

The rule itself lives in the validation core (validate.duration); this name
stays for the callers that only read durations.
"""

from .validate import MAX_DURATION, format_duration  # noqa: F401  (re-exported)
from .validate import duration as _duration


def parse_duration(value, field, minimum=0.0, maximum=MAX_DURATION, positive=False):
    """Seconds (float) from a duration; `field` names the option in errors."""
    return _duration(value, field, minimum, maximum, positive)
