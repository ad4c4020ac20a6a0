"""Refill partition stores from their changelogs in bulk, before faust's own table recovery.

faust restores a table one changelog record at a time through its consumer, its event objects and
its recovery loop: about 7k records/s here, so a worker that lost the RocksDB of a large SOW was
down for minutes (docs/benchmarks.md). Before faust reads the changelog partitions it was just
assigned, the runtime's recovery (:mod:`~sowstream.engine.runtime_restore`) has every changelog
partition that is far behind (store missing or old) copied here, by :func:`copy_changelog` with a
confluent-kafka consumer into RocksDB ``WriteBatch``es, and hands faust the offset it reached, so
faust's recovery only reads what is left (usually nothing). This module does not import faust.

The copy is exactly what faust's recovery would write: the changelog records in offset order,
puts and tombstones, into the same partition database, and faust's own changelog offset key
(``FAUST_OFFSET_KEY``). Each batch carries that offset in the same atomic write, so a worker
killed mid-restore holds a prefix of the changelog that knows its own end, and faust (or the next
copy) goes on from there. faust keeps the assignment, the seek, the standby logic and the
offsets; the copy stops when a new rebalance starts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from rocksdict import WriteBatch

from sowstream.errors import StateStoreError
from sowstream.sow.layout import FAUST_OFFSET_KEY

log = logging.getLogger("sowstream.engine")

# Below this many records behind, faust's own recovery is as quick as starting a consumer.
BATCHED_MIN_RECORDS = 1_000
CONSUME_MAX = 10_000  # records taken from the consumer (and written as one batch) at a time
POLL_SECONDS = 0.5


class RestoreStalledError(StateStoreError):
    """The changelog stopped delivering records before the copy reached its end."""


@dataclass
class PartitionCopy:
    """One changelog partition to copy: into ``db``, offsets ``start``..``end`` (inclusive).

    ``last`` is the last offset stored so far (with faust's offset key), ``records`` how many
    records were written.
    """

    partition: int
    db: Any
    start: int
    end: int
    last: int = field(init=False)
    records: int = 0

    def __post_init__(self) -> None:
        self.last = self.start - 1


def copy_changelog(
    config: Mapping[str, str],
    topic: str,
    copies: Mapping[int, PartitionCopy],
    stop: threading.Event,
    stall_seconds: float,
) -> None:
    """Copy each partition of changelog ``topic`` in ``copies`` into its database (blocking).

    Returns when every partition reached its ``end`` or ``stop`` is set; raises
    RestoreStalledError when no record arrives for ``stall_seconds`` before that, and
    StateStoreError when RocksDB refuses a write. Whatever was written stays: each batch is a
    prefix of the changelog with its offset.
    """
    consumer = Consumer(
        {
            # Never commits: positions come from faust's offsets in the stores.
            "group.id": f"sowstream-restore-{topic}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            # faust reads changelogs uncommitted unless it runs exactly-once, which we do not.
            "isolation.level": "read_uncommitted",
            # A start offset gone from the log must fail the copy, never skip records.
            "auto.offset.reset": "error",
            "max.partition.fetch.bytes": 8 * 1024 * 1024,
            "log_level": 4,
            **config,
        }
    )
    todo = {p for p, c in copies.items() if c.end >= c.start}
    try:
        consumer.assign([TopicPartition(topic, p, copies[p].start) for p in sorted(todo)])
        heard = time.monotonic()
        while todo and not stop.is_set():
            # consume(n, timeout) waits for n records or the whole timeout: the last records of
            # a changelog would wait it out. Wait for one, then take what is already fetched.
            first = consumer.poll(POLL_SECONDS)
            if first is None:
                if time.monotonic() - heard > stall_seconds:
                    behind = {p: copies[p].end - copies[p].last for p in sorted(todo)}
                    raise RestoreStalledError(
                        f"changelog {topic}: no record for {stall_seconds:.0f} s with "
                        f"partitions {behind} (partition: records) still to copy"
                    )
                continue
            heard = time.monotonic()
            _store_chunk(topic, [first, *consumer.consume(CONSUME_MAX - 1, 0)], copies, todo)
    finally:
        consumer.close()


def _store_chunk(
    topic: str, msgs: list[Any], copies: Mapping[int, PartitionCopy], todo: set[int]
) -> None:
    """Write one consumed chunk: one WriteBatch per partition, ending with faust's offset."""
    batches: dict[int, tuple[WriteBatch, int, int]] = {}  # partition: (batch, last, records)
    for msg in msgs:
        p = msg.partition()
        if p not in todo:
            continue
        copy = copies[p]
        err = msg.error()
        if err is not None:
            if err.code() != KafkaError._PARTITION_EOF:
                raise KafkaException(err)
            # At the end of the log: any offsets up to ``end`` not delivered are not records
            # (transaction markers), and faust must not wait for them.
            if msg.offset() > copy.end:
                batch, _, n = batches.get(p) or (WriteBatch(raw_mode=True), copy.last, 0)
                batches[p] = (batch, copy.end, n)
                todo.discard(p)
            continue
        offset = msg.offset()
        if offset > copy.end:
            todo.discard(p)
            continue
        batch, _, n = batches.get(p) or (WriteBatch(raw_mode=True), copy.last, 0)
        value = msg.value()  # keys are never None: a compacted topic refuses such records
        if value is None:
            batch.delete(msg.key())
        else:
            batch.put(msg.key(), value)
        batches[p] = (batch, offset, n + 1)
        if offset >= copy.end:
            todo.discard(p)
    for p, (batch, last, n) in batches.items():
        copy = copies[p]
        if last <= copy.last:
            continue
        batch.put(FAUST_OFFSET_KEY, str(last).encode())
        try:
            copy.db.write(batch)
        except Exception as exc:  # rocksdict raises bare Exception
            raise StateStoreError(
                f"changelog {topic} partition {p}: RocksDB write failed: {exc}"
            ) from exc
        copy.last = last
        copy.records += n
