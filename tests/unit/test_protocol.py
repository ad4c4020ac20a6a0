"""The typed protocol messages agree with the Avro schemas, and one reply writer batches."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sowstream.engine.ports import Sender
from sowstream.engine.replies import MAX_REPLY_BYTES, ReplyWriter
from sowstream.wire.avro import SCHEMA_DIR
from sowstream.wire.protocol import Command, Reply, ReplyRecord
from tests.support.sender import RecordingSender


def schema_fields(name: str) -> list[dict[str, Any]]:
    fields: list[dict[str, Any]] = json.loads((SCHEMA_DIR / f"{name}.avsc").read_text())["fields"]
    return fields


def class_defaults(cls: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def test_command_fields_are_the_schema_fields_in_order_with_its_defaults() -> None:
    fields = schema_fields("Command")
    assert [f.name for f in dataclasses.fields(Command)] == [f["name"] for f in fields]
    defaults = class_defaults(Command)
    assert defaults == {f["name"]: f["default"] for f in fields if "default" in f}


def test_reply_fields_are_the_schema_fields_in_order_with_its_defaults() -> None:
    fields = schema_fields("Reply")
    assert [f.name for f in dataclasses.fields(Reply)] == [f["name"] for f in fields]
    defaults = {
        k: (list(v) if isinstance(v, tuple) else v) for k, v in class_defaults(Reply).items()
    }
    assert defaults == {f["name"]: f["default"] for f in fields if "default" in f}
    record = next(f for f in fields if f["name"] == "records")["type"]["items"]["fields"]
    assert list(ReplyRecord._fields) == [f["name"] for f in record]


texts = st.text(max_size=20)
maybe = st.none() | texts


@given(
    st.builds(
        Command,
        command=texts,
        command_id=texts,
        query_id=texts,
        reply_to=texts,
        topic=texts,
        filter=maybe,
        sow_keys=st.none() | st.lists(texts, max_size=3).map(tuple),
        order_by=maybe,
        top_n=st.none() | st.integers(-(2**31), 2**31 - 1),
        skip_n=st.none() | st.integers(0, 2**31 - 1),
        batch_size=st.integers(1, 10_000),
        after_offset=st.integers(-1, 2**62),
        options=st.dictionaries(texts, texts, max_size=3),
        sub_id=texts,
        identity=texts,
        sub_options=texts,
        previous_filter=maybe,
        message_type=texts,
        topic_regex=maybe,
    )
)
def test_a_command_survives_the_wire(cmd: Command) -> None:
    assert Command.decode(cmd.encode()) == cmd


@given(
    st.lists(
        st.builds(
            ReplyRecord,
            texts,
            st.binary(max_size=30),
            st.integers(0, 2**62),
            st.integers(-1, 2**62),
            st.integers(0, 2**62),
            texts,
        ),
        max_size=4,
    ),
    st.sampled_from(["sow", "part_end", "ack", "oof"]),
    st.integers(-1, 100),
)
def test_a_reply_survives_the_wire(
    records: list[ReplyRecord], command: str, partition: int
) -> None:
    reply = Reply(
        command,
        "c1",
        "q",
        "orders",
        partition,
        3,
        "failure",
        "bad_filter",
        "x",
        7,
        "a1",
        42,
        records,
    )
    assert Reply.decode(reply.encode()) == reply


def writer(sender: Sender) -> ReplyWriter:
    cmd = Command("sow", "c1", "q1", "reply.me", "orders")
    return ReplyWriter.for_command(sender, cmd, "orders", 2)


def test_records_are_cut_at_batch_size_and_end_counts_them() -> None:
    sender = RecordingSender()
    w = writer(sender)
    items = [ReplyRecord(f"k{i}", b"{}", i, i, i) for i in range(7)]

    async def run() -> None:
        assert await w.records(items, 3) == 7
        await w.end(7, log_offset=9)

    asyncio.run(run())
    replies = sender.replies()
    assert [len(r.records) for r in replies] == [3, 3, 1, 0]
    assert {a.topic for a in sender.answers()} == {"reply.me"}
    assert [r.command for r in replies] == ["sow", "sow", "sow", "part_end"]
    end = replies[-1]
    assert (end.count, end.log_offset, end.partition, end.query_id) == (7, 9, 2, "q1")
    assert len({r.answer_id for r in replies}) == 1  # one answer


def test_records_are_cut_before_a_batch_would_pass_the_size_limit() -> None:
    sender = RecordingSender()
    big = b"x" * (MAX_REPLY_BYTES // 2)
    items = [ReplyRecord(f"k{i}", big, 0, i) for i in range(3)]
    asyncio.run(writer(sender).records(items, 1_000))
    assert [len(r.records) for r in sender.replies()] == [1, 1, 1]


def test_a_failure_is_a_failed_part_end_with_the_reason() -> None:
    sender = RecordingSender()
    asyncio.run(writer(sender).failure("bad_filter", "position 3: unexpected ')'"))
    (reply,) = sender.replies()
    assert (reply.command, reply.status, reply.reason) == ("part_end", "failure", "bad_filter")
    assert reply.message == "position 3: unexpected ')'"
