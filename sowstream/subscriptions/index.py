"""An index over subscription filters: which subscriptions may match a record.

A topic can carry thousands of subscriptions, and every update must reach those whose filter
matches the record's old or new state. Testing every filter per update does not scale, so most
filters are indexed by one equality they require: a filter that is an AND (any nesting) with a
conjunct ``/path = literal`` or ``/path IN (literals)`` can only match a record whose value at
``/path`` equals one of those literals, so it is filed under the path and those values. A record
then looks up its own values at each indexed path. Filters with no such conjunct (OR, NOT, ranges,
no filter at all) are kept in a list that every record gets.

``candidates`` must be a superset of the matching subscriptions (callers still run each filter),
so the keys follow the evaluator's ``=`` exactly rather than the hash-index rule of comparing
canonical text (``sowstream.filters.index``), which would miss ``5`` against ``"5.0"``:

* a number literal equals numbers and numeric strings of the same value (``5``, ``5.0``,
  ``"5"``, ``" 5e0 "``);
* a string literal equals the identical string, and if it spells a number, numbers of that value
  (but not other spellings: ``'5'`` does not equal ``"5.0"``);
* a boolean literal equals booleans only (``true`` is neither ``1`` nor ``'true'``);
* NULL and ``''`` equal nothing, so ``/a = NULL`` is filed under no key at all.

Numbers are dictionary keys as they are: Python's ``5 == 5.0`` with equal hashes is exactly the
numeric equality the evaluator uses.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sowstream.filters import ast
from sowstream.filters.evaluate import compile_predicate
from sowstream.filters.values import get_path, str_to_number

__all__ = ["FilterIndex"]

# The buckets of one indexed path, by what filed the key and which record values can hit it.
_NUMBERS = 0  # number literals: hit by record numbers and numeric strings
_STRING_NUMBERS = 1  # the value of numeric string literals: hit by record numbers only
_STRINGS = 2  # string literals: hit by the identical record string
_FLAGS = 3  # boolean literals: hit by record booleans
_BUCKETS = 4

Key = tuple[int, Hashable]  # (bucket, value)


class _Never:
    """Marks a conjunct that no record satisfies, so the whole AND never matches."""


_NEVER = _Never()


@dataclass(frozen=True, slots=True)
class _Placement:
    """Where one subscription is filed, so that ``remove`` can undo ``add``."""

    path: str | None  # None with no keys: never matches; see ``unindexed`` for the rest
    keys: tuple[Key, ...]


class _PathIndex:
    """The subscriptions filed under one path, by normalised value."""

    __slots__ = ("buckets", "single", "steps")

    def __init__(self, path: str) -> None:
        self.steps = tuple(path[1:].split("/"))  # as ast.Path.steps, which the evaluator follows
        self.single = self.steps[0] if len(self.steps) == 1 else None
        self.buckets: list[dict[Any, set[str]]] = [{} for _ in range(_BUCKETS)]

    def __bool__(self) -> bool:
        return any(self.buckets)

    def values(self, record: Mapping[str, Any]) -> list[Any] | tuple[Any]:
        """Every value the path reads in ``record`` (several through arrays)."""
        if self.single is not None:
            # The common one-step path without building a list; arrays take the general route.
            value = record.get(self.single)
            if type(value) is not list and type(value) is not tuple:
                return (value,)
        return get_path(record, self.steps)

    def collect(self, value: Any, out: set[str]) -> None:
        """Add to ``out`` the subscriptions whose literal equals ``value`` under ``=``."""
        # Exact type tests, as in the evaluator: other types (bool is an int subclass) never
        # compare equal to a literal of these kinds.
        kind = type(value)
        if kind is str:
            if not value:
                return  # '' is NULL
            subs = self.buckets[_STRINGS].get(value)
            if subs:
                out |= subs
            numbers = self.buckets[_NUMBERS]
            if numbers:
                number = str_to_number(value)
                if number is not None:
                    subs = numbers.get(number)
                    if subs:
                        out |= subs
        elif kind is int or kind is float:
            for bucket in (_NUMBERS, _STRING_NUMBERS):
                subs = self.buckets[bucket].get(value)
                if subs:
                    out |= subs
        elif kind is bool:
            subs = self.buckets[_FLAGS].get(value)
            if subs:
                out |= subs


def _conjuncts(expr: ast.Expr) -> Iterator[ast.Expr]:
    if isinstance(expr, ast.And):
        for operand in expr.operands:
            yield from _conjuncts(operand)
    else:
        yield expr


def _literal_keys(value: ast.Scalar) -> list[Key]:
    """The keys under which a record value equal to ``value`` is found; none for NULL."""
    if value is None or value == "":
        return []
    if isinstance(value, bool):
        return [(_FLAGS, value)]
    if isinstance(value, str):
        keys: list[Key] = [(_STRINGS, value)]
        number = str_to_number(value)
        if number is not None:
            keys.append((_STRING_NUMBERS, number))
        return keys
    return [(_NUMBERS, value)]


def _pinned(conjunct: ast.Expr) -> tuple[str, list[Key]] | _Never | None:
    """``(path, keys)`` if ``conjunct`` requires ``path`` to equal literals, ``_NEVER`` if it
    can never be true, None if it says nothing an index can use."""
    literals: tuple[ast.Expr, ...]
    match conjunct:
        case ast.Compare(op="=", left=ast.Path() as path, right=ast.Literal() as literal):
            target, literals = path, (literal,)
        case ast.Compare(op="=", left=ast.Literal() as literal, right=ast.Path() as path):
            target, literals = path, (literal,)
        case ast.In(value=ast.Path() as path, options=options):
            target, literals = path, options
        case ast.Path() as path:
            # A value where a condition is expected means `value = TRUE`.
            target, literals = path, (ast.Literal(True),)
        case _:
            return _constant(conjunct)
    keys: list[Key] = []
    for option in literals:
        if not isinstance(option, ast.Literal):
            return None  # `/a IN (/b, 1)` compares with another field: no fixed values
        keys.extend(_literal_keys(option.value))
    return target.text, keys


def _constant(conjunct: ast.Expr) -> _Never | None:
    """``_NEVER`` for a conjunct that reads no field and is not TRUE (``1 = 0``), else None."""
    if ast.paths(conjunct):
        return None
    try:
        value = compile_predicate(conjunct)({})
    except Exception:  # whatever cannot be worked out here is left to the filter itself
        return None
    return None if value is True else _NEVER


def _choose(expr: ast.Expr) -> tuple[str, list[Key]] | _Never | None:
    """The conjunct to file ``expr`` under: the one with the fewest keys, or None."""
    best: tuple[str, list[Key]] | None = None
    for conjunct in _conjuncts(expr):
        found = _pinned(conjunct)
        if found is None:
            continue
        if isinstance(found, _Never):
            return found
        path, keys = found
        keys = list(dict.fromkeys(keys))  # `IN (1, 1.0)` is one key
        if not keys:
            return _NEVER  # `/a = NULL`: nothing equals NULL
        if best is None or len(keys) < len(best[1]):
            best = (path, keys)
    return best


class FilterIndex:
    """Finds the subscriptions whose filter may match a record.

    ``candidates(record)`` is a superset of the subscriptions whose filter matches ``record``:
    callers still evaluate each candidate's filter.
    """

    def __init__(self) -> None:
        self._paths: dict[str, _PathIndex] = {}
        self._unindexed: set[str] = set()
        self._placements: dict[str, _Placement] = {}
        # The indexed paths, a new tuple whenever they change: values read at an older one
        # are not used (``candidates_at``).
        self.paths: tuple[str, ...] = ()
        self._indexes: tuple[_PathIndex, ...] = ()

    def _paths_changed(self) -> None:
        self.paths = tuple(self._paths)
        self._indexes = tuple(self._paths.values())

    def add(self, sub_id: str, expr: ast.Expr | None) -> None:
        """File ``sub_id`` by its filter (None matches everything); re-adding replaces it."""
        self.remove(sub_id)
        choice = _choose(expr) if expr is not None else None
        if choice is None:
            self._unindexed.add(sub_id)
            self._placements[sub_id] = _Placement(None, ())
            return
        if isinstance(choice, _Never):
            self._placements[sub_id] = _Placement(None, ())
            return
        path, keys = choice
        index = self._paths.get(path)
        if index is None:
            index = self._paths[path] = _PathIndex(path)
            self._paths_changed()
        for bucket, value in keys:
            index.buckets[bucket].setdefault(value, set()).add(sub_id)
        self._placements[sub_id] = _Placement(path, tuple(keys))

    def remove(self, sub_id: str) -> None:
        """Forget ``sub_id``; an unknown id is ignored."""
        placement = self._placements.pop(sub_id, None)
        if placement is None:
            return
        self._unindexed.discard(sub_id)
        if placement.path is None:
            return
        index = self._paths[placement.path]
        for bucket, value in placement.keys:
            subs = index.buckets[bucket].get(value)
            if subs is not None:
                subs.discard(sub_id)
                if not subs:
                    del index.buckets[bucket][value]
        if not index:
            del self._paths[placement.path]  # keep lookups to paths someone still files under
            self._paths_changed()

    def candidates(self, record: Mapping[str, Any]) -> set[str]:
        """The subscriptions whose filter may match ``record`` (a superset of those that do)."""
        out = set(self._unindexed)
        for index in self._paths.values():
            for value in index.values(record):
                index.collect(value, out)
        return out

    def candidates_at(self, paths: tuple[str, ...], values: tuple[Any, ...]) -> set[str] | None:
        """``candidates`` of a record known by its scalars at ``paths`` (one per path: None
        when absent, null or not a scalar); None when ``paths`` are no longer the index's."""
        if paths is not self.paths:
            return None
        out = set(self._unindexed)
        for index, value in zip(self._indexes, values, strict=True):
            if value is not None:
                index.collect(value, out)
        return out

    @property
    def unindexed(self) -> frozenset[str]:
        """The subscriptions every record is a candidate for (no usable equality)."""
        return frozenset(self._unindexed)

    def indexed_path(self, sub_id: str) -> str | None:
        """The path ``sub_id`` is filed under; None if unindexed, never matching, or unknown."""
        placement = self._placements.get(sub_id)
        return placement.path if placement is not None else None

    def __contains__(self, sub_id: object) -> bool:
        return sub_id in self._placements

    def __len__(self) -> int:
        return len(self._placements)
