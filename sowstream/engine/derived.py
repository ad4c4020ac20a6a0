"""What views and conflated topics share: writing their records to their own log.

Both are topics the engine computes (only their runner writes their log, marked with the
``sow.view`` header); their records go out as publishes, or ``sow_delete`` by SowKey, and a
runner stores its progress only once Kafka has acknowledged every one of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from sowstream.engine.partition import Sender
from sowstream.engine.store import MemoryPartition, PartitionStore, RocksPartition
from sowstream.messagetypes import MessageType
from sowstream.wire import headers as h

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


async def write_records(
    sender: Sender,
    log_topic: str,
    header: tuple[str, bytes],
    codec: MessageType,
    records: Iterable[tuple[str, Mapping[str, Any] | None]],
    topic_of: Callable[[str], tuple[str, str]] | None = None,
) -> None:
    """Write ``(SowKey, record or None for a delete)`` to ``log_topic`` and wait for Kafka's
    acknowledgements; RuntimeError if any is missing (the caller then stores nothing).

    For a Pattern topic's log, ``topic_of`` turns each key into the SowKey and the topic name
    the record goes out under (header ``sow.topic``)."""
    futures: list[asyncio.Future[Any]] = []
    json = codec.name == "json"
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
        fut = await sender.send(log_topic, value, key=sow_key.encode(), headers=headers)
        if fut is not None:
            futures.append(fut)
    await delivered(futures, f"records of {log_topic!r}")


def runner_store(
    table: Any | None, memory: dict[int, MemoryPartition], partition: int
) -> PartitionStore:
    """A runner's store for ``partition``: its RocksDB table, or (tests, no table) memory kept
    in ``memory`` for the runner's lifetime."""
    if table is None:
        return memory.setdefault(partition, MemoryPartition())
    return RocksPartition(table, partition)
