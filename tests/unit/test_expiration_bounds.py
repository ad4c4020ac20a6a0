"""An expiry a 64-bit millisecond time cannot hold (an expiration header beyond 64 bits, or a log
timestamp near 2**63 plus an expiration) is a dead letter naming the header, never a crash of the
batch write (which used to raise struct.error and reload the partition in a loop); the valid
records of the same batch are stored as published. The compiled fold's side of it is in
tests/unit/test_native_fold.py."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from sowstream.config import load_config_text
from sowstream.config.models import TopicConfig
from sowstream.config.queues import QueueConfig
from sowstream.engine.processor import TopicProcessor
from sowstream.engine.queues import QueueRuntime
from sowstream.engine.store import is_record_key
from sowstream.errors import InvalidMessageError
from sowstream.queues import Bookmark
from sowstream.sow.compiled import compile_topic
from sowstream.sow.expiration import LATEST_MS, expiration_time, parse_expiration_header
from sowstream.sow.keys import generated_sow_key
from sowstream.sow.ops import RawRecord
from sowstream.sow.record import SowRecord
from sowstream.wire import headers as h
from sowstream.wire.avro import decode
from sowstream.wire.topics import TopicNames
from tests.support.sender import RecordingSender

NEAR_END = 2**63 - 5  # a log timestamp a producer may set: any 5 s expiry ends beyond 64 bits


@pytest.mark.parametrize(
    "text", ["9" * 20, "9223372036854776", "99999999999999999999w", "1" + "0" * 400]
)
def test_an_expiration_header_beyond_64_bits_is_refused_naming_the_header(text: str) -> None:
    with pytest.raises(InvalidMessageError) as err:
        parse_expiration_header("orders", text)
    assert err.value.reason == "bad_expiration"
    assert h.EXPIRATION in str(err.value) and "64-bit" in str(err.value)
    assert len(str(err.value)) < 300  # a huge header is quoted cut short


def test_the_largest_expiration_a_64_bit_time_holds_is_taken() -> None:
    assert parse_expiration_header("orders", str(LATEST_MS // 1000)) == LATEST_MS // 1000 * 1000


def test_an_expiry_beyond_64_bits_from_a_late_log_timestamp_is_refused() -> None:
    policy = compile_topic(topic("Expiration: 10s")).definition.expiration
    with pytest.raises(InvalidMessageError) as err:
        expiration_time(policy, 5_000, NEAR_END, "orders")
    assert err.value.reason == "bad_expiration" and h.EXPIRATION in str(err.value)
    with pytest.raises(InvalidMessageError) as err:
        expiration_time(policy, None, NEAR_END, "orders")
    assert "Expiration" in str(err.value) and str(NEAR_END) in str(err.value)
    # 0 = never expire, whatever the timestamp; and one that fits is kept
    assert expiration_time(policy, 0, NEAR_END, "orders") is None
    assert expiration_time(policy, 4_000, NEAR_END - 10_000, "orders") == NEAR_END - 6_000


def topic(extra: str = "", *, sow: bool = True) -> TopicConfig:
    more = f"    {extra}\n" if extra else ""
    if not sow:
        return load_config_text("topics:\n  - Name: t\n").topics[0]
    return load_config_text(
        f"sow:\n  - Name: t\n    Key: /id\n{more}    Durability: transient\n"
    ).topics[0]


def publish(offset: int, ident: str, timestamp: int = 1_000, **headers: str) -> RawRecord:
    key = generated_sow_key("t", "t", ["/id"], {"id": ident}).encode()
    body = orjson.dumps({"id": ident, "v": offset})
    return RawRecord(0, offset, timestamp, key, body, {h.COMMAND: h.PUBLISH, **headers})


BATCH = [
    publish(0, "a"),
    publish(1, "b", **{h.EXPIRATION: "9" * 20}),
    publish(2, "c", NEAR_END, **{h.EXPIRATION: "5"}),
    publish(3, "d", **{h.EXPIRATION: "60"}),
    publish(4, "a", **{h.EXPIRATION: "x" * 5000}),
]


@pytest.mark.parametrize("extra", ["", "Expiration: 10s"])
def test_the_batch_write_dead_letters_what_it_cannot_store_and_keeps_the_rest(extra: str) -> None:
    """Through the real processor (Python fold): the bad records are dead letters naming the
    header, the partition stays loaded, the valid ones are stored as published."""

    async def go() -> None:
        sender = RecordingSender()
        names = TopicNames("p")
        proc = TopicProcessor(compile_topic(topic(extra)), names, sender, native="off")
        ps = await proc.ready(0)
        await proc.process(BATCH)
        await proc.drain()
        assert proc.state(0) is ps and ps.failure is None and ps.watermark == 4
        stored = {
            orjson.loads(r.data)["id"]: (orjson.loads(r.data)["v"], r.expiration)
            for r in (SowRecord.from_bytes(v) for k, v in ps.store.scan() if is_record_key(k))
        }
        default = 1_000 + 10_000 if extra else None
        assert stored == {"a": (0, default), "d": (3, 61_000)}
        letters = [decode("DeadLetter", r.value) for r in sender.records if r.value is not None]
        letters = [
            d for d, r in zip(letters, sender.records, strict=True) if r.topic == names.dead_letter
        ]
        assert [d["source_offset"] for d in letters] == [1, 2, 4]
        assert {d["reason"] for d in letters} == {"bad_expiration"}
        assert all(h.EXPIRATION in d["error"] for d in letters)

    asyncio.run(go())


def test_a_queue_over_a_topic_without_a_sow_dead_letters_a_bad_expiration() -> None:
    """The plain topic's queue hand-off read the header with float(): ``30s`` or ``x`` raised
    out of the batch write, a value beyond 64 bits failed the queue store."""

    async def go() -> None:
        sender = RecordingSender()
        names = TopicNames("p")
        definition = topic(sow=False)
        proc = TopicProcessor(compile_topic(definition), names, sender)
        queue = QueueRuntime(
            QueueConfig(name="Q", underlying_topic="t"),
            names,
            sender,
            proc.store_changes,
        )
        proc.queues.append(queue)
        ps = await proc.ready(0)
        recs = [
            publish(0, "a"),
            publish(1, "b", **{h.EXPIRATION: "9" * 20}),
            publish(2, "c", **{h.EXPIRATION: "x"}),
            publish(3, "d", **{h.EXPIRATION: "30s"}),
            RawRecord(0, 4, 1_000, None, b"{not json", {}),
        ]
        await proc.process(recs)
        await proc.drain()
        assert proc.state(0) is ps and ps.failure is None
        held = [m.bookmark.offset for m in queue.machine.browse()]
        assert held == [0, 3]
        message = queue.machine.message(Bookmark("t", 0, 3))
        assert message is not None
        letters = [
            decode("DeadLetter", r.value)
            for r in sender.records
            if r.topic == names.dead_letter and r.value is not None
        ]
        assert [(d["source_offset"], d["reason"]) for d in letters] == [
            (1, "bad_expiration"),
            (2, "bad_expiration"),
            (4, "malformed_json"),
        ]
        assert all(h.EXPIRATION in d["error"] for d in letters[:2])

    asyncio.run(go())
