"""The OrderBy header (``/orderDate DESC, /customerName ASC``) and the sort key it defines.

Records hold mixed JSON, so the key imposes one total order on all values: numbers (numeric
strings included, compared numerically), then other strings, then booleans, then objects, and
NULL last (first under DESC, which simply reverses the whole order of a field).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .parser import parse_order_by_fields
from .values import canonical_text, get_path, str_to_number

__all__ = ["SortField", "parse_order_by", "sort_key"]


@dataclass(frozen=True, slots=True)
class SortField:
    """One OrderBy entry: a field path and its direction (ascending unless ``descending``)."""

    path: str
    descending: bool = False


def parse_order_by(text: str) -> tuple[SortField, ...]:
    """Parse a comma-separated ``/path [ASC|DESC]`` list; errors are FilterErrors with positions."""
    return tuple(SortField(path, descending) for path, descending, _ in parse_order_by_fields(text))


_NUMBER, _STRING, _BOOLEAN, _OTHER, _NULL = range(5)
_NULL_KEY = (_NULL, 0)


def _value_key(value: Any) -> tuple[int, Any]:
    kind = type(value)
    if value is None:
        return _NULL_KEY
    if kind is int or kind is float:
        return (_NUMBER, value)
    if kind is str:
        if not value:
            return _NULL_KEY
        number = str_to_number(value)
        return (_STRING, value) if number is None else (_NUMBER, number)
    if kind is bool:
        return (_BOOLEAN, value)
    return (_OTHER, canonical_text(value))


class _Descending:
    """Wraps a key so that it sorts in reverse; still a total order, so fields can mix."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[int, Any]) -> None:
        self.key = key

    def __lt__(self, other: _Descending) -> bool:
        return other.key < self.key

    def __le__(self, other: _Descending) -> bool:
        return other.key <= self.key

    def __gt__(self, other: _Descending) -> bool:
        return other.key > self.key

    def __ge__(self, other: _Descending) -> bool:
        return other.key >= self.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"_Descending({self.key!r})"


def _first_value_getter(path: str) -> Callable[[Mapping[str, Any]], Any]:
    steps = path[1:].split("/")
    if len(steps) == 1:
        key = steps[0]

        def first_of_key(record: Mapping[str, Any]) -> Any:
            value = record.get(key)
            if isinstance(value, list | tuple):
                found = get_path(record, steps)
                return found[0] if found else None
            return value

        return first_of_key

    def first_of_path(record: Mapping[str, Any]) -> Any:
        found = get_path(record, steps)
        return found[0] if found else None

    return first_of_path


def sort_key(fields: Sequence[SortField]) -> Callable[[Mapping[str, Any]], Any]:
    """A ``sorted()`` key for records ordered by ``fields`` (multi-valued paths: first value)."""
    parts = [(_first_value_getter(f.path), f.descending) for f in fields]

    def key(record: Mapping[str, Any]) -> tuple[Any, ...]:
        out: list[Any] = []
        for get, descending in parts:
            k = _value_key(get(record))
            out.append(_Descending(k) if descending else k)
        return tuple(out)

    return key
