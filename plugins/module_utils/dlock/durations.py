"""Durations as operators write them: 500ms, 90, 90s, 5m, 1h, 1d."""

import re

from .errors import ConfigError

_UNITS = {"ms": 0.001, "s": 1.0, "": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|)\s*$")


def parse_duration(value, field):
    """Seconds (float) from a duration; `field` names the option in errors."""
    if isinstance(value, bool):
        raise ConfigError("%s: %r is not a duration (use e.g. 500ms, 90, 90s, 5m, 1h)" % (field, value))
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _PATTERN.match(str(value))
        if not match:
            raise ConfigError("%s: %r is not a duration (use e.g. 500ms, 90, 90s, 5m, 1h)" % (field, value))
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds < 0:
        raise ConfigError("%s: %r is negative" % (field, value))
    return seconds


def format_duration(seconds):
    """Short human form used in messages: 250ms, 20s, 1.5s, 5m, 2h."""
    if seconds < 1:
        return "%dms" % round(seconds * 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return "%d%s" % (seconds // size, unit)
    return ("%.3f" % seconds).rstrip("0").rstrip(".") + "s"
