"""What changed between two parsed bodies, and how an update merges into one.

A delta message carries only the fields an update changed; :func:`changed_fields` computes them,
with :func:`same_value` as the JSON notion of equality. The delta_publish merge rule
(:func:`merge_delta`) applies an update to a stored body: the update's fields replace the stored
ones by path; where both sides hold an object at the same path the objects merge field by field;
anything else (scalars, arrays, an object replacing a scalar) is replaced whole, because array
elements have no identity to merge by. A field absent from the update keeps its stored value, and
a field present is an update even if the value is equal. Records are parsed objects; no function
modifies its arguments, though results may share nested values with them.

These live with the message types because every type's diff and merge are defined on its parsed
body; the SOW, subscriptions and the client use them from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["changed_fields", "merge_delta", "merge_deltas", "same_value"]


def same_value(a: Any, b: Any) -> bool:
    """Whether two parsed JSON values are the same JSON value.

    Stricter than ``==``: Python treats ``True == 1`` but JSON ``true`` and ``1`` differ, while
    ``1`` and ``1.0`` are the same JSON number. Arrays compare element by element and objects key
    by key, with the same rule all the way down.
    """
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    if a is None or b is None:
        return a is b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping | list | tuple) or isinstance(b, Mapping | list | tuple):
        return False  # an object against an array, or a container against a scalar
    return bool(a == b)


def changed_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``new`` that differ from ``old``: the body of a delta message.

    Objects present on both sides are compared field by field and contribute a nested dict of
    just their changed fields (nothing if none changed); arrays and scalars are compared whole
    with :func:`same_value`. A field that ``old`` has and ``new`` lacks is reported as ``None``
    (JSON null): that is how a delta says a field was removed, and merging the delta into ``old``
    with the delta_publish rule leaves that field null. A field set to null therefore looks the
    same in a delta as a removed one.
    """
    delta: dict[str, Any] = {}
    for field, value in new.items():
        if field not in old:
            delta[field] = value
            continue
        before = old[field]
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            inner = changed_fields(before, value)
            if inner:
                delta[field] = inner
        elif not same_value(before, value):
            delta[field] = value
    for field in old:
        if field not in new:
            delta[field] = None
    return delta


def merge_delta(stored: dict[str, Any] | None, update: dict[str, Any]) -> dict[str, Any]:
    """Return ``stored`` with ``update`` merged in; neither argument is modified."""
    if stored is None:
        return update
    merged = dict(stored)
    for field, value in update.items():
        current = merged.get(field)
        if isinstance(value, dict) and isinstance(current, dict):
            merged[field] = merge_delta(current, value)
        else:
            merged[field] = value
    return merged


def merge_deltas(first: Mapping[str, Any], later: Mapping[str, Any]) -> dict[str, Any]:
    """One delta with the effect of ``first`` followed by ``later`` (conflation).

    This is the delta_publish merge rule: ``later``'s fields win, objects on both sides merge
    field by field, and fields only ``first`` has are kept, so a field that changed and then
    changed back is still reported, with its final value.
    """
    # merge_delta returns its update unchanged when there is no stored side; a dict copy of
    # ``first`` always gives it one, so the result is always a new dict.
    return merge_delta(dict(first), dict(later))
