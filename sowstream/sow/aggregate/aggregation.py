"""The aggregation itself: per-partition partials, their merge and the output records.

How the three steps split between workers and the client, and the rules they follow, are told in
``sowstream.sow.aggregate``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from sowstream.filters import ast, compile_value
from sowstream.filters.order_by import SortField, sort_key
from sowstream.filters.values import get_path, is_null, path_steps

from .accumulators import Accumulator, StateError, accumulator
from .groups import Group, field_value, group_component
from .layout import ProjectionLayout, ValueFn
from .parsing import AggregationError, parse_grouping, parse_projection

__all__ = ["Aggregation", "Contribution", "Partials", "merge_partials", "parse_aggregation"]

Partials = dict[str, list[Any]]
"""Per-group partial states, JSON-able (orjson), keyed by the group's key text::

    {group_key: [group_values, loose_values, states], ...}

``group_key`` is the JSON text of the group's canonical values (one per grouping field: null for
NULL, the canonical text, or a list of texts for a multi-valued field). ``group_values`` holds the
group's chosen spelling of each grouping field, ``loose_values`` the values of the non-grouped
paths read outside aggregates (null if there are none) and ``states`` one state per aggregate,
in its accumulator's JSON form (``sowstream.sow.aggregate.accumulators``), compacted:

* ``COUNT``: an int;
* ``SUM``, ``AVG``: ``[numbers, floats, exact sum as a fraction's text]``; ``STDDEV_POP``,
  ``STDDEV_SAMP`` add the exact sum of squares;
* ``MIN``, ``MAX``: ``[[kind, value, count], ...]`` for the extreme value's spellings;
* ``COUNT_DISTINCT``, ``DISTINCT_LIST``: ``[[canonical text, count], ...]`` of every value;
  ``ANY``: the same for the chosen value only.
"""


@dataclass(frozen=True, slots=True)
class Contribution:
    """What one record adds to its group (:meth:`Aggregation.contribution`)."""

    key: str
    keys: list[Any]
    loose: list[Any] | None
    inputs: list[list[Any]]


class Aggregation:
    """A parsed ``grouping`` + ``projection`` pair; build it with :func:`parse_aggregation`.

    ``grouping`` holds the grouping paths, ``outputs`` the output paths in projection order,
    ``aggregates`` the distinct aggregate calls (as filter text) whose states partials carry, and
    ``paths`` every record path the aggregation reads. Immutable and safe to share.
    """

    __slots__ = (
        "_aggs",
        "_arg_fns",
        "_group_order",
        "_group_steps",
        "_layout",
        "_loose_steps",
        "aggregates",
        "grouping",
        "grouping_outputs",
        "grouping_text",
        "outputs",
        "paths",
        "projection_text",
    )

    def __init__(
        self,
        grouping: Sequence[str],
        fields: Sequence[ast.ProjectionField],
        *,
        grouping_text: str = "",
        projection_text: str = "",
    ) -> None:
        self.grouping: tuple[str, ...] = tuple(grouping)
        self.grouping_text = grouping_text
        self.projection_text = projection_text
        self._group_steps = tuple(path_steps(p) for p in self.grouping)
        layout = ProjectionLayout(self.grouping, [(f.output, f) for f in fields])
        self._layout = layout
        self._aggs: tuple[Accumulator, ...] = tuple(accumulator(c) for c in layout.calls)
        self._arg_fns: tuple[ValueFn, ...] = tuple(compile_value(c.arg) for c in layout.calls)
        self._loose_steps = tuple(path_steps(p) for p in layout.loose)
        self._group_order = sort_key([SortField(f"/{i}") for i in range(len(self.grouping))])
        self.aggregates: tuple[str, ...] = layout.call_texts
        self.outputs: tuple[str, ...] = tuple(o.path for o in layout.outputs)
        # The outputs that show grouping fields: a delta of a group carries them (send_keys).
        self.grouping_outputs: tuple[str, ...] = tuple(
            o.path for o in layout.outputs if o.kind == "group"
        )
        read = {*self.grouping, *layout.loose}
        for call in layout.calls:
            read |= ast.paths(call.arg)
        self.paths: frozenset[str] = frozenset(read)

    def __repr__(self) -> str:
        return f"Aggregation(grouping={self.grouping!r}, outputs={self.outputs!r})"

    # ---- partial

    def contribution(self, record: Mapping[str, Any]) -> Contribution:
        """What ``record`` adds to its group: the group key, its grouping values, its loose
        values (None without loose paths) and each aggregate slot's non-NULL input values."""
        keys = [field_value(get_path(record, steps)) for steps in self._group_steps]
        key = orjson.dumps([group_component(v) for v in keys]).decode()
        loose = (
            [field_value(get_path(record, s)) for s in self._loose_steps]
            if self._loose_steps
            else None
        )
        inputs: list[list[Any]] = []
        for get in self._arg_fns:
            value = get(record)
            if isinstance(value, tuple):  # several values read through arrays: each counts
                inputs.append([item for item in value if not is_null(item)])
            else:
                inputs.append([] if is_null(value) else [value])
        return Contribution(key, keys, loose, inputs)

    @property
    def accumulators(self) -> tuple[Accumulator, ...]:
        """One accumulator per aggregate slot."""
        return self._aggs

    def encode_group(
        self, keys: list[Any], loose: list[Any] | None, states: list[Any]
    ) -> list[Any]:
        """One group's partial entry (``[group_values, loose_values, states]``), compacted."""
        return [
            list(keys),
            None if loose is None else list(loose),
            [agg.encode(agg.compact(s)) for agg, s in zip(self._aggs, states, strict=True)],
        ]

    def partial(self, records: Iterable[Mapping[str, Any]]) -> Partials:
        """The per-group partial states of ``records`` (one partition's matching records)."""
        groups: dict[str, Group] = {}
        group_steps, loose_steps = self._group_steps, self._loose_steps
        slots = tuple(zip(self._arg_fns, self._aggs, strict=True))
        for record in records:
            keys = [field_value(get_path(record, steps)) for steps in group_steps]
            key = orjson.dumps([group_component(v) for v in keys]).decode()
            group = groups.get(key)
            loose = [field_value(get_path(record, s)) for s in loose_steps] if loose_steps else None
            if group is None:
                group = groups[key] = Group(keys, loose, [agg.new() for agg in self._aggs])
            else:
                group.offer_keys(keys)
                if loose is not None:
                    group.offer_loose(loose)
            states = group.states
            for slot, (get, agg) in enumerate(slots):
                value = get(record)
                if isinstance(value, tuple):  # several values read through arrays: each counts
                    for item in value:
                        if not is_null(item):
                            states[slot] = agg.add(states[slot], item)
                elif not is_null(value):
                    states[slot] = agg.add(states[slot], value)
        return self._encode(groups)

    def _encode(self, groups: dict[str, Group]) -> Partials:
        return {
            key: self.encode_group(g.keys, g.loose, g.states) for key, g in sorted(groups.items())
        }

    def _decode(self, data: Any) -> Group:
        if not isinstance(data, list) or len(data) != 3:
            raise ValueError(f"malformed partials: expected [keys, loose, states], got {data!r}")
        keys, loose, states = data
        if not isinstance(keys, list) or len(keys) != len(self.grouping):
            raise ValueError("partials do not match this aggregation's grouping")
        if not isinstance(states, list) or len(states) != len(self._aggs):
            raise ValueError("partials do not match this aggregation's aggregates")
        if (loose is None) != (not self._loose_steps) or (
            loose is not None and len(loose) != len(self._loose_steps)
        ):
            raise ValueError("partials do not match this aggregation's projection")
        try:
            decoded = [agg.decode(s) for agg, s in zip(self._aggs, states, strict=True)]
        except StateError as exc:
            raise ValueError(f"malformed partials: {exc}") from None
        return Group(list(keys), None if loose is None else list(loose), decoded)

    def _merge_into(self, target: Group, other: Group) -> None:
        target.offer_keys(other.keys)
        if other.loose is not None:
            target.offer_loose(other.loose)
        target.states = [
            agg.merge(a, b)
            for agg, a, b in zip(self._aggs, target.states, other.states, strict=True)
        ]

    # ---- finish

    def finish(self, partials: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The output records of (merged) ``partials``, one per group, in group-value order."""
        rows = [
            (self.group_order(data[0]), key, self.finish_group(data))
            for key, data in partials.items()
        ]
        rows.sort(key=lambda row: (row[0], row[1]))
        return [record for _, _, record in rows]

    def finish_group(self, data: Any) -> dict[str, Any]:
        """The output record of one group's (merged) partial entry."""
        group = self._decode(data)
        results = [agg.result(s) for agg, s in zip(self._aggs, group.states, strict=True)]
        return self._layout.record(group.keys, results, group.loose or [])

    def group_order(self, keys: Any) -> Any:
        """The sort key of a group with grouping values ``keys`` (OrderBy's order, NULL last)."""
        if not isinstance(keys, list):
            raise ValueError(f"malformed partials: expected the group's values, got {keys!r}")
        return self._group_order({str(i): v for i, v in enumerate(keys)})

    def aggregate(self, records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``finish(partial(records))``: the whole aggregation in one process."""
        return self.finish(self.partial(records))


def merge_partials(
    aggregation: Aggregation, partials_list: Iterable[Mapping[str, Any]]
) -> Partials:
    """Combine partials (from partitions, or earlier merges) into one; order does not matter.

    The inputs are not modified. Raises ValueError for partials of a different aggregation.
    """
    merged: dict[str, Group] = {}
    for partials in partials_list:
        for key, data in partials.items():
            group = aggregation._decode(data)
            current = merged.get(key)
            if current is None:
                merged[key] = group
            else:
                aggregation._merge_into(current, group)
    return aggregation._encode(merged)


def parse_aggregation(
    grouping: str | None,
    projection: str | None,
    *,
    grouping_at: int = 0,
    projection_at: int = 0,
) -> Aggregation:
    """Parse the ``grouping`` and ``projection`` option values (``[/a, ...]``) of a ``sow``.

    Either may also be given as the whole option item (``grouping=[/a]``). Positions in errors
    are 0-based offsets into the given text plus ``grouping_at`` / ``projection_at``, so callers
    that cut the values out of a longer option string can report positions in that string.
    Raises :class:`AggregationError` (an InvalidCommandError) naming the option and position.
    """
    if grouping is None and projection is None:
        raise AggregationError(
            "grouping", grouping_at, "an aggregated query needs grouping=[...] and projection=[...]"
        )
    if projection is None:
        raise AggregationError(
            "grouping",
            grouping_at,
            "grouping needs a projection: list the output fields in projection=[...]",
        )
    if grouping is None:
        raise AggregationError(
            "projection",
            projection_at,
            "projection needs a grouping: give the fields to group by in grouping=[...]",
        )
    paths = parse_grouping(grouping, grouping_at)
    fields = parse_projection(projection, projection_at)
    return Aggregation(paths, fields, grouping_text=grouping, projection_text=projection)
