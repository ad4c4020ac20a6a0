"""The fence of queue ack answers against a real group coordinator: a heartbeat of the
generation a partition was held under is answered as current until the group moves on."""

from __future__ import annotations

import asyncio
import types
import uuid

from aiokafka import AIOKafkaConsumer
from confluent_kafka.admin import AdminClient, NewTopic

from sowstream.engine.runtime import heartbeat_at


def make_topic(bootstrap: str) -> str:
    name = f"fence-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(name, 2, 1)]).values():
        fut.result(30)
    return name


async def assigned(consumer: AIOKafkaConsumer, *, after: int = -1) -> int:
    """The consumer's generation once it holds partitions in a generation later than ``after``."""
    for _ in range(300):
        await consumer.getmany(timeout_ms=100)
        generation = int(consumer._coordinator.generation)
        if consumer.assignment() and generation > after:
            return generation
    raise AssertionError("the consumer was never assigned partitions")


def test_a_generation_stays_current_until_the_group_moves_on(kafka_bootstrap: str) -> None:
    topic = make_topic(kafka_bootstrap)
    group = f"fence-{uuid.uuid4().hex[:8]}"

    def consumer() -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            topic,
            bootstrap_servers=kafka_bootstrap,
            group_id=group,
            heartbeat_interval_ms=300,
            session_timeout_ms=6000,
        )

    async def scenario() -> list[bool]:
        first, second = consumer(), consumer()
        await first.start()
        try:
            before = await assigned(first)
            coordinator = first._coordinator
            answers = [await heartbeat_at(coordinator, before)]
            # A member the coordinator does not know (one the group dropped) is not current.
            dropped = types.SimpleNamespace(
                member_id="dropped-member",
                group_id=coordinator.group_id,
                _send_req=coordinator._send_req,
            )
            answers.append(await heartbeat_at(dropped, before))
            await second.start()
            try:
                # A second member joins: the group moves to a new generation and shares the
                # partitions out again.
                after = await assigned(first, after=before)
                await assigned(second)
                answers.append(await heartbeat_at(coordinator, before))
                answers.append(await heartbeat_at(coordinator, after))
            finally:
                await second.stop()
        finally:
            await first.stop()
        return answers

    assert asyncio.run(scenario()) == [True, False, False, True]
