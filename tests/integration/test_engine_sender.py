"""The worker's sender keeps producing to every topic it uses (aiokafka metadata pitfall)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaPartition

from sowstream.engine.runtime import FaustSender
from sowstream.wire.kafka import TopicSpec, ensure_topics

pytestmark = pytest.mark.integration


class _App:
    """What FaustSender uses of a faust app: its aiokafka producer (a real one here)."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = self
        self._producer = producer

    def _ensure_producer(self) -> AIOKafkaProducer:
        return self._producer

    def replies(self) -> AIOKafkaProducer:
        return self._producer


async def _leaders_after_new_topic(bootstrap: str, old: str, new: str) -> Any:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        # Nothing is tracked yet, so a refresh covers every topic: `old` becomes known without
        # being tracked (as the worker's changelogs are after faust's start-up).
        for _ in range(50):
            if old in producer.client.cluster.topics():
                break
            await producer.client.force_metadata_update()
            await asyncio.sleep(0.1)
        assert old in producer.client.cluster.topics()
        sender = FaustSender(_App(producer))  # type: ignore[arg-type]
        await (await sender.send(old, b"first"))  # type: ignore[misc]
        # A topic created later (a new client's reply topic): the first send to it refreshes
        # metadata for the tracked topics only.
        ensure_topics(bootstrap, [TopicSpec(new, 1)])
        await (await sender.send(new, b"other"))  # type: ignore[misc]
        await producer.client.force_metadata_update()
        leader = producer.client.cluster.leader_for_partition(TopicPartition(old, 0))
        # And a send to `old` still goes out, rather than waiting for a leader for ever.
        delivered = await asyncio.wait_for(await sender.send(old, b"again"), 10)  # type: ignore[arg-type]
        return leader, delivered
    finally:
        await producer.stop()


def test_a_topic_sent_to_keeps_its_leader_when_another_topic_is_added(
    kafka_bootstrap: str,
) -> None:
    old, new = f"sender-{uuid.uuid4().hex[:8]}-a", f"sender-{uuid.uuid4().hex[:8]}-b"
    ensure_topics(kafka_bootstrap, [TopicSpec(old, 1)])
    leader, delivered = asyncio.run(_leaders_after_new_topic(kafka_bootstrap, old, new))
    assert leader is not None and leader >= 0, f"the producer lost the leader of {old}"
    assert delivered.topic == old


async def _send_many(
    bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None]]
) -> list[tuple[int, int]]:
    # Small batches (4 KiB), so the records need many of them, as a changelog batch does.
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_batch_size=4096)
    await producer.start()
    try:
        sent = await FaustSender(_App(producer)).send_many(topic, 1, records)  # type: ignore[arg-type]
        done = await asyncio.gather(*(fut for fut, _ in sent))
        return [(meta.offset, count) for meta, (_, count) in zip(done, sent, strict=True)]
    finally:
        await producer.stop()


def test_send_many_writes_the_records_in_order_in_batches(kafka_bootstrap: str) -> None:
    """The changelog's batched sends: every record once, in order, on the partition asked
    for, and each batch's first offset and count tell where its last record is."""
    topic = f"sender-{uuid.uuid4().hex[:8]}-many"
    ensure_topics(kafka_bootstrap, [TopicSpec(topic, 2)])
    records = [(f"k{i}".encode(), None if i % 7 == 0 else b"v" * (i % 300)) for i in range(2000)]
    batches = asyncio.run(_send_many(kafka_bootstrap, topic, records))
    assert len(batches) > 1 and sum(count for _, count in batches) == len(records)
    # Contiguous: each batch starts where the one before ended.
    ends = [offset + count for offset, count in batches]
    assert [offset for offset, _ in batches[1:]] == ends[:-1] and ends[-1] == len(records)
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": uuid.uuid4().hex,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([KafkaPartition(topic, 1, 0)])
    read: list[tuple[bytes, bytes | None]] = []
    deadline = time.monotonic() + 30
    while len(read) < len(records) and time.monotonic() < deadline:
        for msg in consumer.consume(1000, 1.0):
            if not msg.error():
                read.append((msg.key(), msg.value()))
    consumer.close()
    assert read == records


async def _send_replies(bootstrap: str, topic: str, messages: list[bytes]) -> int:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_batch_size=4096)
    await producer.start()
    try:
        sender = FaustSender(_App(producer))  # type: ignore[arg-type]
        # The first reply learns the topic's metadata; the rest go out in batches.
        first = await sender.send_replies(topic, [(messages[0], [("sow.n", b"0")])])
        rest = await sender.send_replies(
            topic, [(m, [("sow.n", str(i).encode())]) for i, m in enumerate(messages[1:], 1)]
        )
        await asyncio.gather(*first, *rest)
        return len(rest)
    finally:
        await producer.stop()


def test_send_replies_writes_a_clients_replies_in_order_with_their_headers(
    kafka_bootstrap: str,
) -> None:
    """Subscription messages batched per reply topic arrive once each, in order, headers kept."""
    topic = f"sender-{uuid.uuid4().hex[:8]}-replies"
    ensure_topics(kafka_bootstrap, [TopicSpec(topic, 1)])
    messages = [b"m" * (i % 200) + str(i).encode() for i in range(500)]
    batches = asyncio.run(_send_replies(kafka_bootstrap, topic, messages))
    assert 1 < batches < len(messages) - 1  # batched, and in more than one Kafka batch
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": uuid.uuid4().hex,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([KafkaPartition(topic, 0, 0)])
    read: list[tuple[bytes | None, Any]] = []
    deadline = time.monotonic() + 30
    while len(read) < len(messages) and time.monotonic() < deadline:
        for msg in consumer.consume(1000, 1.0):
            if not msg.error():
                read.append((msg.value(), msg.headers()))
    consumer.close()
    assert [value for value, _ in read] == messages
    assert [headers for _, headers in read] == [[("sow.n", str(i).encode())] for i in range(500)]
