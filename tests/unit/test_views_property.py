"""Property tests: the incrementally maintained view always equals a naive recomputation.

Random inserts, updates (including group moves and join-key changes) and deletes on one topic
and on joined topics (NULLs, empty strings, one-to-many, numeric strings), checked after every
step; the view changes returned, applied in order to a copy of the view topic, reproduce the
view; and a crash replay (state saved, restored, changes replayed from before the save) ends in
the same view.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sowstream.config.views import ViewConfig
from sowstream.views.inline import UnderlyingChange, conflate, last_per_record
from sowstream.views.maintainer import ViewMaintainer

SCALARS = st.sampled_from([None, "", 0, 1, 7, 7.0, "7", "7.0", 2.5, -3, "a", "b", True])
NUMBERS = st.one_of(st.integers(-50, 50), st.floats(-100, 100, allow_nan=False), st.none())

single_records = st.fixed_dictionaries(
    {"g": SCALARS, "x": st.one_of(NUMBERS, SCALARS), "who": st.sampled_from(["ann", "bob", None])}
)
# An op: (topic index, key, record or None for a delete).
single_ops = st.lists(
    st.tuples(st.just(0), st.integers(0, 6), st.one_of(st.none(), single_records)),
    min_size=1,
    max_size=40,
)

SINGLE = ViewConfig(
    name="P1",
    underlying_topic="t",
    projection=[
        "/g",
        "/who AS /lastWho",
        "COUNT(/x) AS /n",
        "SUM(/x) AS /s",
        "AVG(/x) AS /a",
        "MIN(/x) AS /lo",
        "MAX(/x) AS /hi",
        "COUNT_DISTINCT(/x) AS /d",
        "ANY(/x) AS /any",
        "STDDEV_POP(/x) AS /sd",
        "STDDEV_SAMP(/x) AS /ss",
        "SUM(/x * 2) - COUNT(/x) AS /expr",
    ],
    grouping=["/g"],
)
FILTERED = SINGLE.model_copy(update={"name": "P2", "filter": "/x > 0 OR /who = 'ann'"})

KEYS = st.sampled_from([None, "", "k1", "k2", 1, "1"])
join_records = st.fixed_dictionaries(
    {
        "k": KEYS,
        "k2": st.sampled_from(["p", "q", None]),
        "g": st.sampled_from(["x", "y", None]),
        "v": NUMBERS,
    }
)
join_ops = st.lists(
    st.tuples(st.integers(0, 1), st.integers(0, 4), st.one_of(st.none(), join_records)),
    min_size=1,
    max_size=40,
)
chain_ops = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 3), st.one_of(st.none(), join_records)),
    min_size=1,
    max_size=40,
)


def join_view(null_equivalency: bool) -> ViewConfig:
    return ViewConfig(
        name="J",
        joins=["[A]./k = [B]./k"],
        projection=[
            "[B]./g AS /bg",
            "[A]./v AS /lastAv",
            "SUM([A]./v) AS /sa",
            "COUNT([B]./v) AS /nb",
            "MAX([B]./v) AS /hb",
            "COUNT_DISTINCT([A]./k) AS /dk",
        ],
        grouping=["[B]./g"],
        join_null_equivalency=null_equivalency,
    )


CHAIN = ViewConfig(
    name="C",
    joins=["[A]./k = [B]./k", "[A]./k2 = [B]./k2", "[B]./g = [C]./g"],
    projection=["[A]./g AS /g", "SUM([C]./v) AS /sc", "COUNT([B]./v) AS /nb", "[C]./k AS /ck"],
    grouping=["[A]./g"],
)
TOPICS = {"P1": ["t"], "P2": ["t"], "J": ["A", "B"], "C": ["A", "B", "C"]}


def run(view: ViewConfig, ops: list[tuple[int, int, Any]], **kwargs: Any) -> ViewMaintainer:
    """Apply ``ops`` checking the three invariants after every step; returns the maintainer."""
    m = ViewMaintainer(view, **kwargs)
    state: dict[str, dict[str, tuple[dict[str, Any], int]]] = {}
    published: dict[str, dict[str, Any]] = {}
    for seq, (topic_no, key, record) in enumerate(ops, 1):
        topic = TOPICS[view.name][topic_no]
        table = state.setdefault(topic, {})
        before = table.get(str(key))
        if record is None:
            table.pop(str(key), None)
        else:
            table[str(key)] = (record, seq)
        for change in m.apply(
            topic, str(key), None if before is None else before[0], record, seq=seq
        ):
            assert change.previous == published.get(change.sow_key)
            if change.record is None:
                del published[change.sow_key]
            else:
                published[change.sow_key] = change.record
        current = m.records()
        assert current == m.recompute(state)
        assert current == published
    return m


FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(single_ops)
def test_single_topic_view_equals_recompute(ops: list[tuple[int, int, Any]]) -> None:
    run(SINGLE, ops)


@FAST
@given(single_ops)
def test_filtered_view_equals_recompute(ops: list[tuple[int, int, Any]]) -> None:
    run(FILTERED, ops)


@FAST
@given(join_ops, st.booleans(), st.sampled_from(["left", "right"]), st.booleans())
def test_join_view_equals_recompute(
    ops: list[tuple[int, int, Any]], null_equivalency: bool, preserve: str, outer: bool
) -> None:
    run(join_view(null_equivalency), ops, preserve=preserve, outer=outer)


@FAST
@given(chain_ops)
def test_chained_composite_join_equals_recompute(ops: list[tuple[int, int, Any]]) -> None:
    run(CHAIN, ops)


def replay(
    view: ViewConfig, ops: list[tuple[int, int, Any]], save_at: int, back: int
) -> dict[str, dict[str, Any]]:
    """Run ``ops``, saving state after ``save_at`` of them; restart from the saved bytes and
    replay from ``back`` ops earlier (duplicates), then the rest. Returns the final view."""
    m = ViewMaintainer(view)
    state: dict[str, dict[str, tuple[dict[str, Any], int]]] = {}
    befores: list[dict[str, Any] | None] = []
    saved = m.to_bytes()
    for seq, (topic_no, key, record) in enumerate(ops, 1):
        topic = TOPICS[view.name][topic_no]
        table = state.setdefault(topic, {})
        before = table.get(str(key))
        befores.append(None if before is None else before[0])
        if record is None:
            table.pop(str(key), None)
        else:
            table[str(key)] = (record, seq)
        m.apply(topic, str(key), befores[-1], record, seq=seq)
        if seq == save_at:
            saved = m.to_bytes()
    restored = ViewMaintainer.from_bytes(view, saved)
    assert restored.to_bytes() == saved
    for seq in range(max(1, save_at - back), len(ops) + 1):
        topic_no, key, record = ops[seq - 1]
        topic = TOPICS[view.name][topic_no]
        restored.apply(topic, str(key), befores[seq - 1], record, seq=seq)
    final = restored.records()
    assert final == m.records() == m.recompute(state)
    return final


@FAST
@given(single_ops, st.integers(0, 40), st.integers(0, 5))
def test_single_topic_crash_replay(ops: list[tuple[int, int, Any]], at: int, back: int) -> None:
    replay(SINGLE, ops, min(at, len(ops)), back)


@FAST
@given(join_ops, st.integers(0, 40), st.integers(0, 5))
def test_join_crash_replay(ops: list[tuple[int, int, Any]], at: int, back: int) -> None:
    replay(join_view(False), ops, min(at, len(ops)), back)


def run_inline(view: ViewConfig, ops: list[tuple[int, int, Any]], cuts: list[int]) -> None:
    """``Conflation: inline``: the ops cut into batches at ``cuts``, each batch conflated per
    underlying record and its view changes per view record, give the same view as applying
    every change alone, and the changes sent reproduce it."""
    alone = ViewMaintainer(view)
    inline = ViewMaintainer(view.model_copy(update={"conflation": "inline"}))
    current: dict[str, dict[str, Any]] = {}
    changes: list[UnderlyingChange] = []
    for seq, (topic_no, key, record) in enumerate(ops, 1):
        topic = TOPICS[view.name][topic_no]
        before = current.get(f"{topic}/{key}")
        if record is None:
            current.pop(f"{topic}/{key}", None)
        else:
            current[f"{topic}/{key}"] = record
        alone.apply(topic, str(key), before, record, seq=seq)
        changes.append(UnderlyingChange(topic, str(key), before, record, seq))
    published: dict[str, dict[str, Any]] = {}
    bounds = [0, *sorted({c % (len(ops) + 1) for c in cuts}), len(ops)]
    for start, end in itertools.pairwise(bounds):
        batch = conflate(changes[start:end])
        assert len(batch) <= end - start
        out = [
            c
            for ch in batch
            for c in inline.apply(ch.topic, ch.sow_key, ch.before, ch.after, seq=ch.seq)
        ]
        for change in last_per_record(out):
            assert change.previous == published.get(change.sow_key)
            if change.record is None:
                del published[change.sow_key]
            else:
                published[change.sow_key] = change.record
        assert len({c.sow_key for c in last_per_record(out)}) == len(last_per_record(out))
    assert inline.records() == alone.records() == published


@FAST
@given(single_ops, st.lists(st.integers(0, 40), max_size=6))
def test_inline_conflation_single_topic(ops: list[tuple[int, int, Any]], cuts: list[int]) -> None:
    run_inline(SINGLE, ops, cuts)
    run_inline(FILTERED, ops, cuts)


@FAST
@given(join_ops, st.lists(st.integers(0, 40), max_size=6))
def test_inline_conflation_join(ops: list[tuple[int, int, Any]], cuts: list[int]) -> None:
    run_inline(join_view(False), ops, cuts)


@FAST
@given(chain_ops, st.lists(st.integers(0, 40), max_size=6))
def test_inline_conflation_chained_join(ops: list[tuple[int, int, Any]], cuts: list[int]) -> None:
    run_inline(CHAIN, ops, cuts)
