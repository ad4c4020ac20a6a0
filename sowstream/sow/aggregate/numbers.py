"""Number rules every aggregate shares: what counts as a number, and what JSON can carry out."""

from __future__ import annotations

import math
from typing import Any

from sowstream.filters.values import to_number

__all__ = ["finite_number", "json_int", "output_number"]


def json_int(value: int) -> int | str:
    """An int as orjson can carry it: 64-bit integers as they are, larger ones as decimal text."""
    return value if -(2**63) <= value < 2**64 else str(value)


def output_number(value: int | float) -> int | float:
    """A result number that JSON can carry: an int beyond 64 bits becomes a float."""
    if isinstance(value, int) and not -(2**63) <= value < 2**64:
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    return value


def finite_number(value: Any) -> int | float | None:
    """The finite number ``value`` stands for (numeric strings included), else None."""
    number = to_number(value)
    if number is None or (isinstance(number, float) and not math.isfinite(number)):
        return None
    return number
