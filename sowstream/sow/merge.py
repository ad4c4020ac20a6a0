"""The delta_publish merge rule.

The update's fields replace the stored ones by path. Where both sides hold an object at the same
path the objects merge field by field; anything else (scalars, arrays, an object replacing a
scalar) is replaced whole, because array elements have no identity to merge by. A field absent from
the update keeps its stored value, and a field present is an update even if the value is equal.
"""

from __future__ import annotations

from typing import Any


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
