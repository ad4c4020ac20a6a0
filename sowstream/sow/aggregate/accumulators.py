"""The aggregate functions, one implementation for aggregated queries, aggregated subscriptions
and views: a retractable working state per group, its JSON form, merge and result.

A maintained view (and an aggregated subscription) must *remove* a row's contribution when the
row is updated, deleted or moves to another group, without rereading the group; an aggregated
query merges the states of several partitions. So:

* ``COUNT``, ``SUM``, ``AVG``, ``STDDEV_POP``, ``STDDEV_SAMP`` keep counts and exact running sums
  (:class:`fractions.Fraction`: every finite float is a fraction with a power-of-two denominator,
  so subtracting what was added leaves exactly the earlier sum, whatever the order of changes);
* ``MIN``, ``MAX``, ``COUNT_DISTINCT``, ``DISTINCT_LIST`` and ``ANY`` keep a multiset
  (value -> count), so removing the current minimum falls back to the next one.

States merge exactly (sums of counts and exact sums, unions of multisets), so partitioned
partials combine in any order. :meth:`Accumulator.compact` trims a state to what its result and
a merge need (MIN keeps its minimum only), which is what a partial sends.

Value rules (``sowstream.sow.aggregate``): NULL is skipped,
numeric functions skip values that are not finite numbers, MIN/MAX order numbers before strings,
COUNT_DISTINCT compares canonical texts, a group with no value gives COUNT 0 and NULL otherwise,
and results are rounded once from the exact value, so a view and an aggregated query agree.
``ANY`` returns the value whose JSON text sorts first: any value would do, this one is the same
after every replay. ``DISTINCT_LIST(expr[, delimiter])`` (the chapters' distinct-values list,
whose AMPS name they could not read) joins the distinct values, compared as COUNT_DISTINCT
compares them, each as its canonical text, numbers first in numeric order then the others by
code point, with ``delimiter`` (default ``,``) between them.

Each accumulator also has ``compute(values)``, the batch answer over a plain list, which the
naive recomputation (the reference for tests and recovery checks) uses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import orjson
from sortedcontainers import SortedDict

from sowstream.filters import ast
from sowstream.filters.values import canonical_text, to_number

from .numbers import finite_number, json_int, output_number

__all__ = [
    "ACCUMULATORS",
    "AGGREGATE_FUNCTIONS",
    "DEFAULT_DELIMITER",
    "Accumulator",
    "StateError",
    "accumulator",
]


class StateError(ValueError):
    """A retraction of something the state never held, or malformed encoded state."""


class Accumulator:
    """One aggregate function: a mutable per-group state, add, remove, result, JSON form."""

    name = ""

    def new(self) -> Any:
        raise NotImplementedError

    def add(self, state: Any, value: Any) -> Any:
        """Fold one non-NULL single value in; returns the state (possibly a new object)."""
        raise NotImplementedError

    def remove(self, state: Any, value: Any) -> Any:
        """Take back a value ``add`` folded in earlier."""
        raise NotImplementedError

    def result(self, state: Any) -> Any:
        raise NotImplementedError

    def encode(self, state: Any) -> Any:
        raise NotImplementedError

    def decode(self, data: Any) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        """The state holding both ``a``'s and ``b``'s values (a new object; both left alone)."""
        raise NotImplementedError

    def compact(self, state: Any) -> Any:
        """``state`` trimmed to what its result and a merge need (for partials; not retractable)."""
        return state

    def compute(self, values: Sequence[Any]) -> Any:
        """The result over ``values`` directly (no incremental state): the reference answer."""
        raise NotImplementedError


# ---------------------------------------------------------------------------- counts and sums


class _Count(Accumulator):
    name = "COUNT"

    def new(self) -> list[int]:
        return [0]

    def add(self, state: list[int], value: Any) -> list[int]:
        state[0] += 1
        return state

    def remove(self, state: list[int], value: Any) -> list[int]:
        if state[0] <= 0:
            raise StateError("COUNT: removing a value from an empty count")
        state[0] -= 1
        return state

    def result(self, state: list[int]) -> int:
        return state[0]

    def encode(self, state: list[int]) -> int:
        return state[0]

    def decode(self, data: Any) -> list[int]:
        if not isinstance(data, int) or isinstance(data, bool):
            raise StateError(f"COUNT: expected an integer, got {data!r}")
        return [data]

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return [a[0] + b[0]]

    def compute(self, values: Sequence[Any]) -> int:
        return len(values)


class _Moments:
    """Numbers seen ``n``, floats among them ``floats``, exact sums of values and squares."""

    __slots__ = ("floats", "n", "s1", "s2")

    def __init__(
        self, n: int = 0, floats: int = 0, s1: Fraction = Fraction(0), s2: Fraction = Fraction(0)
    ) -> None:
        self.n, self.floats, self.s1, self.s2 = n, floats, s1, s2


def _fraction_text(x: Fraction) -> str:
    return str(x)


class _Sum(Accumulator):
    name = "SUM"
    squares = False  # STDDEV also keeps the sum of squares

    def new(self) -> _Moments:
        return _Moments()

    def _step(self, state: _Moments, value: Any, sign: int) -> _Moments:
        number = finite_number(value)
        if number is None:
            return state
        exact = Fraction(number)
        state.n += sign
        state.floats += sign * isinstance(number, float)
        state.s1 += sign * exact
        if self.squares:
            state.s2 += sign * exact * exact
        if state.n < 0:
            raise StateError(f"{self.name}: removing more numbers than were added")
        return state

    def add(self, state: _Moments, value: Any) -> _Moments:
        return self._step(state, value, 1)

    def remove(self, state: _Moments, value: Any) -> _Moments:
        return self._step(state, value, -1)

    def result(self, state: _Moments) -> Any:
        if not state.n:
            return None
        if not state.floats:
            return output_number(state.s1.numerator)  # only integers: an exact integer
        return _to_float(state.s1)

    def encode(self, state: _Moments) -> list[Any]:
        data: list[Any] = [state.n, state.floats, _fraction_text(state.s1)]
        if self.squares:
            data.append(_fraction_text(state.s2))
        return data

    def decode(self, data: Any) -> _Moments:
        size = 4 if self.squares else 3
        if not isinstance(data, list) or len(data) != size:
            raise StateError(f"{self.name}: expected a list of {size}, got {data!r}")
        try:
            s2 = Fraction(data[3]) if self.squares else Fraction(0)
            return _Moments(int(data[0]), int(data[1]), Fraction(data[2]), s2)
        except (TypeError, ValueError, ZeroDivisionError) as exc:
            raise StateError(f"{self.name}: malformed state {data!r}: {exc}") from None

    def merge(self, a: _Moments, b: _Moments) -> _Moments:
        return _Moments(a.n + b.n, a.floats + b.floats, a.s1 + b.s1, a.s2 + b.s2)

    def compute(self, values: Sequence[Any]) -> Any:
        state = self.new()
        for v in values:
            state = self.add(state, v)
        return self.result(state)


def _to_float(x: Fraction) -> float:
    try:
        return x.numerator / x.denominator  # int / int: rounded once, correctly
    except OverflowError:
        return math.inf if x > 0 else -math.inf


class _Avg(_Sum):
    name = "AVG"

    def result(self, state: _Moments) -> float | None:
        return None if not state.n else _to_float(state.s1 / state.n)


class _Stddev(_Sum):
    squares = True

    def __init__(self, sample: bool) -> None:
        self.sample = sample
        self.name = "STDDEV_SAMP" if sample else "STDDEV_POP"

    def result(self, state: _Moments) -> float | None:
        n = state.n
        if n == 0 or (self.sample and n < 2):
            return None
        variance = (state.s2 - state.s1 * state.s1 / n) / (n - 1 if self.sample else n)
        return math.sqrt(max(_to_float(variance), 0.0))


# ---------------------------------------------------------------------------- multisets

# A MIN/MAX entry: (kind, value, is_float, repr). Kind 0 is a number, 1 a non-numeric string,
# ordered as OrderBy orders them; equal numbers (7 and 7.0) are told apart by the last two parts.
_Entry = tuple[int, Any, bool, str]


def _entry(value: Any) -> _Entry | None:
    number = finite_number(value)
    if number is not None:
        return (0, number, isinstance(number, float), repr(number))
    if isinstance(value, str) and to_number(value) is None:
        return (1, value, False, repr(value))
    return None  # booleans, objects, non-finite numbers: skipped as in aggregated queries


class _Multiset(Accumulator):
    """Shared add/remove/encode for states that are a sorted value -> count map."""

    def key(self, value: Any) -> Any:
        raise NotImplementedError

    def new(self) -> SortedDict:
        return SortedDict()

    def add(self, state: SortedDict, value: Any) -> SortedDict:
        key = self.key(value)
        if key is not None:
            state[key] = state.get(key, 0) + 1
        return state

    def remove(self, state: SortedDict, value: Any) -> SortedDict:
        key = self.key(value)
        if key is None:
            return state
        count = state.get(key, 0)
        if count <= 0:
            raise StateError(f"{self.name}: removing {value!r}, which the group does not hold")
        if count == 1:
            del state[key]
        else:
            state[key] = count - 1
        return state

    def merge(self, a: SortedDict, b: SortedDict) -> SortedDict:
        out = SortedDict(a)
        for key, count in b.items():
            out[key] = out.get(key, 0) + count
        return out

    def compute(self, values: Sequence[Any]) -> Any:
        state = self.new()
        for v in values:
            state = self.add(state, v)
        return self.result(state)


class _Extreme(_Multiset):
    def __init__(self, largest: bool) -> None:
        self.largest = largest
        self.name = "MAX" if largest else "MIN"

    def key(self, value: Any) -> _Entry | None:
        return _entry(value)

    def result(self, state: SortedDict) -> Any:
        if not state:
            return None
        if self.largest:
            kind, value, _, _ = state.peekitem(-1)[0]
            # Among equal values, the same spelling MIN would pick: the first one.
            entry = state.peekitem(state.bisect_left((kind, value)))[0]
        else:
            entry = state.peekitem(0)[0]
        return output_number(entry[1]) if entry[0] == 0 else entry[1]

    def compact(self, state: SortedDict) -> SortedDict:
        if not state:
            return state
        kind, value = state.peekitem(-1 if self.largest else 0)[0][:2]
        # Every spelling of the extreme value, so the merged result picks the same one.
        return SortedDict((k, c) for k, c in state.items() if (k[0], k[1]) == (kind, value))

    def compute(self, values: Sequence[Any]) -> Any:
        # Batch reference: sort all entries; no multiset involved.
        entries = [e for e in map(_entry, values) if e is not None]
        if not entries:
            return None
        if self.largest:
            top = max(entries, key=lambda e: (e[0], e[1]))
            entry = min(e for e in entries if (e[0], e[1]) == (top[0], top[1]))
        else:
            entry = min(entries)
        return output_number(entry[1]) if entry[0] == 0 else entry[1]

    def encode(self, state: SortedDict) -> list[list[Any]]:
        return [
            [k[0], json_int(k[1]) if k[0] == 0 and not k[2] else k[1], count]
            for k, count in state.items()
        ]

    def decode(self, data: Any) -> SortedDict:
        state = SortedDict()
        if not isinstance(data, list):
            raise StateError(f"{self.name}: expected a list, got {data!r}")
        for item in data:
            if not isinstance(item, list) or len(item) != 3 or item[0] not in (0, 1):
                raise StateError(f"{self.name}: malformed entry {item!r}")
            kind, value, count = item
            if kind == 0 and isinstance(value, str):
                value = int(value)
            entry = (
                (0, value, isinstance(value, float), repr(value)) if kind == 0 else _entry(value)
            )
            if entry is None or entry[0] != kind:
                raise StateError(f"{self.name}: malformed entry {item!r}")
            state[entry] = count
        return state


class _Texts(_Multiset):
    """A multiset of texts (canonical texts of values, or JSON texts): its JSON form."""

    def key(self, value: Any) -> str | None:
        return canonical_text(value)

    def encode(self, state: SortedDict) -> list[list[Any]]:
        return [[k, count] for k, count in state.items()]

    def decode(self, data: Any) -> SortedDict:
        if not isinstance(data, list) or not all(
            isinstance(i, list) and len(i) == 2 and isinstance(i[0], str) for i in data
        ):
            raise StateError(f"{self.name}: malformed state {data!r}")
        return SortedDict((k, int(c)) for k, c in data)


class _CountDistinct(_Texts):
    name = "COUNT_DISTINCT"

    def result(self, state: SortedDict) -> int:
        return len(state)

    def compute(self, values: Sequence[Any]) -> int:
        return len({canonical_text(v) for v in values})


class _Any(_Texts):
    name = "ANY"

    def key(self, value: Any) -> str | None:
        try:
            text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
        except TypeError:
            return None
        return None if text == "null" else text  # NaN and infinities: not JSON values

    def result(self, state: SortedDict) -> Any:
        return orjson.loads(state.peekitem(0)[0]) if state else None

    def compact(self, state: SortedDict) -> SortedDict:
        return SortedDict([state.peekitem(0)]) if state else state

    def compute(self, values: Sequence[Any]) -> Any:
        texts = [t for t in map(self.key, values) if t is not None]
        return orjson.loads(min(texts)) if texts else None


DEFAULT_DELIMITER = ","


def _list_order(text: str) -> tuple[int, Any, str]:
    number = finite_number(text)
    return (0, number, text) if number is not None else (1, 0, text)


class _DistinctList(_Texts):
    """``DISTINCT_LIST(expr[, delimiter])``: the distinct values' texts joined by ``delimiter``."""

    name = "DISTINCT_LIST"

    def __init__(self, delimiter: str = DEFAULT_DELIMITER) -> None:
        self.delimiter = delimiter

    def result(self, state: SortedDict) -> str | None:
        if not state:
            return None
        return self.delimiter.join(sorted(state.keys(), key=_list_order))

    def compute(self, values: Sequence[Any]) -> str | None:
        texts = {canonical_text(v) for v in values}
        return self.delimiter.join(sorted(texts, key=_list_order)) if texts else None


# In the order error messages list them.
ACCUMULATORS: dict[str, Accumulator] = {
    "AVG": _Avg(),
    "COUNT": _Count(),
    "COUNT_DISTINCT": _CountDistinct(),
    "MAX": _Extreme(largest=True),
    "MIN": _Extreme(largest=False),
    "SUM": _Sum(),
    "ANY": _Any(),
    "STDDEV_POP": _Stddev(sample=False),
    "STDDEV_SAMP": _Stddev(sample=True),
    "DISTINCT_LIST": _DistinctList(),
}

AGGREGATE_FUNCTIONS: tuple[str, ...] = tuple(ACCUMULATORS)
"""Every aggregate function: aggregated queries and subscriptions and views take them all."""


def accumulator(call: ast.Aggregate) -> Accumulator:
    """The accumulator of one aggregate call (DISTINCT_LIST's delimiter is part of the call)."""
    if call.name == "DISTINCT_LIST" and call.delimiter is not None:
        return _DistinctList(call.delimiter)
    return ACCUMULATORS[call.name]
