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

from sowstream.sow.keys import sow_key_from_values

from .accumulators import StateError
from .aggregation import Aggregation, Contribution, Partials, merge_partials
from .groups import component_text, spelling_rank

__all__ = ["CombinedGroups", "LiveGroups", "group_sow_key"]


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


class CombinedGroups:
    """The subscriber's side: each partition's latest partial entry per group, combined.

    Partitions send their groups' entries (a placement all of them, each change the groups it
    touched); a group's record is the entries of every partition holding it, merged and
    finished as a query's partials are. So after any message the records equal an aggregated
    query over the partitions' states at the positions those messages reflect.
    """

    def __init__(self, aggregation: Aggregation) -> None:
        self.aggregation = aggregation
        self._entries: dict[str, dict[Any, Any]] = {}  # group key -> partition -> entry

    def load(self, partition: Any, partials: Mapping[str, Any]) -> set[str]:
        """Replace everything ``partition`` holds with ``partials``; the groups touched."""
        touched = {key for key, held in self._entries.items() if partition in held}
        for key in touched:
            self._drop(key, partition)
        for key, entry in partials.items():
            self._entries.setdefault(key, {})[partition] = entry
        return touched | set(partials)

    def update(self, partition: Any, entries: Mapping[str, Any]) -> list[str]:
        """Apply one change's entries (None: the partition no longer holds the group)."""
        for key, entry in entries.items():
            if entry is None:
                self._drop(key, partition)
            else:
                self._entries.setdefault(key, {})[partition] = entry
        return list(entries)

    def _drop(self, key: str, partition: Any) -> None:
        held = self._entries.get(key)
        if held is not None:
            held.pop(partition, None)
            if not held:
                del self._entries[key]

    def record(self, key: str) -> dict[str, Any] | None:
        """Group ``key``'s output record (None: no partition holds it)."""
        held = self._entries.get(key)
        if not held:
            return None
        agg = self.aggregation
        merged = merge_partials(agg, ({key: entry} for entry in held.values()))
        return agg.finish_group(merged[key])

    def keys(self) -> list[str]:
        """The groups held, in the order of their grouping values (as a query returns them)."""
        agg = self.aggregation
        order = {k: agg.group_order(next(iter(h.values()))[0]) for k, h in self._entries.items()}
        return sorted(order, key=lambda k: (order[k], k))

    def records(self) -> dict[str, dict[str, Any]]:
        """Every group's record, by group key, in group order."""
        out: dict[str, dict[str, Any]] = {}
        for key in self.keys():
            record = self.record(key)
            assert record is not None
            out[key] = record
        return out


def group_sow_key(domain: str, key: str) -> str:
    """A group's SowKey: its grouping values hashed with ``domain`` (as a view's records)."""
    return sow_key_from_values(domain, [component_text(c) for c in orjson.loads(key)])
