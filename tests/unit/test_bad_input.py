"""Bad input at the wire, through the real decoders: random bytes, truncated Avro, wrong headers
and oversized values on the control, registry and log topics are refused with a reason (a
dead letter, an answer, or a logged and skipped record), never an exception that escapes."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sowstream.config import load_config_text
from sowstream.engine.commands import ControlRecord
from sowstream.engine.processor import TopicProcessor
from sowstream.engine.registry import SubscriptionRegistry
from sowstream.engine.router import decode_command
from sowstream.errors import InvalidMessageError
from sowstream.sow.compiled import compile_topic
from sowstream.sow.keys import generated_sow_key
from sowstream.sow.ops import RawRecord, decode_log_record
from sowstream.subscriptions.model import SubscriptionSpec
from sowstream.subscriptions.options import parse_options
from sowstream.wire import headers as h
from sowstream.wire.avro import decode, encode
from sowstream.wire.kafka import LARGEST_LOG_RECORD, MAX_RECORD_BYTES
from sowstream.wire.protocol import Command, Reply
from sowstream.wire.topics import TopicNames
from tests.support.sender import RecordingSender

TOPIC = load_config_text("sow:\n  - {Name: orders, Key: /id, Partitions: 1}\n").topics[0]
COMPILED = compile_topic(TOPIC)
GOOD_COMMAND = Command(
    command="sow",
    command_id="c1",
    query_id="q",
    reply_to="p.reply.x",
    topic="orders",
    filter="/a = 1",
).encode()
GOOD_SUBSCRIPTION = encode(
    "Subscription",
    SubscriptionSpec(
        "s", "p.reply.x", "orders", "subscribe", "/a > 1", parse_options("oof")
    ).to_wire(),
)


# What a foreign or broken producer may write: random bytes, cut or bit-flipped good records.
def damaged(good: bytes) -> st.SearchStrategy[bytes]:
    cut = st.integers(0, len(good)).map(lambda n: good[:n])
    flipped = st.tuples(st.integers(0, len(good) - 1), st.integers(1, 255)).map(
        lambda t: good[: t[0]] + bytes([good[t[0]] ^ t[1]]) + good[t[0] + 1 :]
    )
    return st.one_of(st.binary(max_size=300), cut, flipped)


HEADER_NAMES = [h.COMMAND, h.FILTER, h.SOW_KEY, h.EXPIRATION, h.IDENTITY, h.REPLY_TO, "junk"]
headers = st.dictionaries(
    st.sampled_from(HEADER_NAMES),
    st.text(max_size=30) | st.sampled_from(["sow_delete", "delta_publish", "1=", "-5"]),
)


@settings(max_examples=400, deadline=None)
@given(damaged(GOOD_COMMAND))
def test_a_damaged_command_is_decoded_or_skipped_with_a_reason(value: bytes) -> None:
    record = ControlRecord("p.ctl.orders", 0, 7, value)
    cmd = decode_command(record)  # None (logged) or a Command: never raises
    assert cmd is None or isinstance(cmd, Command)


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=damaged(GOOD_SUBSCRIPTION))
def test_a_damaged_registration_is_applied_or_skipped(
    value: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    applied: list[tuple[str, SubscriptionSpec | None]] = []
    registry = SubscriptionRegistry(
        "127.0.0.1:1", "p.subs", {}, lambda k, s: applied.append((k, s))
    )

    class Message:  # what confluent-kafka hands the registry
        def key(self) -> bytes:
            return b"p.reply.x|s|orders"

        def value(self) -> bytes:
            return value

        def headers(self) -> list[tuple[str, bytes]]:
            return []

        def timestamp(self) -> tuple[int, int]:
            return (1, 0)

    with caplog.at_level(logging.WARNING, "sowstream.engine"):
        registry._handle(Message())
    if applied:
        assert applied[0][1] is None or isinstance(applied[0][1], SubscriptionSpec)
    else:
        assert "ignored unreadable registration" in caplog.text


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(st.binary(max_size=200), st.just(b'{"id": 1, "a": '), st.just(b"\xff\xfe{}")),
    headers,
    st.one_of(st.none(), st.binary(max_size=20)),
)
def test_a_damaged_log_record_is_refused_with_a_reason(
    value: bytes, hdrs: dict[str, str], key: bytes | None
) -> None:
    try:
        decode_log_record(COMPILED, key, value, hdrs, 3, 1_000)
    except InvalidMessageError as exc:
        assert exc.reason and exc.topic == "orders" and "orders" in str(exc)


@settings(max_examples=200, deadline=None)
@given(damaged(Reply(command="sow", command_id="c", topic="orders", partition=0).encode()))
def test_a_damaged_reply_raises_an_error_the_client_can_catch(value: bytes) -> None:
    try:
        Reply.decode(value)
    except Exception as exc:  # the client's reader must be able to skip it
        assert not isinstance(exc, (SystemExit, KeyboardInterrupt))


def key(i: int) -> bytes:
    return generated_sow_key("orders", "orders", ["/id"], {"id": i}).encode()


BAD: list[tuple[bytes | None, bytes | None, dict[str, str], str]] = [
    (key(90), b"not json", {}, "malformed_json"),
    (key(91), b'{"id": 91, "a": ', {}, "malformed_json"),
    (key(92), b"\xff\xfe\x00", {}, "malformed_json"),
    (key(93), b'{"no_id": 1}', {}, "missing_key_field"),
    (key(94), orjson.dumps({"id": 94}), {h.COMMAND: "explode"}, "unknown_command"),
    (None, None, {h.COMMAND: "sow_delete", h.FILTER: "/a = "}, "bad_filter"),
    (key(95), orjson.dumps({"id": 95}), {h.EXPIRATION: "soon"}, ""),
]


def test_bad_log_records_go_to_the_dead_letters_and_good_ones_are_kept() -> None:
    """Through the apply stage: each bad record is dead-lettered with its reason, and every good
    record around them is stored (an oversized but valid one too: Kafka's limits decide size)."""
    sender = RecordingSender()
    names = TopicNames("p")
    proc = TopicProcessor(COMPILED, names, sender)
    records: list[RawRecord] = []
    for i, (k, v, hd, _) in enumerate(BAD):
        records.append(RawRecord(0, 2 * i, 1_000, key(i), orjson.dumps({"id": i}), {}))
        records.append(RawRecord(0, 2 * i + 1, 1_000, k, v, hd))
    big = orjson.dumps({"id": 50, "big": "x" * 1_000_000})  # as large as Kafka takes by default
    records.append(RawRecord(0, 2 * len(BAD), 1_000, key(50), big, {}))

    async def go() -> None:
        await proc.ready(0)
        await proc.process(records)
        await proc.drain()

    asyncio.run(go())
    dead = [decode("DeadLetter", r.value) for r in sender.records if r.topic == names.dead_letter]
    reasons = {d["source_offset"]: (d["reason"], d["error"]) for d in dead}
    assert sorted(reasons) == [2 * i + 1 for i in range(len(BAD))]
    for i, (_, _, _, reason) in enumerate(BAD):
        got, error = reasons[2 * i + 1]
        assert got and "orders" in error, (got, error)
        if reason:
            assert got == reason, (i, got, error)
    for i in [*range(len(BAD)), 50]:
        assert proc.table.current_record(0, key(i).decode()) is not None, i


def test_a_record_too_large_to_write_again_is_a_dead_letter_without_its_value() -> None:
    """Kafka took it, but its changelog record or dead letter would not fit Kafka's messages
    (the batch write failed and the partition reloaded for ever): a dead letter that says where
    the record is instead of copying it, and the records around it are stored."""
    sender = RecordingSender()
    names = TopicNames("p")
    proc = TopicProcessor(COMPILED, names, sender, native="off")
    largest = orjson.dumps({"id": 1, "big": "x" * (LARGEST_LOG_RECORD - 40)})
    records = [
        RawRecord(0, 0, 1_000, key(0), orjson.dumps({"id": 0}), {}),
        RawRecord(0, 1, 1_000, key(1), largest, {}),
        RawRecord(0, 2, 1_000, key(2), b'{"id": 2, "big": "' + b"x" * LARGEST_LOG_RECORD, {}),
        RawRecord(0, 3, 1_000, key(3), orjson.dumps({"id": 3}), {"junk": "y" * MAX_RECORD_BYTES}),
        RawRecord(0, 4, 1_000, key(4), orjson.dumps({"id": 4}), {}),
        # fewer characters than the limit, more UTF-8 bytes
        RawRecord(0, 5, 1_000, key(5), orjson.dumps({"id": 5}), {"j": "é" * 600_000}),
    ]

    async def go() -> None:
        await proc.ready(0)
        await proc.process(records)
        await proc.drain()

    asyncio.run(go())
    dead = [decode("DeadLetter", r.value) for r in sender.records if r.topic == names.dead_letter]
    assert [(d["source_offset"], d["reason"]) for d in dead] == [
        (2, "too_large"),
        (3, "too_large"),
        (5, "too_large"),
    ]
    for d in dead:
        assert d["value"] is None and d["key"] is None and d["headers"] == {}
        assert f"p.log.orders[0]@{d['source_offset']}" in d["error"]
        assert str(LARGEST_LOG_RECORD) in d["error"]
    for i in (0, 1, 4):
        assert proc.table.current_record(0, key(i).decode()) is not None, i
    assert all(len(r.value or b"") <= MAX_RECORD_BYTES for r in sender.records)


@pytest.mark.parametrize(
    ("key", "told"),
    [(b"p.reply.x|s1|orders", True), (b"p.reply.x|s1", False), (b"\xff", False), (None, False)],
)
def test_an_unreadable_registration_is_refused_to_whom_its_key_names(
    key: bytes | None, told: bool
) -> None:
    """Its value says nothing, but its key (``reply_to|sub_id|topic``) says whom to tell."""
    refused: list[tuple[str, dict[str, str], str, str]] = []
    registry = SubscriptionRegistry(
        "127.0.0.1:1",
        "p.subs",
        {},
        lambda k, s: pytest.fail("nothing is applied"),
        refuse=lambda k, raw, reason, text: refused.append((k, dict(raw), reason, text)),
    )

    class Message:
        def key(self) -> bytes | None:
            return key

        def value(self) -> bytes:
            return GOOD_SUBSCRIPTION[:5]  # truncated Avro

        def headers(self) -> list[tuple[str, bytes]]:
            return []

        def timestamp(self) -> tuple[int, int]:
            return (1, 0)

    registry._handle(Message())
    if not told:
        assert refused == []
        return
    ((k, raw, reason, text),) = refused
    assert k == "p.reply.x|s1|orders"
    assert raw == {"reply_to": "p.reply.x", "sub_id": "s1", "topic": "orders"}
    assert reason == "bad_registration"
    assert text.startswith("registration 'p.reply.x|s1|orders' is not a Subscription record")
