"""Memo indexes in the real TopicProcessor on an in-memory store: never a different answer.

Random records and random filters are queried through ``TopicProcessor.query`` (whatever plan it
picks: Key, hash, memo, union or scan) and compared with a plain evaluation of the filter over
the records; random update sequences must leave exactly the entries the records call for.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
from collections.abc import Mapping
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sowstream.config import load_config_text
from sowstream.config.models import TopicConfig
from sowstream.engine import memo
from sowstream.engine.metrics import QUERY_PLANS
from sowstream.engine.partition import PartitionState
from sowstream.engine.processor import TopicProcessor
from sowstream.engine.store import MemoryPartition, is_record_key
from sowstream.errors import StateStoreError
from sowstream.filters import ast, compile_filter
from sowstream.sow.compiled import compile_topic
from sowstream.sow.keys import generated_sow_key
from sowstream.sow.layout import store_entries
from sowstream.sow.memo import BUILDING, MEMO_PREFIX, READY, marker_key, memo_entries
from sowstream.sow.ops import RawRecord
from sowstream.sow.planner import MemoLookup, UnionLookup, plan
from sowstream.sow.record import SowRecord
from sowstream.wire import headers as h
from sowstream.wire.protocol import Command
from sowstream.wire.topics import TopicNames
from tests.support.expiry import expire_through_log
from tests.support.sender import RecordingSender


def topic(extra: str = "") -> TopicConfig:
    text = "sow:\n  - Name: t\n    Key: /id\n    Index: [/a]\n    Durability: transient\n"
    return load_config_text(text + extra).topics[0]


def key_of(i: int) -> str:
    return generated_sow_key("t", "t", ["/id"], {"id": i})


def publish(offset: int, body: dict[str, Any]) -> RawRecord:
    return RawRecord(0, offset, 1, key_of(body["id"]).encode(), orjson.dumps(body), {})


async def query(proc: TopicProcessor, sender: RecordingSender, flt: str) -> list[str]:
    sender.take()
    await proc.query(Command("sow", "c", "", "r", "t", filter=flt, batch_size=1000), 0)
    replies = sender.replies()
    (end,) = [r for r in replies if r.command == "part_end"]
    assert end.status == "success", end
    return [r.sow_key for rep in replies if rep.command == "sow" for r in rep.records]


KEY_EQUALITY = re.compile(r"/id (=|IN) |= /id\b")


def scan(bodies: dict[str, dict[str, Any]], flt: str) -> list[str]:
    f = compile_filter(flt)
    return sorted(k for k, body in bodies.items() if f.matches(body))


def stored_memo_entries(ps: PartitionState) -> set[bytes]:
    return {k for k, _ in ps.store.scan(start=MEMO_PREFIX, prefix=MEMO_PREFIX)}


def expected_memo_entries(ps: PartitionState) -> set[bytes]:
    out: set[bytes] = set()
    for key, raw in ps.store.scan():
        if is_record_key(key):
            out |= memo_entries(
                ps.memo, key, SowRecord.from_bytes(raw).parsed(compile_topic(topic()).codec)
            )
    return out


# -- random records and filters ------------------------------------------------------------------

TEXTS = [
    "",
    "0",
    "5",
    "5.0",
    " 7",
    "1e3",
    "-2",
    "10",
    "9",
    "abc",
    "ab",
    "b",
    "Z",
    "true",
    "é",
    "a\x00",
]
scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-12, 12),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(TEXTS),
    st.text(max_size=3),
)
value = st.one_of(scalar, st.lists(scalar, max_size=3), st.fixed_dictionaries({"x": scalar}))
body = st.fixed_dictionaries({"a": value, "b": value})
literal = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-12, 12),
    st.floats(-1e3, 1e3),
    st.sampled_from(TEXTS),
)
path = st.sampled_from(["/a", "/b", "/a/x", "/id"])
PATTERNS = ["^a", "b", "^5", "^ab*", "0$", "^-", "^[0-9]", "^é", "a\\x00", "^$", "."]


def lit(v: ast.Scalar) -> str:
    return ast.to_text(ast.Literal(v))


def lits(vs: list[ast.Scalar]) -> str:
    return "(" + ", ".join(lit(v) for v in vs) + ")"


ops = st.sampled_from(["=", "!=", "<", "<=", ">", ">="])
predicate = st.one_of(
    st.builds(lambda p, o, v: f"{p} {o} {lit(v)}", path, ops, literal),
    st.builds(lambda p, o, v: f"{lit(v)} {o} {p}", path, ops, literal),
    st.builds(lambda p, lo, hi: f"{p} BETWEEN {lit(lo)} AND {lit(hi)}", path, literal, literal),
    st.builds(lambda p, vs: f"{p} IN {lits(vs)}", path, st.lists(literal, min_size=1, max_size=3)),
    st.builds(
        lambda p, vs: f"{p} BEGINS WITH {lits(vs)}", path, st.lists(literal, min_size=1, max_size=2)
    ),
    st.builds(
        lambda p, vs: f"{p} ENDS WITH {lits(vs)}", path, st.lists(literal, min_size=1, max_size=2)
    ),
    st.builds(lambda p, pat: f"{p} LIKE {ast.quote_string(pat)}", path, st.sampled_from(PATTERNS)),
)
filters = st.recursive(
    predicate,
    lambda inner: st.one_of(
        st.builds(lambda a, b: f"({a}) AND ({b})", inner, inner),
        st.builds(lambda a, b: f"({a}) OR ({b})", inner, inner),
        st.builds(lambda a: f"NOT ({a})", inner),
    ),
    max_leaves=4,
)


@settings(max_examples=300, deadline=None)
# Numbers whose text lies outside a BETWEEN of numeric strings that they satisfy as numbers.
@example([{"a": -1, "b": 9.5}], ["/a BETWEEN '-2' AND '5'", "/b BETWEEN '9' AND '10'"])
@example([{"a": 5, "b": [2, "5.0"]}], ["/a = '5.0'", "/b IN ('2.0')", "/b >= '5'"])
@given(st.lists(body, max_size=12), st.lists(filters, min_size=1, max_size=6))
def test_indexed_queries_return_exactly_what_a_scan_returns(
    records: list[dict[str, Any]], flts: list[str]
) -> None:
    bodies = {key_of(i): {"id": i, **b} for i, b in enumerate(records)}

    async def go() -> None:
        sender = RecordingSender()
        proc = TopicProcessor(compile_topic(topic()), TopicNames("p"), sender)
        ps = await proc.ready(0)
        assert ps.memo == {"/a"}  # Index: built at load
        await proc.process([publish(i, b) for i, b in enumerate(bodies.values())])
        await proc.drain()
        for flt in flts:
            if KEY_EQUALITY.search(flt):
                # A Key equality is a SowKey lookup, which compares text as AMPS does
                # (docs/filters.md): `/id = '5.0'` does not find id 5. test_planner covers it.
                continue
            assert await query(proc, sender, flt) == scan(bodies, flt), flt
        assert stored_memo_entries(ps) == expected_memo_entries(ps)

    asyncio.run(go())


# -- maintenance ----------------------------------------------------------------------------------

step: st.SearchStrategy[tuple[str, int, dict[str, Any]]] = st.one_of(
    st.tuples(st.just("publish"), st.integers(0, 3), body),
    st.tuples(st.just("delta"), st.integers(0, 3), body),
    st.tuples(st.just("delete"), st.integers(0, 3), st.just({})),
    st.tuples(st.just("filter"), st.just(0), st.just({})),
    st.tuples(st.just("query"), st.just(0), st.just({})),
)


def to_record(offset: int, kind: str, i: int, b: dict[str, Any]) -> RawRecord:
    key = key_of(i).encode()
    if kind == "publish":
        return RawRecord(0, offset, 1, key, orjson.dumps({"id": i, **b}), {})
    if kind == "delta":
        return RawRecord(
            0, offset, 1, key, orjson.dumps({"id": i, **b}), {h.COMMAND: h.DELTA_PUBLISH}
        )
    if kind == "delete":
        return RawRecord(0, offset, 1, key, None, {h.COMMAND: h.SOW_DELETE})
    return RawRecord(0, offset, 1, None, None, {h.COMMAND: h.SOW_DELETE, h.FILTER: "/a > 3"})


@settings(max_examples=200, deadline=None)
@given(st.lists(step, max_size=30), st.lists(st.integers(0, 30), max_size=4))
def test_entries_follow_every_update_delete_and_filter_delete(
    steps: list[tuple[str, int, dict[str, Any]]], cuts: list[int]
) -> None:
    async def go() -> None:
        sender = RecordingSender()
        proc = TopicProcessor(compile_topic(topic()), TopicNames("p"), sender)
        ps = await proc.ready(0)
        bounds = sorted({0, len(steps), *[c % (len(steps) + 1) for c in cuts]})
        offset = 0
        for lo, hi in itertools.pairwise(bounds):
            batch = []
            for kind, i, b in steps[lo:hi]:
                if kind == "query":
                    continue
                batch.append(to_record(offset, kind, i, b))
                offset += 1
            await proc.process(batch)
            if any(kind == "query" for kind, _, _ in steps[lo:hi]):
                # builds the index on /b on first use; later batches must keep it current
                await query(proc, sender, "/b BEGINS WITH ('a')")
        await proc.drain()
        assert stored_memo_entries(ps) == expected_memo_entries(ps)

    asyncio.run(go())


def test_a_range_query_builds_the_index_once_and_keeps_it_current() -> None:
    async def go() -> None:
        sender = RecordingSender()
        proc = TopicProcessor(compile_topic(topic()), TopicNames("p"), sender)
        ps = await proc.ready(0)
        await proc.process([publish(i, {"id": i, "qty": i * 10}) for i in range(100)])
        await proc.drain()
        assert "/qty" not in ps.memo
        before = QUERY_PLANS.labels("t", "memo")._value.get()
        assert await query(proc, sender, "/qty > 900") == sorted(
            key_of(i) for i in (91, 92, 93, 94, 95, 96, 97, 98, 99)
        )
        assert "/qty" in ps.memo
        assert QUERY_PLANS.labels("t", "memo")._value.get() == before + 1
        # updates after the build are indexed in the same write
        await proc.process([publish(100, {"id": 5, "qty": 5000}), to_record(101, "delete", 99, {})])
        await proc.drain()
        expected = sorted(key_of(i) for i in (5, 91, 92, 93, 94, 95, 96, 97, 98))
        assert await query(proc, sender, "/qty > 900") == expected
        assert stored_memo_entries(ps) == expected_memo_entries(ps)

    asyncio.run(go())


def test_an_and_is_served_by_its_most_selective_index() -> None:
    async def go() -> None:
        sender = RecordingSender()
        proc = TopicProcessor(compile_topic(topic()), TopicNames("p"), sender)
        ps = await proc.ready(0)
        bodies = {key_of(i): {"id": i, "a": i % 2, "qty": i} for i in range(200)}
        await proc.process([publish(i, b) for i, b in enumerate(bodies.values())])
        await proc.drain()
        flt = "/a = 1 AND /qty >= 190"
        await query(proc, sender, "/qty > 0")  # builds /qty
        how = plan(
            proc.topic,
            compile_filter(flt),
            memo_ready=ps.memo,
            estimate=lambda lookup: memo.count(ps.store, lookup, 1000),
        )
        assert isinstance(how, MemoLookup) and how.path == "/qty"
        assert await query(proc, sender, flt) == scan(bodies, flt)
        how = plan(proc.topic, compile_filter("/a = 1 OR /qty < 3"), memo_ready=ps.memo)
        assert isinstance(how, UnionLookup)

    asyncio.run(go())


def test_partial_indexes_are_rebuilt_or_dropped_at_load() -> None:
    async def go() -> None:
        store = MemoryPartition()
        rec = SowRecord(key_of(1), orjson.dumps({"id": 1, "a": 7, "b": "x"}), 0, 1)
        stale = memo_entries(["/a", "/b"], rec.sow_key.encode(), {"a": 1, "b": "old"})
        store.write(
            {
                rec.sow_key.encode(): rec.to_bytes(),
                marker_key("/a"): BUILDING,  # configured (Index): rebuilt
                marker_key("/b"): BUILDING,  # built on demand, never finished: dropped
                **dict.fromkeys(stale, b""),
            }
        )
        # A persistent topic keeps the store it finds (a transient one starts empty).
        proc = TopicProcessor(
            compile_topic(topic().model_copy(update={"durability": "persistent"})),
            TopicNames("p"),
            RecordingSender(),
            new_store=lambda partition: store,
        )
        ps = await proc.ready(0)
        assert ps.memo == {"/a"}
        assert store.get(marker_key("/a")) == READY and store.get(marker_key("/b")) is None
        assert stored_memo_entries(ps) == memo_entries(
            ["/a"], rec.sow_key.encode(), rec.parsed(compile_topic(topic()).codec)
        )
        assert memo.load(store).ready == {"/a"} and not memo.load(store).partial

    asyncio.run(go())


def test_expired_records_take_their_entries_with_them() -> None:
    async def go() -> None:
        sender = RecordingSender()
        proc = TopicProcessor(
            compile_topic(topic("    Expiration: enabled\n")), TopicNames("p"), sender
        )
        ps = await proc.ready(0)
        records = [
            RawRecord(
                0,
                i,
                1_000,
                key_of(i).encode(),
                orjson.dumps({"id": i, "a": i}),
                {h.EXPIRATION: "5"},
            )
            for i in range(10)
        ]
        await proc.process(records)
        await proc.drain()
        assert len(stored_memo_entries(ps)) == 20  # /a: text and number per record
        assert await expire_through_log(proc, sender, 10_000) == 10
        assert stored_memo_entries(ps) == set()
        assert await query(proc, sender, "/a >= 0") == []

    asyncio.run(go())


def test_a_seed_store_holds_the_same_memo_index_as_one_the_engine_filled() -> None:
    async def go() -> None:
        proc = TopicProcessor(compile_topic(topic()), TopicNames("p"), RecordingSender())
        ps = await proc.ready(0)
        bodies = [{"id": i, "a": [i, str(i * 2)], "b": "x"} for i in range(20)]
        await proc.process([publish(i, b) for i, b in enumerate(bodies)])
        await proc.drain()
        engine = {
            k: v for k, v in ps.store.scan(start=b"\x00") if k.startswith((MEMO_PREFIX, b"\x00M/"))
        }
        records = [SowRecord.from_bytes(v) for k, v in ps.store.scan() if is_record_key(k)]
        seed = {
            k: v
            for k, v in store_entries(
                [], records, ps.watermark, compile_topic(topic()).codec, memo=["/a"]
            )
            if k.startswith((MEMO_PREFIX, b"\x00M/"))
        }
        # record 0 holds 0 and "0": one text and one number entry between them
        assert seed == engine and len(seed) == 1 + 19 * 4 + 2

    asyncio.run(go())


class NoRoomForIndexes(MemoryPartition):
    """A store whose disk fills up as soon as a memo index is written (records still fit)."""

    def write(self, changes: Mapping[bytes, bytes | None]) -> None:
        if any(k.startswith(MEMO_PREFIX) for k in changes):
            raise StateStoreError("RocksDB write failed for 't': IO error: No space left on device")
        super().write(changes)


def test_a_failed_build_is_logged_and_the_query_scans(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        sender = RecordingSender()
        # persistent: the processor keeps the store it is given (a transient one starts empty)
        config = topic().model_copy(update={"indexes": (), "durability": "persistent"})
        proc = TopicProcessor(
            compile_topic(config),
            TopicNames("p"),
            sender,
            new_store=lambda partition: NoRoomForIndexes(),
        )
        ps = await proc.ready(0)
        bodies = {key_of(i): {"id": i, "qty": i} for i in range(10)}
        await proc.process([publish(i, b) for i, b in enumerate(bodies.values())])
        await proc.drain()
        with caplog.at_level(logging.ERROR, logger="sowstream.engine"):
            assert await query(proc, sender, "/qty > 6") == scan(bodies, "/qty > 6")
        assert ps.memo == set()
        assert "topic t partition 0: building the memo index on /qty failed" in caplog.text
        assert "No space left on device" in caplog.text

    asyncio.run(go())
