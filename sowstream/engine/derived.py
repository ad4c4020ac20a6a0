"""What views and conflated topics share: reading their input, writing their own log.

Both are topics the engine computes (only their runner writes their log, marked with the
``sow.view`` header); their records go out as publishes, or ``sow_delete`` by SowKey, and a
runner stores its progress only once Kafka has acknowledged every one of them. Both take their
input from a faust agent, whose batches can have holes that are read from the topic itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson
from confluent_kafka import murmur2

from sowstream.engine.ports import LogReader, Sender, StateTable
from sowstream.engine.store import MemoryPartition, PartitionStore, RocksPartition
from sowstream.messagetypes import MessageType
from sowstream.sow.ops import RawRecord
from sowstream.wire import headers as h

Headers = list[tuple[str, bytes]]

log = logging.getLogger("sowstream.engine")

ACK_WAIT_SECONDS = 30.0


async def delivered(futures: Iterable[asyncio.Future[Any]], what: str) -> None:
    """Wait until Kafka has acknowledged every one of ``futures``; RuntimeError naming ``what``
    if any was refused or is still missing after ACK_WAIT_SECONDS (the caller then stores
    nothing, so the work is done again)."""
    pending = list(futures)
    if not pending:
        return
    _, late = await asyncio.wait(pending, timeout=ACK_WAIT_SECONDS)
    failed = [f for f in pending if f.done() and (f.cancelled() or f.exception() is not None)]
    if late or failed:
        raise RuntimeError(f"{len(late) + len(failed)} {what} not acknowledged by Kafka")


async def without_gaps(
    reader: LogReader, partition: int, after: int, recs: Sequence[RawRecord], what: str
) -> list[RawRecord]:
    """The input records of ``partition`` after offset ``after`` up to the batch's last, each
    once, in offset order.

    faust's stream may jump: after a restart it can hand over records it fetched before seeking
    to its committed offset (which a crash leaves ahead of the stored state), then records from
    that offset on, in one batch. An input topic has no holes, so a batch that does not cover
    every offset of its range is read again from the topic itself: a runner's stored position
    must never pass an event it did not apply.
    """
    by_offset = {r.offset: r for r in recs if r.offset > after}
    if not by_offset:
        return []
    last = max(by_offset)
    if len(by_offset) == last - after:
        return [by_offset[o] for o in sorted(by_offset)]
    read: dict[int, RawRecord] = {}
    async for batch in reader.batches(partition, last, after + 1):
        read.update((r.offset, r) for r in batch if after < r.offset <= last)
    log.info(
        "%s partition %d: read offsets %d to %d again from the input topic "
        "(%d of them were not in the batch faust delivered)",
        what,
        partition,
        after + 1,
        last,
        len(read.keys() - by_offset.keys()),
    )
    read.update((o, r) for o, r in by_offset.items() if o not in read)
    return [read[o] for o in sorted(read)]


async def write_records(
    sender: Sender,
    log_topic: str,
    header: tuple[str, bytes],
    codec: MessageType,
    records: Iterable[tuple[str, Mapping[str, Any] | None]],
    topic_of: Callable[[str], tuple[str, str]] | None = None,
    partitions: int | None = None,
) -> None:
    """Write ``(SowKey, record or None for a delete)`` to ``log_topic`` and wait for Kafka's
    acknowledgements; RuntimeError if any is missing (the caller then stores nothing).

    For a Pattern topic's log, ``topic_of`` turns each key into the SowKey and the topic name
    the record goes out under (header ``sow.topic``). Given the log's ``partitions``, the
    records go out per partition (murmur2 of the key, as every client routes them) in Kafka
    batches, not one send each."""
    futures: list[asyncio.Future[Any]] = []
    json = codec.name == "json"
    per_partition: dict[int, tuple[list[tuple[bytes, bytes | None]], list[Headers]]] = {}
    for key, record in records:
        headers = [header]
        sow_key = key
        if topic_of is not None:
            sow_key, name = topic_of(key)
            headers.append((h.TOPIC, name.encode()))
        if record is None:
            headers.append((h.COMMAND, h.SOW_DELETE.encode()))
            value = None
        else:
            value = orjson.dumps(record) if json else codec.serialise(record)
        raw_key = sow_key.encode()
        if partitions is not None:
            keyed, headed = per_partition.setdefault(murmur2(raw_key, partitions), ([], []))
            keyed.append((raw_key, value))
            headed.append(headers)
            continue
        fut = await sender.send(log_topic, value, key=raw_key, headers=headers)
        if fut is not None:
            futures.append(fut)
    for partition, (keyed, headed) in per_partition.items():
        sent = await sender.send_many(log_topic, partition, keyed, headers=headed)
        futures.extend(fut for fut, _ in sent)
    await delivered(futures, f"records of {log_topic!r}")


def runner_store(
    table: StateTable | None, memory: dict[int, MemoryPartition], partition: int
) -> PartitionStore:
    """A runner's store for ``partition``: its RocksDB table, or (tests, no table) memory kept
    in ``memory`` for the runner's lifetime."""
    if table is None:
        return memory.setdefault(partition, MemoryPartition())
    return RocksPartition(table, partition)
