"""Kafka share groups (KIP-932) as the queue benchmark's peer: the same messages acquired and
acknowledged ACCEPT one record at a time by confluent-kafka's ``ShareConsumer`` (explicit
acknowledgement mode, a commit after every poll that returned records).

The Python client's share consumer is a preview (confluent-kafka 2.15+); it works against the
embedded 4.2 broker provided the group starts from the earliest offset (a new share group starts
at the latest offset by default, so records produced while its partitions are still being
initialised are never delivered) and the members have their partitions before the clock starts.
"""

from __future__ import annotations

import threading
import time
import uuid

import orjson
from confluent_kafka import KafkaException, Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from bench.common import paced
from sowstream.wire.kafka import TopicSpec, ensure_topics, producer_config

WARM_TIMEOUT = 60.0
DONE_TIMEOUT = 120.0


def start_at_earliest(bootstrap: str, group: str) -> None:
    """Set the share group's ``share.auto.offset.reset`` to earliest before any member joins."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry(
                "share.auto.offset.reset",
                "earliest",
                incremental_operation=AlterConfigOpType.SET,
            )
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def share_consumer(bootstrap: str, group: str, topic: str) -> ShareConsumer:
    """A member of ``group`` that acknowledges each record explicitly."""
    consumer = ShareConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
            "fetch.wait.max.ms": 10,  # as the bare consumer group and the sowstream client
            "log_level": 3,  # the "preview" warning on every start is noise here
        }
    )
    consumer.subscribe([topic])
    return consumer


def _produce(producer: Producer, topic: str, value: bytes, key: bytes | None = None) -> None:
    while True:
        try:
            producer.produce(topic, value, key=key)
            break
        except BufferError:  # the local queue is full: let it drain
            producer.poll(0.05)
    producer.poll(0)


def share_group_rate(
    bootstrap: str, topic: str, messages: int, members: int, partitions: int
) -> float:
    """Records/s ``members`` share consumers acquire and acknowledge ACCEPT, timed from the
    first of ``messages`` produced to the last acknowledged, once every member has had a
    warm-up record. Each record is counted once, however often it is delivered.

    Not from the first delivery, as the queue rows are: a share consumer is handed hundreds of
    records per poll, so a few thousand can arrive in one or two polls and first-to-last says
    nothing. Counting the producing makes the peer look slower, never faster."""
    ensure_topics(bootstrap, [TopicSpec(topic, partitions, {})], replication_factor=1)
    group = f"share-{uuid.uuid4().hex[:8]}"
    start_at_earliest(bootstrap, group)
    lock = threading.Lock()
    warmed: set[int] = set()
    seen: set[tuple[int, int]] = set()
    times: list[float] = []
    finished = threading.Event()
    counting = threading.Event()
    failures: list[BaseException] = []

    def member(index: int) -> None:
        consumer = share_consumer(bootstrap, group, topic)
        try:
            while not finished.is_set():
                batch = consumer.poll(0.1)
                fresh: list[tuple[int, int]] = []
                for msg in batch:
                    if msg.error():
                        continue
                    consumer.acknowledge(msg)  # ACCEPT
                    if msg.key() is not None:  # the warm-up records have no key
                        fresh.append((msg.partition(), msg.offset()))  # type: ignore[arg-type]
                if len(batch):
                    consumer.commit_async()
                with lock:
                    if len(batch):
                        warmed.add(index)
                    if fresh and counting.is_set():
                        seen.update(fresh)
                        if len(seen) >= messages:
                            times.append(time.perf_counter())
                            finished.set()
        except KafkaException as exc:  # reported by the caller, not lost in a thread
            failures.append(exc)
            finished.set()
        finally:
            consumer.close()

    threads = [threading.Thread(target=member, args=(i,)) for i in range(members)]
    for t in threads:
        t.start()
    producer = Producer(producer_config(bootstrap, {}))
    try:
        # Warm-up records on every partition until each member has been given some: the
        # group's partitions are assigned and initialised before the clock starts.
        deadline = time.monotonic() + WARM_TIMEOUT
        while time.monotonic() < deadline and not failures:
            with lock:
                if len(warmed) >= min(members, partitions):
                    break
            for p in range(partitions):
                producer.produce(topic, b"{}", partition=p)
            producer.flush()
            time.sleep(0.5)
        time.sleep(0.5)
        counting.set()
        times.append(time.perf_counter())
        for n in range(messages):
            _produce(producer, topic, orjson.dumps({"n": n, "pad": "x" * 64}), str(n).encode())
        producer.flush()
        finished.wait(DONE_TIMEOUT)
    finally:
        finished.set()
        for t in threads:
            t.join()
    if failures:
        raise failures[0]
    if len(times) < 2:
        raise RuntimeError(
            f"the share group received {len(seen)} of {messages} records in {DONE_TIMEOUT:.0f}s"
        )
    return messages / max(times[-1] - times[0], 1e-3)


def share_group_latency(
    bootstrap: str, topic: str, rate: float, seconds: float, partitions: int
) -> tuple[list[float], float]:
    """Produce→delivery latencies (ms) to one share consumer at ``rate``, and the produce rate
    achieved; produced without linger, as the queue's publisher and bare Kafka's."""
    ensure_topics(bootstrap, [TopicSpec(topic, partitions, {})], replication_factor=1)
    group = f"share-{uuid.uuid4().hex[:8]}"
    start_at_earliest(bootstrap, group)
    latencies: list[float] = []
    stop = threading.Event()
    warmed = threading.Event()

    def consume() -> None:
        consumer = share_consumer(bootstrap, group, topic)
        try:
            while not stop.is_set():
                batch = consumer.poll(0.1)
                now = time.time()
                for msg in batch:
                    if msg.error():
                        continue
                    consumer.acknowledge(msg)
                    sent = orjson.loads(msg.value() or b"{}").get("sent")
                    if sent is None:
                        warmed.set()
                    else:
                        latencies.append((now - sent) * 1000)
                if len(batch):
                    consumer.commit_async()
        finally:
            consumer.close()

    reader = threading.Thread(target=consume)
    reader.start()
    producer = Producer(producer_config(bootstrap, {"linger.ms": "0"}))
    try:
        deadline = time.monotonic() + WARM_TIMEOUT
        while not warmed.wait(0.5) and time.monotonic() < deadline:
            for p in range(partitions):
                producer.produce(topic, b"{}", partition=p)
            producer.flush()
        achieved = paced(
            lambda _: _produce(
                producer, topic, orjson.dumps({"sent": time.time(), "pad": "x" * 64})
            ),
            rate,
            seconds,
        )
        producer.flush()
        time.sleep(2.0)
    finally:
        stop.set()
        reader.join()
    return latencies, achieved
