"""How long a reply waits for Kafka's acknowledgement while changelog batches stream: one
aiokafka producer for both (the worker before issue 24) against a producer of its own.

Run with ``python -m bench.reply_queue_bench`` (uses $SOWSTREAM_BOOTSTRAP or starts the embedded
local broker). A changelog writer sends 4 partitions of 160-byte records in aiokafka batches as
fast as they are acknowledged (as ``RocksPartition.replicate`` does, 512 KiB batches like the
worker's producer); meanwhile a reply of 200 bytes is sent every 5 ms and its send → ack time
taken. Both producers are configured like faust's (acks=all, linger 0).
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
VALUE = b"\x01" + b"x" * 160
BATCH_BYTES = 512 * 1024


async def changelog(producer: AIOKafkaProducer, topic: str, stop: asyncio.Event) -> int:
    """Send changelog batches of ~2,000 records per partition until ``stop``; records sent."""
    sent = 0
    while not stop.is_set():
        futures = []
        for p in range(PARTITIONS):
            batch = producer.create_batch()
            for i in range(2_000):
                if batch.append(key=b"k%d" % i, value=VALUE, timestamp=None) is None:
                    break
                sent += 1
            futures.append(await producer.send_batch(batch, topic, partition=p))
        await asyncio.gather(*futures)
    return sent


async def replies(producer: AIOKafkaProducer, topic: str, seconds: float) -> list[float]:
    """Send a reply every 5 ms for ``seconds``; each one's send → acknowledgement in ms."""
    waits: list[float] = []
    pending: list[asyncio.Task[None]] = []

    async def one() -> None:
        t0 = time.perf_counter()
        await (await producer.send(topic, b"r" * 200))
        waits.append((time.perf_counter() - t0) * 1000)

    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pending.append(asyncio.create_task(one()))
        await asyncio.sleep(0.005)
    await asyncio.gather(*pending)
    return waits


async def run(bootstrap: str, shared: bool, seconds: float) -> tuple[list[float], int]:
    def producer() -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks=-1, linger_ms=0, max_batch_size=BATCH_BYTES
        )

    main = producer()
    other = main if shared else producer()
    await main.start()
    if not shared:
        await other.start()
    try:
        await main.send_and_wait("reply-queue-changelog", b"warm-up", partition=0)
        await other.send_and_wait("reply-queue-replies", b"warm-up")
        stop = asyncio.Event()
        writer = asyncio.create_task(changelog(main, "reply-queue-changelog", stop))
        waits = await replies(other, "reply-queue-replies", seconds)
        stop.set()
        return waits, await writer
    finally:
        await main.stop()
        if not shared:
            await other.stop()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with ExitStack() as stack:
        bootstrap = bench_bootstrap(stack)
        ensure_topics(
            bootstrap,
            [TopicSpec("reply-queue-changelog", PARTITIONS), TopicSpec("reply-queue-replies", 1)],
        )
        for round_ in range(1, args.rounds + 1):
            for label, shared in (("one producer", True), ("a reply producer", False)):
                waits, records = asyncio.run(run(bootstrap, shared, args.seconds))
                print(
                    f"round {round_} {label:17s} reply ack p50 {pct(waits, 0.5):6.1f} ms, "
                    f"p99 {pct(waits, 0.99):6.1f} ms ({len(waits)} replies); changelog "
                    f"{records / args.seconds:,.0f} records/s"
                )


if __name__ == "__main__":
    main()
