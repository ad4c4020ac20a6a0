"""The aggregate functions of aggregated queries: a working state per group, its JSON form in
partials, how two states merge and the result a state gives (rules: ``sowstream.sow.aggregate``).
"""

from __future__ import annotations

import math
from typing import Any

from sowstream.filters.values import canonical_text, to_number

__all__ = ["AGGREGATE_FUNCTIONS", "STATES", "AggregateState", "finite_number", "output_number"]

AGGREGATE_FUNCTIONS: tuple[str, ...] = ("AVG", "COUNT", "COUNT_DISTINCT", "MAX", "MIN", "SUM")


def _json_int(value: int) -> int | str:
    # orjson carries 64-bit integers only; larger ones travel as decimal text.
    return value if -(2**63) <= value < 2**64 else str(value)


def _from_json_int(value: Any) -> int:
    if isinstance(value, str):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(f"malformed partials: expected an integer, got {value!r}")


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


class AggregateState:
    """One aggregate function: a working state per group, its JSON form, merge and result."""

    def new(self) -> Any:
        raise NotImplementedError

    def add(self, state: Any, value: Any) -> Any:
        """Fold one non-NULL, single value into ``state``; returns the (possibly new) state."""
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def encode(self, state: Any) -> Any:
        raise NotImplementedError

    def decode(self, data: Any) -> Any:
        raise NotImplementedError

    def result(self, state: Any) -> Any:
        raise NotImplementedError


class _Count(AggregateState):
    def new(self) -> int:
        return 0

    def add(self, state: int, value: Any) -> int:
        return state + 1

    def merge(self, a: int, b: int) -> int:
        return a + b

    def encode(self, state: int) -> int:
        return state

    def decode(self, data: Any) -> int:
        return _from_json_int(data)

    def result(self, state: int) -> int:
        return state


class _CountDistinct(AggregateState):
    def new(self) -> set[str]:
        return set()

    def add(self, state: set[str], value: Any) -> set[str]:
        state.add(canonical_text(value))
        return state

    def merge(self, a: set[str], b: set[str]) -> set[str]:
        return a | b

    def encode(self, state: set[str]) -> list[str]:
        return sorted(state)

    def decode(self, data: Any) -> set[str]:
        if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
            raise ValueError(f"malformed partials: expected a list of texts, got {data!r}")
        return set(data)

    def result(self, state: set[str]) -> int:
        return len(state)


class _Exact:
    """A count of numbers and their exact sum ``m * 2**e``; ``f`` tells whether a float took part.

    Every finite float is an integer times a power of two, so the sum of any of them is too:
    keeping it exact makes merging associative, where adding floats in a different grouping
    could change the last bits of a partitioned SUM.
    """

    __slots__ = ("e", "f", "m", "n")

    def __init__(self, n: int = 0, m: int = 0, e: int = 0, f: bool = False) -> None:
        self.n, self.m, self.e, self.f = n, m, e, f

    def add(self, m: int, e: int) -> None:
        low = min(self.e, e)
        self.m = (self.m << (self.e - low)) + (m << (e - low))
        self.e = low

    def normalised(self) -> tuple[int, int]:
        if not self.m:
            return 0, 0
        zeros = (self.m & -self.m).bit_length() - 1
        return self.m >> zeros, self.e + zeros


class _Sum(AggregateState):
    def new(self) -> _Exact:
        return _Exact()

    def add(self, state: _Exact, value: Any) -> _Exact:
        number = finite_number(value)
        if number is None:
            return state
        state.n += 1
        if isinstance(number, int):
            state.add(number, 0)
        else:
            numerator, denominator = number.as_integer_ratio()
            state.add(numerator, 1 - denominator.bit_length())  # denominator is a power of 2
            state.f = True
        return state

    def merge(self, a: _Exact, b: _Exact) -> _Exact:
        out = _Exact(a.n + b.n, a.m, a.e, a.f or b.f)
        out.add(b.m, b.e)
        return out

    def encode(self, state: _Exact) -> list[Any] | None:
        if not state.n:
            return None
        m, e = state.normalised()
        return [state.n, _json_int(m), e, int(state.f)]

    def decode(self, data: Any) -> _Exact:
        if data is None:
            return _Exact()
        if not isinstance(data, list) or len(data) != 4:
            raise ValueError(f"malformed partials: expected [n, m, e, f], got {data!r}")
        n, m, e, f = data
        return _Exact(_from_json_int(n), _from_json_int(m), _from_json_int(e), bool(f))

    def result(self, state: _Exact) -> int | float | None:
        if not state.n:
            return None
        m, e = state.normalised()
        if not state.f:
            return output_number(m << e if e >= 0 else m >> -e)
        try:  # both forms round the exact value once, correctly
            return float(m << e) if e >= 0 else m / (1 << -e)
        except OverflowError:
            return math.inf if m > 0 else -math.inf


class _Avg(_Sum):
    def result(self, state: _Exact) -> float | None:
        if not state.n:
            return None
        m, e = state.normalised()
        numerator, denominator = (m << e, state.n) if e >= 0 else (m, state.n << -e)
        return numerator / denominator  # int / int is correctly rounded


# A MIN/MAX candidate: (0, number) or (1, non-numeric string), ordered as OrderBy orders them.
_Candidate = tuple[int, Any]


def _candidate(value: Any) -> _Candidate | None:
    number = finite_number(value)
    if number is not None:
        return (0, number)
    if isinstance(value, str) and to_number(value) is None:
        return (1, value)
    return None  # booleans, objects, non-finite numbers


class _Extreme(AggregateState):
    def __init__(self, largest: bool) -> None:
        self.largest = largest

    def new(self) -> _Candidate | None:
        return None

    def add(self, state: _Candidate | None, value: Any) -> _Candidate | None:
        candidate = _candidate(value)
        if candidate is None:
            return state
        return candidate if state is None else self.merge(state, candidate)

    def merge(self, a: _Candidate | None, b: _Candidate | None) -> _Candidate | None:
        if a is None or b is None:
            return b if a is None else a
        if a != b:  # 7 == 7.0 here, which the tie-break below settles
            return a if (a > b) == self.largest else b
        # Equal values: the same choice for MIN and MAX and in any order (int first, then repr).
        return min(a, b, key=lambda c: (isinstance(c[1], float), repr(c[1])))

    def encode(self, state: _Candidate | None) -> list[Any] | None:
        if state is None:
            return None
        kind, value = state
        return [kind, _json_int(value) if isinstance(value, int) else value]

    def decode(self, data: Any) -> _Candidate | None:
        if data is None:
            return None
        if not isinstance(data, list) or len(data) != 2 or data[0] not in (0, 1):
            raise ValueError(f"malformed partials: expected [kind, value], got {data!r}")
        kind, value = data
        if kind == 0:
            value = _from_json_int(value) if isinstance(value, str) else value
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"malformed partials: expected a number, got {value!r}")
        elif not isinstance(value, str):
            raise ValueError(f"malformed partials: expected a string, got {value!r}")
        return (kind, value)

    def result(self, state: _Candidate | None) -> Any:
        if state is None:
            return None
        kind, value = state
        return output_number(value) if kind == 0 else value


STATES: dict[str, AggregateState] = {
    "COUNT": _Count(),
    "COUNT_DISTINCT": _CountDistinct(),
    "SUM": _Sum(),
    "AVG": _Avg(),
    "MIN": _Extreme(largest=False),
    "MAX": _Extreme(largest=True),
}
assert sorted(STATES) == list(AGGREGATE_FUNCTIONS)
