"""What the processor's stages send clients: record batches cut at BatchSize, then one
``part_end`` (or a failed one), and publishers' acks, in the Reply record the client reads."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from sowstream.config import load_config_text
from sowstream.engine.processor import TopicProcessor
from sowstream.sow.compiled import compile_topic
from sowstream.sow.keys import generated_sow_key
from sowstream.sow.ops import RawRecord
from sowstream.wire import headers as h
from sowstream.wire.avro import decode, encode
from sowstream.wire.protocol import Command
from sowstream.wire.topics import TopicNames
from tests.support.sender import RecordingSender

TOPIC = load_config_text("sow:\n  - Name: t\n    Key: /id\n    Durability: transient\n").topics[0]


def decoded(sender: RecordingSender) -> list[dict[str, Any]]:
    """The replies to commands as the client's Avro decoder reads them."""
    return [decode("Reply", a.value) for a in sender.answers()]


def publish(offset: int, ident: int, **headers: str) -> RawRecord:
    key = generated_sow_key("t", "t", ["/id"], {"id": ident}).encode()
    return RawRecord(0, offset, 7, key, orjson.dumps({"id": ident}), headers)


async def loaded(sender: RecordingSender, count: int) -> TopicProcessor:
    proc = TopicProcessor(compile_topic(TOPIC), TopicNames("p"), sender)
    await proc.ready(0)
    await proc.process([publish(i, i) for i in range(count)])
    await proc.drain()
    return proc


def sow(**fields: Any) -> Command:
    return Command(command="sow", command_id="c1", query_id="q1", reply_to="r", topic="t", **fields)


def test_a_query_answers_in_batches_of_batch_size_then_part_end_with_the_count() -> None:
    async def go() -> list[dict[str, Any]]:
        sender = RecordingSender()
        proc = await loaded(sender, 5)
        await proc.query(sow(batch_size=2, order_by="/id"), 0)
        assert {a.topic for a in sender.answers()} == {"r"}
        return decoded(sender)

    replies = asyncio.run(go())
    assert [r["command"] for r in replies] == ["sow", "sow", "sow", "part_end"]
    assert [len(r["records"]) for r in replies] == [2, 2, 1, 0]
    assert len({r["answer_id"] for r in replies}) == 1 and replies[0]["answer_id"]
    for r in replies:
        assert (r["command_id"], r["query_id"], r["topic"], r["partition"]) == ("c1", "q1", "t", 0)
        assert (r["status"], r["reason"], r["message"]) == ("success", "", "")
    records = [rec for r in replies for rec in r["records"]]
    assert [rec["sort_rank"] for rec in records] == [0, 1, 2, 3, 4]
    assert [orjson.loads(rec["data"])["id"] for rec in records] == [0, 1, 2, 3, 4]
    assert [rec["log_offset"] for rec in records] == [0, 1, 2, 3, 4]
    assert all(rec["timestamp"] == 7 and rec["topic"] == "" for rec in records)
    assert (replies[-1]["count"], replies[-1]["log_offset"]) == (5, -1)


def test_a_refused_query_is_one_failed_part_end_as_the_client_reads_it() -> None:
    async def go() -> list[tuple[str, bytes]]:
        sender = RecordingSender()
        proc = await loaded(sender, 1)
        await proc.query(sow(filter="/id = = 1"), 0)
        return [(a.topic, a.value) for a in sender.answers()]

    ((topic, value),) = asyncio.run(go())
    reply = decode("Reply", value)
    assert topic == "r" and reply["reason"] == "bad_filter" and reply["message"]
    assert value == encode(
        "Reply",
        {
            "answer_id": reply["answer_id"],
            "command_id": "c1",
            "query_id": "q1",
            "topic": "t",
            "partition": 0,
            "command": "part_end",
            "status": "failure",
            "reason": "bad_filter",
            "message": reply["message"],
        },
    )


def test_a_subscription_part_end_carries_the_watermark_it_was_placed_at() -> None:
    async def go() -> list[dict[str, Any]]:
        sender = RecordingSender()
        proc = await loaded(sender, 3)
        cmd = sow(batch_size=10).with_(command="sow_and_subscribe", sub_id="s")
        await proc.subscribe(cmd, 0)
        return decoded(sender)

    replies = asyncio.run(go())
    assert [r["command"] for r in replies] == ["sow", "part_end"]
    assert len(replies[0]["records"]) == 3
    assert (replies[-1]["count"], replies[-1]["log_offset"]) == (3, 2)


def test_publishers_get_their_acks_as_before() -> None:
    async def go() -> list[tuple[str, bytes]]:
        sender = RecordingSender()
        proc = await loaded(sender, 0)
        good = publish(0, 1, **{h.REPLY_TO: "pub", h.COMMAND_ID: "a1"})
        bad = RawRecord(0, 1, 7, None, b"{not json", {h.REPLY_TO: "pub", h.COMMAND_ID: "a2"})
        await proc.process([good, bad])
        await proc.drain()
        return [(a.topic, a.value) for a in sender.answers()]

    (t1, ok), (t2, refused) = asyncio.run(go())
    assert t1 == t2 == "pub"
    common = {"command": "ack", "topic": "t", "partition": 0}
    assert ok == encode(
        "Reply",
        {
            **common,
            "command_id": "a1",
            "log_offset": 0,
            "status": "success",
            "reason": "",
            "message": "",
            "count": 1,
        },
    )
    reply = decode("Reply", refused)
    assert reply["status"] == "failure" and reply["reason"] and reply["message"]
    assert refused == encode(
        "Reply",
        {
            **common,
            "command_id": "a2",
            "log_offset": 1,
            "status": "failure",
            "reason": reply["reason"],
            "message": reply["message"],
            "count": 0,
        },
    )
