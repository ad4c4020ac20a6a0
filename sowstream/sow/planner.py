"""Which records a filter can touch: key lookups, hash-index or memo-index lookups, or a scan.

The order of preference is AMPS's: a filter that is exactly an equality (``=``/``IN``) on the Key
fields reads those SowKeys, one on exactly a HashIndex's fields reads that index (both compare
values as text, as AMPS's hash indexes do); otherwise a memo index serves ranges, BEGINS WITH,
ENDS WITH, LIKE and equality on its field; anything else scans the partition.

Inside a larger filter an AND is served by its most selective indexed conjunct (a Key or hash
lookup on strings first, then the memo index with the fewest entries in range), and an OR only
when every branch can be served (the union of their lookups). Whatever the plan, it yields a
superset of the matches: the full filter is run on every candidate, so a plan changes how fast a
query is answered, never what it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from sowstream.filters import Filter, ast
from sowstream.filters.index import conjuncts, equality_lookup, string_lookup
from sowstream.filters.values import canonical_text, scalar_text, str_to_number
from sowstream.sow.keys import sow_key_from_values
from sowstream.sow.layout import index_entry_prefix
from sowstream.sow.memo import (
    KeyRange,
    index_prefix,
    number_range,
    text_prefix_range,
    text_range,
)
from sowstream.sow.patterns import NameScope, record_key
from sowstream.sow.ports import TopicDefinition

__all__ = [
    "FullScan",
    "IndexLookup",
    "KeyLookup",
    "MemoLookup",
    "Plan",
    "UnionLookup",
    "describe",
    "like_prefix",
    "memo_paths",
    "plan",
    "plan_name",
]

MemoKind = Literal["equality", "prefix", "between", "range", "text scan"]
# Without counts, how selective each kind of memo lookup usually is (lower: fewer records).
_RANK: dict[str, int] = {"equality": 1, "prefix": 2, "between": 2, "range": 3, "text scan": 4}
_META = frozenset(".^$*+?{}[]\\|()")


@dataclass(frozen=True)
class KeyLookup:
    """Read exactly these SowKeys."""

    sow_keys: tuple[str, ...]


@dataclass(frozen=True)
class IndexLookup:
    """Read the records under these hash-index entry prefixes."""

    index: int
    prefixes: tuple[bytes, ...]


@dataclass(frozen=True)
class MemoLookup:
    """Read the records whose entries in the memo index on ``path`` lie in ``ranges``.

    With ``like`` (a regular expression) or ``suffixes`` only entries whose text passes that
    test count: the index's texts are read instead of the records.
    """

    path: str
    ranges: tuple[KeyRange, ...]
    kind: MemoKind
    like: str | None = None
    suffixes: tuple[str, ...] | None = None

    @property
    def prefix(self) -> bytes:
        """The key prefix of the index's entries."""
        return index_prefix(self.path)


@dataclass(frozen=True)
class UnionLookup:
    """Every record any of ``parts`` reads (an OR whose branches all have a lookup)."""

    parts: tuple[Plan, ...]


@dataclass(frozen=True)
class FullScan:
    """Test every record."""


Plan = KeyLookup | IndexLookup | MemoLookup | UnionLookup | FullScan
Estimate = Callable[[MemoLookup], int | None]


@dataclass(frozen=True)
class _Context:
    topic: TopicDefinition
    ready: Collection[str]
    auto: bool
    estimate: Estimate | None
    # A Pattern topic's one topic name read (None: several, or not a Pattern topic).
    name: str | None = None

    def key_lookup(self, combos: list[tuple[str, ...]]) -> KeyLookup | None:
        """The SowKeys (record keys on a Pattern topic) of these Key values; None on a Pattern
        topic read across names, whose records' keys depend on their names."""
        topic = self.topic
        if topic.pattern is None:
            return _key_lookup(topic.effective_key_domain, combos)
        if self.name is None:
            return None
        found = _key_lookup(topic.key_domain_of(self.name), combos)
        return KeyLookup(tuple(record_key(self.name, k) for k in found.sow_keys))

    def usable(self, path: str, *, builds: bool) -> bool:
        """Whether a memo index on ``path`` exists, or may be built for this kind of test."""
        return path in self.ready or (builds and self.auto)


def plan(
    topic: TopicDefinition,
    flt: Filter | None,
    sow_keys: Sequence[str] | None = None,
    *,
    memo_ready: Collection[str] = (),
    memo_auto: bool = False,
    estimate: Estimate | None = None,
    scope: NameScope | None = None,
) -> Plan:
    """The cheapest way to find the records ``flt`` (and ``sow_keys``) can match.

    ``memo_ready`` are the fields whose memo index is complete; with ``memo_auto`` a range,
    BEGINS WITH, ENDS WITH or LIKE on any other field plans a memo index too (the caller builds
    it before reading, see :func:`memo_paths`). ``estimate`` counts a memo lookup's entries
    (None when unknown) to pick the most selective conjunct of an AND.

    On a Pattern topic ``scope`` says which topic names are read: key lookups need exactly one
    (a record's key holds its name); across names the plan is a superset and the caller keeps
    the records in scope (``NameScope.admits``), SowKeys included.
    """
    name = scope.literal if scope is not None else None
    ctx = _Context(topic, memo_ready, memo_auto, estimate, name)
    if sow_keys is not None:
        keys = tuple(dict.fromkeys(sow_keys))
        if topic.pattern is None:
            return KeyLookup(keys)
        return (
            KeyLookup(tuple(record_key(name, k) for k in keys)) if name is not None else FullScan()
        )
    if flt is None:
        return FullScan()
    expr = flt.ast
    if topic.keys:
        combos = equality_lookup(expr, topic.keys)
        if combos is not None and (keyed := ctx.key_lookup(combos)) is not None:
            return keyed
    for number, fields in enumerate(topic.hash_indexes):
        combos = equality_lookup(expr, fields)
        if combos is not None:
            return IndexLookup(number, tuple(index_entry_prefix(number, c) for c in combos))
    found = _access(expr, ctx)
    return found if found is not None else FullScan()


def memo_paths(how: Plan) -> set[str]:
    """The fields whose memo index ``how`` reads."""
    if isinstance(how, MemoLookup):
        return {how.path}
    if isinstance(how, UnionLookup):
        return {p for part in how.parts for p in memo_paths(part)}
    return set()


def plan_name(how: Plan) -> str:
    """A short label for metrics: key, hash, memo, union or scan."""
    match how:
        case KeyLookup():
            return "key"
        case IndexLookup():
            return "hash"
        case MemoLookup():
            return "memo"
        case UnionLookup():
            return "union"
    return "scan"


def describe(how: Plan) -> str:
    """The plan in words, for the debug log."""
    match how:
        case KeyLookup(sow_keys=keys):
            return f"SowKey lookup ({len(keys)} keys)"
        case IndexLookup(index=index, prefixes=prefixes):
            return f"hash index {index} ({len(prefixes)} lookups)"
        case MemoLookup(path=path, kind=kind, ranges=ranges):
            return f"memo index {path} ({kind}, {len(ranges)} ranges)"
        case UnionLookup(parts=parts):
            return "union of " + "; ".join(describe(p) for p in parts)
    return "full scan"


# -- access paths -------------------------------------------------------------------------------


def _key_lookup(domain: str, combos: list[tuple[str, ...]]) -> KeyLookup:
    return KeyLookup(tuple(dict.fromkeys(sow_key_from_values(domain, c) for c in combos)))


def _hashed(parts: Sequence[ast.Expr], ctx: _Context) -> Plan | None:
    """A Key or hash-index lookup served by some of ``parts`` (AND operands) on strings."""
    topic = ctx.topic
    if topic.keys:
        combos = string_lookup(parts, topic.keys)
        if combos is not None and (found := ctx.key_lookup(combos)) is not None:
            return found
    for number, fields in enumerate(topic.hash_indexes):
        combos = string_lookup(parts, fields)
        if combos is not None:
            return IndexLookup(number, tuple(index_entry_prefix(number, c) for c in combos))
    return None


def _access(expr: ast.Expr, ctx: _Context) -> Plan | None:
    """A lookup yielding every record ``expr`` can match, or None when only a scan can."""
    if isinstance(expr, ast.And):
        return _best_conjunct(conjuncts(expr), ctx)
    if isinstance(expr, ast.Or):
        parts: list[Plan] = []
        for operand in expr.operands:
            found = _access(operand, ctx)
            if found is None:
                return None
            parts.extend(found.parts if isinstance(found, UnionLookup) else [found])
        return UnionLookup(tuple(parts))
    hashed = _hashed([expr], ctx)
    return hashed if hashed is not None else _memo(expr, ctx)


def _best_conjunct(parts: list[ast.Expr], ctx: _Context) -> Plan | None:
    hashed = _hashed(parts, ctx)
    if hashed is not None:
        return hashed
    candidates = [found for part in parts if (found := _access(part, ctx)) is not None]
    candidates.extend(_bounded_pairs(parts, ctx))
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    return min(candidates, key=lambda c: _cost(c, ctx))


def _cost(how: Plan, ctx: _Context) -> tuple[int, int]:
    """Measured entries first (an index that exists and was counted), then the static rank."""
    count = _count(how, ctx)
    return (0, count) if count is not None else (1, _rank(how))


def _count(how: Plan, ctx: _Context) -> int | None:
    if isinstance(how, KeyLookup | IndexLookup):
        return len(how.sow_keys if isinstance(how, KeyLookup) else how.prefixes)
    if isinstance(how, MemoLookup):
        if ctx.estimate is None or how.path not in ctx.ready:
            return None
        return ctx.estimate(how)
    if isinstance(how, UnionLookup):
        counts = [_count(p, ctx) for p in how.parts]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)
    return None


def _rank(how: Plan) -> int:
    if isinstance(how, MemoLookup):
        return _RANK[how.kind]
    if isinstance(how, UnionLookup):
        return max(_rank(p) for p in how.parts)
    return 0


def _path_literal(expr: ast.Compare) -> tuple[str, ast.CompareOp, ast.Scalar] | None:
    """``(path, op, value)`` for ``path op literal`` written either way round."""
    flipped: dict[ast.CompareOp, ast.CompareOp] = {
        "=": "=",
        "!=": "!=",
        "<": ">",
        "<=": ">=",
        ">": "<",
        ">=": "<=",
    }
    left, right, op = expr.left, expr.right, expr.op
    if isinstance(left, ast.Literal) and isinstance(right, ast.Path):
        left, right, op = right, left, flipped[op]
    if isinstance(left, ast.Path) and isinstance(right, ast.Literal):
        return left.text, op, right.value
    return None


def _bounded_pairs(parts: list[ast.Expr], ctx: _Context) -> list[Plan]:
    """``/x >= a AND /x <= b`` read as one BETWEEN lookup on ``/x`` (bounds taken inclusive)."""
    lows: dict[str, ast.Scalar] = {}
    highs: dict[str, ast.Scalar] = {}
    for part in parts:
        found = _path_literal(part) if isinstance(part, ast.Compare) else None
        if found is None:
            continue
        path, op, value = found
        if op in (">", ">="):
            lows.setdefault(path, value)
        elif op in ("<", "<="):
            highs.setdefault(path, value)
    out: list[Plan] = []
    for path in lows.keys() & highs.keys():
        low, high = lows[path], highs[path]
        if _kind(low) != _kind(high):
            continue
        between = ast.Between(ast.Path(path), ast.Literal(low), ast.Literal(high))
        lookup = _memo(between, ctx)
        if lookup is not None:
            out.append(lookup)
    return out


def _memo(expr: ast.Expr, ctx: _Context) -> MemoLookup | None:
    """A memo-index lookup for one predicate on a field, or None."""
    match expr:
        case ast.Compare(op=op) if op != "!=":
            found = _path_literal(expr)
            if found is None:
                return None
            path, op, value = found
            if op == "=":
                if not ctx.usable(path, builds=False):
                    return None
                return MemoLookup(path, tuple(_equal(path, value)), "equality")
            if not ctx.usable(path, builds=True):
                return None
            return MemoLookup(path, tuple(_compare(path, op in (">", ">="), value)), "range")
        case ast.In(value=ast.Path(text=path), options=options):
            if not ctx.usable(path, builds=False) or not _all_literals(options):
                return None
            literals = [o.value for o in options if isinstance(o, ast.Literal)]
            ranges = [r for value in literals for r in _equal(path, value)]
            return MemoLookup(path, tuple(ranges), "equality")
        case ast.Between(value=ast.Path(text=path), low=ast.Literal(value=low)) if isinstance(
            expr.high, ast.Literal
        ):
            if not ctx.usable(path, builds=True):
                return None
            return MemoLookup(path, tuple(_between(path, low, expr.high.value)), "between")
        case ast.BeginsWith(value=ast.Path(text=path), prefixes=prefixes):
            if not ctx.usable(path, builds=True) or not _all_literals(prefixes):
                return None
            starts = _texts(prefixes)
            return MemoLookup(path, tuple(text_prefix_range(path, t) for t in starts), "prefix")
        case ast.EndsWith(value=ast.Path(text=path), suffixes=suffixes):
            if not ctx.usable(path, builds=True) or not _all_literals(suffixes):
                return None
            ends = tuple(_texts(suffixes))
            whole = (text_range(path, None, None),) if ends else ()
            return MemoLookup(path, whole, "text scan", suffixes=ends)
        case ast.Like(value=ast.Path(text=path), pattern=pattern):
            if not ctx.usable(path, builds=True):
                return None
            known = like_prefix(pattern)
            if known:
                return MemoLookup(path, (text_prefix_range(path, known),), "prefix", like=pattern)
            return MemoLookup(path, (text_range(path, None, None),), "text scan", like=pattern)
    return None


def _all_literals(items: Sequence[ast.Expr]) -> bool:
    return all(isinstance(i, ast.Literal) for i in items)


def _texts(items: Sequence[ast.Expr]) -> list[str]:
    """The texts of literal affixes as string predicates see them (NULLs never match)."""
    texts = (scalar_text(i.value) for i in items if isinstance(i, ast.Literal))
    return list(dict.fromkeys(t for t in texts if t is not None))


def _kind(value: ast.Scalar) -> str:
    """How a literal compares: as text, a number, a boolean, or never (NULL)."""
    if value is None or value == "":
        return "null"
    if isinstance(value, bool):
        return "bool"
    return "text" if isinstance(value, str) else "number"


def _equal(path: str, value: ast.Scalar) -> list[KeyRange]:
    """Entries a value equal to the literal has (strings equal as text, numbers as numbers)."""
    kind = _kind(value)
    if kind == "null":
        return []
    if kind == "bool":
        text = canonical_text(value)
        return [text_range(path, text, text)]
    if isinstance(value, str):
        out = [text_range(path, value, value)]
        number = str_to_number(value)
        numeric = None if number is None else number_range(path, number, number)
        return out + ([numeric] if numeric is not None else [])
    assert isinstance(value, int | float)
    exact = number_range(path, value, value)
    return [exact] if exact is not None else []


def _compare(path: str, lower: bool, value: ast.Scalar) -> list[KeyRange]:
    """Entries at or beyond the literal (``lower``: at or above it; else at or below)."""
    kind = _kind(value)
    if kind == "null":
        return []
    if kind == "bool":
        text = canonical_text(value)  # "false" < "true" as False < True
        return [text_range(path, text, None) if lower else text_range(path, None, text)]
    if isinstance(value, str):
        out = [text_range(path, value, None) if lower else text_range(path, None, value)]
        number = str_to_number(value)
        if number is not None:
            bounds = (number, None) if lower else (None, number)
            numeric = number_range(path, *bounds)
            out += [numeric] if numeric is not None else []
        return out
    assert isinstance(value, int | float)
    found = number_range(path, value, None) if lower else number_range(path, None, value)
    return [found] if found is not None else []


def _between(path: str, low: ast.Scalar, high: ast.Scalar) -> list[KeyRange]:
    """Entries between the bounds; one bound's range when they compare by different rules."""
    kind = _kind(low)
    if kind == "null" or _kind(high) == "null":
        return []
    if kind != _kind(high):
        # e.g. 1 AND 'z': a string value may meet one bound as a number and the other as text,
        # so only the lower bound narrows the search.
        return _compare(path, True, low)
    if kind == "bool":
        return [text_range(path, canonical_text(low), canonical_text(high))]
    if isinstance(low, str) and isinstance(high, str):
        out = [text_range(path, low, high)]
        lo, hi = str_to_number(low), str_to_number(high)
        if lo is not None and hi is not None:
            numeric = number_range(path, lo, hi)
            out += [numeric] if numeric is not None else []
        return out
    assert isinstance(low, int | float) and isinstance(high, int | float)
    found = number_range(path, low, high)
    return [found] if found is not None else []


def like_prefix(pattern: str) -> str:
    """The literal text every match of ``pattern`` starts with ('' when none is certain).

    Only a pattern anchored with ``^`` and without alternation has one: the plain characters
    after the anchor, less the last if a quantifier makes it optional.
    """
    if not pattern.startswith("^") or "|" in pattern:
        return ""
    end = 1
    while end < len(pattern) and pattern[end] not in _META:
        end += 1
    if end < len(pattern) and pattern[end] in "?*{":
        end -= 1
    return pattern[1:end]
