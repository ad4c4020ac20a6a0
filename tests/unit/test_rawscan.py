"""Raw scan batches: the layout docs/protocol.md gives, read as a client in another language
would; the processor's raw answers against its Avro ones; and malformed batches refused."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import io
import json
import struct
import time
from typing import Any

import fastavro
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sowstream.client.messages import Message
from sowstream.client.rawscan import raw_messages
from sowstream.config import load_config_text
from sowstream.engine.processor import TopicProcessor
from sowstream.engine.replies import MAX_REPLY_BYTES, ReplyWriter
from sowstream.errors import CorruptReplyError
from sowstream.sow.compiled import compile_topic
from sowstream.sow.keys import generated_sow_key
from sowstream.sow.ops import RawRecord
from sowstream.sow.record import SowRecord
from sowstream.wire import headers as h
from sowstream.wire import rawscan
from sowstream.wire.avro import SCHEMA_DIR, encode
from sowstream.wire.protocol import SOW_RAW, Command, Reply, ReplyRecord
from sowstream.wire.rawscan import RawBatch, pack
from sowstream.wire.topics import TopicNames
from tests.support.sender import RecordingSender

# The compiled splitter itself (not COMPILED_SPLIT, which $SOWSTREAM_NATIVE=off turns off):
# make test builds native/, and these tests compare it with the Python reader.
COMPILED: rawscan.Split = importlib.import_module("sowstream_native").raw_records

# -- the documented layout, read with fastavro, struct and orjson only -------------------------


def read_reply_as_documented(payload: bytes) -> list[dict[str, Any]]:
    """A reader written from docs/protocol.md alone: the Avro envelope with the schema file,
    then the raw batch byte by byte."""
    schema = fastavro.parse_schema(json.loads((SCHEMA_DIR / "Reply.avsc").read_text()))
    reply = fastavro.schemaless_reader(io.BytesIO(payload), schema, None)
    assert isinstance(reply, dict) and reply["command"] == "sow_raw"
    (element,) = reply["records"]
    batch: bytes = element["data"]
    version, flags, count, rank = struct.unpack_from(">BBII", batch, 0)
    assert version == 1
    ends = struct.unpack_from(f">{count}I", batch, 10)
    area = batch[10 + 4 * count :]
    assert ends[-1] == len(area)
    out = []
    begin = 0
    for i, end in enumerate(ends):
        record = area[begin:end]
        begin = end
        marker, offset, timestamp, key_length = struct.unpack_from(">BqqI", record, 0)
        at = 21
        expiration = None
        if marker == 0x03:
            (expiration,) = struct.unpack_from(">q", record, 21)
            at = 29
        key = record[at : at + key_length].decode()
        name = ""
        if flags & 1:
            name, _, key = key.partition("\x1f")
        out.append(
            {
                "topic": name or reply["topic"],
                "sow_key": key,
                "body": orjson.loads(record[at + key_length :]),
                "log_offset": offset,
                "timestamp": timestamp,
                "expiration": expiration,
                "sort_rank": rank + i,
                "bookmark": f"{timestamp}|{reply['partition']}|{offset}",
            }
        )
    return out


def test_a_raw_reply_reads_with_fastavro_and_the_documented_layout_alone() -> None:
    values = [
        SowRecord("k1", b'{"id":1,"s":"\xc3\xa9"}', 10, 1000).to_bytes(),
        SowRecord("k2", b'{"id":2}', 11, 1001, expiration=5000).to_bytes(),
    ]
    base = Reply(SOW_RAW, "c1", "q1", "orders", 3, answer_id="a")
    reply = base.with_(records=[ReplyRecord("", pack(values, 5), 0, -1)])
    got = read_reply_as_documented(reply.encode())
    assert got == [
        {
            "topic": "orders",
            "sow_key": "k1",
            "body": {"id": 1, "s": "é"},
            "log_offset": 10,
            "timestamp": 1000,
            "expiration": None,
            "sort_rank": 5,
            "bookmark": "1000|3|10",
        },
        {
            "topic": "orders",
            "sow_key": "k2",
            "body": {"id": 2},
            "log_offset": 11,
            "timestamp": 1001,
            "expiration": 5000,
            "sort_rank": 6,
            "bookmark": "1001|3|11",
        },
    ]


def test_pattern_keys_carry_the_name_and_the_flag_says_so() -> None:
    values = [SowRecord("orders.us\x1fk1", b'{"id":1}', 1, 2).to_bytes()]
    block = pack(values, 0, rawscan.PATTERN_KEYS)
    reply = Reply(SOW_RAW, "c1", "q1", "orders", 0, records=[ReplyRecord("", block, 0, -1)])
    (got,) = read_reply_as_documented(reply.encode())
    assert (got["topic"], got["sow_key"]) == ("orders.us", "k1")
    (msg,) = raw_messages(reply, "q1", None)
    assert (msg.topic, msg.sow_key) == ("orders.us", "k1")


# -- the Python client's messages from a raw batch ----------------------------------------------


def raw_reply(values: list[bytes], rank: int = 0, flags: int = 0, partition: int = 2) -> Reply:
    block = pack(values, rank, flags)
    return Reply(SOW_RAW, "c1", "q1", "orders", partition, records=[ReplyRecord("", block, 0, -1)])


@given(
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=12).filter(lambda k: "\x1f" not in k),
            st.binary(max_size=40),
            st.integers(-(2**63), 2**63 - 1),
            st.integers(-(2**63), 2**63 - 1),
            st.none() | st.integers(-(2**63), 2**63 - 1),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_messages_from_a_raw_batch_equal_those_of_the_record_form(
    records: list[tuple[str, bytes, int, int, int | None]],
) -> None:
    """Split by the compiled splitter or read lazily in Python, the same messages."""
    values = [SowRecord(*r).to_bytes() for r in records]
    got = raw_messages(raw_reply(values), "q1", None, COMPILED)
    assert got == raw_messages(raw_reply(values), "q1", None, None)
    want = [
        Message(
            "sow",
            topic="orders",
            sow_key=key,
            query_id="q1",
            data=data,
            timestamp=timestamp,
            batch_size=len(records),
            bookmark=f"{timestamp}|2|{offset}",
        )
        for key, data, offset, timestamp, _ in records
    ]
    assert got == want


def test_a_raw_message_reads_its_record_once_and_behaves_as_any_message() -> None:
    """Without the compiled splitter a message reads its record when first used."""
    values = [SowRecord("k1", b'{"id":1}', 10, 1000).to_bytes()]
    (msg,) = raw_messages(raw_reply(values), "q1", None, None)
    assert "_source" in msg.__dict__  # nothing read yet
    assert msg.command == "sow" and msg.query_id == "q1" and msg.topic == "orders"
    assert "_source" in msg.__dict__  # those came with the batch
    assert msg.json() == {"id": 1}
    assert "_source" not in msg.__dict__ and msg.sow_key == "k1"
    eager = Message("sow", "orders", "k1", "q1", b'{"id":1}', 1000, 1, bookmark="1000|2|10")
    assert msg == eager and hash(msg) == hash(eager) and repr(msg) == repr(eager)
    assert dataclasses.replace(msg, sow_key="") == dataclasses.replace(eager, sow_key="")
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.sow_key = "x"  # type: ignore[misc]
    (other,) = raw_messages(raw_reply(values), "q1", None, None)
    assert other.bookmark == "1000|2|10"  # the first field read brings the others
    assert other.__dict__["data"] == b'{"id":1}'
    assert Message.data == b"" and Message("group_begin").data == b""


# -- malformed batches --------------------------------------------------------------------------

ONE = pack([SowRecord("k1", b"{}", 1, 2).to_bytes()], 0)
GOOD = pack([SowRecord("k1", b"{}", 1, 2).to_bytes(), SowRecord("k2", b"{}", 3, 4).to_bytes()], 0)


@pytest.mark.parametrize(
    ("block", "problem"),
    [
        (b"\x01\x00", "shorter than its header"),
        (b"\x02" + GOOD[1:], "layout version 2"),
        (GOOD[:2] + struct.pack(">I", 0) + GOOD[6:], "holds 0 records"),
        (GOOD[:2] + struct.pack(">I", 999) + GOOD[6:], "holds 999 records"),
        (GOOD[:-1], "records end at byte"),
        (GOOD + b"x", "records end at byte"),
        (GOOD[:10] + struct.pack(">II", 10, 50) + GOOD[18:], "shorter than a record header"),
        (GOOD[:18] + b"\x07" + GOOD[19:], "unknown marker 0x07"),
        (ONE[:14] + b"\x00" + ONE[15:], "unknown marker 0x00"),
    ],
)
def test_a_malformed_batch_is_refused_naming_the_problem(block: bytes, problem: str) -> None:
    reply = Reply(SOW_RAW, "c9", "q1", "orders", 4, records=[ReplyRecord("", block, 0, -1)])
    with pytest.raises(CorruptReplyError, match=problem) as caught:
        raw_messages(reply, "q1", None)
    assert "command c9, topic 'orders' partition 4" in str(caught.value)


@pytest.mark.parametrize("split", [COMPILED, None], ids=["compiled", "python"])
def test_a_key_running_past_its_record_or_not_utf8_fails_when_the_message_is_read(
    split: rawscan.Split | None,
) -> None:
    """Only the bad record's message fails, when it is read; the batch's others read."""
    long_key = bytearray(SowRecord("k1", b"{}", 1, 2).to_bytes())
    long_key[17:21] = struct.pack(">I", 50)
    bad_utf8 = SowRecord("k1", b"{}", 1, 2).to_bytes().replace(b"k1", b"\xff\xfe")
    good = SowRecord("k2", b'{"a":1}', 3, 4).to_bytes()
    for value, problem in ((bytes(long_key), "runs past"), (bad_utf8, "not UTF-8")):
        msg, fine = raw_messages(raw_reply([value, good]), "q1", None, split)
        assert fine.sow_key == "k2" and fine.json() == {"a": 1} and fine.bookmark == "4|2|3"
        with pytest.raises(CorruptReplyError, match=problem) as caught:
            _ = msg.data
        assert "topic 'orders' partition 2: raw batch record 0" in str(caught.value)
        with pytest.raises(CorruptReplyError):  # and again: nothing half-read was kept
            _ = msg.sow_key


def test_a_failing_splitter_leaves_the_batch_to_the_python_reader(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(block: bytes, starts: Any, ends: Any) -> list[Any]:
        raise ValueError("boom")

    values = [SowRecord("k1", b'{"id":1}', 10, 1000).to_bytes()]
    (msg,) = raw_messages(raw_reply(values), "q1", None, broken)
    assert msg.sow_key == "k1" and msg.bookmark == "1000|2|10"
    assert "the compiled splitter failed on a raw batch (boom)" in caplog.text


@pytest.mark.parametrize("expiring", [False, True])
def test_the_compiled_splitter_and_the_python_reader_agree_on_every_key_length(
    expiring: bool,
) -> None:
    """Around the record's end: a key that ends the record, one that runs a byte past it."""
    values = [
        SowRecord("k1", b"{}", 1, 2, 3 if expiring else None).to_bytes(),
        SowRecord("k2", b"{}", 4, 5).to_bytes(),
    ]
    for size in range(len(values[0]) + 2):
        first = bytearray(values[0])
        first[17:21] = struct.pack(">I", size)
        batch = RawBatch(pack([bytes(first), values[1]], 0))
        assert batch.records(COMPILED) == batch.records(None), size


@given(
    st.lists(
        st.tuples(
            st.text(max_size=8),
            st.binary(max_size=16),
            st.integers(-(2**63), 2**63 - 1),
            st.integers(-(2**63), 2**63 - 1),
            st.none() | st.integers(-(2**63), 2**63 - 1),
        ),
        min_size=1,
        max_size=12,
    ),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
)
def test_the_compiled_splitter_reads_every_batch_as_the_python_reader(
    records: list[tuple[str, bytes, int, int, int | None]], flips: list[tuple[int, int]]
) -> None:
    """Differential: the compiled splitter and RawBatch.record agree on every record of random
    batches, with bytes overwritten anywhere in the records (a record either refuses or
    reads the same)."""
    block = bytearray(pack([SowRecord(*r).to_bytes() for r in records], 0))
    base = rawscan.BATCH_HEAD.size + rawscan.END_SIZE * len(records)
    for at, byte in flips:  # the records area only: the batch's own checks stay as they are
        block[base + at % (len(block) - base)] = byte
    try:
        batch = RawBatch(bytes(block))
    except CorruptReplyError:
        return  # a marker overwritten: the whole batch is refused before any split
    assert batch.records(COMPILED) == batch.records(None)


def test_a_sow_raw_reply_holds_exactly_one_batch() -> None:
    reply = Reply(SOW_RAW, "c1", "q1", "orders", 0, records=[ReplyRecord("", GOOD, 0, -1)] * 2)
    with pytest.raises(CorruptReplyError, match="one raw batch, not 2 records"):
        raw_messages(reply, "q1", None)


# -- the worker's side --------------------------------------------------------------------------


def test_raw_batches_are_cut_at_batch_size_and_the_size_limit_with_running_ranks() -> None:
    sender = RecordingSender()
    cmd = Command("sow", "c1", "q1", "reply.me", "orders")
    writer = ReplyWriter.for_command(sender, cmd, "orders", 2)
    small = [SowRecord(f"k{i}", b"{}", i, i).to_bytes() for i in range(7)]
    big = [SowRecord(f"b{i}", b"x" * (MAX_REPLY_BYTES // 3), i, i).to_bytes() for i in range(4)]

    async def run() -> None:
        assert await writer.raw_records(small, 3) == 7
        assert await writer.raw_records(big, 1000) == 4

    asyncio.run(run())
    batches = [RawBatch(r.records[0].data) for r in sender.replies()]
    assert [b.count for b in batches] == [3, 3, 1, 2, 2]
    assert [b.first_rank for b in batches] == [0, 3, 6, 0, 2]
    assert all(len(r.encode()) < 1_000_000 for r in sender.replies())
    assert [batches[0].record(i)[0] for i in range(3)] == ["k0", "k1", "k2"]


TOPICS = """
sow:
  - Name: t
    Key: /id
    Durability: transient
    Expiration: enabled
  - Name: p
    Pattern: 'p\\..*'
    Key: /id
    Durability: transient
"""
NOW_MS = int(time.time() * 1000)  # log time of the records: expirations count from it


def publish(
    name: str, offset: int, body: dict[str, Any], at: int = NOW_MS, **headers: str
) -> RawRecord:
    key = generated_sow_key(name, name, ["/id"], body).encode()
    if name.startswith("p."):
        headers = {h.TOPIC: name, **headers}
    return RawRecord(0, offset, at + offset, key, orjson.dumps(body), headers)


def records() -> list[RawRecord]:
    out = [publish("t", i, {"id": i, "px": (i * 37) % 11, "desk": f"d{i % 3}"}) for i in range(40)]
    # Two that expired long ago (still stored: no expiry sweep runs here), one that has not.
    long_ago = NOW_MS - 60_000
    out.append(publish("t", 40, {"id": 40, "px": 1}, long_ago, **{h.EXPIRATION: "1"}))
    out[3] = publish("t", 3, {"id": 3, "px": 2}, long_ago, **{h.EXPIRATION: "1"})
    out.append(publish("t", 41, {"id": 41, "px": 3}, **{h.EXPIRATION: "3600"}))
    return out


def pattern_records() -> list[RawRecord]:
    names = ["p.us", "p.eu", "p.asia"]
    return [publish(names[i % 3], i, {"id": i % 7, "px": i}) for i in range(30)]


async def answers(
    config: int, log: list[RawRecord], cmd: Command, stored: dict[bytes, bytes] | None = None
) -> dict[bool, list[Any]]:
    """The records of ``cmd``'s answer as the client sees them, asked raw and not; ``stored``
    is written into the partition's store as it is, after the log."""
    topic = load_config_text(TOPICS).topics[config]
    sender = RecordingSender()
    proc = TopicProcessor(compile_topic(topic), TopicNames("x"), sender)
    await proc.ready(0)
    await proc.process(log)
    await proc.drain()
    if stored:
        ps = proc.table.get(0)
        assert ps is not None
        ps.store.write(stored)
    seen: dict[bool, list[Any]] = {}
    for raw in (False, True):
        sender.replied.clear()
        ask = cmd.with_(options={**cmd.options, **({"raw": "1"} if raw else {})})
        if cmd.command == "sow":
            await proc.query(ask, 0)
        else:
            await proc.subscribe(ask.with_(sub_id=f"s{raw}"), 0)
        replies = sender.replies()
        kinds = {r.command for r in replies[:-1]}
        # select projects each record, so its SOW part stays in the record form.
        form = "sow_raw" if raw and "select" not in cmd.sub_options else "sow"
        assert kinds <= {form}, kinds
        end = replies[-1]
        assert end.command == "part_end" and end.status == "success", end
        messages = [m for r in replies[:-1] for m in client_messages(r)]
        assert end.count == len(messages)
        seen[raw] = [(m.topic, m.sow_key, m.data, m.timestamp, m.bookmark) for m in messages]
    return seen


def client_messages(reply: Reply) -> list[Message]:
    """What the client makes of a reply's records (the record form as ``collect`` reads it)."""
    if reply.command == SOW_RAW:
        return raw_messages(reply, "q", None)
    out = []
    for rec in reply.records:
        out.append(
            Message(
                "sow",
                topic=rec.topic or reply.topic,
                sow_key=rec.sow_key,
                query_id="q",
                data=rec.data,
                timestamp=rec.timestamp,
                batch_size=len(reply.records),
                bookmark=f"{rec.timestamp}|{reply.partition}|{rec.log_offset}",
            )
        )
    return out


def sow(topic: str = "t", **fields: Any) -> Command:
    fields = {"command": "sow", "batch_size": 7, **fields}
    return Command(command_id="c1", query_id="q", reply_to="r", topic=topic, **fields)


@pytest.mark.parametrize(
    "cmd",
    [
        sow(),
        sow(batch_size=1),
        sow(filter="/px > 4"),
        sow(filter="/desk = 'd1' AND /px < 9"),
        sow(order_by="/px DESC, /id", top_n=12),
        sow(order_by="/desk"),
        sow(top_n=5),
        sow(top_n=5, filter="/px >= 2"),
        sow(sow_keys=tuple(generated_sow_key("t", "t", ["/id"], {"id": i}) for i in (1, 3, 5))),
        sow(command="sow_and_subscribe"),
        sow(command="sow_and_subscribe", filter="/px > 4"),
        sow(command="sow_and_subscribe", sub_options="select=[/id]"),
    ],
    ids=lambda cmd: f"{cmd.command}:{cmd.filter}:{cmd.order_by}:{cmd.top_n}:{cmd.sub_options}",
)
def test_raw_answers_hold_what_the_record_form_holds(cmd: Command) -> None:
    got = asyncio.run(answers(0, records(), cmd))
    assert got[True] == got[False]
    ids = {orjson.loads(data)["id"] for _, _, data, _, _ in got[True]}
    expired = {3, 40}
    if cmd.command == "sow":
        assert not ids & expired
    elif cmd.filter is None:
        # Their removal not yet through the log: a subscription's SOW part holds them, since
        # their oof follows in its stream.
        assert expired <= ids
    if cmd.filter is None and cmd.sow_keys is None and cmd.top_n is None:
        assert 41 in ids and len(ids) == (40 if cmd.command == "sow" else 42)


@pytest.mark.parametrize(
    "regex", [None, "p\\.us", "p\\.(us|eu)"], ids=["every name", "one name", "two names"]
)
def test_raw_answers_of_a_pattern_topic_carry_each_records_name(regex: str | None) -> None:
    for cmd in (sow("p", topic_regex=regex), sow("p", topic_regex=regex, order_by="/px DESC")):
        got = asyncio.run(answers(1, pattern_records(), cmd))
        assert got[True] == got[False]
        names = {topic for topic, *_ in got[True]}
        assert names == (
            {"p.us", "p.eu", "p.asia"}
            if regex is None
            else {"p.us", "p.eu"}
            if "|" in regex
            else {"p.us"}
        )


def test_records_in_the_avro_form_of_earlier_releases_go_out_in_format_1() -> None:
    key = generated_sow_key("t", "t", ["/id"], {"id": 99})
    legacy = {
        "sow_key": key,
        "data": b'{"id":99,"px":7}',
        "log_offset": 5,
        "log_timestamp": NOW_MS,
        "expiration": None,
    }
    stored = {key.encode(): encode("SowRecord", legacy)}
    for cmd in (sow(), sow(filter="/px = 7"), sow(filter="/id > 90", order_by="/px", top_n=3)):
        got = asyncio.run(answers(0, records(), cmd, stored))
        assert got[True] == got[False]
        assert (
            "t",
            key,
            b'{"id":99,"px":7}',
            NOW_MS,
            f"{NOW_MS}|0|5",
        ) in got[True]
