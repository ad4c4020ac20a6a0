"""Recognise filters that a hash index (or the SowKey) can answer with direct lookups.

A hash index maps the canonical text of a fixed set of fields to records, so it serves exactly
the filters that pin every one of those fields, and nothing else, to literal values with ``=``
or ``IN``. Like AMPS, index values are compared as text: ``/qty = 5`` looks up ``"5"`` and will
not find a record holding ``"5.0"``, which a full scan would match. Index lookups produce
candidates: callers still run the filter on them (that also settles type rules such as
``true`` vs ``'true'``, which share the text ``"true"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product
from math import prod
from typing import TypeVar

from . import ast
from .values import canonical_text, str_to_number

__all__ = ["MAX_LOOKUPS", "conjuncts", "equality_lookup", "string_lookup", "usable_hash_index"]

# Beyond this many value combinations (large INs multiplied together) a scan is the better plan.
MAX_LOOKUPS = 10_000

IndexT = TypeVar("IndexT", bound=Sequence[str])


def conjuncts(expr: ast.Expr) -> list[ast.Expr]:
    """The operands of an AND, nested ANDs flattened (``[expr]`` for anything else)."""
    if isinstance(expr, ast.And):
        return [c for operand in expr.operands for c in conjuncts(operand)]
    return [expr]


def _literal_texts(literals: Sequence[ast.Expr]) -> list[str] | None:
    """Canonical texts of the non-NULL literals (NULL never equals anything), or None."""
    texts: dict[str, None] = {}
    for lit in literals:
        if not isinstance(lit, ast.Literal):
            return None
        if lit.value is None or lit.value == "":
            continue
        texts[canonical_text(lit.value)] = None
    return list(texts)


def _pinned(expr: ast.Expr) -> tuple[str, list[str]] | None:
    """``(path, texts)`` when ``expr`` is ``path = literal`` or ``path IN (literals)``."""
    if isinstance(expr, ast.Compare) and expr.op == "=":
        left, right = expr.left, expr.right
        if isinstance(right, ast.Path):
            left, right = right, left
        if isinstance(left, ast.Path) and isinstance(right, ast.Literal):
            texts = _literal_texts([right])
            return None if texts is None else (left.text, texts)
        return None
    if isinstance(expr, ast.In) and isinstance(expr.value, ast.Path):
        texts = _literal_texts(expr.options)
        return None if texts is None else (expr.value.text, texts)
    return None


def equality_lookup(
    expr: ast.Expr, fields: Sequence[str], *, max_lookups: int = MAX_LOOKUPS
) -> list[tuple[str, ...]] | None:
    """The value combinations to look up, in ``fields`` order, or None if the index can't serve.

    ``expr`` must be an AND (any nesting) of ``=``/``IN`` tests pinning each of ``fields``
    exactly once to literals. An empty list means no record can match (e.g. ``/a = NULL``).
    """
    wanted = set(fields)
    if not fields or len(wanted) != len(fields):
        return None
    pinned: dict[str, list[str]] = {}
    for conjunct in conjuncts(expr):
        found = _pinned(conjunct)
        if found is None:
            return None
        path, texts = found
        if path not in wanted or path in pinned:
            return None
        pinned[path] = texts
    if len(pinned) != len(wanted):
        return None
    columns = [pinned[f] for f in fields]
    if prod(len(c) for c in columns) > max_lookups:
        return None
    return list(product(*columns))


def _plain_strings(expr: ast.Expr) -> bool:
    """Whether every literal ``expr`` compares with is a string that is not a number."""
    literals = [expr.right, expr.left] if isinstance(expr, ast.Compare) else []
    if isinstance(expr, ast.In):
        literals = list(expr.options)
    return all(
        isinstance(lit.value, str) and str_to_number(lit.value) is None
        for lit in literals
        if isinstance(lit, ast.Literal)
    )


def string_lookup(
    parts: Sequence[ast.Expr], fields: Sequence[str], *, max_lookups: int = MAX_LOOKUPS
) -> list[tuple[str, ...]] | None:
    """Lookups for an index on ``fields`` from some of the conjuncts ``parts`` of an AND.

    Unlike :func:`equality_lookup` the other conjuncts may be anything, so this serves as one
    way into a larger filter whose result must not depend on the index: only pins to strings
    that are not numbers count, whose text lookup finds every value the comparison matches
    (``/a = 5`` also matches ``"5.0"``, which a text lookup of ``"5"`` would miss).
    """
    wanted = set(fields)
    if not fields or len(wanted) != len(fields):
        return None
    pinned: dict[str, list[str]] = {}
    for part in parts:
        found = _pinned(part)
        if found is None or found[0] not in wanted or found[0] in pinned:
            continue
        if _plain_strings(part):
            pinned[found[0]] = found[1]
    if len(pinned) != len(wanted):
        return None
    columns = [pinned[f] for f in fields]
    if prod(len(c) for c in columns) > max_lookups:
        return None
    return list(product(*columns))


def usable_hash_index(
    expr: ast.Expr, indexes: Sequence[IndexT]
) -> tuple[IndexT, list[tuple[str, ...]]] | None:
    """The first of ``indexes`` (each a sequence of field paths) that ``expr`` can use, with
    its lookups; None when every index would need a scan."""
    for index in indexes:
        lookups = equality_lookup(expr, index)
        if lookups is not None:
            return index, lookups
    return None
