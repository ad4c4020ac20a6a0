"""The compiled fold (sowstream_native) against the Python fold, which stays the reference.

Random logs go through two processors, one folding with the compiled fold and one without, chunk
by chunk (so old values come from the store, the batches in flight and the chunk itself), then
once more as a replay after a crash. Everything a fold produces must be byte-equal: the store
writes (the changelog records, index entries and watermark included), change events, acks, dead
letters, re-keyed copies. Where the compiled fold declines a record, the Python fold's result is
what both give; on logs of records it covers it must decline none.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import sys
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sowstream.config import load_config_text
from sowstream.config.models import TopicConfig
from sowstream.engine import metrics, native
from sowstream.engine.native import digest, native_fold
from sowstream.engine.partition import Outcome, PartitionState
from sowstream.engine.processor import TopicProcessor
from sowstream.filters import parse_filter
from sowstream.messagetypes.changes import merge_delta
from sowstream.sow.compiled import CompiledTopic, compile_topic
from sowstream.sow.keys import generated_sow_key
from sowstream.sow.ops import RawRecord
from sowstream.subscriptions.index import FilterIndex
from sowstream.subscriptions.model import SubscriptionSpec
from sowstream.subscriptions.options import parse_options
from sowstream.wire import headers as h
from sowstream.wire.kafka import LARGEST_LOG_RECORD
from sowstream.wire.topics import TopicNames
from tests.support.sender import RecordingSender

pytest.importorskip("sowstream_native", reason="the compiled fold is not built (no cargo)")

TOPICS = {
    "keyed": "sow:\n  - Name: t\n    Key: /id\n    HashIndex: [[/g]]\n    Durability: transient\n",
    "nested": "sow:\n  - Name: t\n    Key: [/id, /a/b]\n    Expiration: 10s\n"
    "    Durability: transient\n",
    "user": "sow:\n  - Name: t\n    Durability: transient\n",
}


def compiled(kind: str) -> CompiledTopic[TopicConfig]:
    return compile_topic(load_config_text(TOPICS[kind]).topics[0])


INTS = st.sampled_from(
    [0, 1, -1, 2**31, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1, 2**64, -(2**63) - 1]
)
FLOATS = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [0.0, -0.0, 1e16, 1e15, 1e-5, 1.5e-5, 1e-7, 5e-324, 1.7976931348623157e308, 0.1]
)
TEXT = st.text(max_size=6) | st.sampled_from(["", "é", "\x00\x1f\x7f", '"\\/', "\u2028", "😀"])
SCALARS = st.none() | st.booleans() | INTS | st.integers() | FLOATS | TEXT
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
IDS = st.sampled_from(["a", "b"]) | st.sampled_from(
    ["a", "b", "é", 1, 2, 2**64 - 1, "", None, True, 1.5, [1], {"x": 1}]
)
INDEXED = st.integers(0, 2) | st.sampled_from([None, "1", 1.0, -0.0, [1], {"x": 1}]) | VALUES
# Spellings of a body the Python fold reads in its own way, and bad ones.
ODD = st.sampled_from(
    [
        b"",
        b"[1]",
        b"{",
        b'{"id": "a", "id": "b"}',
        b'{"id":"a","v":-0}',
        b'{"id":"a","v":-0.0}',
        b'{"id":"a","v":1E400}',
        b'{"id":"a","v":1.0e16,"w":[1e-7]}',
        b'{"id":"a\xff"}',
        b'{"id":"\\ud800"}',
        b'{"id":"a","v":"\\u00e9\\n"}',
        b'\xef\xbb\xbf{"id":"a"}',
        b'{"id":"a","v":123456789012345678901234567890}',
        b'  {"id" : "b" , "a" : {"b" : 2}}  ',
    ]
)


@st.composite
def records(draw: st.DrawFn, kind: str) -> list[RawRecord]:
    """A log of one partition; a ``wild`` one holds what the compiled fold declines too."""
    topic = compiled(kind).definition
    wild = draw(st.booleans())
    out: list[RawRecord] = []
    offset = 0
    for _ in range(draw(st.integers(0, 14))):
        offset += draw(st.integers(1, 2))
        body: dict[str, Any] = {}
        if draw(st.integers(0, 5)):
            body["id"] = draw(IDS if wild else st.sampled_from(["a", "b", "é", 7, 2**64 - 1]))
        if kind == "nested" and draw(st.integers(0, 4)):
            body["a"] = draw(st.sampled_from([{"b": 1}, {"b": "x"}, {"b": None}, {}, 3, [1]]))
        for indexed in ("g", "w"):  # the hash index's and the memo index's fields
            if draw(st.integers(0, 3)):
                body[indexed] = draw(INDEXED)
        body.update(draw(st.dictionaries(st.sampled_from(["v", "a"]), VALUES, max_size=3)))
        spelling = draw(st.integers(0 if wild else 1, 9))
        if spelling == 0:
            value: bytes | None = draw(ODD)
        elif spelling == 1:
            value = json.dumps(body, ensure_ascii=draw(st.booleans())).encode()
        else:
            try:
                value = orjson.dumps(body)
            except TypeError:  # an integer beyond 64 bits
                value = json.dumps(body).encode()
        commands = [None, "publish", "delta_publish", "delta_publish", "sow_delete", ""]
        command = draw(st.sampled_from([*commands, "bogus"] if wild else commands))
        headers: dict[str, str] = {}
        if command is not None:
            headers[h.COMMAND] = command
        if command == "sow_delete" and draw(st.booleans()):
            value = None
        if draw(st.booleans()):
            headers[h.REPLY_TO] = "r"
        expirations = [None, None, "", "0", "5", "007"] + (
            ["30s", "x", "9" * 12, "9" * 20, "9223372036854775"] if wild else []
        )
        expiration = draw(st.sampled_from(expirations))
        if expiration is not None:
            headers[h.EXPIRATION] = expiration
        keys = ["k1", "k2", "k+/=_-", ""] + (["bad key", "a\n", "x" * 1030] if wild else [])
        supplied = draw(st.sampled_from(keys))
        how = draw(st.integers(0, 3 if wild else 2))
        key: bytes | None = None
        if topic.user_supplied_keys:
            if how == 0:
                key = supplied.encode()
            elif how == 1:
                headers[h.SOW_KEY] = supplied
            elif how == 3:
                key = b"\xff\xfe"
        elif how <= 2:
            try:
                parsed = orjson.loads(value or b"")
                key = generated_sow_key("t", "t", topic.keys, parsed).encode()
            except Exception:
                key = b"k1"
        elif draw(st.booleans()):
            key = supplied.encode()
            headers[h.SOW_KEY] = supplied
        # A producer may set a log time near 2**63: any expiry from it ends beyond 64 bits.
        timestamp = draw(st.sampled_from([1, 1_700_000_000_000] + ([2**63 - 5] if wild else [])))
        out.append(RawRecord(0, offset, timestamp, key, value, headers))
    return out


# Filters the subscriptions index by equality at these paths: the compiled fold reads each
# change's values there, and matching takes its candidates from them.
FILTERS = ["/v = 1", "/a/b = 'x'", "/g = 2", "/a = true", "/v IN ('1', 2.5, 'é', -0.0)", "/w = 'a'"]


def filter_index() -> FilterIndex:
    index = FilterIndex()
    for n, text in enumerate(FILTERS):
        index.add(f"f{n}", parse_filter(text))
    return index


async def processor(
    kind: str, mode: str, *, unfiltered: bool = True, view: str | None = None
) -> tuple[TopicProcessor, PartitionState]:
    """A processor with the FILTERS subscriptions and, with ``unfiltered``, one that takes every
    change (without it the compiled fold skips the events no subscription can take); ``view``:
    the topic is that view's (only its maintainer writes the log)."""
    proc = TopicProcessor(compiled(kind), TopicNames("p"), RecordingSender(), native=mode)  # type: ignore[arg-type]
    proc.view_name = view
    if unfiltered:
        proc.subs.upsert(SubscriptionSpec("s", "r", "t", "subscribe", None, parse_options("")))
    for n, text in enumerate(FILTERS):
        options = parse_options("oof")
        proc.subs.upsert(SubscriptionSpec(f"f{n}", "r", "t", "subscribe", text, options))
    ps = await proc.ready(0)
    if kind == "keyed":
        ps.memo.add("/w")  # a memo index kept by every write, beside the hash index on /g
    return proc, ps


def both(
    kind: str,
    recs: list[RawRecord],
    cuts: list[int],
    *,
    unfiltered: bool = True,
    view: str | None = None,
) -> list[tuple[Any, ...]]:
    """Fold ``recs`` chunk by chunk, then replay them all, on both folds; what each produced.
    Without ``unfiltered`` only the events some subscription may take are compared."""

    async def go() -> list[tuple[Any, ...]]:
        seen: list[tuple[Any, ...]] = []
        python, ps_py = await processor(kind, "off", unfiltered=unfiltered, view=view)
        compiled_, ps_c = await processor(kind, "on", unfiltered=unfiltered, view=view)
        taken = compiled_.applier.taken_events()
        assert compiled_.applier._native is not None
        bounds = sorted({0, len(recs), *[c % (len(recs) + 1) for c in cuts]})
        chunks = [recs[lo:hi] for lo, hi in itertools.pairwise(bounds)]
        for chunk in [*chunks, recs]:
            replay = chunk is recs
            if replay:  # a crash: what was folded is folded again from the store
                ps_py.folded = ps_c.folded = -1
            a = python.applier.apply(ps_py, chunk, replay=replay)
            b = compiled_.applier.apply(ps_c, chunk, replay=replay)
            ps_py.folded = max(ps_py.folded, a.last)
            ps_c.folded = max(ps_c.folded, b.last)
            assert digest(b, taken) == digest(a, taken)
            if unfiltered:  # every event is someone's: none may be skipped
                assert digest(b) == digest(a)
            assert b.changes == a.changes
            check_watched(b)
            # What subscribers are sent is the same, whether candidates came from the values the
            # compiled fold read or from parsed bodies.
            assert compiled_.subs.dispatch(b.events, 0) == python.subs.dispatch(a.events, 0)
            seen.append(digest(a))
        assert sorted(ps_c.store.scan()) == sorted(ps_py.store.scan())
        return seen

    return asyncio.run(go())


def check_watched(outcome: Outcome) -> None:
    """Every change's values read by the compiled fold give the candidates its bodies give."""
    index = filter_index()
    codec = compiled("keyed").codec
    for change in outcome.events:
        if change.watched is None:
            continue
        assert change.watched_at == index.paths
        states = (
            (change.before, change.before_body(codec)),
            (change.after, change.after_body(codec)),
        )
        for (state, body), values in zip(states, change.watched, strict=True):
            if state is None or values is None:
                continue
            assert body is not None
            assert index.candidates_at(index.paths, values) == index.candidates(body), (
                body,
                values,
            )


@pytest.mark.parametrize("kind", sorted(TOPICS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), cuts=st.lists(st.integers(0, 20), max_size=3), unfiltered=st.booleans())
def test_the_compiled_fold_equals_the_python_fold(
    kind: str, data: st.DataObject, cuts: list[int], unfiltered: bool
) -> None:
    both(kind, data.draw(records(kind)), cuts, unfiltered=unfiltered)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    cuts=st.lists(st.integers(0, 20), max_size=3),
    marks=st.lists(st.sampled_from(["v", "v", "v", "w", None, "expire"]), min_size=16),
)
def test_on_a_views_log_the_compiled_fold_equals_the_python_fold(
    data: st.DataObject, cuts: list[int], marks: list[str | None]
) -> None:
    """A view's log takes only its maintainer's records (``sow.view``) and the expiry sweep's:
    the compiled fold stops at any other, which the Python fold refuses as a dead letter."""
    recs = []
    for rec, mark in zip(data.draw(records("keyed")), marks, strict=False):
        headers = dict(rec.headers)
        if mark == "expire":
            headers[h.COMMAND] = h.SOW_EXPIRE
        elif mark is not None:
            headers[h.VIEW] = mark
        recs.append(
            RawRecord(rec.partition, rec.offset, rec.timestamp, rec.key, rec.value, headers)
        )
    both("keyed", recs, cuts, view="v")


def log_of(bodies: list[tuple[str, dict[str, Any]]], user: bool = False) -> list[RawRecord]:
    out = []
    for i, (command, body) in enumerate(bodies):
        try:
            value = orjson.dumps(body)
        except TypeError:  # an integer beyond 64 bits: not orjson's spelling, filtered out
            value = json.dumps(body).encode()
        key = generated_sow_key("t", "t", ("/id",), body).encode() if not user else b"k1"
        out.append(RawRecord(0, i, 1_000 + i, key, value, {h.COMMAND: command, h.REPLY_TO: "r"}))
    return out


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["publish", "delta_publish", "sow_delete"]),
            st.fixed_dictionaries(
                {"id": st.sampled_from(["a", "b", 7])},
                optional={
                    "g": INTS,
                    "v": VALUES.filter(lambda v: not _negative_zero(v)),
                    "w": TEXT,
                },
            ),
        ),
        max_size=20,
    )
)
@settings(max_examples=100, deadline=None)
@example(
    [
        ("publish", {"id": "a", "v": {"x": 1, "y": [1.5]}}),
        ("delta_publish", {"id": "a", "v": {"x": 1e16}}),
    ]
)
def test_the_compiled_fold_declines_nothing_it_covers(
    ops: list[tuple[str, dict[str, Any]]],
) -> None:
    """On orjson-spelt bodies with right keys it folds every record itself (no -0.0 or integers
    beyond 64 bits, which it declines: their text is not orjson's own), and both folds agree."""
    recs = [r for r in log_of(ops) if _spelt_by_orjson(r.value)]
    fold = native_fold(compiled("keyed"), "on")
    assert fold is not None
    declined_at, *_ = fold.run(recs, -1, lambda keys: [None] * len(keys), [])
    assert declined_at == len(recs)
    both("keyed", recs, [len(recs) // 2])


@pytest.mark.parametrize("kind", ["keyed", "nested"])
def test_an_expiry_beyond_64_bits_is_a_dead_letter_on_both_folds(kind: str) -> None:
    """An expiration header beyond 64 bits, or a log time near 2**63 plus an expiration (the
    topic's default on ``nested``): both folds dead-letter the record naming the header, and the
    valid records around it are stored alike (the batch write once failed with struct.error)."""
    late = 2**63 - 5
    keys = ("/id", "/a/b") if kind == "nested" else ("/id",)

    def rec(
        offset: int, ident: str, timestamp: int = 1_000, expiration: str | None = None
    ) -> RawRecord:
        body = {"id": ident, "a": {"b": 1}}
        headers = {h.COMMAND: "publish", h.REPLY_TO: "r"}
        if expiration is not None:
            headers[h.EXPIRATION] = expiration
        key = generated_sow_key("t", "t", keys, body).encode()
        return RawRecord(0, offset, timestamp, key, orjson.dumps(body), headers)

    recs = [rec(0, "a"), rec(1, "b", expiration="9" * 20), rec(2, "a", late, "5"), rec(3, "b")]
    if kind == "nested":  # the topic's Expiration: 10s from a late log time
        recs.append(rec(4, "c", late))
    results = both(kind, recs, [2])[:-1]  # the chunks (the replay sends no dead letters)
    dead = [d for result in results for d in result[7]]
    assert [d[0] for d in dead] == ([1, 2, 4] if kind == "nested" else [1, 2])
    assert all(reason == "bad_expiration" for _, reason, _, _ in dead)
    assert all(h.EXPIRATION in text for _, _, text, _ in dead[:2])
    overlay = {k: r for result in results for k, r in result[3]}
    stored = sorted(r[1] for r in overlay.values() if r is not None)
    assert stored == sorted([recs[0].value, recs[3].value])


def test_a_record_too_large_to_take_is_a_dead_letter_on_both_folds() -> None:
    """The compiled fold stops before a record larger than the engine takes; the Python fold
    dead-letters it (too_large) and goes on, and both folds agree."""
    recs = log_of([("publish", {"id": i}) for i in ("a", "b", "a", "b")])
    big = recs[1]
    recs[1] = RawRecord(
        big.partition,
        big.offset,
        big.timestamp,
        big.key,
        orjson.dumps({"id": "b", "big": "x" * LARGEST_LOG_RECORD}),
        big.headers,
    )
    fold = native_fold(compiled("keyed"), "on")
    assert fold is not None
    results = both("keyed", recs, [])[:-1]
    dead = [d for result in results for d in result[7]]
    assert [(d[0], d[1]) for d in dead] == [(1, "too_large")]


def _spelt_by_orjson(value: bytes | None) -> bool:
    try:
        return value is not None and orjson.dumps(orjson.loads(value)) == value
    except orjson.JSONDecodeError:
        return False


def test_a_panic_refolds_the_chunk_in_python(caplog: pytest.LogCaptureFixture) -> None:
    """A Rust panic (made by the test hook) while decoding or while folding: the chunk is folded
    by the Python fold, the result is the reference's, the worker goes on."""
    recs = log_of([("publish", {"id": "a", "v": 1}), ("delta_publish", {"id": "a", "w": 2})])
    for at in (1, -1):

        async def go(at: int = at) -> tuple[Outcome, Outcome, float]:
            ref, ps_ref = await processor("keyed", "off")
            proc, ps = await processor("keyed", "on")
            fold = proc.applier._native
            assert fold is not None
            fold.panic_at(at)
            before = metrics.NATIVE_PANICS.labels("t")._value.get()
            got = proc.applier.apply(ps, recs, replay=False)
            panics = metrics.NATIVE_PANICS.labels("t")._value.get() - before
            return got, ref.applier.apply(ps_ref, recs, replay=False), panics

        with caplog.at_level(logging.ERROR, "sowstream.engine"):
            got, want, panics = asyncio.run(go())
        assert digest(got) == digest(want) and got.changes == want.changes
        assert panics == 1
        assert "the compiled fold panicked" in caplog.text


def test_events_no_subscription_can_take_are_not_made() -> None:
    """With only filtered subscriptions, the compiled fold makes no event for an op whose
    values before and after match no filter, and subscribers are sent the same messages."""
    recs = log_of(
        [
            ("publish", {"id": "a", "v": 7}),  # matches nothing
            ("publish", {"id": "b", "v": 1}),  # f0 and f4 take it
            ("delta_publish", {"id": "a", "g": 5}),  # still nothing
            ("delta_publish", {"id": "b", "v": 3}),  # out of their focus
        ]
    )

    async def go() -> tuple[Outcome, Outcome, TopicProcessor, TopicProcessor]:
        ref, ps_ref = await processor("keyed", "off", unfiltered=False)
        proc, ps = await processor("keyed", "on", unfiltered=False)
        return (
            proc.applier.apply(ps, recs, replay=False),
            ref.applier.apply(ps_ref, recs, replay=False),
            proc,
            ref,
        )

    got, want, proc, ref = asyncio.run(go())
    assert [c.offset for c in want.events] == [0, 1, 2, 3]
    assert [c.offset for c in got.events] == [1, 3]
    assert got.changes == want.changes
    sent = proc.subs.dispatch(got.events, 0)
    # f0 (/v = 1) and f4 (/v IN ('1', ...): text and number compare as numbers) take b
    assert sorted((d.offset, d.spec.sub_id, d.command) for d in sent) == [
        (1, "f0", "publish"),
        (1, "f4", "publish"),
        (3, "f0", "oof"),
        (3, "f4", "oof"),
    ]
    assert sent == ref.subs.dispatch(want.events, 0)


def test_a_views_own_records_are_folded_compiled_and_a_stranger_in_python() -> None:
    """The view's maintainer writes its log with ``sow.view``: a chunk of those records takes
    the compiled fold; a chunk holding a record someone else put there is folded in Python
    whole, which refuses that record. (Cutting the chunk at the stranger left the memo index
    entries of the compiled and the Python part different: the differential test found it.)"""
    recs = log_of([("publish", {"id": "a", "v": 1}), ("publish", {"id": "b", "v": 2})])
    for rec in recs:
        rec.headers[h.VIEW] = "v"
    stranger = RawRecord(
        0, 9, 1, b"k", orjson.dumps({"id": "c"}), {h.COMMAND: "publish", h.REPLY_TO: "r"}
    )

    async def go() -> tuple[float, float, Outcome]:
        proc, ps = await processor("keyed", "on", view="v")
        counter = metrics.NATIVE_RECORDS.labels("t", "folded")
        before = counter._value.get()
        proc.applier.apply(ps, recs, replay=False)
        own = counter._value.get() - before
        outcome = proc.applier.apply(ps, [stranger], replay=False)
        return own, counter._value.get() - before - own, outcome

    own, mixed, outcome = asyncio.run(go())
    assert (own, mixed) == (2, 0)
    assert [r.record.offset for r in outcome.dead] == [9]
    assert "computed by the engine" in str(outcome.dead[0].error)
    assert len(outcome.overlay) == 0


def test_shadow_mode_counts_a_difference(caplog: pytest.LogCaptureFixture) -> None:
    """engine.native: shadow uses the Python fold's result and counts chunks where the compiled
    fold differs (here it is made to differ by a compiled fold of another topic's Key)."""
    recs = log_of([("publish", {"id": "a", "v": 1})])

    async def go() -> tuple[Outcome, Outcome, float, float]:
        ref, ps_ref = await processor("keyed", "off")
        proc, ps = await processor("keyed", "shadow")
        before = metrics.NATIVE_MISMATCHES.labels("t")._value.get()
        same = proc.applier.apply(ps, recs, replay=False)
        agreed = metrics.NATIVE_MISMATCHES.labels("t")._value.get() - before
        other = native_fold(compiled("nested"), "on")  # keys on /id and /a/b: other SowKeys
        proc.applier._native = other
        ps.folded = -1
        proc.applier.apply(ps, recs, replay=True)
        differed = metrics.NATIVE_MISMATCHES.labels("t")._value.get() - before
        return same, ref.applier.apply(ps_ref, recs, replay=False), agreed, differed

    with caplog.at_level(logging.WARNING, "sowstream.engine"):
        got, want, agreed, differed = asyncio.run(go())
    assert digest(got) == digest(want)
    assert agreed == 0 and differed == 1
    assert "the compiled fold differs from the Python fold" in caplog.text


def test_without_the_extension_the_python_fold_runs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No compiled fold installed (no cargo): one clear line, and the Python fold applies."""
    monkeypatch.setitem(sys.modules, "sowstream_native", None)  # makes its import fail
    monkeypatch.setattr(native, "_loaded", {})
    with caplog.at_level(logging.WARNING, "sowstream.engine"):
        assert native.load_native() is None
        assert native.load_native() is None  # said once
        recs = log_of([("publish", {"id": "a", "v": 1})])

        async def go() -> Outcome:
            proc, ps = await processor("keyed", "on")
            assert proc.applier._native is None
            return proc.applier.apply(ps, recs, replay=False)

        outcome = asyncio.run(go())
    assert len(outcome.overlay) == 1 and outcome.acks[0].changed == 1
    lines = [r for r in caplog.records if "compiled fold" in r.getMessage()]
    assert len(lines) == 1
    assert "applying logs with the Python fold" in lines[0].getMessage()


def test_a_record_the_compiled_fold_cannot_read_is_folded_in_python() -> None:
    """A header Rust cannot take as UTF-8 (a lone surrogate) makes the call fail: the chunk is
    folded by the Python fold, as the reference does it (an unknown command here)."""
    recs = log_of([("publish", {"id": "a", "v": 1})])
    recs.append(RawRecord(0, 5, 1, b"k", b'{"id":"b"}', {h.COMMAND: "\udcff", h.REPLY_TO: "r"}))
    seen = both("keyed", recs, [])
    assert seen[0][7][0][1] == "unknown_command"  # the dead letters of the first chunk


@settings(max_examples=300, deadline=None)
@given(st.lists(VALUES, min_size=1, max_size=4))
def test_a_merged_record_is_spelt_as_orjson_spells_it(values: list[Any]) -> None:
    """Each delta_publish re-writes the record: floats (shortest round trip, orjson's exponent
    forms), 64-bit integers, escapes and key order come out as orjson.dumps writes them; only a
    record holding -0.0 is declined (orjson reads -0 as the integer 0)."""
    bodies = [("publish", {"id": "a"})] + [("delta_publish", {"id": "a", "v": v}) for v in values]
    recs = log_of(bodies)
    fold = native_fold(compiled("keyed"), "on")
    assert fold is not None
    declined_at, ops, *_ = fold.run(recs, -1, lambda keys: [None] * len(keys), [])
    merged: dict[str, Any] = orjson.loads(recs[0].value or b"")
    assert ops[0][4] == recs[0].value
    for rec, op in zip(recs[1:], ops[1:], strict=False):
        merged = merge_delta(merged, orjson.loads(rec.value or b""))
        assert op[4] == orjson.dumps(merged)
    if declined_at < len(recs):
        assert _negative_zero(merge_delta(merged, orjson.loads(recs[declined_at].value or b"")))


def _negative_zero(value: Any) -> bool:
    if isinstance(value, float):
        return value == 0.0 and str(value).startswith("-")
    if isinstance(value, dict):
        return any(_negative_zero(v) for v in value.values())
    if isinstance(value, list):
        return any(_negative_zero(v) for v in value)
    return False


@pytest.mark.parametrize(
    "stage",
    ["    Preprocessing: ['/a * 2 AS /b']\n", "    Enrichment: ['/a * 2 AS /b']\n"],
)
def test_topics_with_preprocessing_or_enrichment_fold_in_python_only(stage: str) -> None:
    # Their order around a delta_publish's merge (sow.ops) is the Python fold's alone.
    topic = compile_topic(load_config_text(TOPICS["keyed"] + stage).topics[0])
    assert not native.covers(topic)
    assert native_fold(topic, "on") is None and native_fold(topic, "shadow") is None
    assert native_fold(compiled("keyed"), "on") is not None  # the extension is there
