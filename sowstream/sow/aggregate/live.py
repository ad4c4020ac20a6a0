"""An aggregation kept up to date record by record: the groups of one partition's matching
records for an aggregated subscription.

A record that enters, changes or leaves takes its old contribution back and adds its new one
(the accumulators are retractable), so the partition's groups always equal what
:meth:`Aggregation.partial` computes from scratch over the records matching now: the same
partial entries, byte for byte once encoded. That is what makes the subscriber's view, merged
over partitions like a query's partials, equal to an aggregated ``sow`` at every step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from .accumulators import StateError
from .aggregation import Aggregation, Contribution, Partials
from .groups import spelling_rank

__all__ = ["LiveGroups"]


def _text(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _loose_rank(values: list[Any]) -> tuple[int, str]:
    return (sum(v is None for v in values), _text(values))


class _Group:
    """One group's rows: how many, each grouping field's spellings and the loose values seen
    (each with a count, so a row can be taken back), and the aggregate states."""

    __slots__ = ("loose", "rows", "spellings", "states")

    def __init__(self, fields: int, states: list[Any]) -> None:
        self.rows = 0
        self.spellings: list[dict[str, list[Any]]] = [{} for _ in range(fields)]
        self.loose: dict[str, list[Any]] = {}
        self.states = states


def _count(counts: dict[str, list[Any]], text: str, value: Any, step: int) -> None:
    entry = counts.get(text)
    if entry is None:
        if step < 0:
            raise StateError(f"taking back {text}, which the group does not hold")
        counts[text] = [1, value]
    elif entry[0] + step == 0:
        del counts[text]
    else:
        entry[0] += step


class LiveGroups:
    """The groups of a set of records under one :class:`Aggregation`, retractable."""

    def __init__(self, aggregation: Aggregation) -> None:
        self.aggregation = aggregation
        self._accs = aggregation.accumulators
        self.groups: dict[str, _Group] = {}

    def __len__(self) -> int:
        return len(self.groups)

    def load(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Add every record of ``records``."""
        for record in records:
            self.add(record)

    def add(self, record: Mapping[str, Any]) -> str:
        """Fold ``record`` in; returns its group key."""
        return self._step(self.aggregation.contribution(record), 1)

    def remove(self, record: Mapping[str, Any]) -> str:
        """Take back ``record`` (as it was added); returns its group key."""
        return self._step(self.aggregation.contribution(record), -1)

    def change(
        self, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None
    ) -> list[str]:
        """A matching record went from ``before`` to ``after`` (None: not matching, or absent);
        returns the keys of the groups that changed."""
        touched: list[str] = []
        if before is not None:
            touched.append(self.remove(before))
        if after is not None:
            key = self.add(after)
            if key not in touched:
                touched.append(key)
        return touched

    def _step(self, c: Contribution, step: int) -> str:
        group = self.groups.get(c.key)
        if group is None:
            if step < 0:
                raise StateError(f"taking back a record of group {c.key}, which holds none")
            group = self.groups[c.key] = _Group(len(c.keys), [acc.new() for acc in self._accs])
        for counts, value in zip(group.spellings, c.keys, strict=True):
            _count(counts, _text(value), value, step)
        if c.loose is not None:
            _count(group.loose, _text(c.loose), c.loose, step)
        for slot, (acc, values) in enumerate(zip(self._accs, c.inputs, strict=True)):
            change = acc.add if step > 0 else acc.remove
            for value in values:
                group.states[slot] = change(group.states[slot], value)
        group.rows += step
        if group.rows == 0:
            del self.groups[c.key]
        return c.key

    def entry(self, key: str) -> list[Any] | None:
        """Group ``key``'s partial entry, as :meth:`Aggregation.partial` writes it (None: the
        group has no records)."""
        group = self.groups.get(key)
        if group is None:
            return None
        keys = [min((v for _, v in s.values()), key=spelling_rank) for s in group.spellings]
        loose = min((v for _, v in group.loose.values()), key=_loose_rank) if group.loose else None
        return self.aggregation.encode_group(keys, loose, group.states)

    def partials(self) -> Partials:
        """Every group's partial entry: what ``Aggregation.partial`` gives for the records."""
        out: Partials = {}
        for key in sorted(self.groups):
            entry = self.entry(key)
            assert entry is not None
            out[key] = entry
        return out
