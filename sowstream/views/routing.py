"""Where an underlying change goes: the change events a view's input topic receives.

A worker that applies a change to a topic a view reads turns it into one or two *change
events* for the view's input topic (``<prefix>.view-in.<view>``), keyed by a *routing key*
chosen so that everything one maintainer needs is on its partition:

* a view over one topic routes by group key: all rows of a group meet in one maintainer. A
  row that moves to another group becomes two events, a retraction (before image only) to the
  old group's partition and an addition (after image only) to the new one. Rows the view's
  Filter drops on both sides send nothing;
* a join view routes by join key when its Grouping fields are fields of the preserved topic
  that every joined topic is related on (``[A]./k = [B]./k`` grouped by ``[A]./k``): then every
  partner of a row, and every row of a group, meet in one maintainer. A row whose join key
  changes is a deletion on the old partition and an insertion on the new one;
* any other join view has one input partition (correct for any join; the cost is that one
  worker maintains it).

Every event carries its source position ``[topic, partition, offset, seq, part]``: the
maintainer drops an event whose position is not after the last one it applied from that
source partition, so a worker that replays its log after a crash (and produces the same events
again) changes nothing. The module is pure: the engine sends what :meth:`ViewFeed.events`
returns.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from sowstream.filters.values import get_path
from sowstream.sow.aggregate import field_value, group_component
from sowstream.views.ports import ViewDefinition
from sowstream.views.projection import group_key

__all__ = ["ChangeEvent", "Source", "ViewFeed", "input_partitions", "join_route_paths"]

Source = tuple[str, int, int, int]
"""Where an underlying change comes from: (topic ident, log partition, log offset, seq)."""


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One record for a view's input topic."""

    partition: int
    key: bytes
    value: bytes


def join_route_paths(view: ViewDefinition) -> dict[str, tuple[str, ...]] | None:
    """Per joined topic, the fields whose values route its rows; None if the view cannot be
    routed by join key (then it has one input partition).

    Routable when every Grouping field is a field of the preserved topic that lies in a class of
    Join fields every topic takes part in (fields equal to one another through conditions).
    """
    compiled = view.compile()
    if compiled.plan is None:
        return None
    parent: dict[tuple[str, str], tuple[str, str]] = {}

    def find(node: tuple[str, str]) -> tuple[str, str]:
        parent.setdefault(node, node)
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for cond in view.join_conditions:
        a = find((cond.left.topic.topic, cond.left.path))
        b = find((cond.right.topic.topic, cond.right.path))
        if a != b:
            parent[max(a, b)] = min(a, b)
    topics = [t.topic for t in compiled.plan.topics]
    members: dict[tuple[str, str], dict[str, list[str]]] = {}
    for node in list(parent):
        members.setdefault(find(node), {}).setdefault(node[0], []).append(node[1])
    classes: list[tuple[str, str]] = []
    for path in compiled.projection.grouping:
        alias, _, field = path.lstrip("/").partition("/")
        if alias != "0" or (topics[0], f"/{field}") not in parent:
            return None
        root = find((topics[0], f"/{field}"))
        if set(members[root]) != set(topics):
            return None  # a topic that is not related on this field
        if root not in classes:
            classes.append(root)
    return {t: tuple(sorted(members[c][t])[0] for c in classes) for t in topics}


def input_partitions(view: ViewDefinition) -> int:
    """How many partitions the view's input topic has."""
    if view.underlying_topic is not None or join_route_paths(view) is not None:
        return view.partitions
    return 1


def _partition_of(key: bytes, partitions: int) -> int:
    return zlib.crc32(key) % partitions if partitions > 1 else 0


class ViewFeed:
    """Turns the changes of one underlying topic into a view's change events."""

    def __init__(
        self, view: ViewDefinition, topic: str, input_topic: str, *, only_changes: bool = False
    ) -> None:
        """``topic``: the underlying topic's name as the view refers to it. ``only_changes``:
        a record written again unchanged sends nothing (a queue's available messages, which
        are restated at will; a topic's republish still updates the view)."""
        compiled = view.compile()
        self.view = view
        self.only_changes = only_changes
        self.topic = topic
        self.input_topic = input_topic
        self.partitions = input_partitions(view)
        self.projection = compiled.projection
        self.joined = compiled.plan is not None
        routes = join_route_paths(view)
        self._route_paths: tuple[str, ...] | None = routes[topic] if routes else None

    def route(self, record: Mapping[str, Any]) -> bytes:
        """The routing key of a row of this topic (see the module docstring)."""
        if not self.joined:
            return group_key(self.projection.group_values(record)).encode()
        if self._route_paths is None:
            return b""
        parts = [group_component(field_value(get_path(record, p))) for p in self._route_paths]
        return orjson.dumps(parts)

    def events(
        self,
        sow_key: str,
        before: Mapping[str, Any] | None,
        after: Mapping[str, Any] | None,
        source: Source,
    ) -> list[ChangeEvent]:
        """The events for one change of a record (``before``/``after``: None when absent)."""
        if self.only_changes and before == after:
            return []
        if not self.joined:
            p = self.projection
            if before is not None and not p.matches(before):
                before = None
            if after is not None and not p.matches(after):
                after = None
        if before is None and after is None:
            return []
        old = self.route(before) if before is not None else None
        new = self.route(after) if after is not None else None
        if old is not None and new is not None and old != new:
            # Leaves one maintainer, arrives at another: two events, in this order.
            return [
                self._event(sow_key, before, None, source, 0, old),
                self._event(sow_key, None, after, source, 1, new),
            ]
        route = new if new is not None else old
        assert route is not None
        return [self._event(sow_key, before, after, source, 0, route)]

    def _event(
        self,
        sow_key: str,
        before: Mapping[str, Any] | None,
        after: Mapping[str, Any] | None,
        source: Source,
        part: int,
        route: bytes,
    ) -> ChangeEvent:
        body: dict[str, Any] = {"t": self.topic, "k": sow_key, "a": after, "s": [*source, part]}
        if not self.joined:
            body["b"] = before  # a join reads the previous image from its own rows
        return ChangeEvent(_partition_of(route, self.partitions), route, orjson.dumps(body))


def decode_event(value: bytes) -> tuple[str, str, Any, Any, tuple[Any, ...]]:
    """An input record as (topic, SowKey, before, after, source position)."""
    body = orjson.loads(value)
    return body["t"], body["k"], body.get("b"), body["a"], tuple(body["s"])


def source_mark(position: Sequence[Any]) -> tuple[str, tuple[int, int, int]]:
    """A source position split into its stream (topic and partition) and its place in it."""
    topic, partition, offset, seq, part = position
    return f"{topic}|{partition}", (int(offset), int(seq), int(part))
