"""History: the versions the engine keeps, point-in-time reads, Granularity and the Window.

The property tests run the real ``TopicProcessor`` on an in-memory store with random batches
and crash replays, and compare every point-in-time read with a naive fold of the log up to
that moment.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sowstream.config import load_config_text
from sowstream.config.models import HistoryConfig
from sowstream.engine.processor import TopicProcessor
from sowstream.errors import InvalidCommandError
from sowstream.sow.bookmarks import Bookmark, message_bookmark, parse_bookmark
from sowstream.sow.compiled import compile_topic
from sowstream.sow.history import (
    DELETED,
    HISTORY_PREFIX,
    Version,
    as_of_bound,
    check_window,
    expired_versions,
    parse_version_key,
    states_as_of,
    version_changes,
    version_key,
)
from sowstream.sow.ops import RawRecord
from sowstream.sow.record import SowRecord
from sowstream.sow.timestamps import format_timestamp, parse_timestamp
from sowstream.wire import headers as h
from sowstream.wire.topics import TopicNames
from tests.support.sender import RecordingSender
from tests.unit.test_processor_model import key_of, op


def topic_with(granularity: str) -> Any:
    text = (
        "sow:\n  - Name: t\n    Key: /id\n    Durability: transient\n"
        f"    History: {{Window: 1d, Granularity: {granularity}}}\n"
    )
    return load_config_text(text).topics[0]


def rec(key: str, value: int, offset: int, at: int) -> SowRecord:
    return SowRecord(key, orjson.dumps({"v": value}), offset, at)


def test_version_keys_sort_by_record_then_time_and_round_trip() -> None:
    keys = [version_key("ab", 5, 1), version_key("abc", 1, 0), version_key("ab", 300, 2)]
    assert sorted(keys) == [keys[0], keys[2], keys[1]]
    assert parse_version_key(keys[2]) == ("ab", 300, 2)
    assert all(k.startswith(HISTORY_PREFIX) for k in keys)


def test_granularity_zero_keeps_every_version() -> None:
    a1, a2 = rec("a", 1, 0, 100), rec("a", 2, 1, 150)
    changes = version_changes(
        HistoryConfig(granularity_ms=0),
        [
            Version("a", None, a1, 0, 100),
            Version("a", a1, a2, 1, 150),
            Version("a", a2, None, 2, 160),
        ],
    )
    assert changes == {
        version_key("a", 100, 0): a1.to_bytes(),
        version_key("a", 150, 1): a2.to_bytes(),
        version_key("a", 160, 2): DELETED,
    }


def test_granularity_keeps_the_last_version_of_each_interval() -> None:
    a1, a2, a3 = rec("a", 1, 0, 1_000), rec("a", 2, 1, 1_500), rec("a", 3, 2, 2_100)
    history = HistoryConfig(granularity_ms=1_000)
    changes = version_changes(
        history,
        [
            Version("a", None, a1, 0, 1_000),
            Version("a", a1, a2, 1, 1_500),
            Version("a", a2, a3, 2, 2_100),
        ],
    )
    assert changes[version_key("a", 1_000, 0)] is None  # replaced within [1000, 2000)
    assert changes[version_key("a", 1_500, 1)] == a2.to_bytes()
    assert changes[version_key("a", 2_100, 2)] == a3.to_bytes()
    # a later batch finds the previous version from the stored record's own time and offset
    a4 = rec("a", 4, 3, 2_900)
    later = version_changes(history, [Version("a", a3, a4, 3, 2_900)])
    assert later == {version_key("a", 2_100, 2): None, version_key("a", 2_900, 3): a4.to_bytes()}


def test_as_of_bound_rounds_down_to_the_granularity() -> None:
    assert as_of_bound(HistoryConfig(granularity_ms=0), 12_345) == 12_345
    assert as_of_bound(HistoryConfig(granularity_ms=1_000), 12_345) == 11_999
    assert as_of_bound(HistoryConfig(granularity_ms=1_000), 12_000) == 11_999


def test_states_as_of_and_deletions() -> None:
    entries = sorted(
        {
            version_key("a", 10, 0): rec("a", 1, 0, 10).to_bytes(),
            version_key("a", 20, 2): DELETED,
            version_key("b", 15, 1): rec("b", 7, 1, 15).to_bytes(),
        }.items()
    )

    def at(t: int) -> dict[str, Any]:
        return {r.sow_key: orjson.loads(r.data) for r in states_as_of(entries, t)}

    assert at(9) == {}
    assert at(10) == {"a": {"v": 1}}
    assert at(19) == {"a": {"v": 1}, "b": {"v": 7}}
    assert at(20) == {"b": {"v": 7}}


def test_window_pruning_keeps_the_state_at_the_cutoff() -> None:
    entries = sorted(
        {
            version_key("a", 10, 0): b"x",
            version_key("a", 20, 1): b"y",
            version_key("a", 40, 2): b"z",
            version_key("b", 5, 3): b"q",
            version_key("b", 25, 4): DELETED,
            version_key("c", 50, 5): b"w",
        }.items()
    )
    assert set(expired_versions(entries, 30)) == {
        version_key("a", 10, 0),  # a's state at 30 is its version of 20: kept
        version_key("b", 5, 3),
        version_key("b", 25, 4),  # b was deleted before the cutoff: nothing to keep
    }


def test_check_window_errors_name_the_topic() -> None:
    with pytest.raises(InvalidCommandError, match="topic 'px' keeps no History"):
        check_window("px", None, 0, 0)
    with pytest.raises(InvalidCommandError, match="older than the History Window"):
        check_window("px", HistoryConfig(window_ms=1_000), 0, 5_000)
    check_window("px", HistoryConfig(window_ms=1_000), 4_500, 5_000)


def test_bookmarks() -> None:
    assert parse_bookmark("EPOCH") == Bookmark(-1)
    assert parse_bookmark("now") == Bookmark(None)
    assert parse_bookmark("20261123T080000") == Bookmark(parse_timestamp("2026-11-23T08:00:00"))
    opaque = parse_bookmark(message_bookmark(1_000, 2, 41))
    assert opaque == Bookmark(999, 2, 41)
    assert opaque.start_offset(2, 0) == 42 and opaque.start_offset(1, 7) == 7
    with pytest.raises(InvalidCommandError, match="resolved by the client"):
        parse_bookmark("MOST_RECENT")
    with pytest.raises(InvalidCommandError, match="bookmark 'yesterday' is not a timestamp"):
        parse_bookmark("yesterday")
    assert format_timestamp(parse_timestamp("20261123T080000.250")) == "20261123T080000.250Z"


# -- the engine keeps history exactly (property) -------------------------------------------------

ops = st.lists(op, max_size=30)


def to_records(sequence: list[tuple[str, int, int, int]], gaps: list[int]) -> list[RawRecord]:
    out, at = [], 1_000
    for offset, ((kind, i, g, v), gap) in enumerate(zip(sequence, itertools.cycle(gaps or [0]))):
        at += gap
        if kind == "publish":
            r = RawRecord(0, offset, at, key_of(i), orjson.dumps({"id": i, "g": g, "v": v}), {})
        elif kind == "delta":
            body = orjson.dumps({"id": i, "v": v})
            r = RawRecord(0, offset, at, key_of(i), body, {h.COMMAND: h.DELTA_PUBLISH})
        elif kind == "delete":
            r = RawRecord(0, offset, at, key_of(i), None, {h.COMMAND: h.SOW_DELETE})
        else:
            r = RawRecord(
                0, offset, at, None, None, {h.COMMAND: h.SOW_DELETE, h.FILTER: f"/g = {g}"}
            )
        out.append(r)
    return out


def model_at(
    sequence: list[tuple[str, int, int, int]], records: list[RawRecord], t: int
) -> dict[bytes, Any]:
    state: dict[bytes, Any] = {}
    for (kind, i, g, v), r in zip(sequence, records, strict=True):
        if r.timestamp > t:
            break
        if kind == "publish":
            state[key_of(i)] = {"id": i, "g": g, "v": v}
        elif kind == "delta":
            state[key_of(i)] = {**state.get(key_of(i), {}), "id": i, "v": v}
        elif kind == "delete":
            state.pop(key_of(i), None)
        else:
            state = {k: b for k, b in state.items() if b.get("g") != g}
    return state


def engine_history(
    topic: Any, records: list[RawRecord], cuts: list[int], replay_from: int | None
) -> list[tuple[bytes, bytes]]:
    async def go() -> list[tuple[bytes, bytes]]:
        proc = TopicProcessor(compile_topic(topic), TopicNames("p"), RecordingSender())
        ps = await proc.ready(0)
        bounds = sorted({0, len(records), *[c % (len(records) + 1) for c in cuts]})
        for lo, hi in itertools.pairwise(bounds):
            await proc.process(records[lo:hi])
        if replay_from is not None and records:
            await proc.drain()
            ps.watermark = ps.folded = -1  # a crash: records come again
            await proc.process(records[replay_from % len(records) :])
        await proc.drain()
        return list(ps.store.scan(prefix=HISTORY_PREFIX))

    return asyncio.run(go())


@settings(max_examples=400, deadline=None)
@given(
    ops,
    st.lists(st.integers(0, 700), max_size=6),
    st.lists(st.integers(0, 40), max_size=4),
    st.none() | st.integers(0, 40),
    st.sampled_from(["0s", "1s"]),
)
def test_every_point_in_time_equals_a_fold_of_the_log_up_to_it(
    sequence: list[tuple[str, int, int, int]],
    gaps: list[int],
    cuts: list[int],
    replay_from: int | None,
    granularity: str,
) -> None:
    topic = topic_with(granularity)
    assert topic.history is not None
    records = to_records(sequence, gaps)
    entries = engine_history(topic, records, cuts, replay_from)
    moments = {r.timestamp for r in records} | {r.timestamp - 1 for r in records} | {0, 10**7}
    for t in sorted(moments):
        got = {
            r.sow_key.encode(): orjson.loads(r.data)
            for r in states_as_of(entries, as_of_bound(topic.history, t))
        }
        assert got == model_at(sequence, records, as_of_bound(topic.history, t)), t
