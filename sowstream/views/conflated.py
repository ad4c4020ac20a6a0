"""Conflated topics, the pure part: what a conflated topic's input receives, and what one input
partition holds between two flushes.

A conflated topic reads the change events of its underlying SOW topic (the same events views
get, ``sowstream.views.routing``) from its own input topic, routed by the underlying SowKey so
every change of a record lands on one partition, in order. :class:`ConflatedFeed` makes those
events; it applies the Filter on both sides so a record leaving the Filter arrives as a delete.
:class:`Conflator` keeps, per SowKey, only the latest state seen since the last flush (None for
a delete) and the input offset it has taken in; :meth:`Conflator.take` hands them over.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

import orjson

from sowstream.filters import compile_filter
from sowstream.views.ports import ConflatedDefinition
from sowstream.views.routing import ChangeEvent, Source, decode_event

__all__ = ["ConflatedFeed", "Conflator"]


class ConflatedFeed:
    """Turns the changes of the underlying topic into a conflated topic's input events.

    It has the shape the topic processor expects of a view's feed (``input_topic`` and
    :meth:`events`), so the processor sends to both alike.
    """

    def __init__(self, conflated: ConflatedDefinition, input_topic: str) -> None:
        self.conflated = conflated
        self.topic = conflated.underlying_topic
        self.input_topic = input_topic
        self.partitions = conflated.partitions
        self._filter = compile_filter(conflated.filter) if conflated.filter else None

    def _keeps(self, record: Mapping[str, Any] | None) -> bool:
        return record is not None and (self._filter is None or self._filter.matches(record))

    def events(
        self,
        sow_key: str,
        before: Mapping[str, Any] | None,
        after: Mapping[str, Any] | None,
        source: Source,
    ) -> list[ChangeEvent]:
        """One event per change the conflated topic must see: the new state when the record
        matches, a delete when it matched before and no longer does (or is gone)."""
        if self._keeps(after):
            state = after
        elif self._keeps(before):
            state = None
        else:
            return []
        key = sow_key.encode()
        body = {"t": self.topic, "k": sow_key, "a": state, "s": [*source, 0]}
        partition = zlib.crc32(key) % self.partitions if self.partitions > 1 else 0
        return [ChangeEvent(partition, key, orjson.dumps(body))]


class Conflator:
    """The latest state per SowKey of one input partition since the last flush.

    ``flushed`` is the input offset the conflated topic's log holds everything up to;
    ``taken`` the last input offset folded in (at least ``flushed``).
    """

    def __init__(self, flushed: int = -1) -> None:
        self.flushed = flushed
        self.taken = flushed
        self.pending: dict[str, dict[str, Any] | None] = {}

    def add(self, offset: int, value: bytes | None) -> bool:
        """Fold in the input event at ``offset`` (events at or below ``taken`` are ignored);
        True when it was a change taken in."""
        if offset <= self.taken:
            return False
        self.taken = offset
        if value is None:
            return False
        _, sow_key, _, after, _ = decode_event(value)
        # Re-inserted so the flush writes records in the order of their last change.
        self.pending.pop(sow_key, None)
        self.pending[sow_key] = after
        return True

    def take(self) -> tuple[dict[str, dict[str, Any] | None], int]:
        """What to write at a flush, and the input offset it covers; the caller calls
        :meth:`flushed_to` once the conflated topic's log has it."""
        pending, self.pending = self.pending, {}
        return pending, self.taken

    def flushed_to(self, offset: int) -> None:
        self.flushed = max(self.flushed, offset)

    def restore(self, pending: dict[str, dict[str, Any] | None]) -> None:
        """Put back states a failed flush did not write (newer states folded in since win)."""
        for key, state in pending.items():
            self.pending.setdefault(key, state)
