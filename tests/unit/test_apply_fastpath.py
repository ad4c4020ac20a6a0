"""The shortcuts of the per-record apply path give what the plain computation gives.

Issue 13 made the path cheaper in four places; each is checked here against the slow form it
replaces: the stored-record format (and reading the Avro records of earlier stores), the SowKey
hash, skipping index upkeep when no indexed value changed, and the publish body the fold keeps.
Runs the real ``TopicProcessor`` on an in-memory store.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sowstream.config import load_config_text
from sowstream.engine.processor import TopicProcessor
from sowstream.engine.store import INDEX_PREFIX, is_record_key
from sowstream.filters.values import canonical_text, is_null
from sowstream.sow.compiled import compile_topic
from sowstream.sow.keys import field_values, key_values, same_values, sow_key_from_values
from sowstream.sow.layout import index_entries
from sowstream.sow.memo import MEMO_PREFIX, memo_entries
from sowstream.sow.ops import RawRecord
from sowstream.sow.record import SowRecord
from sowstream.wire import headers as h
from sowstream.wire.avro import encode
from sowstream.wire.topics import TopicNames
from tests.support.sender import RecordingSender

TOPIC = load_config_text(
    "sow:\n  - Name: t\n    Key: /id\n    HashIndex: [[/g], [/g, /n/v]]\n"
    "    Durability: transient\n"
).topics[0]
MEMO = ("/g", "/n/v")

# Values that compare equal in Python but index differently (1, 1.0, True, "1"; 0.0, -0.0),
# NULLs, and values that are not scalars.
tricky = st.sampled_from(
    [0, 1, 1.0, True, False, "1", "", None, 0.0, -0.0, 2.5, float("nan"), [1, 2], [1, True]]
)
nested = st.one_of(tricky, st.fixed_dictionaries({}, optional={"v": tricky}))
body = st.fixed_dictionaries({"id": st.integers(0, 2)}, optional={"g": tricky, "n": nested})


def avro_record(rec: SowRecord) -> bytes:
    """``rec`` as stores held it before the format-1 header (Avro, schemas/SowRecord.avsc)."""
    return encode(
        "SowRecord",
        {
            "sow_key": rec.sow_key,
            "data": rec.data,
            "log_offset": rec.log_offset,
            "log_timestamp": rec.log_timestamp,
            "expiration": rec.expiration,
        },
    )


records = st.builds(
    SowRecord,
    st.text(max_size=40),
    st.binary(max_size=200),
    st.integers(-1, 2**62),
    st.integers(0, 2**62),
    st.none() | st.integers(-(2**62), 2**62),
)


@given(records)
def test_stored_records_read_back_in_both_formats(rec: SowRecord) -> None:
    raw = rec.to_bytes()
    assert raw[0] % 2 == 1  # never the even first byte an Avro record starts with
    assert SowRecord.from_bytes(raw) == rec
    assert SowRecord.from_bytes(avro_record(rec)) == rec


def test_a_record_stays_immutable() -> None:
    rec = SowRecord("k", b"{}", 1, 2)
    assert rec.expiration is None and rec == SowRecord("k", b"{}", 1, 2, None)
    with pytest.raises(AttributeError):
        rec.data = b"x"  # type: ignore[misc]


def reference_sow_key(domain: str, values: list[str]) -> str:
    """The SowKey as the engine always computed it (docs/protocol.md)."""
    digest = hashlib.blake2b(digest_size=12)
    for part in (domain, *values):
        raw = part.encode()
        digest.update(len(raw).to_bytes(4, "big"))
        digest.update(raw)
    return base64.urlsafe_b64encode(digest.digest()).decode()


@given(st.text(), st.lists(st.text(), max_size=3))
def test_sow_keys_are_unchanged(domain: str, values: list[str]) -> None:
    assert sow_key_from_values(domain, values) == reference_sow_key(domain, values)


@given(st.one_of(st.integers(), st.text(min_size=1), st.floats(allow_nan=False), st.booleans()))
def test_key_values_of_a_top_level_field(value: Any) -> None:
    record = {"id": value}
    found = field_values(record, "/id")
    expected = [canonical_text(found[0])]
    assert not is_null(found[0])
    assert key_values("t", ["/id"], record) == expected


@settings(max_examples=300, deadline=None)
@given(body, body)
def test_unchanged_values_mean_unchanged_entries(old: dict[str, Any], new: dict[str, Any]) -> None:
    key = b"k"
    if same_values(("/g", "/n/v"), old, new):
        assert index_entries([("/g",), ("/g", "/n/v")], key, old) == index_entries(
            [("/g",), ("/g", "/n/v")], key, new
        )
        assert memo_entries(MEMO, key, old) == memo_entries(MEMO, key, new)


def test_equal_values_of_other_types_are_changes() -> None:
    pairs = [(1, True), (1, 1.0), (1, "1"), (0.0, -0.0), ([1], [True]), (None, "")]
    for a, b in [*pairs, ({"a": 1}, {"a": 1})]:  # objects are never compared: a change
        assert not same_values(("/g",), {"g": a}, {"g": b}), (a, b)
    assert same_values(("/g", "/x"), {"g": 2.5}, {"g": 2.5, "y": 1})
    assert same_values(("/g",), {"g": [1, "a"]}, {"g": [1, "a"]})  # array elements, each


# One log operation on record id 0..2: publish, delta_publish, delete, delete by filter.
operation = st.one_of(
    st.tuples(st.just("publish"), body),
    st.tuples(st.just("delta"), body),
    st.tuples(st.just("delete"), st.fixed_dictionaries({"id": st.integers(0, 2)})),
    st.tuples(st.just("filter"), st.just({})),
)


def log(ops: list[tuple[str, dict[str, Any]]]) -> list[RawRecord]:
    out = []
    for offset, (kind, fields) in enumerate(ops):
        value = orjson.dumps(fields, option=orjson.OPT_NON_STR_KEYS) if fields else None
        key = reference_sow_key("t", [str(fields.get("id"))]).encode() if fields else None
        headers = {
            "publish": {},
            "delta": {h.COMMAND: h.DELTA_PUBLISH},
            "delete": {h.COMMAND: h.SOW_DELETE},
            "filter": {h.COMMAND: h.SOW_DELETE, h.FILTER: "/g = 1"},
        }[kind]
        out.append(RawRecord(0, offset, 1, key, None if kind == "delete" else value, headers))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(operation, max_size=30), st.lists(st.integers(0, 30), max_size=4), st.booleans())
def test_index_entries_match_the_stored_records(
    ops: list[tuple[str, dict[str, Any]]], cuts: list[int], stored_as_avro: bool
) -> None:
    """After any batches of operations the hash and memo index entries in the store are
    exactly those of the stored records, also when the records were stored by an earlier
    version (Avro) and updates now apply over them."""

    async def go() -> None:
        proc = TopicProcessor(compile_topic(TOPIC), TopicNames("p"), RecordingSender())
        ps = await proc.ready(0)
        ps.memo.update(MEMO)
        recs = log(ops)
        bounds = sorted({0, len(recs), *[c % (len(recs) + 1) for c in cuts]})
        for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            await proc.process(recs[lo:hi])
            await proc.drain()
            if stored_as_avro and i == 0:
                ps.store.write(
                    {
                        k: avro_record(SowRecord.from_bytes(v))
                        for k, v in list(ps.store.scan())
                        if is_record_key(k)
                    }
                )
        expected: set[bytes] = set()
        for key, raw in ps.store.scan():
            if is_record_key(key):
                parsed = orjson.loads(SowRecord.from_bytes(raw).data)
                expected |= index_entries(proc.table.index_fields, key, parsed)
                expected |= memo_entries(MEMO, key, parsed)
        held = {
            k
            for k, _ in ps.store.scan(start=b"")
            if k[:1] == INDEX_PREFIX or k.startswith(MEMO_PREFIX)
        }
        assert held == expected

    asyncio.run(go())
