"""Keep one view up to date from its underlying topics' changes, and recompute it naively.

:meth:`ViewMaintainer.apply` takes one underlying change (topic, SowKey, before and after
images, and ``seq``, the change's position in the view's input) and returns the view records it
creates, updates or deletes. No group is ever recomputed from scratch: a change retracts the
old contribution of the rows it touches and adds the new one.

:meth:`ViewMaintainer.recompute` computes the view from the underlying topics' current state by
the definition alone (nested-loop join, grouping by dict, aggregates over plain lists). It is the
reference the incremental state must equal after every change, and the recovery check.

Replays: a change whose ``seq`` is not above the last one applied is a duplicate (an engine
that restarts from an older input offset replays changes the saved state already holds) and is
ignored, so applying a change twice is harmless as long as ``seq`` strictly increases along the
view's input and is saved with the state (:meth:`to_bytes`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from sowstream.sow.aggregate import StateError, spelling_rank
from sowstream.sow.keys import sow_key_from_values
from sowstream.views.groups import GroupTable
from sowstream.views.joins import PRESERVE, JoinState, Side, StoredRow, join_rows_naive
from sowstream.views.ports import ViewDefinition
from sowstream.views.projection import Row, group_key, key_texts

__all__ = ["ViewChange", "ViewMaintainer"]

STATE_VERSION = 1
GROUP_PREFIX = b"g/"
ROW_PREFIX = b"r/"
# A group row's non-grouped values: b"l/" + group key + b"\x00" + row id (a group key is JSON
# text, which holds no NUL, so the first NUL ends it).
LOOSE_PREFIX = b"l/"
LAST_SEQ_KEY = b"seq"


def _loose_key(group: str, row_id: str) -> bytes:
    return LOOSE_PREFIX + group.encode() + b"\x00" + row_id.encode()


def _row_key(topic: int, sow_key: str) -> bytes:
    return ROW_PREFIX + f"{topic}/{sow_key}".encode()


UnderlyingState = Mapping[str, Mapping[str, tuple[dict[str, Any], int]]]
"""Per underlying topic, per SowKey: (current record, seq of its latest change)."""


@dataclass(frozen=True, slots=True)
class ViewChange:
    """One view record written or removed by a change.

    ``record`` is the new state, or None when the group emptied and the record is deleted (its
    subscribers get an ``oof``, reason ``deleted``, with ``previous`` as the body). ``previous``
    is the record before the change (None for a new group).
    """

    sow_key: str
    record: dict[str, Any] | None
    previous: dict[str, Any] | None

    @property
    def deleted(self) -> bool:
        return self.record is None


class ViewMaintainer:
    """Incremental state of one view: its groups and, for joins, the joined topics' rows."""

    def __init__(
        self, view: ViewDefinition, *, preserve: Side = PRESERVE, outer: bool = True
    ) -> None:
        compiled = view.compile(preserve)
        self.view = view
        self.projection = compiled.projection
        self.plan = compiled.plan
        self.outer = outer
        self.groups = GroupTable(self.projection, view.effective_key_domain)
        self.joins: JoinState | None = None
        if self.plan is not None:
            self.joins = JoinState(
                self.plan, null_equivalent=view.join_null_equivalency, outer=outer
            )
        self._topic_index = {t.topic: i for i, t in enumerate(self.projection.topics)}
        self.last_seq = -1
        # What changed since the last take_entries(): group keys, and (topic index, SowKey) rows.
        self._dirty_groups: set[str] = set()
        self._dirty_rows: set[tuple[int, str]] = set()
        # Each group's record as the last change of this batch left it: the next change's
        # previous record (assembling it twice per change was a fifth of a view's upkeep).
        # Forgotten with every take_entries() and load, so it never outlives the state.
        self._records: dict[str, dict[str, Any] | None] = {}

    # ---- incremental

    def apply(
        self,
        topic: str,
        sow_key: str,
        before: Mapping[str, Any] | None,
        after: Mapping[str, Any] | None,
        *,
        seq: int,
    ) -> list[ViewChange]:
        """Apply one underlying change; returns the view changes, one per touched group.

        ``before`` is the record's previous image (None for an insert), ``after`` its new one
        (None for a delete). Join views keep their rows and read the previous image from there.
        """
        if topic not in self._topic_index:
            raise ValueError(f"view {self.view.name!r} does not read topic {topic!r}")
        if seq <= self.last_seq:
            return []  # already applied: a replay after a restart
        touched: dict[str, dict[str, Any] | None] = {}
        groups, shown, p = self.groups, self._records, self.projection

        def touch(row: Row) -> list[Any]:
            values = p.group_values(row)
            key = group_key(values)
            if key not in touched:
                touched[key] = shown[key] if key in shown else groups.record(key)
            return values

        if self.joins is None:
            if before is not None and p.matches(before):
                groups.retract(before, sow_key, touch(before))
            if after is not None and p.matches(after):
                groups.add(after, sow_key, seq, touch(after))
        else:
            stored = None if after is None else StoredRow(dict(after), seq)
            self._dirty_rows.add((self._topic_index[topic], sow_key))
            removed, added = self.joins.apply(self._topic_index[topic], sow_key, stored)
            for row in removed:
                data = row.as_row()
                groups.retract(data, row.row_id, touch(data))
            for row in added:
                data = row.as_row()
                groups.add(data, row.row_id, row.seq, touch(data))
        self.last_seq = seq
        self._dirty_groups.update(touched)
        changes: list[ViewChange] = []
        for key, previous in touched.items():
            record = shown[key] = groups.record(key)
            if record is None and previous is None:
                continue  # a group that appeared and vanished within this change
            changes.append(ViewChange(groups.sow_key(key), record, previous))
        return changes

    def records(self) -> dict[str, dict[str, Any]]:
        """The view as it stands: SowKey -> record."""
        return dict(self.groups.records())

    # ---- the reference

    def recompute(self, underlying: UnderlyingState) -> dict[str, dict[str, Any]]:
        """The view computed from scratch from the underlying topics' state (SowKey -> record).

        Used as the reference: the incremental state must always equal it.
        """
        p = self.projection
        rows: list[tuple[Row, str, int]] = []
        if self.plan is None:
            topic = p.topics[0].topic
            for sow_key, (record, seq) in underlying.get(topic, {}).items():
                if p.matches(record):
                    rows.append((record, sow_key, seq))
        else:
            tables = [
                {k: StoredRow(r, s) for k, (r, s) in underlying.get(t.topic, {}).items()}
                for t in self.plan.topics
            ]
            for joined in join_rows_naive(
                self.plan,
                tables,
                null_equivalent=self.view.join_null_equivalency,
                outer=self.outer,
            ):
                rows.append((joined.as_row(), joined.row_id, joined.seq))
        grouped: dict[str, list[tuple[Row, str, int]]] = {}
        for item in rows:
            grouped.setdefault(group_key(p.group_values(item[0])), []).append(item)
        out: dict[str, dict[str, Any]] = {}
        for members in grouped.values():
            values_per_field = list(zip(*(p.group_values(r) for r, _, _ in members), strict=True))
            shown = [min(vs, key=spelling_rank) for vs in values_per_field]
            inputs = [p.inputs(r) for r, _, _ in members]
            results = [
                agg.accumulator.compute([v for row in inputs for v in row[slot]])
                for slot, agg in enumerate(p.aggregates)
            ]
            latest = max(members, key=lambda m: (m[2], m[1]))
            loose = p.loose_values(latest[0]) if p.loose else []
            sow_key = sow_key_from_values(self.groups.key_domain, key_texts(shown))
            out[sow_key] = p.assemble(shown, results, loose)
        return out

    # ---- state, entry by entry (what an engine keeps in a key-value store)

    def take_entries(self) -> dict[bytes, bytes | None]:
        """The store entries changed since the last call: one per touched group and joined
        topic row (None: deleted), then ``last_seq``. Written together they keep the store equal
        to this state; :meth:`load_entries` reads them back."""
        out: dict[bytes, bytes | None] = {}
        accumulators = self.groups.accumulators
        for key in sorted(self._dirty_groups):
            group = self.groups.groups.get(key)
            out[GROUP_PREFIX + key.encode()] = (
                None if group is None else orjson.dumps(group.encode_head(accumulators))
            )
        for (key, row_id), entry in sorted(self.groups.take_loose().items()):
            out[_loose_key(key, row_id)] = None if entry is None else orjson.dumps(entry)
        if self.joins is not None:
            for topic, sow_key in sorted(self._dirty_rows):
                row = self.joins.rows[topic].get(sow_key)
                out[_row_key(topic, sow_key)] = (
                    None if row is None else orjson.dumps([row.record, row.seq])
                )
        self._dirty_groups.clear()
        self._dirty_rows.clear()
        self._records.clear()
        out[LAST_SEQ_KEY] = str(self.last_seq).encode()
        return out

    def load_entries(self, entries: Iterable[tuple[bytes, bytes]]) -> None:
        """Replace the state with what :meth:`take_entries` wrote (other keys are ignored)."""
        groups: dict[str, Any] = {}
        rows: list[dict[str, Any]] = [{} for _ in self.projection.topics]
        loose: list[tuple[str, str, Any]] = []
        self.last_seq = -1
        for key, value in entries:
            if key.startswith(GROUP_PREFIX):
                groups[key[len(GROUP_PREFIX) :].decode()] = orjson.loads(value)
            elif key.startswith(LOOSE_PREFIX):
                owner, _, row = key[len(LOOSE_PREFIX) :].partition(b"\x00")
                loose.append((owner.decode(), row.decode(), orjson.loads(value)))
            elif key.startswith(ROW_PREFIX):
                topic, _, sow_key = key[len(ROW_PREFIX) :].decode().partition("/")
                rows[int(topic)][sow_key] = orjson.loads(value)
            elif key == LAST_SEQ_KEY:
                self.last_seq = int(value)
        # A group written whole by an older release (its rows' values inside its entry) is
        # written again in this layout with the next batch.
        whole = {
            k for k, data in groups.items() if isinstance(data, list) and len(data) == 4 and data[3]
        }
        self.groups.load(groups)
        for group_key_text, row_id, entry in loose:
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], int)):
                raise StateError(f"malformed row values of group {group_key_text}: {entry!r:.80}")
            target = self.groups.groups.get(group_key_text)
            if target is None:
                raise StateError(f"row values of group {group_key_text}, which is not stored")
            target.put_loose(row_id, entry[0], entry[1])
        if self.joins is not None:
            self.joins.load(rows)
        self._dirty_groups.clear()
        self._dirty_rows.clear()
        self._records.clear()
        self.groups.take_loose()
        for text in whole:
            self._dirty_groups.add(text)
            self.groups.mark_loose(text)

    # ---- state, whole

    def to_bytes(self) -> bytes:
        """The whole state (groups, join rows, last seq) as one orjson document."""
        return orjson.dumps(
            {
                "version": STATE_VERSION,
                "last_seq": self.last_seq,
                "groups": self.groups.encode(),
                "rows": None if self.joins is None else self.joins.encode(),
            }
        )

    def load_bytes(self, data: bytes) -> None:
        """Replace this maintainer's state with one :meth:`to_bytes` produced."""
        try:
            state = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise StateError(f"view {self.view.name!r}: state is not JSON: {exc}") from None
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise StateError(f"view {self.view.name!r}: unknown state version")
        self.groups.load(state["groups"])
        if self.joins is not None:
            self.joins.load(state["rows"])
        self.last_seq = int(state["last_seq"])
        self._records.clear()
        self.groups.take_loose()

    @classmethod
    def from_bytes(
        cls, view: ViewDefinition, data: bytes, *, preserve: Side = PRESERVE, outer: bool = True
    ) -> ViewMaintainer:
        maintainer = cls(view, preserve=preserve, outer=outer)
        maintainer.load_bytes(data)
        return maintainer
