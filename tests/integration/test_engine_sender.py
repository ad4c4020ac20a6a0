"""The worker's sender keeps producing to every topic it uses (aiokafka metadata pitfall)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition

from sowstream.engine.app import FaustSender
from sowstream.wire.kafka import TopicSpec, ensure_topics

pytestmark = pytest.mark.integration


class _App:
    """What FaustSender uses of a faust app: its aiokafka producer (a real one here)."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = self
        self._producer = producer

    def _ensure_producer(self) -> AIOKafkaProducer:
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
