"""Protocol schema versions: each version's schemas are pinned, and readers tell versions apart.

A change to ``schemas/Command.avsc``, ``Reply.avsc``, ``Subscription.avsc``, ``TopicInfo.avsc``
or ``DeadLetter.avsc`` is a new protocol
version (docs/protocol.md, *Schema versions*): the first test fails until the version is raised,
the released files are kept under ``schemas/versions/<old version>/`` and the new fingerprints
are recorded in ``sowstream.wire.versions.FINGERPRINTS``.
"""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import fastavro
import pytest

from sowstream.config import load_config_text
from sowstream.engine.meta import topic_info
from sowstream.engine.processor import TopicProcessor
from sowstream.errors import SchemaVersionError
from sowstream.sow.compiled import compile_topic
from sowstream.sow.ops import RawRecord
from sowstream.wire import versions
from sowstream.wire.avro import SCHEMA_DIR, encode, schema
from sowstream.wire.protocol import Command, Reply, ReplyRecord
from sowstream.wire.topics import TopicNames
from sowstream.wire.versions import (
    FINGERPRINTS,
    OLDEST_ACCEPTED,
    PROTOCOL_VERSION,
    VERSIONED,
    check,
    decode_headed,
    decode_versioned,
    version_of,
)
from tests.support.sender import RecordingSender


def fingerprint(path: Any) -> str:
    parsed = fastavro.schema.load_schema(str(path))
    return str(
        fastavro.schema.fingerprint(
            fastavro.schema.to_parsing_canonical_form(parsed), "CRC-64-AVRO"
        )
    )


def test_the_current_schemas_are_the_current_version() -> None:
    for name in VERSIONED:
        assert fingerprint(SCHEMA_DIR / f"{name}.avsc") == FINGERPRINTS[PROTOCOL_VERSION][name], (
            f"schemas/{name}.avsc changed within protocol version {PROTOCOL_VERSION}: raise "
            "PROTOCOL_VERSION in sowstream/wire/versions.py, keep the released file as "
            f"schemas/versions/{PROTOCOL_VERSION}/{name}.avsc and record the new fingerprints "
            "(docs/protocol.md, Schema versions)"
        )


def test_every_older_version_accepted_has_its_schemas_as_released() -> None:
    assert set(FINGERPRINTS) == set(range(1, PROTOCOL_VERSION + 1))
    for version in range(OLDEST_ACCEPTED, PROTOCOL_VERSION):
        for name in VERSIONED:
            path = SCHEMA_DIR / "versions" / str(version) / f"{name}.avsc"
            if FINGERPRINTS[version][name] != FINGERPRINTS[version + 1][name]:
                assert fingerprint(path) == FINGERPRINTS[version][name]


def test_versions_only_append_fields_with_defaults_after_the_frozen_ones() -> None:
    """What makes a newer record readable by an older reader (as far as its schema goes) and
    an older one by a newer reader (the added fields take their defaults)."""
    for version in range(OLDEST_ACCEPTED, PROTOCOL_VERSION):
        for name in VERSIONED:
            old = [f["name"] for f in versions.writer_schema(name, version)["fields"]]
            new = versions.writer_schema(name, PROTOCOL_VERSION)["fields"]
            assert [f["name"] for f in new[: len(old)]] == old
            assert all("default" in f for f in new[len(old) :])


def test_the_refusal_fields_are_the_first_of_every_version() -> None:
    """A refusal must be readable with any version's schema: its fields come first, always."""
    reply = json.loads((SCHEMA_DIR / "Reply.avsc").read_text())["fields"]
    assert [f["name"] for f in reply[:9]] == [
        "command",
        "command_id",
        "query_id",
        "topic",
        "partition",
        "partitions",
        "status",
        "reason",
        "message",
    ]
    cmd = json.loads((SCHEMA_DIR / "Command.avsc").read_text())["fields"]
    assert [f["name"] for f in cmd[:5]] == [
        "command",
        "command_id",
        "query_id",
        "reply_to",
        "topic",
    ]


def test_a_record_without_the_header_is_version_1() -> None:
    assert version_of(None) == version_of({}) == version_of({"sow.schema": ""}) == 1
    assert version_of({"sow.schema": "7"}) == 7


@pytest.mark.parametrize("text", ["two", "0", "-1", "1.5"])
def test_a_header_that_is_no_version_is_refused(text: str) -> None:
    with pytest.raises(SchemaVersionError, match="is not a schema version") as caught:
        version_of({"sow.schema": text})
    assert caught.value.written is None


def test_versions_outside_the_accepted_range_are_refused_naming_both() -> None:
    check(PROTOCOL_VERSION, "the command")
    with pytest.raises(SchemaVersionError) as newer:
        check(PROTOCOL_VERSION + 1, "the command")
    assert str(newer.value) == (
        f"the command was written with protocol schema version {PROTOCOL_VERSION + 1}; this "
        f"side reads versions {OLDEST_ACCEPTED} to {PROTOCOL_VERSION}: upgrade it, or write "
        f"version {PROTOCOL_VERSION}"
    )
    with pytest.raises(SchemaVersionError) as older:
        check(OLDEST_ACCEPTED - 1, "the registration")
    assert str(older.value) == (
        f"the registration was written with protocol schema version {OLDEST_ACCEPTED - 1}, "
        f"which is no longer accepted (this side reads versions {OLDEST_ACCEPTED} to "
        f"{PROTOCOL_VERSION}): update the client's copy of the schemas"
    )
    assert (older.value.written, older.value.accepted) == (
        OLDEST_ACCEPTED - 1,
        (OLDEST_ACCEPTED, PROTOCOL_VERSION),
    )


def newer_schema(name: str) -> Any:
    """``name``'s schema as a next version would have it: one more field, with its default."""
    raw = json.loads((SCHEMA_DIR / f"{name}.avsc").read_text())
    raw["fields"].append({"name": "added_later", "type": "string", "default": ""})
    return fastavro.parse_schema(raw)


def test_a_newer_record_is_read_as_far_as_this_version_goes() -> None:
    cmd = Command("sow", "c1", "q", "reply.c1", "orders", filter="/a = 1", top_n=3)
    buf = io.BytesIO()
    record = {**_as_record(cmd), "added_later": "something new"}
    fastavro.schemaless_writer(buf, newer_schema("Command"), record)
    assert Command.decode(buf.getvalue(), PROTOCOL_VERSION + 1) == cmd
    reply = Reply("part_end", "c1", topic="orders", records=[ReplyRecord("k", b"{}", 1, 2)])
    assert decode_versioned("Reply", reply.encode(), PROTOCOL_VERSION)["records"][0]["sow_key"] == (
        "k"
    )


def test_an_older_record_takes_the_defaults_of_the_fields_added_since() -> None:
    """Resolution as the engine does it for an older writer: written without the newer field,
    read with the newer schema, the field has its default."""
    cmd = Command("sow", "c1", "q", "reply.c1", "orders")
    newer = newer_schema("Command")
    read = fastavro.schemaless_reader(io.BytesIO(cmd.encode()), schema("Command"), newer)
    assert isinstance(read, dict) and read["added_later"] == "" and read["command_id"] == "c1"


def _as_record(cmd: Command) -> dict[str, Any]:
    record = fastavro.schemaless_reader(io.BytesIO(cmd.encode()), schema("Command"), None)
    assert isinstance(record, dict)
    return record


def test_topic_info_and_dead_letter_records_are_read_with_or_without_the_header() -> None:
    """Records written before the header existed (none) are version 1; a newer version is read
    as far as this version goes; a header that is no version is refused."""
    letter = {
        "topic": "orders",
        "source_topic": "p.log.orders",
        "source_partition": 0,
        "source_offset": 3,
        "timestamp": 1,
        "reason": "malformed_json",
        "error": "topic 'orders': ...",
        "message_type": "json",
    }
    value = encode("DeadLetter", letter)
    old = decode_headed("DeadLetter", value, None)
    assert old == decode_headed("DeadLetter", value, {"sow.schema": "1"})
    assert old["reason"] == "malformed_json" and old["message_type"] == "json"
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, newer_schema("DeadLetter"), {**old, "added_later": "x"})
    newer = decode_headed("DeadLetter", buf.getvalue(), {"sow.schema": str(PROTOCOL_VERSION + 1)})
    assert newer == old
    topic = load_config_text("sow:\n  - {Name: orders, Key: /id}\n").topics[0]
    info = encode("TopicInfo", topic_info(topic, TopicNames("p")))
    assert decode_headed("TopicInfo", info, {})["log_topic"] == "p.log.orders"
    with pytest.raises(SchemaVersionError):
        decode_headed("TopicInfo", info, {"sow.schema": "x"})


def test_the_engine_writes_its_dead_letters_with_the_version_header() -> None:
    async def go() -> RecordingSender:
        sender = RecordingSender()
        topic = load_config_text("sow:\n  - {Name: t, Key: /id, Durability: transient}\n")
        proc = TopicProcessor(compile_topic(topic.topics[0]), TopicNames("p"), sender)
        await proc.ready(0)
        await proc.process([RawRecord(0, 0, 1, None, b"{bad", {})])
        await proc.drain()
        return sender

    sender = asyncio.run(go())
    letters = [r for r in sender.records if r.topic == "p.deadletter"]
    assert len(letters) == 1 and letters[0].headers == {"sow.schema": str(PROTOCOL_VERSION)}
    assert decode_headed("DeadLetter", letters[0].value or b"", letters[0].headers)["reason"] == (
        "malformed_json"
    )
