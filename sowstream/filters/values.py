"""Value rules shared by the filter evaluator, OrderBy sorting and hash indexes.

These functions define what a field path reads from a record, what counts as NULL, when a string
is a number and how a value is spelled as text; every part of sowstream that compares record
values must go through them so that a filter, a sort and an index lookup agree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

__all__ = [
    "canonical_text",
    "collect_path",
    "get_path",
    "is_null",
    "path_steps",
    "scalar_text",
    "str_to_number",
    "to_number",
]

# ASCII digits only: Python's int() also accepts other scripts' digits and "1_000", which a
# Spark cast would not, and the two backends must agree on what is numeric.
_NUMBER_RE = re.compile(
    r"[ \t\n\r]*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[ \t\n\r]*\Z"
)
_INTEGER_RE = re.compile(r"[ \t\n\r]*[+-]?[0-9]+[ \t\n\r]*\Z")


def path_steps(path: str) -> tuple[str, ...]:
    """Split a field path such as ``/a/b`` into its keys; the leading ``/`` is required."""
    if not path.startswith("/"):
        raise ValueError(f"a field path starts with '/': {path!r}")
    return tuple(path[1:].split("/"))


def get_path(record: Mapping[str, Any], path: str | Sequence[str]) -> list[Any]:
    """Every value ``path`` reaches in ``record``: ``[]`` when absent, several through arrays.

    A JSON array met on the way (or at the end) contributes each of its elements, nested arrays
    included, which is how repeated fields take part in "any value matches" comparisons.
    """
    steps = path_steps(path) if isinstance(path, str) else tuple(path)
    out: list[Any] = []
    collect_path(record, steps, 0, out)
    return out


def collect_path(node: Any, steps: Sequence[str], index: int, out: list[Any]) -> None:
    """Append to ``out`` every value reached from ``node`` by following ``steps[index:]``."""
    if isinstance(node, list | tuple):
        for item in node:
            collect_path(item, steps, index, out)
        return
    if index == len(steps):
        out.append(node)
        return
    if isinstance(node, Mapping) and steps[index] in node:
        collect_path(node[steps[index]], steps, index + 1, out)


def is_null(value: Any) -> bool:
    """True for the values the filter language treats as NULL: None (missing/null) and ``""``."""
    return value is None or (isinstance(value, str) and not value)


def to_number(value: Any) -> int | float | None:
    """The numeric reading of ``value``: numbers as is, numeric strings parsed, else None.

    Booleans are not numbers here, so ``true`` never equals ``1``.
    """
    kind = type(value)
    if kind is int or kind is float:
        number: int | float = value
        return number
    if kind is str:
        return str_to_number(value)
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        return str_to_number(value)
    return None


def str_to_number(text: str) -> int | float | None:
    """The number a string spells (ASCII digits, optional sign, fraction, exponent), else None."""
    # The isdigit() shortcut avoids a regex for the common case of a plain integer string.
    if (text.isascii() and text.isdigit()) or _INTEGER_RE.match(text):
        try:
            return int(text)
        except ValueError:  # more digits than int() accepts: a float still orders it right
            return float(text)
    if _NUMBER_RE.match(text):
        return float(text)
    return None


def canonical_text(value: Any) -> str:
    """The string form of a value used by hash indexes and generated SOW keys.

    Hash index values are compared as strings, so ``1``, ``1.0`` and ``"1"`` must all spell
    ``"1"`` while objects get a key-order-independent JSON spelling.
    """
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value.is_integer():
            return str(int(value))
        return repr(value)
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return str(value)


def scalar_text(value: Any) -> str | None:
    """The text string predicates (LIKE, BEGINS WITH, ENDS WITH) and string functions see.

    A non-empty string as is, a boolean or number in its canonical spelling; None for NULL and
    for objects. Memo indexes store exactly this text, so a scan of the index and a scan of the
    records test the same strings.
    """
    kind = type(value)
    if kind is str:
        return value if value else None
    if kind is bool or kind is int or kind is float:
        return canonical_text(value)
    return None
