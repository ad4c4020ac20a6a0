"""The bulk fold (what Spark runs per SowKey) gives the engine's SOW for the same log.

The engine side is the real ``TopicProcessor`` on an in-memory store (see
test_processor_model.py); the bulk side sorts the same records by (key, partition, offset) the
way the Spark job does and folds them with ``fold_sorted``.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sowstream.config import load_config_text
from sowstream.sow.compiled import compile_topic
from sowstream.sow.fold import (
    FilterDeletes,
    apply_record,
    fold_key,
    fold_sorted,
    is_filter_delete,
    state_row,
)
from sowstream.sow.ops import RawRecord
from sowstream.sow.record import SowRecord
from sowstream.wire import headers as h
from tests.unit.test_processor_model import TOPIC, key_of, op, ops, run, to_records

EXPIRING = compile_topic(
    load_config_text(
        "sow:\n  - Name: t\n    Key: /id\n    Expiration: 10s\n    Durability: transient\n"
    ).topics[0]
)
COMPILED = compile_topic(TOPIC)


def bulk(
    records: list[RawRecord], topic: Any = COMPILED, until_ms: int = 10**15
) -> dict[bytes, Any]:
    by_partition: dict[int, list[RawRecord]] = {}
    keyed = []
    for rec in records:
        if is_filter_delete(rec.headers):
            by_partition.setdefault(rec.partition, []).append(rec)
        elif rec.key is not None:
            keyed.append(rec)
    deletes = {p: FilterDeletes.of(topic, recs) for p, recs in by_partition.items()}
    keyed.sort(key=lambda r: (r.key or b"", r.partition, r.offset))
    return {
        state.sow_key.encode(): orjson.loads(state.data)
        for _, _, state in fold_sorted(topic, keyed, deletes, until_ms=until_ms)
        if state is not None
    }


@settings(max_examples=300, deadline=None)
@example([("publish", 1, 0, 5), ("filter", 0, 1, 0), ("delta", 1, 1, 7)])
@example([("publish", 1, 0, 5), ("filter", 0, 0, 0), ("delta", 1, 1, 7)])
@given(ops)
def test_bulk_fold_equals_the_engine(sequence: list[tuple[str, int, int, int]]) -> None:
    records = to_records(sequence)
    assert bulk(records) == run(records, [], None)


def rec(offset: int, ts: int, body: dict[str, Any] | None, **headers: str) -> RawRecord:
    value = orjson.dumps(body) if body is not None else None
    key = key_of(body["id"]) if body is not None else key_of(1)
    return RawRecord(0, offset, ts, key, value, dict(headers))


def test_expired_record_is_gone_by_until_and_before_a_later_delta() -> None:
    first = rec(0, 1_000, {"id": 1, "a": 1, "b": 2})
    delta = rec(1, 20_000, {"id": 1, "b": 3}, **{h.COMMAND: h.DELTA_PUBLISH})
    # expired at 11,000, so the delta at 20,000 starts a new record from its own fields
    state = fold_key(EXPIRING, [first, delta], until_ms=20_000)
    assert state is not None and orjson.loads(state.data) == {"id": 1, "b": 3}
    assert state.expiration == 30_000
    assert fold_key(EXPIRING, [first, delta], until_ms=30_000) is None
    # before expiry the delta merges
    early = rec(1, 5_000, {"id": 1, "b": 3}, **{h.COMMAND: h.DELTA_PUBLISH})
    merged = fold_key(EXPIRING, [first, early], until_ms=6_000)
    assert merged is not None and orjson.loads(merged.data) == {"id": 1, "a": 1, "b": 3}


def test_per_message_expiration_header_and_never() -> None:
    keep = rec(0, 1_000, {"id": 1}, **{h.EXPIRATION: "0"})
    assert fold_key(EXPIRING, [keep], until_ms=10**12) is not None
    short = rec(0, 1_000, {"id": 1}, **{h.EXPIRATION: "2"})
    assert fold_key(EXPIRING, [short], until_ms=2_999) is not None
    assert fold_key(EXPIRING, [short], until_ms=3_000) is None


def test_filter_delete_after_the_last_update_and_bad_records_are_skipped() -> None:
    pub = rec(0, 1, {"id": 1, "g": 1})
    bad = RawRecord(0, 1, 1, key_of(1), b"{not json", {})
    fdel = RawRecord(0, 2, 1, None, None, {h.COMMAND: h.SOW_DELETE, h.FILTER: "/g = 1"})
    bad_filter = RawRecord(0, 3, 1, None, None, {h.COMMAND: h.SOW_DELETE, h.FILTER: "/g = ("})
    deletes = FilterDeletes.of(COMPILED, [bad_filter, fdel])
    assert deletes.offsets == [2]
    assert fold_key(COMPILED, [pub, bad], deletes, until_ms=0) is None
    assert fold_key(COMPILED, [pub, bad], FilterDeletes.of(COMPILED, []), until_ms=0) is not None


def test_state_row_is_flat() -> None:
    state = fold_key(COMPILED, [rec(7, 42, {"id": 1, "g": 0})], until_ms=0)
    assert state is not None
    row = state_row(state, 3)
    assert row["log_partition"] == 3 and row["log_offset"] == 7 and row["log_timestamp"] == 42
    assert orjson.loads(row["data"]) == {"id": 1, "g": 0}
    assert row["sow_key"] == key_of(1).decode()


@given(st.integers(0, 5))
def test_unkeyed_records_are_left_to_the_engine_rekey(i: int) -> None:
    # a record whose Kafka key is not its SowKey is re-keyed by the engine, not applied
    wrong = RawRecord(0, 0, 1, b"other", orjson.dumps({"id": i}), {})
    assert fold_key(COMPILED, [wrong], until_ms=0) is None


# -- anchored folds: Spark drops each key's records before its last full publish ------------------

messy_ops = st.lists(
    st.one_of(
        op,
        st.tuples(st.just("malformed"), st.integers(0, 2), st.just(0), st.just(0)),
        st.tuples(st.just("wrong_key"), st.integers(0, 2), st.integers(0, 1), st.integers(0, 9)),
    ),
    max_size=40,
)


def messy_records(sequence: list[tuple[str, int, int, int]]) -> list[RawRecord]:
    clean = [
        op if op[0] not in ("malformed", "wrong_key") else ("publish", *op[1:]) for op in sequence
    ]
    records = to_records(clean)
    for offset, (kind, i, g, v) in enumerate(sequence):
        if kind == "malformed":
            records[offset] = RawRecord(0, offset, 1, key_of(i), b"{oops", {})
        elif kind == "wrong_key":  # keyed as record i, but its body says record i + 1
            body = orjson.dumps({"id": i + 1, "g": g, "v": v})
            records[offset] = RawRecord(0, offset, 1, key_of(i), body, {})
    return records


def anchored_bulk(records: list[RawRecord]) -> dict[bytes, Any]:
    """What the Spark job does: prune at each key's last publish, fold, refold flagged keys."""
    fdel = [r for r in records if is_filter_delete(r.headers)]
    deletes = {0: FilterDeletes.of(COMPILED, fdel)}
    keyed = sorted(
        (r for r in records if not is_filter_delete(r.headers) and r.key is not None),
        key=lambda r: (r.key or b"", r.offset),
    )
    anchors: dict[bytes | None, int] = {}
    for r in keyed:
        if (r.headers.get(h.COMMAND) or h.PUBLISH) == h.PUBLISH and r.value is not None:
            anchors[r.key] = max(anchors.get(r.key, -1), r.offset)
    pruned = [r for r in keyed if r.offset >= anchors.get(r.key, -1)]
    out: dict[bytes, Any] = {}
    again: set[bytes | None] = set()
    for _, key, state in fold_sorted(COMPILED, pruned, deletes, until_ms=0, anchored=True):
        if state is None:
            again.add(key)
        else:
            out[state.sow_key.encode()] = orjson.loads(state.data)
    full = [r for r in keyed if r.key in again]
    for _, _, state in fold_sorted(COMPILED, full, deletes, until_ms=0):
        if state is not None:
            out[state.sow_key.encode()] = orjson.loads(state.data)
    return out


@settings(max_examples=300, deadline=None)
@example([("publish", 1, 0, 5), ("delta", 1, 0, 6), ("malformed", 1, 0, 0)])
@example([("publish", 1, 0, 5), ("wrong_key", 1, 0, 6)])
@given(messy_ops)
def test_anchored_fold_with_refolds_equals_the_engine(
    sequence: list[tuple[str, int, int, int]],
) -> None:
    records = messy_records(sequence)
    assert anchored_bulk(records) == run(records, [], None)


# -- stepping an in-memory state (bookmark replays) ----------------------------------------------


@settings(max_examples=200, deadline=None)
@given(messy_ops)
def test_stepping_record_by_record_ends_where_the_engine_does(
    sequence: list[tuple[str, int, int, int]],
) -> None:
    state: dict[str, SowRecord] = {}
    for rec in messy_records(sequence):
        for step in apply_record(COMPILED, state, rec):
            assert state.get(step.sow_key) is step.after  # each step says what it left
    assert {k.encode(): orjson.loads(r.data) for k, r in state.items()} == run(
        messy_records(sequence), [], None
    )


def test_a_delete_by_filter_numbers_its_removals_in_sow_key_order() -> None:
    state: dict[str, SowRecord] = {}
    for i in range(3):
        apply_record(COMPILED, state, rec(i, 1, {"id": i, "g": 1}))
    fdel = RawRecord(0, 9, 1, None, None, {h.COMMAND: h.SOW_DELETE, h.FILTER: "/g = 1"})
    steps = apply_record(COMPILED, state, fdel)
    assert [s.seq for s in steps] == [1, 2, 3] and not state
    assert [s.sow_key for s in steps] == sorted(key_of(i).decode() for i in range(3))
    assert all(s.after is None and s.before is not None for s in steps)
    assert apply_record(COMPILED, state, fdel) == []  # nothing left to remove
