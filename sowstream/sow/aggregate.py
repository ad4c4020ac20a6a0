"""Aggregated SOW queries: the ``grouping=[...]`` and ``projection=[...]`` options of ``sow``.

An aggregated query groups the records that match its filter by the ``grouping`` fields and
returns one record per group, built from the ``projection`` entries::

    grouping=[/description]
    projection=[/description, COUNT(/id) AS /count, SUM(/qty * /px) AS /notional]

The records of a topic are spread over partitions that live on different workers, and only the
client sees every partition's answer. So aggregation is split in three steps:

* :meth:`Aggregation.partial` runs on each worker over its partition's matching records and
  yields :data:`Partials`: per group, a small JSON-able state per aggregate (a count, an exact sum
  and its count, a distinct set, a current minimum, ...). It travels in the Kafka replies.
* :func:`merge_partials` combines any number of partials. It is associative and commutative (and
  exact: sums are kept as exact binary fractions), so the answer does not depend on how records
  are spread over partitions, in which order replies arrive, or how merges are nested.
* :meth:`Aggregation.finish` turns merged partials into the output records. ``AVG`` is the merged
  sum over the merged count here, never an average of per-partition averages.

Rules, where AMPS's documentation leaves a choice open:

* NULL (a missing field, JSON ``null``, ``""``: the filter language's rule) is skipped by every
  aggregate. A path that crosses arrays reads several values, and each non-NULL one counts, so
  ``SUM(/legs/qty)`` adds up every leg. A group with no value left gives ``COUNT`` 0 and NULL
  for the others.
* ``SUM`` and ``AVG`` read numbers and numeric strings as the filter's arithmetic does; other
  values, and NaN or infinities (which JSON cannot carry), are skipped. ``SUM`` of integers is an
  integer, otherwise a float, correctly rounded from the exact sum; ``AVG`` is always a float. A
  result integer too big for 64 bits comes out as a float, for the same reason.
* ``MIN`` and ``MAX`` follow OrderBy's value order: numbers (numeric strings read as numbers)
  before other strings, strings by code point; booleans and objects are skipped.
* ``COUNT_DISTINCT`` compares values by their canonical text, as hash indexes and SowKeys do:
  ``7``, ``7.0`` and ``"7"`` are one value, ``"7.0"`` another.
* Group keys are compared the same way; NULL forms a group of its own, as in SQL. A grouping path
  that reads several values groups by the list of its non-NULL values, so every record is in
  exactly one group. The output shows one of the group's spellings, chosen deterministically
  (numbers, then strings, booleans and the rest, each by JSON text).
* A path used outside any aggregate that is not a grouping field is allowed, as in AMPS: it
  reads one record of the group. Which one is unspecified but deterministic (one with the fewest
  NULLs among those paths, ties broken by their JSON text), and every such path in the projection
  reads the same record.
* A projected value that is NULL is left out of the output record. Output records come in the
  order of their group's values (OrderBy's order, NULL last); callers apply OrderBy and top_n.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from sowstream.errors import InvalidCommandError
from sowstream.filters import FilterError, ast, parse_filter
from sowstream.filters import compile_value as _compile_value
from sowstream.filters.order_by import SortField, sort_key
from sowstream.filters.values import canonical_text, get_path, is_null, path_steps, to_number

__all__ = [
    "AGGREGATE_FUNCTIONS",
    "Aggregation",
    "AggregationError",
    "Partials",
    "merge_partials",
    "parse_aggregation",
]

AGGREGATE_FUNCTIONS: tuple[str, ...] = ("AVG", "COUNT", "COUNT_DISTINCT", "MAX", "MIN", "SUM")

Partials = dict[str, list[Any]]
"""Per-group partial states, JSON-able (orjson), keyed by the group's key text::

    {group_key: [group_values, loose_values, states], ...}

``group_key`` is the JSON text of the group's canonical values (one per grouping field: null for
NULL, the canonical text, or a list of texts for a multi-valued field). ``group_values`` holds the
group's chosen spelling of each grouping field, ``loose_values`` the values of the non-grouped
paths read outside aggregates (null if there are none) and ``states`` one state per aggregate:

* ``COUNT``: an int;
* ``COUNT_DISTINCT``: the sorted list of the canonical texts seen;
* ``SUM``, ``AVG``: null when no number was seen, else ``[count, mantissa, exponent, float]``:
  the exact sum is ``mantissa * 2**exponent`` (a decimal string when the mantissa needs more
  than 64 bits) and ``float`` is 1 when any float took part;
* ``MIN``, ``MAX``: null, ``[0, number]`` (a decimal string for a very large int) or
  ``[1, string]``.
"""

# ---------------------------------------------------------------------------- errors


class AggregationError(InvalidCommandError):
    """A ``grouping`` or ``projection`` option that cannot be used, with where and why.

    ``option`` is ``"grouping"`` or ``"projection"``; ``position`` is the 0-based character offset
    of the problem in that option's text (plus the offset the caller passed in).
    """

    def __init__(self, option: str, position: int, problem: str) -> None:
        super().__init__(f"{option} error at position {position}: {problem}")
        self.option = option
        self.position = position
        self.problem = problem


# ---------------------------------------------------------------------------- parsing

_UNKNOWN_FUNCTION = re.compile(r"unknown function '(\w+)'")
# The AS keyword (case-insensitive, as in AMPS's `SUM(/qty) as /quantity`).
_AS = re.compile(r"(?<![\w.$@/-])as(?![\w.$@-])", re.I)


def _mask_strings(text: str) -> tuple[str, int | None]:
    """``text`` with the inside of every string literal blanked, and where an unclosed one starts.

    Commas, parentheses, brackets and words inside quotes are data, not structure; blanking them
    lets the scanners below work on plain text while positions stay those of ``text``. Escapes
    follow the filter grammar.
    """
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        quote = text[i]
        if quote not in "'\"":
            i += 1
            continue
        start = i
        i += 1
        while i < n:
            ch = text[i]
            # A backslash escapes the next character; a doubled quote stands for one quote.
            if i + 1 < n and (ch == "\\" or (ch == quote and text[i + 1] == quote)):
                out[i] = out[i + 1] = " "
                i += 2
            elif ch == quote:
                break
            else:
                out[i] = " "
                i += 1
        if i >= n:
            return "".join(out), start
        i += 1
    return "".join(out), None


@dataclass(frozen=True, slots=True)
class _Source:
    """One option's text as the scanners see it, and how to report a problem in it."""

    option: str
    text: str
    masked: str
    offset: int
    stage: bool = False  # a Preprocessing or Enrichment field (parse_filter's ``stage``)
    functions: frozenset[str] = frozenset()  # parse_filter's ``functions``

    def error(self, position: int, problem: str) -> AggregationError:
        return AggregationError(self.option, self.offset + position, problem)

    def fragment(self, start: int, end: int) -> str:
        piece = self.text[start:end].strip()
        return piece if len(piece) <= 40 else piece[:37] + "..."

    def parse(self, start: int, end: int, what: str) -> ast.Expr:
        """Parse ``text[start:end]`` with the filter parser, keeping positions absolute."""
        try:
            return parse_filter(
                " " * start + self.text[start:end], stage=self.stage, functions=self.functions
            )
        except FilterError as exc:
            problem = _filter_problem(exc)
            raise self.error(exc.position, f"{problem} (in {what})" if what else problem) from None


def _filter_problem(exc: FilterError, aggregates: Collection[str] = AGGREGATE_FUNCTIONS) -> str:
    """The filter parser's complaint, with the aggregate functions named where they could help."""
    if exc.reason.startswith("unknown function"):
        return (
            f"{exc.reason}: the aggregate functions are {', '.join(aggregates)} and the "
            f"other functions {', '.join(sorted(ast.FUNCTIONS))}"
        )
    return exc.reason


def _source(
    option: str, text: str, offset: int, stage: bool = False, functions: Collection[str] = ()
) -> _Source:
    # Tolerate the whole `option=[...]` item as well as just its value.
    prefix = re.match(rf"\s*{option}\s*=", text, re.I)
    if prefix:
        text = " " * prefix.end() + text[prefix.end() :]
    masked, unclosed = _mask_strings(text)
    src = _Source(option, text, masked, offset, stage, frozenset(functions))
    if unclosed is not None:
        raise src.error(unclosed, "unterminated string literal")
    return src


def _list_entries(src: _Source) -> list[tuple[int, int]]:
    """The (start, end) spans of the bracketed list's comma-separated entries, trimmed."""
    masked = src.masked
    first = len(masked) - len(masked.lstrip())
    end = len(masked.rstrip())
    example = f"{src.option}=[/field]" if src.option == "grouping" else "projection=[/a, ...]"
    if not masked.strip():
        raise src.error(first, f"{src.option} needs a bracketed list like {example}")
    if masked[first] != "[":
        raise src.error(first, f"the {src.option} list must start with '[', like {example}")
    if masked[end - 1] != "]" or end - 1 == first:
        closing = masked.find("]", first + 1)
        if closing != -1:
            after = closing + 1 + len(masked[closing + 1 :]) - len(masked[closing + 1 :].lstrip())
            raise src.error(
                after, f"unexpected text after the closing ']' of the {src.option} list"
            )
        raise src.error(end, f"the {src.option} list has no closing ']'")
    spans: list[tuple[int, int]] = []
    depth = 0
    start = first + 1
    for i in range(first + 1, end - 1):
        ch = masked[i]
        if ch == "[":
            raise src.error(i, f"unexpected '[' inside the {src.option} list (lists do not nest)")
        if ch == "]":
            raise src.error(i, f"unexpected ']' before the end of the {src.option} list")
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)  # a stray ')' is left for the parser to point at
        elif ch == "," and depth == 0:
            spans.append((start, i))
            start = i + 1
    spans.append((start, end - 1))
    if len(spans) == 1 and not masked[spans[0][0] : spans[0][1]].strip():
        raise src.error(first, f"the {src.option} list is empty: give at least one entry")
    trimmed: list[tuple[int, int]] = []
    for s, e in spans:
        piece = masked[s:e]
        if not piece.strip():
            raise src.error(e if e < end - 1 else s, f"empty entry in the {src.option} list")
        trimmed.append((s + len(piece) - len(piece.lstrip()), s + len(piece.rstrip())))
    return trimmed


def _depths(masked: str, start: int, end: int) -> list[int]:
    """The parenthesis depth at each position of ``masked[start:end]``."""
    out: list[int] = []
    depth = 0
    for i in range(start, end):
        ch = masked[i]
        if ch == ")":
            depth = max(0, depth - 1)
        out.append(depth)
        if ch == "(":
            depth += 1
    return out


@dataclass(frozen=True, slots=True)
class _Call:
    """An aggregate call in a projection entry: ``name(arg)`` spanning ``text[start:end]``."""

    name: str
    arg: ast.Expr
    start: int
    end: int
    text: str


def _closing(masked: str, open_at: int) -> int:
    """The position of the ``)`` matching the ``(`` at ``open_at`` (strings already blanked)."""
    depth = 0
    for i in range(open_at, len(masked)):
        if masked[i] == "(":
            depth += 1
        elif masked[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return len(masked)  # unreachable for text the parser accepted up to the call's end


def _parse_expression(
    src: _Source, start: int, end: int, aggregates: Collection[str] = AGGREGATE_FUNCTIONS
) -> tuple[ast.Expr, dict[int, _Call]]:
    """Parse ``text[start:end]``, a filter expression that may hold aggregate calls.

    The filter grammar knows no aggregates, so each call surfaces as an "unknown function" error
    at its name; the call is then cut out and parsing retried. Letting the parser find the calls,
    rather than scanning the text for names, keeps ``/a/count(`` a path and ``SUM(/a)/COUNT(/b)``
    a division, exactly as the lexer reads them. A call is replaced by a path of the same length,
    so the parser sees an atom where the call was and every position stays that of the text.
    The calls come back keyed by their position, which is that of the path standing for them.
    """
    masked = src.masked
    chars = list(" " * start + src.text[start:end])
    calls: dict[int, _Call] = {}
    while True:
        try:
            return parse_filter("".join(chars), stage=src.stage, functions=src.functions), calls
        except FilterError as exc:
            unknown = _UNKNOWN_FUNCTION.fullmatch(exc.reason)
            name = unknown.group(1).upper() if unknown else ""
            if name not in aggregates:
                raise src.error(exc.position, _filter_problem(exc, aggregates)) from None
            at = exc.position
        open_at = masked.index("(", at)
        close_at = _closing(masked, open_at)
        # Inner calls reduce first, so an aggregate inside this one has already been cut out.
        for inner in calls.values():
            if at < inner.start < close_at:
                raise src.error(
                    inner.start,
                    f"aggregate {inner.name} is nested inside {name} (at position "
                    f"{src.offset + at}): aggregate functions cannot be nested",
                )
        for i, depth in enumerate(_depths(masked, open_at + 1, close_at)):
            if depth == 0 and masked[open_at + 1 + i] == ",":
                raise src.error(open_at + 1 + i, f"{name} takes exactly one argument")
        if not masked[open_at + 1 : close_at].strip():
            raise src.error(open_at, f"{name} needs an argument, like {name}(/field)")
        arg = src.parse(open_at + 1, close_at, f"the argument of {name}")
        calls[at] = _Call(name, arg, at, close_at + 1, src.text[at : close_at + 1])
        chars[at : close_at + 1] = "/x" + " " * (close_at - at - 1)


@dataclass(frozen=True, slots=True)
class _Entry:
    """A parsed projection entry: its expression with aggregate calls cut out, and its target."""

    output: str
    output_at: int
    expr: ast.Expr
    calls: dict[int, _Call]  # keyed by the position of the path standing for the call


def _projection_entry(
    src: _Source, start: int, end: int, aggregates: Collection[str] = AGGREGATE_FUNCTIONS
) -> _Entry:
    masked = src.masked
    depths = _depths(masked, start, end)
    hits = [m for m in _AS.finditer(masked, start, end) if depths[m.start() - start] == 0]
    if len(hits) > 1:
        raise src.error(hits[1].start(), "a projection entry takes one AS")
    expr_end = end
    output: ast.Path | None = None
    if hits:
        expr_end = hits[0].start()
        target_start = hits[0].end()
        target_start += len(masked[target_start:end]) - len(masked[target_start:end].lstrip())
        if target_start >= end:
            raise src.error(hits[0].start(), "AS needs an output path, like AS /total")
        if not masked[start:expr_end].strip():
            raise src.error(start, "nothing to project before AS")
        try:
            target: ast.Expr | None = parse_filter(
                " " * target_start + src.text[target_start:end],
                stage=src.stage,
                functions=src.functions,
            )
        except FilterError:
            target = None
        if not isinstance(target, ast.Path):
            raise src.error(
                target_start,
                f"AS must be followed by a field path such as /total, not "
                f"{src.fragment(target_start, end)!r}",
            )
        output = target
        expr_end = len(masked[:expr_end].rstrip())

    expr, by_pos = _parse_expression(src, start, expr_end, aggregates)

    if output is None:
        if not isinstance(expr, ast.Path) or expr.pos in by_pos:
            raise src.error(
                start,
                f"{src.fragment(start, expr_end)!r} is computed and needs an output path: "
                "add AS /name",
            )
        return _Entry(expr.text, start, expr, by_pos)
    return _Entry(output.text, output.pos, expr, by_pos)


# ---------------------------------------------------------------------------- aggregate states


def _json_int(value: int) -> int | str:
    # orjson carries 64-bit integers only; larger ones travel as decimal text.
    return value if -(2**63) <= value < 2**64 else str(value)


def _from_json_int(value: Any) -> int:
    if isinstance(value, str):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(f"malformed partials: expected an integer, got {value!r}")


def _output_number(value: int | float) -> int | float:
    """A result number that JSON can carry: an int beyond 64 bits becomes a float."""
    if isinstance(value, int) and not -(2**63) <= value < 2**64:
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    return value


def _number(value: Any) -> int | float | None:
    """The finite number ``value`` stands for (numeric strings included), else None."""
    number = to_number(value)
    if number is None or (isinstance(number, float) and not math.isfinite(number)):
        return None
    return number


class _Aggregate:
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


class _Count(_Aggregate):
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


class _CountDistinct(_Aggregate):
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


class _Sum(_Aggregate):
    def new(self) -> _Exact:
        return _Exact()

    def add(self, state: _Exact, value: Any) -> _Exact:
        number = _number(value)
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
            return _output_number(m << e if e >= 0 else m >> -e)
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
    number = _number(value)
    if number is not None:
        return (0, number)
    if isinstance(value, str) and to_number(value) is None:
        return (1, value)
    return None  # booleans, objects, non-finite numbers


class _Extreme(_Aggregate):
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
        return _output_number(value) if kind == 0 else value


_AGGREGATES: dict[str, _Aggregate] = {
    "COUNT": _Count(),
    "COUNT_DISTINCT": _CountDistinct(),
    "SUM": _Sum(),
    "AVG": _Avg(),
    "MIN": _Extreme(largest=False),
    "MAX": _Extreme(largest=True),
}
assert sorted(_AGGREGATES) == list(AGGREGATE_FUNCTIONS)


# ---------------------------------------------------------------------------- values and groups


def _field_value(values: list[Any]) -> Any:
    """One field's value from what its path read: None, the single value, or a list of several."""
    present = [v for v in values if not is_null(v)]
    if not present:
        return None
    return present[0] if len(present) == 1 else present


def _component(value: Any) -> Any:
    """A field value's part of the group key: spellings with the same text group together."""
    if value is None:
        return None
    if isinstance(value, list):
        return [canonical_text(v) for v in value]
    return canonical_text(value)


def _json_text(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # not JSON (records from JSON always are): fall back to a stable spelling
        return repr(value)


def _spelling_rank(value: Any) -> tuple[int, str]:
    """The order in which one of a group's equivalent spellings is chosen to show."""
    if isinstance(value, bool):
        kind = 2
    elif isinstance(value, int | float):
        kind = 0
    elif isinstance(value, str):
        kind = 1
    else:
        kind = 3
    return (kind, _json_text(value))


def _loose_rank(values: list[Any]) -> tuple[int, str]:
    return (sum(v is None for v in values), _json_text(values))


class _Group:
    """One group's working state while partials are built, merged or finished."""

    __slots__ = ("keys", "loose", "loose_rank", "states")

    def __init__(self, keys: list[Any], loose: list[Any] | None, states: list[Any]) -> None:
        self.keys = keys
        self.loose = loose
        self.loose_rank = None if loose is None else _loose_rank(loose)
        self.states = states

    def offer_keys(self, keys: Sequence[Any]) -> None:
        for i, value in enumerate(keys):
            current = self.keys[i]
            if type(value) is type(current) and value == current:
                continue  # the common case: the very same spelling
            if _spelling_rank(value) < _spelling_rank(current):
                self.keys[i] = value

    def offer_loose(self, loose: list[Any]) -> None:
        rank = _loose_rank(loose)
        if self.loose_rank is None or rank < self.loose_rank:
            self.loose, self.loose_rank = loose, rank


# ---------------------------------------------------------------------------- the aggregation

ValueFn = Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True, slots=True)
class _Output:
    """How one projection entry's value is produced from a finished group."""

    path: str
    steps: tuple[str, ...]
    kind: str  # "aggregate", "group", "loose" (index into that list) or "expr" (evaluate fn)
    index: int
    fn: ValueFn | None


def _rewrite(node: ast.Expr, replace: Callable[[ast.Expr], ast.Expr | None]) -> ast.Expr:
    """A copy of ``node`` with the nodes for which ``replace`` returns a node replaced."""
    new = replace(node)
    if new is not None:
        return new
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if isinstance(value, ast.Expr):
            changes[f.name] = _rewrite(value, replace)
        elif isinstance(value, tuple) and any(isinstance(v, ast.Expr) for v in value):
            changes[f.name] = tuple(
                _rewrite(v, replace) if isinstance(v, ast.Expr) else v for v in value
            )
    return dataclasses.replace(node, **changes) if changes else node


def _set_path(record: dict[str, Any], steps: tuple[str, ...], value: Any) -> None:
    for step in steps[:-1]:
        record = record.setdefault(step, {})
    record[steps[-1]] = value


class Aggregation:
    """A parsed ``grouping`` + ``projection`` pair; build it with :func:`parse_aggregation`.

    ``grouping`` holds the grouping paths, ``outputs`` the output paths in projection order,
    ``aggregates`` the distinct aggregate calls (as filter text) whose states partials carry, and
    ``paths`` every record path the aggregation reads. Immutable and safe to share.
    """

    __slots__ = (
        "_aggs",
        "_arg_fns",
        "_group_order",
        "_group_steps",
        "_loose_steps",
        "_outputs",
        "aggregates",
        "grouping",
        "grouping_text",
        "outputs",
        "paths",
        "projection_text",
    )

    def __init__(
        self,
        grouping: Sequence[str],
        entries: Sequence[_Entry],
        *,
        grouping_text: str = "",
        projection_text: str = "",
    ) -> None:
        self.grouping: tuple[str, ...] = tuple(grouping)
        self.grouping_text = grouping_text
        self.projection_text = projection_text
        self._group_steps = tuple(path_steps(p) for p in self.grouping)
        group_index = {p: i for i, p in enumerate(self.grouping)}

        calls: list[tuple[str, ast.Expr]] = []  # equal calls in several entries share a state
        texts: list[str] = []
        loose: list[str] = []
        outputs: list[_Output] = []
        read: set[str] = set(self.grouping)
        for entry in entries:
            slot_of: dict[int, int] = {}
            for pos, call in entry.calls.items():
                if (call.name, call.arg) not in calls:
                    calls.append((call.name, call.arg))
                    texts.append(" ".join(call.text.split()))
                slot_of[pos] = calls.index((call.name, call.arg))
                read |= ast.paths(call.arg)

            def synthetic(node: ast.Expr, slot_of: dict[int, int] = slot_of) -> ast.Expr | None:
                # Inside finish, an entry's expression reads a flat record of the group's
                # values: a<slot> for aggregates, g<i> for grouping fields, r<j> for the rest.
                if not isinstance(node, ast.Path):
                    return None
                if node.pos in slot_of:
                    return ast.Path(f"/a{slot_of[node.pos]}")
                if node.text in group_index:
                    return ast.Path(f"/g{group_index[node.text]}")
                if node.text not in loose:
                    loose.append(node.text)
                return ast.Path(f"/r{loose.index(node.text)}")

            flat = _rewrite(entry.expr, synthetic)
            steps = path_steps(entry.output)
            if isinstance(flat, ast.Path):  # a plain reference needs no evaluation
                kind = {"a": "aggregate", "g": "group", "r": "loose"}[flat.text[1]]
                outputs.append(_Output(entry.output, steps, kind, int(flat.text[2:]), None))
            else:
                outputs.append(_Output(entry.output, steps, "expr", -1, _compile_value(flat)))

        self._outputs = tuple(outputs)
        self._aggs = tuple(_AGGREGATES[name] for name, _ in calls)
        self._arg_fns: tuple[ValueFn, ...] = tuple(_compile_value(arg) for _, arg in calls)
        self._loose_steps = tuple(path_steps(p) for p in loose)
        self._group_order = sort_key([SortField(f"/{i}") for i in range(len(self.grouping))])
        self.aggregates: tuple[str, ...] = tuple(texts)
        self.outputs: tuple[str, ...] = tuple(o.path for o in outputs)
        self.paths: frozenset[str] = frozenset(read | set(loose))

    def __repr__(self) -> str:
        return f"Aggregation(grouping={self.grouping!r}, outputs={self.outputs!r})"

    # ---- partial

    def partial(self, records: Iterable[Mapping[str, Any]]) -> Partials:
        """The per-group partial states of ``records`` (one partition's matching records)."""
        groups: dict[str, _Group] = {}
        group_steps, loose_steps = self._group_steps, self._loose_steps
        slots = tuple(zip(self._arg_fns, self._aggs, strict=True))
        for record in records:
            keys = [_field_value(get_path(record, steps)) for steps in group_steps]
            key = orjson.dumps([_component(v) for v in keys]).decode()
            group = groups.get(key)
            loose = (
                [_field_value(get_path(record, s)) for s in loose_steps] if loose_steps else None
            )
            if group is None:
                group = groups[key] = _Group(keys, loose, [agg.new() for agg in self._aggs])
            else:
                group.offer_keys(keys)
                if loose is not None:
                    group.offer_loose(loose)
            states = group.states
            for slot, (get, agg) in enumerate(slots):
                value = get(record)
                if isinstance(value, tuple):  # several values read through arrays: each counts
                    for item in value:
                        if not is_null(item):
                            states[slot] = agg.add(states[slot], item)
                elif not is_null(value):
                    states[slot] = agg.add(states[slot], value)
        return self._encode(groups)

    def _encode(self, groups: dict[str, _Group]) -> Partials:
        return {
            key: [
                list(g.keys),
                None if g.loose is None else list(g.loose),
                [agg.encode(s) for agg, s in zip(self._aggs, g.states, strict=True)],
            ]
            for key, g in sorted(groups.items())
        }

    def _decode(self, data: Any) -> _Group:
        if not isinstance(data, list) or len(data) != 3:
            raise ValueError(f"malformed partials: expected [keys, loose, states], got {data!r}")
        keys, loose, states = data
        if not isinstance(keys, list) or len(keys) != len(self.grouping):
            raise ValueError("partials do not match this aggregation's grouping")
        if not isinstance(states, list) or len(states) != len(self._aggs):
            raise ValueError("partials do not match this aggregation's aggregates")
        if (loose is None) != (not self._loose_steps) or (
            loose is not None and len(loose) != len(self._loose_steps)
        ):
            raise ValueError("partials do not match this aggregation's projection")
        return _Group(
            list(keys),
            None if loose is None else list(loose),
            [agg.decode(s) for agg, s in zip(self._aggs, states, strict=True)],
        )

    def _merge_into(self, target: _Group, other: _Group) -> None:
        target.offer_keys(other.keys)
        if other.loose is not None:
            target.offer_loose(other.loose)
        target.states = [
            agg.merge(a, b)
            for agg, a, b in zip(self._aggs, target.states, other.states, strict=True)
        ]

    # ---- finish

    def finish(self, partials: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The output records of (merged) ``partials``, one per group, in group-value order."""
        rows: list[tuple[Any, str, dict[str, Any]]] = []
        for key, data in partials.items():
            group = self._decode(data)
            results = [agg.result(s) for agg, s in zip(self._aggs, group.states, strict=True)]
            loose = group.loose or []
            flat: dict[str, Any] | None = None
            record: dict[str, Any] = {}
            for out in self._outputs:
                if out.kind == "aggregate":
                    value = results[out.index]
                elif out.kind == "group":
                    value = group.keys[out.index]
                elif out.kind == "loose":
                    value = loose[out.index]
                else:
                    if flat is None:
                        flat = {f"a{i}": v for i, v in enumerate(results)}
                        flat.update((f"g{i}", v) for i, v in enumerate(group.keys))
                        flat.update((f"r{i}", v) for i, v in enumerate(loose))
                    assert out.fn is not None
                    value = out.fn(flat)
                    if isinstance(value, tuple):  # multi-valued result
                        value = [v for v in value if not is_null(v)] or None
                if not is_null(value):
                    _set_path(record, out.steps, value)
            order = self._group_order({str(i): v for i, v in enumerate(group.keys)})
            rows.append((order, key, record))
        rows.sort(key=lambda row: (row[0], row[1]))
        return [record for _, _, record in rows]

    def aggregate(self, records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``finish(partial(records))``: the whole aggregation in one process."""
        return self.finish(self.partial(records))


def merge_partials(
    aggregation: Aggregation, partials_list: Iterable[Mapping[str, Any]]
) -> Partials:
    """Combine partials (from partitions, or earlier merges) into one; order does not matter.

    The inputs are not modified. Raises ValueError for partials of a different aggregation.
    """
    merged: dict[str, _Group] = {}
    for partials in partials_list:
        for key, data in partials.items():
            group = aggregation._decode(data)
            current = merged.get(key)
            if current is None:
                merged[key] = group
            else:
                aggregation._merge_into(current, group)
    return aggregation._encode(merged)


def parse_aggregation(
    grouping: str | None,
    projection: str | None,
    *,
    grouping_at: int = 0,
    projection_at: int = 0,
) -> Aggregation:
    """Parse the ``grouping`` and ``projection`` option values (``[/a, ...]``) of a ``sow``.

    Either may also be given as the whole option item (``grouping=[/a]``). Positions in errors
    are 0-based offsets into the given text plus ``grouping_at`` / ``projection_at``, so callers
    that cut the values out of a longer option string can report positions in that string.
    Raises :class:`AggregationError` (an InvalidCommandError) naming the option and position.
    """
    if grouping is None and projection is None:
        raise AggregationError(
            "grouping", grouping_at, "an aggregated query needs grouping=[...] and projection=[...]"
        )
    if projection is None:
        raise AggregationError(
            "grouping",
            grouping_at,
            "grouping needs a projection: list the output fields in projection=[...]",
        )
    if grouping is None:
        raise AggregationError(
            "projection",
            projection_at,
            "projection needs a grouping: give the fields to group by in grouping=[...]",
        )

    gsrc = _source("grouping", grouping, grouping_at)
    paths: list[str] = []
    for start, end in _list_entries(gsrc):
        try:
            node: ast.Expr | None = parse_filter(" " * start + gsrc.text[start:end])
        except FilterError:
            node = None
        if not isinstance(node, ast.Path):
            raise gsrc.error(
                start,
                f"grouping lists field paths such as /region, not {gsrc.fragment(start, end)!r}",
            )
        if node.text in paths:
            raise gsrc.error(start, f"{node.text} is listed twice in grouping")
        paths.append(node.text)

    psrc = _source("projection", projection, projection_at)
    entries: list[_Entry] = []
    for start, end in _list_entries(psrc):
        entry = _projection_entry(psrc, start, end)
        steps = path_steps(entry.output)
        for other in entries:
            other_steps = path_steps(other.output)
            shorter = min(len(steps), len(other_steps))
            if steps == other_steps:
                raise psrc.error(
                    entry.output_at,
                    f"output path {entry.output} is already produced (at position "
                    f"{psrc.offset + other.output_at})",
                )
            if steps[:shorter] == other_steps[:shorter]:
                raise psrc.error(
                    entry.output_at,
                    f"output path {entry.output} clashes with {other.output} (at position "
                    f"{psrc.offset + other.output_at}): one would hold the other",
                )
        entries.append(entry)
    return Aggregation(paths, entries, grouping_text=grouping, projection_text=projection)


# ---------------------------------------------------------------------------- shared with views
# Maintained views (sowstream.views) read projection fields with this parser and group, compare
# and spell values with these rules, so that an aggregated query and a view with the same
# projection give the same records.

ProjectionEntry = _Entry
"""A parsed projection field: ``output`` path, ``expr`` with each aggregate call replaced by a
path at the call's position, and ``calls`` (:class:`AggregateCall`) keyed by that position."""
AggregateCall = _Call
field_value = _field_value
group_component = _component
spelling_rank = _spelling_rank
rewrite_expr = _rewrite
set_output_path = _set_path
output_number = _output_number
finite_number = _number
mask_strings = _mask_strings


def parse_projection_field(
    text: str,
    *,
    aggregates: Collection[str] = AGGREGATE_FUNCTIONS,
    stage: bool = False,
    functions: Collection[str] = (),
) -> ProjectionEntry:
    """Parse one projection entry (``SUM(/qty) AS /total``), without the surrounding list.

    ``aggregates`` names the functions read as aggregate calls (views accept more than queries);
    ``stage`` reads a Preprocessing or Enrichment field (``parse_filter``'s ``stage``),
    ``functions`` admits some stage-only functions (``parse_filter``'s ``functions``).
    Raises :class:`AggregationError` with the 0-based position in ``text``.
    """
    src = _source("projection", text, 0, stage, functions)
    masked = src.masked
    start = len(masked) - len(masked.lstrip())
    end = len(masked.rstrip())
    if start >= end:
        raise src.error(0, "the projection field is empty")
    return _projection_entry(src, start, end, tuple(aggregates))


def parse_grouping_field(text: str) -> str:
    """The field path of one grouping entry (``/region``); AggregationError if it is not one."""
    src = _source("grouping", text, 0)
    start = len(text) - len(text.lstrip())
    try:
        node: ast.Expr | None = parse_filter(text)
    except FilterError:
        node = None
    if not isinstance(node, ast.Path):
        raise src.error(
            start, f"grouping lists field paths such as /region, not {src.fragment(0, len(text))!r}"
        )
    return node.text
