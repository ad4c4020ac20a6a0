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
from sowstream.sow.fold import FilterDeletes, fold_key, fold_sorted, is_filter_delete, state_row
from sowstream.sow.ops import RawRecord
from sowstream.wire import headers as h
from tests.unit.test_processor_model import TOPIC, key_of, ops, run, to_records

EXPIRING = load_config_text(
    "sow:\n  - Name: t\n    Key: /id\n    Expiration: 10s\n    Durability: transient\n"
).topics[0]


def bulk(records: list[RawRecord], topic: Any = TOPIC, until_ms: int = 10**15) -> dict[bytes, Any]:
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
        for _, state in fold_sorted(topic, keyed, deletes, until_ms=until_ms)
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
    deletes = FilterDeletes.of(TOPIC, [bad_filter, fdel])
    assert deletes.offsets == [2]
    assert fold_key(TOPIC, [pub, bad], deletes, until_ms=0) is None
    assert fold_key(TOPIC, [pub, bad], FilterDeletes.of(TOPIC, []), until_ms=0) is not None


def test_state_row_is_flat() -> None:
    state = fold_key(TOPIC, [rec(7, 42, {"id": 1, "g": 0})], until_ms=0)
    assert state is not None
    row = state_row(state, 3)
    assert row["log_partition"] == 3 and row["log_offset"] == 7 and row["log_timestamp"] == 42
    assert orjson.loads(row["data"]) == {"id": 1, "g": 0}
    assert row["sow_key"] == key_of(1).decode()


@given(st.integers(0, 5))
def test_unkeyed_records_are_left_to_the_engine_rekey(i: int) -> None:
    # a record whose Kafka key is not its SowKey is re-keyed by the engine, not applied
    wrong = RawRecord(0, 0, 1, b"other", orjson.dumps({"id": i}), {})
    assert fold_key(TOPIC, [wrong], until_ms=0) is None
