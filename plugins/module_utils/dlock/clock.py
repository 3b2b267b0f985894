"""Local clock against the backend's clock, and chrony's view when present."""

import os
import time

from .errors import ClockUnsafe


def measure_offset(backend):
    """(offset, rtt) in seconds; offset > 0 means the backend's clock is ahead.
    A reading R seconds coarse (backend.clock_resolution) is as uncertain as
    a round trip R seconds longer, so rtt includes it."""
    wall = time.time()
    start = time.monotonic()
    server = backend.server_time()
    rtt = time.monotonic() - start
    return server - (wall + rtt / 2), rtt + backend.clock_resolution


def check_offset(offset, rtt, max_skew):
    """Refuse when the offset, less what the round trip leaves uncertain, is over the bound."""
    if abs(offset) - rtt / 2 > max_skew:
        raise ClockUnsafe("clock unsafe: local clock is %.3fs %s the backend's (bound %.3fs); "
                          "check time sync (chronyc tracking)"
                          % (abs(offset), "behind" if offset > 0 else "ahead of", max_skew))


def chrony_tracking():
    """chronyc's tracking as a dict, or None when chronyc is absent or fails."""
    import shutil  # only check-clock and metrics need these; `run` stays lean
    import subprocess
    chronyc = shutil.which("chronyc")
    if chronyc is None:
        return None
    try:
        out = subprocess.run([chronyc, "-c", "tracking"], capture_output=True, text=True, timeout=5,
                             env=dict(os.environ, LC_ALL="C"), check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = out.stdout.strip().split(",")
    if out.returncode != 0 or len(fields) < 14:
        return {"error": (out.stderr or out.stdout).strip() or "chronyc failed"}
    return {
        "reference": fields[1] or fields[0],
        "stratum": int(fields[2]),
        "system_time_offset": float(fields[4]),
        "leap_status": fields[13],
        "synchronised": fields[13] != "Not synchronised",
    }


def assess(backend, max_skew):
    """The whole clock check (dlock check-clock, dlock metrics): offset to the
    backend, chrony's state, and whether the clock is safe, as a dict."""
    offset, rtt = measure_offset(backend)
    chrony = chrony_tracking()
    problems = []
    try:
        check_offset(offset, rtt, max_skew)
    except ClockUnsafe as exc:
        problems.append(str(exc))
    if chrony and chrony.get("synchronised") is False:
        problems.append("chrony: not synchronised")
    return {"offset_seconds": round(offset, 6), "rtt_seconds": round(rtt, 6), "max_skew_seconds": max_skew,
            "chrony": chrony, "safe": not problems, "problems": problems, "checked_at": time.time()}
