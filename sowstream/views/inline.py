"""Inline conflation (``Conflation: inline``): a batch of underlying changes folded so each
underlying record and each view record is handled once.

Pure functions, so the engine and the property tests share them: :func:`conflate` merges the
changes of one underlying record, :func:`last_per_record` keeps each view record's last state.
Both keep the final view equal to applying every change one by one; only intermediate view
records are skipped, which is what the option asks for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sowstream.views.maintainer import ViewChange

__all__ = ["UnderlyingChange", "conflate", "last_per_record"]


@dataclass(frozen=True, slots=True)
class UnderlyingChange:
    """One change of an underlying record as a view reads it; ``seq`` is its input position."""

    topic: str
    sow_key: str
    before: Any
    after: Any
    seq: int


def conflate(changes: Iterable[UnderlyingChange]) -> list[UnderlyingChange]:
    """The changes of each underlying record merged into one, from its first before image to its
    last after image, placed (and ordered) at its last change.

    The images chain (a change's before image is the previous change's after image, as the view
    partition saw the record), so retracting the first and adding the last leaves every group as
    applying the changes one by one would.
    """
    merged: dict[tuple[str, str], UnderlyingChange] = {}
    for change in changes:
        key = (change.topic, change.sow_key)
        first = merged.pop(key, None)
        if first is not None:
            change = UnderlyingChange(
                change.topic, change.sow_key, first.before, change.after, change.seq
            )
        merged[key] = change  # re-inserted, so the dict is in the order of last changes
    return list(merged.values())


def last_per_record(changes: Iterable[ViewChange]) -> list[ViewChange]:
    """One change per view record, its last state, in the order of last changes; a record that
    appeared and vanished within the batch sends nothing."""
    last: dict[str, ViewChange] = {}
    for change in changes:
        first = last.pop(change.sow_key, None)
        previous = change.previous if first is None else first.previous
        last[change.sow_key] = ViewChange(change.sow_key, change.record, previous)
    return [c for c in last.values() if not (c.record is None and c.previous is None)]
