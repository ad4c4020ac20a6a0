"""Conflated topics on a worker: the input topic in, one write per changed record per Interval.

Each conflated topic has an input topic (``<prefix>.view-in.<name>``) that the processor of its
underlying topic fills with change events (:class:`~sowstream.views.conflated.ConflatedFeed`),
a faust agent that folds them into a :class:`~sowstream.views.conflated.Conflator` per input
partition, and a flush every Interval that writes the pending states to the conflated topic's
log (publish by the underlying SowKey, ``sow_delete`` for a record gone or filtered out, each
marked with the ``sow.view`` header so the log takes nothing else). The conflated topic's own
processor applies its log like any SOW topic: ``sow``, subscriptions, delta and ``oof`` work.

Nothing changed during an interval is lost to a crash: only once Kafka has acknowledged a
flush's writes is the input offset it covers stored (in a RocksDB table replicated to its
changelog). A partition loaded after a restart reads its input again from there; writing a
record again is harmless, since the log keeps the latest state per SowKey.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence

from sowstream.config.conflated import ConflatedTopicConfig
from sowstream.engine import metrics
from sowstream.engine.derived import runner_store, without_gaps, write_records
from sowstream.engine.ports import LogReader, Sender, StateTable
from sowstream.engine.store import MemoryPartition, PartitionStore, commit
from sowstream.messagetypes import MessageType
from sowstream.sow.ops import RawRecord
from sowstream.sow.patterns import split_key
from sowstream.views.conflated import Conflator
from sowstream.wire import headers as h

log = logging.getLogger("sowstream.engine.conflated")

FLUSHED = b"flushed"


class ConflatedRunner:
    """Keeps one conflated topic on this worker, for the input partitions it was assigned."""

    def __init__(
        self,
        conflated: ConflatedTopicConfig,
        sender: Sender,
        table: StateTable | None,
        input_reader: LogReader,
        *,
        input_topic: str,
        log_topic: str,
        codec: MessageType,
        pattern: bool = False,
        log_partitions: int | None = None,
    ) -> None:
        """``log_partitions``: the conflated log's partition count, so a flush goes out per
        partition in Kafka batches (None: one send per record, partitioned by the producer)."""
        self.conflated = conflated
        self._log_partitions = log_partitions
        self.input_topic = input_topic
        self.log_topic = log_topic
        self._sender = sender
        self._table = table
        self._reader = input_reader
        self._codec = codec
        self._parts: dict[int, Conflator] = {}
        self._held: set[int] = set()  # input partitions faust assigned this worker
        self._stores: dict[int, PartitionStore] = {}
        self._memory: dict[int, MemoryPartition] = {}
        self._lock = asyncio.Lock()
        self._header = (h.VIEW, conflated.name.encode())
        # Over a Pattern topic the input is keyed by record keys (name and SowKey): each record
        # goes out under its SowKey and the name TopicFormat makes of its name.
        self._topic_of = self._formatted if pattern else None
        # Since this worker started: changes taken in, records written (conflation ratio).
        self.incoming = 0
        self.published = 0
        self._incoming = metrics.CONFLATED_INCOMING.labels(conflated.name)
        self._published = metrics.CONFLATED_PUBLISHED.labels(conflated.name)

    def _formatted(self, record_key: str) -> tuple[str, str]:
        name, sow_key = split_key(record_key)
        return sow_key, self.conflated.topic_name(name)

    def _add(self, conflator: Conflator, offset: int, value: bytes | None) -> None:
        """Fold one input event in, counting the changes taken."""
        if conflator.add(offset, value):
            self.incoming += 1
            self._incoming.inc()

    def ratio(self) -> float | None:
        """Changes taken in per record written since this worker started (None: none written)."""
        return round(self.incoming / self.published, 2) if self.published else None

    def _store(self, partition: int) -> PartitionStore:
        store = self._stores.get(partition)
        if store is None:
            store = self._stores[partition] = runner_store(self._table, self._memory, partition)
        return store

    async def _ready(self, partition: int) -> Conflator | None:
        """The partition's conflator; on first use it reads the input from the last flush.
        None for a partition not assigned here (its events may arrive after a revocation)."""
        conflator = self._parts.get(partition)
        if conflator is None:
            if partition not in self._held:
                return None
            stored = self._store(partition).get(FLUSHED)
            conflator = Conflator(int(stored) if stored is not None else -1)
            last = await self._reader.end_offset(partition)
            if last > conflator.taken:
                async for batch in self._reader.batches(partition, last, conflator.taken + 1):
                    for rec in batch:
                        self._add(conflator, rec.offset, rec.value)
            self._parts[partition] = conflator
            log.info(
                "conflated topic %s partition %d: flushed up to input offset %d, %d records "
                "pending",
                self.conflated.name,
                partition,
                conflator.flushed,
                len(conflator.pending),
            )
        return conflator

    async def warm(self, partitions: Iterable[int]) -> None:
        """Load newly assigned partitions, so a restart flushes what the last interval held."""
        for partition in partitions:
            if partition in self._parts:
                continue
            try:
                async with self._lock:
                    await self._ready(partition)
            except Exception:
                log.exception(
                    "conflated topic %s partition %d: loading failed",
                    self.conflated.name,
                    partition,
                )

    def position(self, partition: int) -> int | None:
        """The input offset to read next for ``partition``; None while it is not loaded."""
        conflator = self._parts.get(partition)
        return None if conflator is None else conflator.taken + 1

    def assign(self, partitions: Iterable[int]) -> None:
        """Partitions faust assigned this worker: only these are loaded and folded."""
        self._held.update(partitions)

    def assigned(self) -> list[int]:
        """The input partitions faust assigned this worker."""
        return sorted(self._held)

    def loading(self) -> list[int]:
        """Input partitions assigned here whose input is not read from the last flush yet."""
        return sorted(p for p in self._held if p not in self._parts)

    async def drop(self, partitions: Iterable[int]) -> None:
        """Forget partitions taken away by a rebalance (the new owner reads from the flush).

        Waits for a flush or fold in progress, so the next owner starts after it."""
        async with self._lock:
            for p in partitions:
                self._held.discard(p)
                self._parts.pop(p, None)
                self._stores.pop(p, None)

    async def handle(self, records: Sequence[RawRecord]) -> None:
        """Fold a batch of input records in (any mix of partitions, each in offset order)."""
        by_partition: dict[int, list[RawRecord]] = {}
        for rec in records:
            by_partition.setdefault(rec.partition, []).append(rec)
        async with self._lock:
            for partition, recs in by_partition.items():
                try:
                    conflator = await self._ready(partition)
                except Exception:
                    log.exception(
                        "conflated topic %s partition %d: loading failed",
                        self.conflated.name,
                        partition,
                    )
                    continue
                if conflator is None:
                    continue  # not (or no longer) assigned here: the owner reads it itself
                what = f"conflated topic {self.conflated.name}"
                for rec in await without_gaps(self._reader, partition, conflator.taken, recs, what):
                    self._add(conflator, rec.offset, rec.value)

    async def flush(self) -> int:
        """Write every partition's pending states to the log; returns how many were written."""
        written = 0
        async with self._lock:
            for partition, conflator in list(self._parts.items()):
                pending, upto = conflator.take()
                if upto <= conflator.flushed:
                    continue
                try:
                    await write_records(
                        self._sender,
                        self.log_topic,
                        self._header,
                        self._codec,
                        pending.items(),
                        self._topic_of,
                        partitions=self._log_partitions,
                    )
                except Exception:
                    conflator.restore(pending)
                    log.exception(
                        "conflated topic %s partition %d: flush failed, retried at the next "
                        "interval",
                        self.conflated.name,
                        partition,
                    )
                    continue
                entries = {FLUSHED: str(upto).encode()}
                store = self._store(partition)
                await commit(store, entries, self._sender)
                conflator.flushed_to(upto)
                written += len(pending)
                self.published += len(pending)
                self._published.inc(len(pending))
        return written

    async def run(self) -> None:
        """Flush every Interval, for as long as the worker runs."""
        while True:
            await asyncio.sleep(self.conflated.interval_seconds)
            await self.flush()
