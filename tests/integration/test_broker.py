"""The embedded local broker, and the partitioner pitfall: every client must agree on partitions."""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

import pytest
from aiokafka.partitioner import DefaultPartitioner
from confluent_kafka import AcknowledgeType, Consumer, Producer, ShareConsumer, murmur2
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from sowstream.broker.local import LocalBroker, answers
from sowstream.errors import BrokerError
from sowstream.wire.kafka import TopicSpec, ensure_topics, producer_config

pytestmark = pytest.mark.integration


def test_local_broker_lifecycle(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path / "kafka")
    assert not broker.status().running
    bootstrap = broker.start()
    try:
        status = broker.status()
        assert status.running and status.bootstrap == bootstrap and status.pid
        assert broker.start() == bootstrap  # idempotent: the running broker is reused
        ensure_topics(bootstrap, [TopicSpec("lifecycle", 2)])
        producer = Producer(producer_config(bootstrap))
        producer.produce("lifecycle", key=b"k", value=b"hello")
        assert producer.flush(10) == 0
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": uuid.uuid4().hex,
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe(["lifecycle"])
        got = None
        for _ in range(40):
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got = msg.value()
                break
        consumer.close()
        assert got == b"hello"
    finally:
        assert broker.stop()
    assert not broker.status().running
    assert not answers(bootstrap, timeout=1.0)
    port = int(bootstrap.rsplit(":", 1)[1])
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))  # nothing listens there any more
    assert not broker.stop()  # stopping twice is harmless


def _share_member(bootstrap: str, group: str, topic: str) -> ShareConsumer:
    member = ShareConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
            "log_level": 3,
        }
    )
    member.subscribe([topic])
    return member


def test_local_broker_serves_share_groups(tmp_path: Path) -> None:
    """Kafka 4.2 share groups (KIP-932) on the embedded broker: two members of one share group
    acquire every record once between them, acknowledge each ACCEPT, and an accepted record is
    not delivered again (the queue benchmark's peer runs on this)."""
    broker = LocalBroker(tmp_path / "kafka")
    bootstrap = broker.start()
    try:
        topic, group = "shared", f"share-{uuid.uuid4().hex[:8]}"
        ensure_topics(bootstrap, [TopicSpec(topic, 2)])
        admin = AdminClient({"bootstrap.servers": bootstrap})
        earliest = ConfigEntry(
            "share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET
        )
        resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[earliest])
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(30)
        producer = Producer(producer_config(bootstrap))
        for n in range(30):
            producer.produce(topic, key=str(n).encode(), value=str(n).encode())
        assert producer.flush(10) == 0
        members = [_share_member(bootstrap, group, topic) for _ in range(2)]
        deliveries: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(deliveries) < 30 and time.monotonic() < deadline:
            for member in members:
                batch = member.poll(0.2)
                for msg in batch:
                    assert msg.error() is None
                    deliveries.append(msg.value() or b"")
                    member.acknowledge(msg, AcknowledgeType.ACCEPT)
                if len(batch):
                    assert all(e is None for e in member.commit_sync(10).values())
        assert sorted(deliveries) == sorted(str(n).encode() for n in range(30))
        for member in members:
            member.close()
        # A new member is given the one record produced since, none of the accepted ones.
        again = _share_member(bootstrap, group, topic)
        producer.produce(topic, key=b"late", value=b"late")
        assert producer.flush(10) == 0
        later: list[bytes] = []
        deadline = time.monotonic() + 60
        while b"late" not in later and time.monotonic() < deadline:
            for msg in again.poll(0.3):
                later.append(msg.value() or b"")
                again.acknowledge(msg)
        again.close()
        assert later == [b"late"]
    finally:
        assert broker.stop()


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(BrokerError, match=f"port {port} .* already in use"):
            LocalBroker(tmp_path / "kafka").start(port=port)


def test_corrupt_data_dir_fails_with_the_log(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path / "kafka")
    broker.data_dir.mkdir(parents=True)
    (broker.data_dir / "meta.properties").write_text("this is not a kafka meta file\n")
    with pytest.raises(BrokerError, match=r"exited|did not answer"):
        broker.start(timeout=60)
    assert not broker.status().running


def test_confluent_murmur2_partitions_like_aiokafka(kafka_bootstrap: str) -> None:
    """librdkafka defaults to CRC32; with murmur2_random it agrees with faust's aiokafka."""
    topic = f"partitioner-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [TopicSpec(topic, 8)])
    producer = Producer(producer_config(kafka_bootstrap))
    landed: dict[bytes, int] = {}

    def delivered(err: object, msg: object) -> None:
        assert err is None
        landed[msg.key()] = msg.partition()  # type: ignore[attr-defined]

    keys = [f"key-{i}".encode() for i in range(300)]
    for key in keys:
        producer.produce(topic, key=key, value=b"x", on_delivery=delivered)
    assert producer.flush(20) == 0
    aiokafka_partition = DefaultPartitioner()
    partitions = list(range(8))
    for key in keys:
        expected = aiokafka_partition(key, partitions, partitions)
        assert landed[key] == expected == murmur2(key, 8)
    assert len(set(landed.values())) == 8
    # the pitfall is real: librdkafka's default partitioner disagrees for most keys
    default = Producer({"bootstrap.servers": kafka_bootstrap})
    crc: dict[bytes, int] = {}
    for key in keys[:50]:
        default.produce(
            topic,
            key=key,
            value=b"x",
            on_delivery=lambda e, m: crc.__setitem__(m.key(), m.partition()),
        )
    default.flush(20)
    assert sum(crc[k] != landed[k] for k in keys[:50]) > 25
