"""AMPS intervals (``30s``, ``1.5h``, ``7d``) and sizes (``5MB``) as milliseconds and bytes."""

from __future__ import annotations

import math
import re
from fractions import Fraction

# Exact fractions so that "1.1s" is 1100 ms, not 1100.0000000000002 truncated to 1100 or 1099.
_NS_PER_UNIT: dict[str, int] = {
    "ns": 1,
    "us": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3_600 * 1_000_000_000,
    "d": 86_400 * 1_000_000_000,
    "w": 7 * 86_400 * 1_000_000_000,
}
_NS_PER_MS = 1_000_000

_BYTES_PER_UNIT: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1024**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1024**4,
    "tib": 1024**4,
}

_QUANTITY = re.compile(r"(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[A-Za-z]*)")


def _split(text: str | int | float, what: str, example: str) -> tuple[Fraction, str]:
    """Number and lower-cased unit of ``text``, or a ValueError that quotes ``text``."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ValueError(f"{what} must be text like {example!r}, got {text!r}")
    raw = str(text).strip()
    if not raw:
        raise ValueError(f"{what} is empty: give a value like {example!r}")
    if raw.startswith("-"):
        raise ValueError(f"{what} {raw!r} is negative: it must be zero or more")
    match = _QUANTITY.fullmatch(raw)
    if match is None:
        raise ValueError(f"{what} {raw!r} is not a number with an optional unit, like {example!r}")
    return Fraction(match["number"]), match["unit"].lower()


def parse_interval(text: str | int | float) -> int:
    """Milliseconds in an AMPS interval such as ``30s``, ``1.5h`` or ``500 ms``.

    Units are ns, us, ms, s, m, h, d and w (any case); a bare number is seconds, as in AMPS. A
    non-zero interval shorter than a millisecond rounds up to 1 so it never turns into "none".
    """
    number, unit = _split(text, "interval", "30s")
    if unit == "":
        unit = "s"
    if unit not in _NS_PER_UNIT:
        units = ", ".join(_NS_PER_UNIT)
        raise ValueError(f"interval {str(text).strip()!r} has unknown unit {unit!r}: use {units}")
    return math.ceil(number * _NS_PER_UNIT[unit] / _NS_PER_MS)


def parse_size(text: str | int | float) -> int:
    """Bytes in an AMPS size such as ``5MB``, ``512KB`` or ``1GB`` (binary multiples, 1KB = 1024).

    A bare number is bytes. Only AMPS options that sowstream accepts and ignores use sizes today.
    """
    number, unit = _split(text, "size", "5MB")
    if unit not in _BYTES_PER_UNIT:
        raise ValueError(
            f"size {str(text).strip()!r} has unknown unit {unit!r}: use B, KB, MB, GB or TB"
        )
    return math.ceil(number * _BYTES_PER_UNIT[unit])
