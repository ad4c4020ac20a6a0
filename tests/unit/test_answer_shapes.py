"""Every answer docs/protocol.md documents, as the engine really sends it, against the schema file.

Each shape below is produced by the worker's own units (the router, the processor's stages, the
queues) through a recording Sender, read back with ``schemas/Reply.avsc`` as a client in another
language would (the file itself, fastavro, nothing of ours), and checked field by field against
what the documentation says of it. The documentation's sentence that defines the shape is quoted,
so a shape whose description changes fails here until the test follows it, and every reply
``command`` the *Replies* section lists must have a shape here.
"""

from __future__ import annotations

import asyncio
import io
import re
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
import orjson
import pytest

from sowstream.sow.keys import generated_sow_key
from sowstream.sow.ops import RawRecord
from sowstream.wire import headers as h
from sowstream.wire.versions import PROTOCOL_VERSION
from tests.support.router import Setup, command, record

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "protocol.md").read_text()
# A QueueStatus row leaves counters at zero out: a reader fills in the schema's defaults.
QUEUE_STATUS_DEFAULTS = {
    f["name"]: f["default"]
    for f in orjson.loads((ROOT / "schemas" / "QueueStatus.avsc").read_bytes())["fields"]
    if "default" in f
}
SCHEMA = fastavro.parse_schema(fastavro.schema.load_schema(str(ROOT / "schemas" / "Reply.avsc")))


def flat(text: str) -> str:
    """Markdown text with its line breaks and repeated spaces folded (quotes span lines)."""
    return re.sub(r"\s+", " ", text)


def read(value: bytes) -> dict[str, Any]:
    """A reply as any Avro library reads it with the schema file, checked to be exactly one
    Reply record: valid against the schema, nothing left over, written back to the same bytes."""
    buf = io.BytesIO(value)
    reply = fastavro.schemaless_reader(buf, SCHEMA, None)
    assert isinstance(reply, dict)
    assert buf.read() == b"", "bytes left after the Reply record"
    assert fastavro.validate(reply, SCHEMA)
    again = io.BytesIO()
    fastavro.schemaless_writer(again, SCHEMA, reply)
    assert again.getvalue() == value
    return reply


def answers(setup: Setup) -> list[dict[str, Any]]:
    """The Avro replies sent so far (each with the version header), read as above."""
    sent = [r for r in setup.sender.replied if r.headers is None]
    assert all(r.schema == str(PROTOCOL_VERSION) for r in sent)
    setup.sender.replied.clear()
    return [read(r.value) for r in sent]


async def publish(setup: Setup, offset: int, body: dict[str, Any], **headers: str) -> None:
    """Apply one publish to partition 0 of ``orders`` (as the log pump would)."""
    key = generated_sow_key("orders", "orders", ["/id"], body).encode()
    rec = RawRecord(0, offset, 1_700_000_000_000 + offset, key, orjson.dumps(body), headers)
    proc = setup.orders.proc
    await proc.ready(0)
    await proc.process([rec])
    await proc.drain()


async def answer(setup: Setup, name: str, **fields: Any) -> list[dict[str, Any]]:
    await setup.router.handle(setup.orders, [record(command(name, **fields))])
    return answers(setup)


@dataclass(frozen=True)
class Shape:
    """One documented answer: the sentence that documents it, the reply kinds it covers, and
    the check of what the engine sent for it."""

    documented: str
    commands: tuple[str, ...]
    check: Callable[[], Awaitable[None]]


async def sow_batches_and_part_end() -> None:
    setup = Setup()
    await publish(setup, 0, {"id": 1, "a": 1})
    await publish(setup, 1, {"id": 2, "a": 1})
    batch, end = await answer(setup, "sow", batch_size=10)
    assert (batch["command"], batch["command_id"], batch["query_id"]) == ("sow", "id-sow", "q1")
    assert (batch["topic"], batch["partition"], batch["status"]) == ("orders", 0, "success")
    assert [
        (orjson.loads(r["data"])["id"], r["timestamp"], r["log_offset"]) for r in batch["records"]
    ] == [(1, 1_700_000_000_000, 0), (2, 1_700_000_000_001, 1)]
    assert all(len(r["sow_key"]) == 16 for r in batch["records"])
    assert (end["command"], end["count"], end["status"], end["records"]) == (
        "part_end",
        2,
        "success",
        [],
    )
    assert end["answer_id"] == batch["answer_id"] != ""


async def sow_raw_batch_and_part_end() -> None:
    """A raw batch read from its documented layout alone (struct, as another language would)."""
    setup = Setup()
    await publish(setup, 0, {"id": 1, "a": 1})
    await publish(setup, 1, {"id": 2, "a": 1})
    batch, end = await answer(setup, "sow", batch_size=10, options={"raw": "1"})
    assert (batch["command"], batch["topic"], batch["partition"]) == ("sow_raw", "orders", 0)
    (element,) = batch["records"]
    assert (element["sow_key"], element["timestamp"], element["log_offset"]) == ("", 0, -1)
    data = element["data"]
    version, flags, count, rank = struct.unpack_from(">BBII", data)
    assert (version, flags, count, rank) == (1, 0, 2, 0)
    ends = struct.unpack_from(f">{count}I", data, 10)
    area = data[10 + 4 * count :]
    assert ends[-1] == len(area)
    rows = []
    for i in range(count):
        rec = area[(ends[i - 1] if i else 0) : ends[i]]
        marker, offset, timestamp, key_len = struct.unpack_from(">BqqI", rec)
        assert marker == 0x01
        key = rec[21 : 21 + key_len].decode()
        rows.append((orjson.loads(rec[21 + key_len :])["id"], timestamp, offset, len(key)))
    assert rows == [(1, 1_700_000_000_000, 0, 16), (2, 1_700_000_000_001, 1, 16)]
    assert (end["command"], end["count"], end["answer_id"]) == ("part_end", 2, batch["answer_id"])


async def failed_part_end() -> None:
    setup = Setup()
    (end,) = await answer(setup, "sow", filter="/a = = 1")
    assert (end["command"], end["status"], end["reason"], end["partition"]) == (
        "part_end",
        "failure",
        "bad_filter",
        0,
    )
    assert "position 5" in end["message"]


async def placement_part_end_with_the_watermark() -> None:
    setup = Setup()
    await publish(setup, 0, {"id": 1, "a": 1})
    await publish(setup, 1, {"id": 2, "a": 2})
    batch, end = await answer(setup, "sow_and_subscribe", sub_id="s1", filter="/a = 1")
    assert [orjson.loads(r["data"]) for r in batch["records"]] == [{"id": 1, "a": 1}]
    assert (end["command"], end["count"], end["log_offset"]) == ("part_end", 1, 1)


async def oof_of_a_replace() -> None:
    setup = Setup()
    await publish(setup, 0, {"id": 1, "a": 1})
    await publish(setup, 1, {"id": 2, "a": 2})
    await answer(setup, "sow_and_subscribe", sub_id="s1", filter="/a = 1", sub_options="oof")
    entered, left, end = await answer(
        setup,
        "sow_and_subscribe",
        sub_id="s1",
        filter="/a = 2",
        previous_filter="/a = 1",
        sub_options="oof,replace",
    )
    assert (entered["command"], [orjson.loads(r["data"]) for r in entered["records"]]) == (
        "sow",
        [{"id": 2, "a": 2}],
    )
    assert (left["command"], left["reason"]) == ("oof", "match")
    assert [orjson.loads(r["data"]) for r in left["records"]] == [{"id": 1, "a": 1}]
    assert end["command"] == "part_end"


async def partial_aggregates() -> None:
    setup = Setup()
    await publish(setup, 0, {"id": 1, "a": 1})
    await publish(setup, 1, {"id": 2, "a": 1})
    partial, end = await answer(
        setup, "sow", options={"grouping": "[/a]", "projection": "[/a, COUNT(/id) AS /n]"}
    )
    assert partial["command"] == "partial" and len(partial["records"]) == 1
    assert isinstance(orjson.loads(partial["records"][0]["data"]), dict)
    assert (end["command"], end["count"]) == ("part_end", 2)


async def ack_of_a_log_record() -> None:
    setup = Setup()
    await publish(setup, 3, {"id": 1}, **{h.REPLY_TO: "reply.c1", h.COMMAND_ID: "p1"})
    (ack,) = answers(setup)
    assert (ack["command"], ack["command_id"], ack["partition"], ack["log_offset"]) == (
        "ack",
        "p1",
        0,
        3,
    )
    assert (ack["status"], ack["count"]) == ("success", 1)


async def declare_topic_ack() -> None:
    for problem in (None, "auto-creation is off"):
        setup = Setup(problem=problem)
        declare = command("declare_topic", topic="fresh").encode()
        rec = record(declare).__class__("sowstream.ctl-auto", 0, 0, declare)
        await setup.router.auto_command(rec)
        (ack,) = answers(setup)
        assert (ack["command"], ack["topic"], ack["partition"]) == ("ack", "fresh", 0)
        if problem is None:
            assert (ack["status"], ack["count"], ack["log_offset"]) == ("success", 1, -1)
        else:
            assert (ack["status"], ack["reason"], ack["message"]) == (
                "failure",
                "not_declared",
                problem,
            )


async def queue_answers() -> None:
    setup = Setup()
    await publish(setup, 4, {"id": 7})
    batch, end = await answer(setup, "sow", topic="work")
    (message,) = batch["records"]
    assert (batch["command"], batch["topic"], batch["partition"]) == ("sow", "orders", 0)
    assert (message["sow_key"], message["log_offset"]) == ("orders|0|4", -1)
    assert orjson.loads(message["data"]) == {"id": 7}
    assert (end["command"], end["topic"], end["count"]) == ("part_end", "orders", 1)
    status, end = await answer(setup, "queue_status", topic="work")
    (row,) = status["records"]
    assert (status["command"], status["topic"], row["sow_key"]) == ("sow", "orders", "")
    data = orjson.loads(row["data"])
    assert {k: data.pop(k) for k in ("topic", "depth", "leased")} == {
        "topic": "orders",
        "depth": 1,
        "leased": 0,
    }
    # Published long ago (log time 1_700_000_000_004), nothing leased, no Priority.
    assert data.pop("seconds_behind") > 1e6
    assert data == {}  # no lease, no Priority: left out at zero, as counters are
    # The row is a QueueStatus as schemas/QueueStatus.avsc describes it, defaults filled in.
    status_schema = fastavro.parse_schema(
        fastavro.schema.load_schema(str(ROOT / "schemas" / "QueueStatus.avsc"))
    )
    assert fastavro.validate({**QUEUE_STATUS_DEFAULTS, **orjson.loads(row["data"])}, status_schema)
    (ack,) = await answer(setup, "queue_ack", topic="work", options={"bookmarks": "orders|0|4"})
    assert (ack["command"], ack["topic"], ack["partition"], ack["log_offset"]) == (
        "ack",
        "orders",
        0,
        0,
    )
    assert (ack["status"], ack["count"], orjson.loads(ack["message"])) == (
        "success",
        1,
        {"removed": 1},
    )
    (failed,) = await answer(setup, "queue_ack", topic="work", options={"bookmarks": "nonsense"})
    assert (failed["command"], failed["topic"], failed["status"], failed["reason"]) == (
        "ack",
        "work",
        "failure",
        "invalid",
    )
    assert "nonsense" in failed["message"]


async def status_row() -> None:
    setup = Setup()
    await publish(setup, 0, {"id": 1})
    rows, end = await answer(setup, "status")
    (row,) = rows["records"]
    assert set(orjson.loads(row["data"])) == {
        "topic",
        "partition",
        "worker",
        "sow",
        "watermark",
        "records",
        "warnings",
    }
    assert (end["command"], end["count"]) == ("part_end", 1)


SHAPES = {
    "sow": Shape(
        '`command = "sow"`: a batch of up to `batch_size` records (fewer when the batch would '
        "exceed about 900 kB), each with `sow_key`, `data`, `timestamp` (log time of its last "
        "update, ms) and `log_offset`; `topic` and `partition` say where they come from",
        ("sow", "part_end"),
        sow_batches_and_part_end,
    ),
    "part_end failure": Shape(
        '`command = "part_end"`: that partition has sent all its records (`count` of them), or, '
        'with `status = "failure"`, why it could not',
        ("part_end",),
        failed_part_end,
    ),
    "sow_raw": Shape(
        '`command = "sow_raw"`: the same as a `sow` batch, only as one raw batch (below), for a '
        "command that asked for it with the option `raw = 1`",
        ("sow_raw", "part_end"),
        sow_raw_batch_and_part_end,
    ),
    "placement": Shape(
        "the `part_end` carries `log_offset`: the partition's watermark at the instant the "
        "subscription started there",
        ("sow", "part_end"),
        placement_part_end_with_the_watermark,
    ),
    "oof": Shape(
        "its answer holds `sow` batches for records entering the scope and, with `oof`, `oof` "
        'batches (`reason = "match"`) for records leaving it',
        ("oof",),
        oof_of_a_replace,
    ),
    "partial": Shape(
        '`command = "partial"`: for an aggregated query, one record whose `data` is a JSON '
        "object of partial aggregates per group",
        ("partial",),
        partial_aggregates,
    ),
    "ack": Shape(
        "An `ack` carries the `partition` and `log_offset` of the log record it answers",
        ("ack",),
        ack_of_a_log_record,
    ),
    "declare_topic": Shape(
        "the engine answers with an `ack` (`count` 1) once the log exists",
        ("ack",),
        declare_topic_ack,
    ),
    "queue": Shape(
        'Each partition answers with one `Reply` with `command = "ack"`, the *underlying '
        "topic's* name in `topic` and its `partition`",
        ("ack", "sow", "part_end"),
        queue_answers,
    ),
    "status": Shape(
        "is answered by each partition's owner with one `sow` reply whose record's `data` is a "
        "JSON object",
        ("sow", "part_end"),
        status_row,
    ),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_documented_answer_is_what_the_engine_sends(name: str) -> None:
    shape = SHAPES[name]
    assert flat(shape.documented) in flat(DOC), (
        f"docs/protocol.md no longer says: {shape.documented}"
    )
    asyncio.run(shape.check())


def test_every_reply_kind_the_documentation_lists_has_a_shape_here() -> None:
    replies = DOC[DOC.index("## Replies") : DOC.index("## Subscriptions")]
    listed = set(re.findall(r'^\* `command = "(\w+)"`', replies, flags=re.MULTILINE))
    assert listed == {"sow", "sow_raw", "part_end", "ack", "oof", "partial"}
    assert listed <= {kind for shape in SHAPES.values() for kind in shape.commands}
