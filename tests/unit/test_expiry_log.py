"""Expiry as a log operation: the sweep writes ``sow_expire`` records, and the fold removes a
record only when it still carries the expiration the removal names.

Logged, an expiry has a log position of its own: a worker that takes a partition over and applies
a removal again sends its ``oof`` at the same position as the first owner did, which the client
drops as a repeat (issue 26's chaos run found second ``oof``s positioned at a new owner's
watermark). The bulk fold (Spark) and the engine agree on logs with removals, stale or not.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sowstream.config import load_config_text
from sowstream.engine.processor import TopicProcessor
from sowstream.errors import InvalidMessageError
from sowstream.sow.compiled import compile_topic
from sowstream.sow.layout import is_record_key
from sowstream.sow.ops import RawRecord, decode_log_record
from sowstream.wire import headers as h
from sowstream.wire.protocol import Command
from sowstream.wire.topics import TopicNames
from tests.support.expiry import expire_through_log
from tests.support.sender import RecordingSender
from tests.unit.test_fold import bulk
from tests.unit.test_processor_model import key_of, run

TOPIC = load_config_text(
    "sow:\n  - Name: t\n    Key: /id\n    Expiration: enabled\n    Durability: transient\n"
).topics[0]
COMPILED = compile_topic(TOPIC)
LIFETIME_S = 5  # every expiring publish here lives 5 s from its timestamp (1 s)
DUE = 1_000 + LIFETIME_S * 1000


def publish(offset: int, ident: int, v: int, expiring: bool = True) -> RawRecord:
    headers = {h.EXPIRATION: str(LIFETIME_S if expiring else 0)}
    return RawRecord(0, offset, 1_000, key_of(ident), orjson.dumps({"id": ident, "v": v}), headers)


def expire(offset: int, ident: int, due: int | str = DUE, at: int = 1_000) -> RawRecord:
    """A removal written at ``at`` (the bulk fold also drops what has expired by a record's
    timestamp, as the engine's sweep would have: the property keeps the timestamps before the
    expiration so that only the removals decide)."""
    headers = {h.COMMAND: h.SOW_EXPIRE, h.DUE: str(due)}
    return RawRecord(0, offset, at, key_of(ident), None, headers)


def stored(proc: TopicProcessor) -> set[bytes]:
    ps = proc.state(0)
    assert ps is not None
    return {k for k, _ in ps.store.scan() if is_record_key(k)}


# -- the fold: what a removal removes ------------------------------------------------------------

removals = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(0, 2), st.booleans()),
        st.tuples(st.just("expire"), st.integers(0, 2), st.booleans()),  # True: a stale due
        st.tuples(st.just("delete"), st.integers(0, 2), st.just(False)),
    ),
    max_size=30,
)


def removal_log(sequence: list[tuple[str, int, bool]]) -> list[RawRecord]:
    records = []
    for offset, (kind, i, flag) in enumerate(sequence):
        if kind == "publish":
            records.append(publish(offset, i, offset, expiring=flag))
        elif kind == "expire":
            records.append(expire(offset, i, DUE + 1 if flag else DUE))
        else:
            records.append(RawRecord(0, offset, 1_000, key_of(i), None, {h.COMMAND: h.SOW_DELETE}))
    return records


def model(sequence: list[tuple[str, int, bool]]) -> dict[bytes, Any]:
    """What the log leaves: a removal takes a record only if it expires at the removal's due."""
    state: dict[bytes, tuple[dict[str, Any], bool]] = {}
    for offset, (kind, i, flag) in enumerate(sequence):
        key = key_of(i)
        if kind == "publish":
            state[key] = ({"id": i, "v": offset}, flag)
        elif kind == "delete" or (not flag and key in state and state[key][1]):
            state.pop(key, None)
    return {k: body for k, (body, _) in state.items()}


@settings(max_examples=200, deadline=None)
@given(removals, st.lists(st.integers(0, 30), max_size=3))
def test_the_engine_and_the_bulk_fold_apply_removals_as_the_model_says(
    sequence: list[tuple[str, int, bool]], cuts: list[int]
) -> None:
    records = removal_log(sequence)
    wanted = model(sequence)
    assert run(records, cuts, None, TOPIC) == wanted
    assert bulk(records, COMPILED, until_ms=0) == wanted


@pytest.mark.parametrize("due", ["", "soon", "-5", "9" * 30])
def test_a_removal_without_a_usable_due_is_refused_naming_the_header(due: str) -> None:
    with pytest.raises(InvalidMessageError, match=h.DUE) as failed:
        decode_log_record(COMPILED, key_of(1), None, expire(0, 1, due).headers, 0, 9_000)
    assert failed.value.reason == "bad_header"


def test_a_bad_removal_is_a_dead_letter_and_the_record_stays() -> None:
    async def go() -> None:
        sender = RecordingSender()
        proc = TopicProcessor(COMPILED, TopicNames("p"), sender)
        await proc.ready(0)
        await proc.process([publish(0, 1, 1), expire(1, 1, "soon")])
        await proc.drain()
        assert len(stored(proc)) == 1
        (letter,) = [r for r in sender.records if r.topic == proc.names.dead_letter]
        assert b"bad_header" in (letter.value or b"")

    asyncio.run(go())


# -- the sweep and the messages it leads to ------------------------------------------------------


def subscribed() -> Command:
    return Command(
        command="sow_and_subscribe",
        command_id="c",
        query_id="q",
        sub_id="s",
        reply_to="r",
        topic="t",
        sub_options="oof",
    )


def test_the_sweep_writes_removals_and_the_oof_comes_from_applying_them() -> None:
    async def go() -> None:
        sender = RecordingSender()
        proc = TopicProcessor(COMPILED, TopicNames("p"), sender)
        await proc.ready(0)
        await proc.process([publish(0, 1, 1), publish(1, 2, 1, expiring=False)])
        await proc.drain()
        await proc.subscribe(subscribed(), 0)
        sender.take()
        assert await proc.expire_due(now_ms=DUE - 1) == 0
        assert await expire_through_log(proc, sender, DUE) == 1
        (removal,) = [r for r in sender.records if r.topic == proc.log_topic]
        assert (removal.key, removal.partition) == (key_of(1), 0)
        assert removal.headers == {h.COMMAND: h.SOW_EXPIRE, h.DUE: str(DUE)}
        (kept,) = stored(proc)
        assert kept.endswith(key_of(2))
        (oof,) = [headers for _, headers in sender.live()]
        assert (oof[h.COMMAND], oof[h.REASON]) == ("oof", "expired")
        assert (oof[h.PARTITION], oof[h.OFFSET], oof.get(h.SEQ, "0")) == ("0", "2", "0")
        # Swept again before the removal came back (or after it was lost): written again, and
        # a no-op once applied.
        assert await expire_through_log(proc, sender, DUE + 60_000) == 0

    asyncio.run(go())


def test_a_new_owner_replaying_a_removal_sends_the_oof_at_the_same_position() -> None:
    """The first owner applied the removal and sent its oof, then died before storing it; the
    next owner reads the same log record again and positions its oof exactly as the first."""

    async def owner(records: list[RawRecord]) -> dict[str, str]:
        sender = RecordingSender()
        proc = TopicProcessor(COMPILED, TopicNames("p"), sender)
        await proc.ready(0)
        await proc.process(records[:1])
        await proc.drain()
        await proc.subscribe(subscribed(), 0)
        sender.take()
        await proc.process(records[1:])
        await proc.drain()
        (oof,) = [headers for _, headers in sender.live()]
        return oof

    records = [publish(0, 1, 1), expire(1, 1)]
    first, second = asyncio.run(owner(records)), asyncio.run(owner(records))
    position = (h.PARTITION, h.OFFSET, h.SEQ)
    assert [first.get(p) for p in position] == [second.get(p) for p in position]
    assert first[h.REASON] == "expired"


def test_a_subscription_placed_before_the_removal_comes_through_gets_the_record_then_its_oof() -> (
    None
):
    """A query hides a record past its expiration at once; a subscription's SOW part still
    carries it while its removal is on the way, so the oof that follows is for a held record."""

    async def go() -> None:
        sender = RecordingSender()
        proc = TopicProcessor(COMPILED, TopicNames("p"), sender)
        await proc.ready(0)
        await proc.process([publish(0, 1, 1)])  # expired long ago by the wall clock
        await proc.drain()
        query = subscribed().with_(command="sow", sub_id="", sub_options="")
        await proc.query(query, 0)
        assert [r.command for r in sender.replies()] == ["part_end"]
        sender.take()
        await proc.subscribe(subscribed().with_(batch_size=10), 0)
        (snapshot, end) = sender.replies()
        assert (snapshot.command, end.command) == ("sow", "part_end")
        assert [orjson.loads(r.data) for r in snapshot.records] == [{"id": 1, "v": 1}]
        sender.take()
        await proc.process([expire(1, 1)])
        await proc.drain()
        (oof,) = [headers for _, headers in sender.live()]
        assert (oof[h.COMMAND], oof[h.REASON], oof[h.OFFSET]) == ("oof", "expired", "1")

    asyncio.run(go())
