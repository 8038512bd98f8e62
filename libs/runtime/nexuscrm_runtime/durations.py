"""The one duration parser of every operator command: Go durations as ``datetime.timedelta``.

A duration is one or more decimal numbers, each with a unit, without spaces: ``30s``, ``5m``,
``1h30m``, ``500ms``, ``1.5s``, ``250us``. Units are Go's: ``ns``, ``us`` (or ``µs``), ``ms``,
``s``, ``m``, ``h``. Every flag that takes one wants a positive bound, so zero, a sign, a bare
number, an unknown unit and anything above Go's largest duration (about 2562047h) are usage
errors that name the bad value. ``parse_duration`` is an argparse ``type``: its error is an
``argparse.ArgumentTypeError``, which argparse reports with the usage exit code.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
from decimal import Decimal

NANOSECONDS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 MICRO SIGN
    "μs": 1_000,  # U+03BC GREEK SMALL LETTER MU, which Go accepts too
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
MAX_NANOSECONDS = 2**63 - 1  # Go's time.Duration is an int64 of nanoseconds
_PART = re.compile(r"(\d+\.?\d*|\.\d+)([^\d.]*)")
_EXAMPLES = "use a positive duration such as 30s, 5m, 1h30m or 500ms"


class InvalidDuration(argparse.ArgumentTypeError, ValueError):
    """A text that is not a positive Go duration; the message names the text and why."""

    def __init__(self, text: str, why: str) -> None:
        super().__init__(f"invalid duration {text!r}: {why}; {_EXAMPLES}")
        self.text = text


def parse_duration(text: str) -> dt.timedelta:
    """The positive ``timedelta`` a Go duration such as ``30s`` or ``1h30m`` names.

    Raises ``InvalidDuration`` for an empty text, a sign (negative durations), zero, a number
    without a unit, an unknown unit, a duration below one microsecond (the resolution of
    ``timedelta``) or above Go's maximum.
    """
    if not text:
        raise InvalidDuration(text, "empty")
    if text[0] in "+-":
        raise InvalidDuration(text, "a sign is not allowed (durations are positive)")
    total = Decimal(0)
    position = 0
    for match in _PART.finditer(text):
        if match.start() != position:
            break
        number, unit = match.groups()
        if not unit:
            raise InvalidDuration(text, f"missing unit after {number}")
        if unit not in NANOSECONDS:
            raise InvalidDuration(text, f"unknown unit {unit!r} (use ns, us, ms, s, m or h)")
        total += Decimal(number) * NANOSECONDS[unit]
        position = match.end()
    if position != len(text):
        raise InvalidDuration(text, f"cannot read {text[position:]!r}")
    if total > MAX_NANOSECONDS:
        raise InvalidDuration(text, "too long (overflow): at most 2562047h47m16.854775807s")
    microseconds = int((total / 1000).to_integral_value())
    if microseconds <= 0:
        raise InvalidDuration(text, "must be positive (at least 1us)")
    return dt.timedelta(microseconds=microseconds)


def whole_seconds(value: dt.timedelta | None) -> int:
    """``value`` in whole seconds for a field where 0 means "none": 0 for None, else at least 1.

    A sub-second duration is not rounded down to "none".
    """
    return 0 if value is None else max(1, round(value.total_seconds()))


def format_duration(value: dt.timedelta) -> str:
    """``value`` as Go prints a duration: ``1h30m0s``, ``5m0s``, ``1.5s``, ``300ms``, ``250µs``."""
    microseconds = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    if microseconds < 0:
        return "-" + format_duration(-value)
    if microseconds == 0:
        return "0s"
    if microseconds < 1_000:
        return f"{microseconds}µs"
    if microseconds < 1_000_000:
        return f"{_decimal(microseconds, 1_000)}ms"
    hours, rest = divmod(microseconds, 3600 * 1_000_000)
    minutes, rest = divmod(rest, 60 * 1_000_000)
    seconds = f"{_decimal(rest, 1_000_000)}s"
    if hours:
        return f"{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{minutes}m{seconds}"
    return seconds


def _decimal(amount: int, per_unit: int) -> str:
    whole, fraction = divmod(amount, per_unit)
    if not fraction:
        return str(whole)
    digits = len(str(per_unit)) - 1
    return f"{whole}.{fraction:0{digits}d}".rstrip("0")
