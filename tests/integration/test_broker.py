"""The embedded local broker, and the partitioner pitfall: every client must agree on partitions."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest
from aiokafka.partitioner import DefaultPartitioner
from confluent_kafka import Consumer, Producer, murmur2

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
