"""Group keys and the spelling a group shows: how aggregated queries (and views) read a grouping
field's value, compare it and choose among equivalent spellings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from sowstream.filters.values import canonical_text, is_null

__all__ = ["Group", "field_value", "group_component", "spelling_rank"]


def field_value(values: list[Any]) -> Any:
    """One field's value from what its path read: None, the single value, or a list of several."""
    present = [v for v in values if not is_null(v)]
    if not present:
        return None
    return present[0] if len(present) == 1 else present


def group_component(value: Any) -> Any:
    """A field value's part of the group key: spellings with the same text group together."""
    if value is None:
        return None
    if isinstance(value, list):
        return [canonical_text(v) for v in value]
    return canonical_text(value)


def component_text(component: Any) -> str:
    """A group key component as a SowKey part: "" for NULL, JSON for several values."""
    if component is None:
        return ""
    if isinstance(component, list):
        return orjson.dumps(component).decode()
    return str(component)


def _json_text(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # not JSON (records from JSON always are): fall back to a stable spelling
        return repr(value)


def spelling_rank(value: Any) -> tuple[int, str]:
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


class Group:
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
            if spelling_rank(value) < spelling_rank(current):
                self.keys[i] = value

    def offer_loose(self, loose: list[Any]) -> None:
        rank = _loose_rank(loose)
        if self.loose_rank is None or rank < self.loose_rank:
            self.loose, self.loose_rank = loose, rank
