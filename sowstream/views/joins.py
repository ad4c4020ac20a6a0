"""Join state of a view over several topics: rows per topic, indexed by join key.

Semantics (the SQL equivalent): the *preserved* topic ``P`` LEFT OUTER JOINed with every other
topic, each attached, in ``Join`` order, to the topics already joined, on the AND of all ``Join``
conditions between them. Every joined row holds exactly one ``P`` row (its *anchor*); a ``P``
row with no partner gives one row NULL-extended on the other topics; rows of the other topics
with no ``P`` partner give nothing. An inner join (``outer=False``) drops NULL-extended rows.

Which topic is preserved is decided in one place, :data:`PRESERVE` and :func:`preserved_topic`:
sowstream preserves the left-hand topic of the first ``Join`` until that is checked against a
real AMPS server (the reference is ambiguous).

Join values are compared as strings (canonical text: ``12345`` equals ``"12345"``, not
``"12345.00"``). NULL (missing, null or ``""``) matches nothing, not even NULL, unless
JoinNullEquivalency is enabled: then all NULLs match each other. Several conditions on the same
pair of topics form a composite key.

Incremental maintenance: the joined rows of a ``P`` row depend only on that row and its
partners, so a change to any row finds the anchors whose joined rows could change (walking up
from the changed topic through the indexes), computes those anchors' joined rows before and
after the change, and returns the difference. Work is proportional to the fan-out, never to
the size of the tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from sowstream.filters.values import get_path
from sowstream.sow.aggregate import field_value, group_component
from sowstream.views.projection import JoinCondition, TopicRef

__all__ = [
    "PRESERVE",
    "JoinPlan",
    "JoinState",
    "JoinedRow",
    "StoredRow",
    "join_rows_naive",
    "preserved_topic",
]

Side = Literal["left", "right"]
PRESERVE: Side = "left"
"""The side of the first Join whose topic is preserved (see the module docstring)."""


def preserved_topic(joins: Sequence[JoinCondition], preserve: Side = PRESERVE) -> str:
    """The topic whose rows always appear in a join view."""
    first = joins[0]
    return (first.left if preserve == "left" else first.right).topic.topic


@dataclass(frozen=True, slots=True)
class StoredRow:
    """One underlying message as the join keeps it: its record and its input position."""

    record: dict[str, Any]
    seq: int


@dataclass(frozen=True, slots=True)
class _Link:
    """How topic ``index`` attaches: to ``parent`` on a composite key, plus extra conditions."""

    parent: int
    child_paths: tuple[str, ...]
    parent_paths: tuple[str, ...]
    extra: tuple[tuple[str, int, str], ...]  # (own path, other topic index, other path)


class JoinPlan:
    """The join's topics in attach order (``topics[0]`` is preserved) and how each attaches."""

    def __init__(self, joins: Sequence[JoinCondition], preserve: Side = PRESERVE) -> None:
        if not joins:
            raise ValueError("a join view needs at least one Join condition")
        root = preserved_topic(joins, preserve)
        refs: dict[str, TopicRef] = {}
        for cond in joins:
            for side in (cond.left, cond.right):
                refs.setdefault(side.topic.topic, side.topic)
        order = [root]
        attached_by: dict[str, JoinCondition] = {}
        changed = True
        while changed:
            changed = False
            for cond in joins:
                a, b = cond.left.topic.topic, cond.right.topic.topic
                if (a in order) != (b in order):
                    new = b if a in order else a
                    order.append(new)
                    attached_by[new] = cond
                    changed = True
        missing = [t for t in refs if t not in order]
        if missing:
            raise ValueError(
                f"topics {', '.join(missing)} are not connected by any Join to {root}; every "
                "topic of a join view must be related to the others"
            )
        self.topics: tuple[TopicRef, ...] = tuple(refs[t] for t in order)
        index = {t: i for i, t in enumerate(order)}
        links: list[_Link | None] = [None]
        for i, name in enumerate(order[1:], 1):
            first = attached_by[name]
            parent = index[
                (first.left if first.right.topic.topic == name else first.right).topic.topic
            ]
            child_paths: list[str] = []
            parent_paths: list[str] = []
            extra: list[tuple[str, int, str]] = []
            for cond in joins:
                ends = {cond.left.topic.topic: cond.left, cond.right.topic.topic: cond.right}
                if name not in ends:
                    continue
                other = next(f for t, f in ends.items() if t != name)
                j = index[other.topic.topic]
                if j > i:
                    continue  # belongs to the later topic's link
                if j == parent:
                    child_paths.append(ends[name].path)
                    parent_paths.append(other.path)
                else:
                    extra.append((ends[name].path, j, other.path))
            links.append(_Link(parent, tuple(child_paths), tuple(parent_paths), tuple(extra)))
        self.links: tuple[_Link | None, ...] = tuple(links)
        self.index = index
        # Every (topic, path) a condition reads, for the naive reference.
        self.conditions: tuple[tuple[int, str, int, str], ...] = tuple(
            (index[c.left.topic.topic], c.left.path, index[c.right.topic.topic], c.right.path)
            for c in joins
        )


def _component(record: Mapping[str, Any], path: str, null_equivalent: bool) -> Any:
    """A join field's comparable value: canonical text (or texts), None for NULL.

    With JoinNullEquivalency, NULL becomes a marker that equals only other NULLs.
    """
    value = group_component(field_value(get_path(record, path)))
    if value is None and null_equivalent:
        return [None]  # never produced for a present value (those are text or lists of text)
    return value


def join_key(record: Mapping[str, Any], paths: Sequence[str], null_equivalent: bool) -> str | None:
    """The text of a composite join key, or None when a part is NULL (so it matches nothing)."""
    parts = [_component(record, p, null_equivalent) for p in paths]
    if any(p is None for p in parts):
        return None
    return orjson.dumps(parts).decode()


def values_match(
    a: Mapping[str, Any], a_path: str, b: Mapping[str, Any], b_path: str, null_equivalent: bool
) -> bool:
    """One Join condition between two records, under the NULL rules."""
    x = _component(a, a_path, null_equivalent)
    return x is not None and x == _component(b, b_path, null_equivalent)


@dataclass(frozen=True, slots=True, eq=False)
class JoinedRow:
    """One row of the join: each topic's (SowKey, record) in plan order, or None if NULL."""

    parts: tuple[tuple[str, StoredRow] | None, ...]

    @property
    def row_id(self) -> str:
        return orjson.dumps([p[0] if p else None for p in self.parts]).decode()

    @property
    def seq(self) -> int:
        return max(p[1].seq for p in self.parts if p is not None)

    def as_row(self) -> dict[str, Any]:
        """The mapping projections read: topic alias (``"0"``, ``"1"``...) -> record."""
        return {str(i): p[1].record for i, p in enumerate(self.parts) if p is not None}


def _sig(row: JoinedRow) -> tuple[tuple[str, int] | None, ...]:
    # Identity of the stored rows a joined row is made of (valid while they are alive).
    return tuple((p[0], id(p[1])) if p else None for p in row.parts)


class JoinState:
    """Rows of every joined topic with their join-key indexes; yields joined-row changes."""

    def __init__(
        self, plan: JoinPlan, *, null_equivalent: bool = False, outer: bool = True
    ) -> None:
        self.plan = plan
        self.null_equivalent = null_equivalent
        self.outer = outer
        self._reset()

    def _reset(self) -> None:
        n = len(self.plan.topics)
        self.rows: list[dict[str, StoredRow]] = [{} for _ in range(n)]
        # child_index[i]: rows of topic i by their side of link i; parent_index[i]: rows of
        # link i's parent by the parent's side (to walk up from a changed row to its anchors).
        self.child_index: list[dict[str, set[str]]] = [{} for _ in range(n)]
        self.parent_index: list[dict[str, set[str]]] = [{} for _ in range(n)]

    # ---- indexes

    def _index(self, topic: int, sow_key: str, record: Mapping[str, Any], add: bool) -> None:
        link = self.plan.links[topic]
        entries: list[tuple[dict[str, set[str]], str | None]] = []
        if link is not None:
            entries.append(
                (self.child_index[topic], join_key(record, link.child_paths, self.null_equivalent))
            )
        for child, child_link in enumerate(self.plan.links):
            if child_link is not None and child_link.parent == topic:
                key = join_key(record, child_link.parent_paths, self.null_equivalent)
                entries.append((self.parent_index[child], key))
        for index, key in entries:
            if key is None:
                continue
            if add:
                index.setdefault(key, set()).add(sow_key)
            else:
                members = index[key]
                members.discard(sow_key)
                if not members:
                    del index[key]

    # ---- anchors and expansion

    def _anchors(self, topic: int, sow_key: str, record: Mapping[str, Any], out: set[str]) -> None:
        if topic == 0:
            out.add(sow_key)
            return
        link = self.plan.links[topic]
        assert link is not None
        key = join_key(record, link.child_paths, self.null_equivalent)
        if key is None:
            return
        for parent_key in self.parent_index[topic].get(key, ()):
            parent = self.rows[link.parent][parent_key]
            self._anchors(link.parent, parent_key, parent.record, out)

    def expand(self, anchor: str) -> list[JoinedRow]:
        """The joined rows of the preserved row ``anchor`` (none if it does not exist)."""
        root = self.rows[0].get(anchor)
        if root is None:
            return []
        partials: list[list[tuple[str, StoredRow] | None]] = [[(anchor, root)]]
        for i, link in enumerate(self.plan.links[1:], 1):
            assert link is not None
            grown: list[list[tuple[str, StoredRow] | None]] = []
            for partial in partials:
                matches: list[tuple[str, StoredRow]] = []
                parent = partial[link.parent]
                if parent is not None:
                    key = join_key(parent[1].record, link.parent_paths, self.null_equivalent)
                    for child_key in sorted(self.child_index[i].get(key, ())) if key else ():
                        child = self.rows[i][child_key]
                        if all(
                            (other := partial[j]) is not None
                            and values_match(
                                child.record,
                                path,
                                other[1].record,
                                other_path,
                                self.null_equivalent,
                            )
                            for path, j, other_path in link.extra
                        ):
                            matches.append((child_key, child))
                if matches:
                    grown.extend([*partial, m] for m in matches)
                elif self.outer:
                    grown.append([*partial, None])
            partials = grown
        return [JoinedRow(tuple(p)) for p in partials]

    # ---- changes

    def apply(
        self, topic: int, sow_key: str, after: StoredRow | None
    ) -> tuple[list[JoinedRow], list[JoinedRow]]:
        """Store the new state of one row (None: deleted); returns (removed, added) joined rows.

        Rows present before and after with the same parts are left out of both lists.
        """
        old = self.rows[topic].get(sow_key)
        anchors: set[str] = set()
        for image in (old, after):
            if image is not None:
                self._anchors(topic, sow_key, image.record, anchors)
        ordered = sorted(anchors)
        before_rows = [r for a in ordered for r in self.expand(a)]
        if old is not None:
            self._index(topic, sow_key, old.record, add=False)
            del self.rows[topic][sow_key]
        if after is not None:
            self.rows[topic][sow_key] = after
            self._index(topic, sow_key, after.record, add=True)
        after_rows = [r for a in ordered for r in self.expand(a)]
        # A joined row made of the very same stored rows before and after is untouched.
        kept = {_sig(r) for r in before_rows} & {_sig(r) for r in after_rows}
        return (
            [r for r in before_rows if _sig(r) not in kept],
            [r for r in after_rows if _sig(r) not in kept],
        )

    # ---- state

    def encode(self) -> list[dict[str, list[Any]]]:
        return [{k: [r.record, r.seq] for k, r in rows.items()} for rows in self.rows]

    def load(self, data: Any) -> None:
        if not isinstance(data, list) or len(data) != len(self.plan.topics):
            raise ValueError("join state does not match this view's topics")
        self._reset()
        for topic, rows in enumerate(data):
            for sow_key, (record, seq) in rows.items():
                self.rows[topic][sow_key] = StoredRow(record, seq)
                self._index(topic, sow_key, record, add=True)


def join_rows_naive(
    plan: JoinPlan,
    tables: Sequence[Mapping[str, StoredRow]],
    *,
    null_equivalent: bool = False,
    outer: bool = True,
) -> list[JoinedRow]:
    """The join by nested loops straight from its definition: the reference for tests.

    Each topic in attach order joins every row of the topics before it on all conditions
    between them (scanning, no index); no match gives a NULL-extended row when ``outer``.
    """
    partials: list[list[tuple[str, StoredRow] | None]] = [
        [(k, r)] for k, r in sorted(tables[0].items())
    ]
    for i in range(1, len(plan.topics)):
        conditions = []
        for a, a_path, b, b_path in plan.conditions:
            if a == i and b < i:
                conditions.append((a_path, b, b_path))
            elif b == i and a < i:
                conditions.append((b_path, a, a_path))
        grown: list[list[tuple[str, StoredRow] | None]] = []
        for partial in partials:
            matches = [
                (k, r)
                for k, r in sorted(tables[i].items())
                if all(
                    (other := partial[j]) is not None
                    and values_match(r.record, path, other[1].record, other_path, null_equivalent)
                    for path, j, other_path in conditions
                )
            ]
            if matches:
                grown.extend([*partial, m] for m in matches)
            elif outer:
                grown.append([*partial, None])
        partials = grown
    return [JoinedRow(tuple(p)) for p in partials]
