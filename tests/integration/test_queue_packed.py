"""Packed leases on a real broker: a subscriber that asks for them and one that does not (an
older client) share a queue, and every message is leased to one of them and acknowledged once;
each reply topic holds the form its client asked for, and a lease too big to pack comes as a
record of its own, which the packing client reads too.

One worker; no LeasePeriod, so a lease never lapses and any second delivery is a fault.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from sowstream.client import Client, Message
from sowstream.wire import headers as h
from sowstream.wire.leases import PUBLISH_PACKED
from tests.support.engine import EngineProcesses, running_engine
from tests.support.messages import take

pytestmark = pytest.mark.integration

PLAIN = [{"Name": "pk", "Partitions": 2}, {"Name": "big", "Partitions": 1}]
QUEUES: list[dict[str, Any]] = [
    {"Name": "PK", "UnderlyingTopic": "pk", "MaxPerSubscriptionBacklog": 50},
    {"Name": "BIG", "UnderlyingTopic": "big", "MaxPerSubscriptionBacklog": 10},
]
MESSAGES = 600


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    with running_engine(
        kafka_bootstrap,
        tmp_path_factory.mktemp("packed"),
        [],
        workers=("w1",),
        plain_topics=PLAIN,
        queues=QUEUES,
    ) as procs:
        yield procs


def reply_commands(client: Client) -> list[str]:
    """``sow.cmd`` of every live message on the client's reply topic so far, read with a bare
    consumer (the engine's answers to commands carry none)."""
    consumer = Consumer(
        {"bootstrap.servers": client.bootstrap, "group.id": f"peek-{uuid.uuid4().hex}"}
    )
    try:
        tp = TopicPartition(client.reply_topic, 0, 0)
        _, end = consumer.get_watermark_offsets(tp, timeout=10)
        consumer.assign([tp])
        commands: list[str] = []
        seen = 0
        deadline = time.monotonic() + 20
        while seen < end and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.5):
                if msg.error():
                    continue
                seen = (msg.offset() or 0) + 1
                command = h.header_map(msg.headers()).get(h.COMMAND)
                if command is not None:
                    commands.append(command)
        assert seen >= end, f"read {seen} of {end} records of {client.reply_topic}"
        return commands
    finally:
        consumer.close()


def test_a_packed_and_an_unpacked_subscriber_each_message_leased_and_acked_once(
    engine: EngineProcesses, publisher: Client
) -> None:
    got: dict[str, list[Message]] = {"packed": [], "plain": []}
    lock = threading.Lock()

    def keep(kind: str) -> Any:
        def handle(msg: Message) -> None:
            with lock:
                got[kind].append(msg)

        return handle

    with engine.client() as packed, engine.client(packed_leases=False) as plain:
        subs = {
            kind: c.subscribe(
                "PK",
                options="max_backlog=50",
                auto_ack=True,
                ack_batch_size=10,
                on_message=keep(kind),
            )
            for kind, c in (("packed", packed), ("plain", plain))
        }
        for sub in subs.values():
            assert sub.wait_processed(20) == 50
        for n in range(MESSAGES):
            publisher.publish("pk", {"n": n})
        publisher.flush()
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < MESSAGES and time.monotonic() < deadline:
            for sub in subs.values():
                sub.flush_acks()  # the last partial batches free their backlog units
            time.sleep(0.2)
        time.sleep(1.5)  # a second delivery of anything would arrive meanwhile
        for sub in subs.values():
            sub.flush_acks(wait=True)
        status = packed.queue_status("PK")
        packed_commands, plain_commands = reply_commands(packed), reply_commands(plain)
        for sub in subs.values():
            sub.close()

    numbers = [m.json()["n"] for kind in got for m in got[kind]]
    assert sorted(numbers) == list(range(MESSAGES)), "each message once, none missing"
    assert got["packed"] and got["plain"], "both subscribers leased"
    for msg in got["packed"] + got["plain"]:
        assert msg.topic == "PK" and msg.deliveries == 1 and msg.lease_expires is None
        topic, partition, offset = msg.bookmark.split("|")
        assert topic == "pk" and partition in ("0", "1") and int(offset) >= 0
    assert (status["depth"], status["acked"], status["delivered"]) == (0, MESSAGES, MESSAGES)
    # Each client got the form it asked for; the packing one in fewer records than messages.
    assert PUBLISH_PACKED not in plain_commands
    assert plain_commands.count(h.PUBLISH) == len(got["plain"])
    assert h.PUBLISH not in packed_commands
    assert 0 < packed_commands.count(PUBLISH_PACKED) < len(got["packed"])


def test_a_lease_too_big_to_pack_comes_alone_and_the_packing_client_reads_both_forms(
    client: Client, publisher: Client
) -> None:
    sub = client.subscribe("BIG", options="max_backlog=10")
    assert sub.wait_processed(20) == 10
    bodies = [{"n": 0}, {"n": 1, "pad": "x" * 920_000}, {"n": 2}, {"n": 3}]
    for body in bodies:
        publisher.publish("big", body)
    publisher.flush()
    got = take(sub, len(bodies), timeout=30)
    assert [m.json() for m in got] == bodies
    client.ack("BIG", [m.bookmark for m in got])
    commands = reply_commands(client)
    assert commands.count(h.PUBLISH) == 1 and PUBLISH_PACKED in commands
    assert not sub.damaged
    sub.close()
