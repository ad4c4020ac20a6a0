"""A client of the wire protocol with nothing of sowstream's but the schema files: raw
confluent-kafka and fastavro, following docs/protocol.md, as a client in another language is."""

from __future__ import annotations

import io
import time
import uuid
from pathlib import Path
from typing import Any

import fastavro
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.engine import EngineProcesses

ROOT = Path(__file__).resolve().parents[2]


def schema(name: str) -> Any:
    return fastavro.parse_schema(
        fastavro.schema.load_schema(str(ROOT / "schemas" / f"{name}.avsc"))
    )


COMMAND, REPLY, SUBSCRIPTION = schema("Command"), schema("Reply"), schema("Subscription")


def avro(parsed: Any, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, record)
    return buf.getvalue()


class RawClient:
    """A client of the wire protocol with nothing of sowstream's: a reply topic of its own,
    Avro commands and registrations out, replies and live messages in."""

    def __init__(self, engine: EngineProcesses) -> None:
        self.prefix = engine.prefix
        self.reply_to = f"{engine.prefix}.reply.raw-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": engine.bootstrap})
        for fut in admin.create_topics([NewTopic(self.reply_to, 1, 1)]).values():
            fut.result(30)
        self.producer = Producer(
            {"bootstrap.servers": engine.bootstrap, "partitioner": "murmur2_random"}
        )
        self.consumer = Consumer(
            {
                "bootstrap.servers": engine.bootstrap,
                "group.id": self.reply_to,
                "enable.auto.commit": False,
                "log_level": 3,
            }
        )
        self.consumer.assign([TopicPartition(self.reply_to, 0, 0)])

    def close(self) -> None:
        self.consumer.close()

    def command(
        self,
        name: str,
        topic: str,
        ctl: str,
        partition: int = 0,
        headers: dict[str, str] | None = None,
        extra: bytes = b"",
        command_id: str | None = None,
        **fields: Any,
    ) -> str:
        """Write a Command (its defaults as the schema gives them) to ``ctl``'s ``partition``;
        returns its command id."""
        command_id = command_id or uuid.uuid4().hex
        record = {
            "command": name,
            "command_id": command_id,
            "query_id": "q",
            "reply_to": self.reply_to,
            "topic": topic,
            **fields,
        }
        self.producer.produce(
            f"{self.prefix}.{ctl}",
            avro(COMMAND, record) + extra,
            partition=partition,
            headers=headers or {},
        )
        self.producer.flush(30)
        return command_id

    def register(self, topic: str, headers: dict[str, str] | None = None, **fields: Any) -> str:
        """Write a Subscription record to the registry; returns its sub_id."""
        sub_id = uuid.uuid4().hex[:8]
        record = {
            "sub_id": sub_id,
            "reply_to": self.reply_to,
            "topic": topic,
            "command": "subscribe",
            "options": "",
            "identity": "",
            **fields,
        }
        self.producer.produce(
            f"{self.prefix}.subs",
            avro(SUBSCRIPTION, record),
            key=f"{self.reply_to}|{sub_id}|{topic}".encode(),
            headers=headers or {},
        )
        self.producer.flush(30)
        return sub_id

    def replies(self, command_id: str, count: int, timeout: float = 30) -> list[dict[str, Any]]:
        """The first ``count`` Reply records for ``command_id`` (failing if they do not come)."""
        found: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while len(found) < count:
            assert time.monotonic() < deadline, f"{len(found)} of {count} replies came: {found}"
            msg = self.consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            headers = dict(msg.headers() or [])
            if "sow.cmd" in headers:
                continue
            assert headers.get("sow.schema") == b"1"
            reply = fastavro.schemaless_reader(io.BytesIO(msg.value()), REPLY, None)
            assert isinstance(reply, dict)
            if reply["command_id"] == command_id:
                found.append(reply)
        return found

    def live(self, sub_id: str, timeout: float = 30) -> tuple[dict[str, str], str]:
        """The first live message for ``sub_id``: its headers and its value as text."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            headers = {k: (v or b"").decode() for k, v in msg.headers() or []}
            if headers.get("sow.sub_id") == sub_id:
                return headers, (msg.value() or b"").decode()
        raise AssertionError(f"no message for subscription {sub_id}")

    def replies_within(self, command_id: str, seconds: float) -> list[dict[str, Any]]:
        """Every Reply record for ``command_id`` arriving within ``seconds``."""
        found: list[dict[str, Any]] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            msg = self.consumer.poll(0.2)
            if msg is None or msg.error() or "sow.cmd" in dict(msg.headers() or []):
                continue
            reply = fastavro.schemaless_reader(io.BytesIO(msg.value()), REPLY, None)
            assert isinstance(reply, dict)
            if reply["command_id"] == command_id:
                found.append(reply)
        return found
