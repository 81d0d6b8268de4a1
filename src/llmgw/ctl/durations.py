"""Durations on the command line: `30d`, `12h`, `1h30m` (units s, m, h, d, w).

Standard library only: `main.py` uses it as an argparse `type`, so a bad
`--since` is a bad command line (exit 2, with the usage) before any command
module is imported.
"""

from __future__ import annotations

import argparse
import re

# How far back `usage --since` may reach: the controller's bound (wire.usage.MAX_SINCE_S,
# ten years), repeated because argparse uses this module before msgspec is imported;
# tests/unit/test_ctl_durations.py keeps the two equal. Past it the controller would
# refuse the call, in seconds and under its own parameter's name.
MAX_SINCE_S = 10 * 366 * 86_400

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def duration_problem(text: str) -> str | None:
    """Why `text` is not a duration above 0, or None when it is one."""
    given = text.strip()
    parts = _DURATION.findall(given)
    if not given or "".join(n + u for n, u in parts) != given:
        return "not a duration; use a number and a unit (s, m, h, d, w), e.g. 30d or 12h"
    if seconds_of(given) <= 0:
        return "must be above 0"
    return None


def seconds_of(text: str) -> float:
    """Seconds in a duration that `duration_problem` accepted."""
    return sum(float(n) * _UNITS[u] for n, u in _DURATION.findall(text.strip()))


def duration_arg(text: str) -> float:
    """argparse `type=`: seconds, or the reason as an ArgumentTypeError (exit 2)."""
    why = duration_problem(text)
    if why is not None:
        raise argparse.ArgumentTypeError(f"{text!r}: {why}")
    return seconds_of(text)


def since_arg(text: str) -> float:
    """argparse `type=` of `usage --since`: a duration of at most MAX_SINCE_S."""
    seconds = duration_arg(text)
    if seconds > MAX_SINCE_S:
        raise argparse.ArgumentTypeError(f"{text!r}: at most {MAX_SINCE_S // 86_400}d (ten years)")
    return seconds
