"""Group state of a maintained view: add and retract contributing rows, read view records.

One :class:`Group` per distinct combination of Grouping values among the contributing rows
(underlying messages, or joined rows). It counts its rows, keeps every aggregate's retractable
state, the spellings seen for each grouping value (``7`` and ``"7"`` are one group; the record
shows the spelling aggregated queries would show) and, when the projection reads fields outside
aggregates and Grouping, the rows' values of those fields ordered by processing position.

"Last processed value" rule, chosen so that it is reproducible: a row carries ``seq``, the
position of its latest change in the view's input (for a joined row, the latest of its parts);
a non-grouped field shows the value of the group's row with the highest ``(seq, row id)``. When
that row leaves, the next most recent one takes over; a recomputation from the underlying state
(with each record's position) gives the same answer, and so does any replay.

The state encodes to JSON-able values per group (:meth:`Group.encode`), so an engine can keep
one RocksDB entry per group and write only the groups a change touched.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any

import orjson
from sortedcontainers import SortedDict

from sowstream.sow.aggregate import Accumulator, StateError, spelling_rank
from sowstream.sow.keys import sow_key_from_values
from sowstream.views.projection import Row, ViewProjection, group_key

__all__ = ["Group", "GroupTable"]


def _text(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


class Group:
    """One group's state: row count, grouping spellings, aggregate states, non-grouped values."""

    __slots__ = ("last", "last_seq", "rows", "spellings", "states")

    def __init__(self, n_grouping: int, accumulators: Sequence[Accumulator]) -> None:
        self.rows = 0
        self.spellings: list[dict[str, int]] = [{} for _ in range(n_grouping)]
        self.states: list[Any] = [acc.new() for acc in accumulators]
        # (seq, row id) -> non-grouped values, and row id -> seq to find an entry again.
        self.last: SortedDict = SortedDict()
        self.last_seq: dict[str, int] = {}

    def group_values(self) -> list[Any]:
        """Each grouping field's value as shown: the preferred one of the spellings present."""
        out: list[Any] = []
        for spellings in self.spellings:
            values = [orjson.loads(t) for t in spellings]
            out.append(min(values, key=spelling_rank) if values else None)
        return out

    def encode(self, accumulators: Sequence[Accumulator]) -> list[Any]:
        """The whole group: its head (:meth:`encode_head`) and every row's non-grouped values."""
        return [
            *self.encode_head(accumulators),
            # The dict's own items, not SortedDict's sorted view (a Python generator): decode
            # sorts them again.
            [[seq, row_id, values] for (seq, row_id), values in dict.items(self.last)],
        ]

    def encode_head(self, accumulators: Sequence[Accumulator]) -> list[Any]:
        """Row count, spellings and aggregate states: what a store keeps as the group's entry,
        its rows' non-grouped values being entries of their own (a group of many rows would
        otherwise be written whole at every change to one of them)."""
        return [
            self.rows,
            self.spellings,
            [acc.encode(s) for acc, s in zip(accumulators, self.states, strict=True)],
        ]

    def put_loose(self, row_id: str, seq: int, values: list[Any]) -> None:
        """One row's non-grouped values, read back from the row's own store entry."""
        self.last[(seq, row_id)] = values
        self.last_seq[row_id] = seq

    @classmethod
    def decode(cls, data: Any, n_grouping: int, accumulators: Sequence[Accumulator]) -> Group:
        """A group from :meth:`encode`, or from :meth:`encode_head` (its rows' values are then
        added with :meth:`put_loose`)."""
        if isinstance(data, list) and len(data) == 3:
            data = [*data, []]
        if not isinstance(data, list) or len(data) != 4:
            raise StateError(f"malformed group state: {data!r:.80}")
        rows, spellings, states, last = data
        if len(spellings) != n_grouping or len(states) != len(accumulators):
            raise StateError("group state does not match this view's projection")
        group = cls(n_grouping, accumulators)
        group.rows = int(rows)
        group.spellings = [dict(s) for s in spellings]
        group.states = [acc.decode(s) for acc, s in zip(accumulators, states, strict=True)]
        for seq, row_id, values in last:
            group.last[(seq, row_id)] = values
            group.last_seq[row_id] = seq
        return group


class GroupTable:
    """All groups of one view, keyed by group key text; records and SowKeys on demand."""

    def __init__(self, projection: ViewProjection, key_domain: str) -> None:
        self.projection = projection
        self.key_domain = key_domain
        self.accumulators: tuple[Accumulator, ...] = tuple(
            agg.accumulator for agg in projection.aggregates
        )
        self.groups: dict[str, Group] = {}
        # (group key, row id) -> the row's (seq, non-grouped values), None when it left the
        # group: what changed since take_loose(), for a store that keeps them row by row.
        self._loose_changes: dict[tuple[str, str], tuple[int, list[Any]] | None] = {}

    def __len__(self) -> int:
        return len(self.groups)

    def key_of(self, row: Row) -> str:
        return group_key(self.projection.group_values(row))

    def add(self, row: Row, row_id: str, seq: int, values: list[Any] | None = None) -> str:
        """Fold ``row`` into its group (created if new); returns the group key. ``values``:
        its grouping values when the caller has them already."""
        p = self.projection
        if values is None:
            values = p.group_values(row)
        key = group_key(values)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = Group(len(values), self.accumulators)
        group.rows += 1
        for spellings, value in zip(group.spellings, values, strict=True):
            text = _text(value)
            spellings[text] = spellings.get(text, 0) + 1
        for slot, (acc, items) in enumerate(zip(self.accumulators, p.inputs(row), strict=True)):
            for item in items:
                group.states[slot] = acc.add(group.states[slot], item)
        if p.loose:
            if row_id in group.last_seq:
                raise StateError(f"row {row_id} is already counted in group {key}")
            loose = p.loose_values(row)
            group.last[(seq, row_id)] = loose
            group.last_seq[row_id] = seq
            self._loose_changes[(key, row_id)] = (seq, loose)
        return key

    def retract(self, row: Row, row_id: str, values: list[Any] | None = None) -> tuple[str, bool]:
        """Take ``row``'s contribution back; returns the group key and whether it emptied."""
        p = self.projection
        if values is None:
            values = p.group_values(row)
        key = group_key(values)
        group = self.groups.get(key)
        if group is None or group.rows <= 0:
            raise StateError(f"retracting row {row_id} from group {key}, which holds no rows")
        for spellings, value in zip(group.spellings, values, strict=True):
            text = _text(value)
            count = spellings.get(text, 0)
            if count <= 0:
                raise StateError(f"retracting row {row_id}: group {key} never saw {text}")
            if count == 1:
                del spellings[text]
            else:
                spellings[text] = count - 1
        for slot, (acc, items) in enumerate(zip(self.accumulators, p.inputs(row), strict=True)):
            for item in items:
                group.states[slot] = acc.remove(group.states[slot], item)
        if p.loose:
            seq = group.last_seq.pop(row_id, None)
            if seq is None:
                raise StateError(f"retracting row {row_id}, which group {key} does not hold")
            del group.last[(seq, row_id)]
            self._loose_changes[(key, row_id)] = None
        group.rows -= 1
        if group.rows == 0:
            del self.groups[key]
            return key, True
        return key, False

    def record(self, key: str) -> dict[str, Any] | None:
        """The view record of group ``key``, or None if the group does not exist."""
        group = self.groups.get(key)
        if group is None:
            return None
        results = [acc.result(s) for acc, s in zip(self.accumulators, group.states, strict=True)]
        loose = group.last.peekitem(-1)[1] if group.last else []
        return self.projection.assemble(group.group_values(), results, loose)

    def sow_key(self, key: str) -> str:
        """The view record's SowKey: the grouping values hashed with the KeyDomain."""
        return _sow_key(self.key_domain, key)

    def take_loose(self) -> dict[tuple[str, str], tuple[int, list[Any]] | None]:
        """The rows' non-grouped values changed since the last call (None: the row left)."""
        taken, self._loose_changes = self._loose_changes, {}
        return taken

    def mark_loose(self, key: str) -> None:
        """Take every row of group ``key`` as changed (a group read in an older layout)."""
        for (seq, row_id), values in self.groups[key].last.items():
            self._loose_changes[(key, row_id)] = (seq, values)

    def records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every (SowKey, record) of the view."""
        for key in self.groups:
            record = self.record(key)
            assert record is not None
            yield self.sow_key(key), record

    def encode(self) -> dict[str, Any]:
        return {key: g.encode(self.accumulators) for key, g in self.groups.items()}

    def load(self, data: Any) -> None:
        if not isinstance(data, dict):
            raise StateError("malformed group table state")
        n = len(self.projection.grouping)
        self.groups = {k: Group.decode(v, n, self.accumulators) for k, v in data.items()}


@lru_cache(maxsize=65_536)
def _sow_key(key_domain: str, key: str) -> str:
    # A hash per view change otherwise: a group changes many times between two of its keys.
    return sow_key_from_values(key_domain, key_texts_of(key))


def key_texts_of(key: str) -> list[str]:
    """The SowKey parts of a group key text (as :func:`projection.key_texts` gives them)."""
    parts: list[str] = []
    for component in orjson.loads(key):
        if component is None:
            parts.append("")
        elif isinstance(component, list):
            parts.append(orjson.dumps(component).decode())
        else:
            parts.append(component)
    return parts
