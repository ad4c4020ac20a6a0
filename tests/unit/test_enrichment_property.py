"""On a topic with Preprocessing and Enrichment, the engine and the bulk fold (what Spark runs)
give the same SOW, replays after a crash enrich nothing twice, and both equal a plain model.

The engine side is the real ``TopicProcessor`` on an in-memory store, fed random batches and
replayed from a random point; the bulk side folds the same log per key as the Spark rebuild does
(``fold_sorted``, with and without cutting each key's history at its last publish).
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sowstream.config import load_config_text
from sowstream.sow.compiled import compile_topic
from sowstream.sow.fold import FilterDeletes, apply_record, fold_sorted, is_filter_delete
from sowstream.sow.keys import generated_sow_key
from sowstream.sow.ops import RawRecord
from sowstream.sow.record import SowRecord
from sowstream.wire import headers as h
from tests.unit.test_processor_model import run

TOPIC = load_config_text(
    """
engine: {app_id: prop}
sow:
  - Name: t
    Key: /key
    HashIndex: [[/g]]
    Durability: transient
    Preprocessing:
      - CONCAT('k', /id) AS /key
    Enrichment:
      - COALESCE(/n OF PREVIOUS, 0) + 1 AS /n
      - IF(/v < 0, /v OF PREVIOUS, /v) AS /v
      - COALESCE(/first OF PREVIOUS, UNIX_TIMESTAMP()) AS /first
      - UNIX_TIMESTAMP() AS /at
      - AMPS_INSTANCE_NAME() AS /by
      - IF(/p IS NULL, 'delta', 'whole') AS /came
"""
).topics[0]
COMPILED = compile_topic(TOPIC)


def key_of(i: int) -> bytes:
    return generated_sow_key("t", "t", ["/key"], {"key": f"k{i}"}).encode()


def ts(offset: int) -> int:
    return 1_000 + 7 * offset


# One log operation: (kind, record id, group, value); values below 0 are refused by Enrichment.
op = st.one_of(
    st.tuples(st.just("publish"), st.integers(0, 2), st.integers(0, 1), st.integers(-2, 9)),
    st.tuples(st.just("delta"), st.integers(0, 2), st.integers(0, 1), st.integers(-2, 9)),
    st.tuples(st.just("delete"), st.integers(0, 2), st.just(0), st.just(0)),
    st.tuples(st.just("filter"), st.just(0), st.integers(0, 1), st.just(0)),
    # published by a plain Kafka producer keyed by its own idea of the key: re-keyed by the
    # engine, so neither side applies it here
    st.tuples(st.just("raw_key"), st.integers(0, 2), st.integers(0, 1), st.integers(0, 9)),
)
ops = st.lists(op, max_size=30)


def to_records(sequence: list[tuple[str, int, int, int]]) -> list[RawRecord]:
    records = []
    for offset, (kind, i, g, v) in enumerate(sequence):
        body = orjson.dumps({"id": i, "g": g, "v": v, "p": offset})
        headers: dict[str, str] = {}
        key: bytes | None = key_of(i)
        if kind == "delta":
            # Leaves /p out: the merged record keeps the stored one. (It carries /g, which
            # deletes by filter read: a replayed delta that re-creates a record a later delete
            # removed must match that delete again, as in test_processor_model.)
            body, headers = orjson.dumps({"id": i, "g": g, "v": v}), {h.COMMAND: h.DELTA_PUBLISH}
        elif kind == "delete":
            body, headers = None, {h.COMMAND: h.SOW_DELETE}
        elif kind == "filter":
            body, key = None, None
            headers = {h.COMMAND: h.SOW_DELETE, h.FILTER: f"/g = {g}"}
        elif kind == "raw_key":
            key = f"{i}".encode()
        records.append(RawRecord(0, offset, ts(offset), key, body, headers))
    return records


def model(sequence: list[tuple[str, int, int, int]]) -> dict[bytes, Any]:
    """The chapter's rules spelled out by hand, one operation at a time."""
    state: dict[bytes, dict[str, Any]] = {}
    for offset, (kind, i, g, v) in enumerate(sequence):
        key = key_of(i)
        previous = state.get(key)
        if kind in ("publish", "delta"):
            message: dict[str, Any] = {"id": i, "g": g, "v": v, "p": offset, "key": f"k{i}"}
            if kind == "delta":
                message = {"id": i, "g": g, "v": v, "key": f"k{i}"}
            # Enrichment runs on the incoming message (a delta as it came), then a delta merges.
            now = ts(offset) / 1000
            prev = previous or {}
            message["n"] = prev.get("n", 0) + 1
            message["v"] = prev.get("v") if message["v"] < 0 else message["v"]
            message["first"] = prev.get("first", now)
            message["at"] = now
            message["by"] = "prop"
            message["came"] = "whole" if "p" in message else "delta"
            if kind == "delta" and previous is not None:
                message = {**previous, **message}
            state[key] = message
        elif kind == "delete":
            state.pop(key, None)
        elif kind == "filter":
            state = {k: r for k, r in state.items() if r["g"] != g}
    return state


def bulk(records: list[RawRecord], *, anchored: bool) -> dict[bytes, Any]:
    """The Spark rebuild's fold: per key, optionally from its last publish, refolding keys
    the cut cannot start (every key here: the Enrichment reads the record before)."""
    fdel = [r for r in records if is_filter_delete(r.headers)]
    deletes = {0: FilterDeletes.of(COMPILED, fdel)}
    keyed = sorted(
        (r for r in records if not is_filter_delete(r.headers) and r.key is not None),
        key=lambda r: (r.key or b"", r.offset),
    )
    out: dict[bytes, Any] = {}
    again: set[bytes | None] = set()
    for _, key, state in fold_sorted(COMPILED, keyed, deletes, until_ms=0, anchored=anchored):
        if state is None:
            again.add(key)
        else:
            out[state.sow_key.encode()] = orjson.loads(state.data)
    full = [r for r in keyed if r.key in again]
    for _, _, state in fold_sorted(COMPILED, full, deletes, until_ms=0):
        if state is not None:
            out[state.sow_key.encode()] = orjson.loads(state.data)
    return out


def stepped(records: list[RawRecord]) -> dict[bytes, Any]:
    """What a bookmark replay computes, one record at a time."""
    state: dict[str, SowRecord] = {}
    for rec in records:
        apply_record(COMPILED, state, rec)
    return {k.encode(): orjson.loads(r.data) for k, r in state.items()}


@settings(max_examples=300, deadline=None)
# A counter: replaying the first publish must not count it twice.
@example([("publish", 1, 0, 5), ("publish", 1, 0, -1)], [1], 0)
# Delta then a refused value: the Enrichment reads the delta's /v, then the delta merges.
@example([("publish", 1, 0, 5), ("delta", 1, 1, -1), ("filter", 0, 0, 0)], [], 1)
@given(ops, st.lists(st.integers(0, 40), max_size=4), st.none() | st.integers(0, 40))
def test_engine_fold_and_model_agree(
    sequence: list[tuple[str, int, int, int]], cuts: list[int], replay_from: int | None
) -> None:
    records = to_records(sequence)
    expected = model(sequence)
    assert run(records, cuts, replay_from, TOPIC) == expected
    assert bulk(records, anchored=False) == expected
    assert bulk(records, anchored=True) == expected
    assert stepped(records) == expected
