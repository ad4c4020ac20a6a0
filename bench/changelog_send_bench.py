"""Event-loop CPU per changelog record: aiokafka's send per record against its batches.

Run with ``python -m bench.changelog_send_bench`` (uses $SOWSTREAM_BOOTSTRAP or starts the
embedded local broker). Sends the same records (about 160 bytes, four partitions) both ways
through an aiokafka producer configured like faust's (acks=all), twice each, and prints the
main thread's CPU and the wall clock per record until Kafka has acknowledged them all. The
worker's changelog sends went from the first way to the second (``FaustSender.send_many``).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from contextlib import ExitStack

from aiokafka import AIOKafkaProducer

from bench.common import bench_bootstrap
from sowstream.wire.kafka import TopicSpec, ensure_topics

PARTITIONS = 4
VALUE = b"\x01" + b"x" * 140


async def per_record(producer: AIOKafkaProducer, topic: str, keys: list[bytes]) -> None:
    futures = []
    for i, key in enumerate(keys):
        futures.append(await producer.send(topic, VALUE, key=key, partition=i % PARTITIONS))
        if i % 256 == 0:
            await asyncio.sleep(0)  # as RocksPartition.replicate yields
    await asyncio.gather(*futures)


async def batched(producer: AIOKafkaProducer, topic: str, keys: list[bytes]) -> None:
    futures = []
    batches = {p: producer.create_batch() for p in range(PARTITIONS)}
    for i, key in enumerate(keys):
        p = i % PARTITIONS
        if batches[p].append(key=key, value=VALUE, timestamp=None) is None:
            futures.append(await producer.send_batch(batches[p], topic, partition=p))
            batches[p] = producer.create_batch()
            batches[p].append(key=key, value=VALUE, timestamp=None)
    for p, batch in batches.items():
        if batch.record_count():
            futures.append(await producer.send_batch(batch, topic, partition=p))
    await asyncio.gather(*futures)


async def timed(bootstrap: str, topic: str, keys: list[bytes], batch: bool) -> tuple[float, float]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=-1, linger_ms=0)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"warm-up", partition=0)
        cpu, wall = time.thread_time(), time.perf_counter()
        await (batched if batch else per_record)(producer, topic, keys)
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    finally:
        await producer.stop()
    return cpu / len(keys) * 1e6, wall / len(keys) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=100_000)
    args = parser.parse_args()
    keys = [f"key{i:012d}".encode() for i in range(args.records)]
    with ExitStack() as stack:
        bootstrap = bench_bootstrap(stack)
        ensure_topics(bootstrap, [TopicSpec("send-one", PARTITIONS), TopicSpec("send-batch", 4)])
        for run in (1, 2):
            for label, topic, batch in (
                ("one send per record", "send-one", False),
                ("aiokafka batches", "send-batch", True),
            ):
                cpu, wall = asyncio.run(timed(bootstrap, topic, keys, batch))
                print(f"run {run} {label:20s} {cpu:5.2f} µs CPU, {wall:6.2f} µs wall per record")


if __name__ == "__main__":
    main()
