"""The input side of a view or conflated topic: its input topic read in batches with
confluent-kafka, as :class:`~sowstream.engine.pump.LogPump` reads a SOW topic's log.

faust still assigns the input topic's partitions (so the runner's RocksDB table, co-partitioned
with it, comes with them), but never fetches them (``Wiring.pumped_agent``): its stream hands
events over one at a time and capped a view at a fraction of plain ingest (docs/benchmarks.md).
No consumer offsets are committed: each partition's position is the runner's own, stored with its
state (a view's watermark, a conflated topic's last input offset taken).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from confluent_kafka import Consumer, TopicPartition

from sowstream.engine.pump import HeldPartitions, as_record, fetch, pump_forever
from sowstream.sow.ops import RawRecord

log = logging.getLogger("sowstream.engine")

IDLE_SECONDS = 0.05


class PumpedRunner(Protocol):
    """What an input pump feeds: a view's or conflated topic's runner."""

    def assigned(self) -> list[int]:
        """Input partitions assigned to this worker."""

    def position(self, partition: int) -> int | None:
        """The input offset to read next for ``partition``; None while it is not loaded and
        caught up (its runner reads up to the end itself first)."""

    async def handle(self, records: Sequence[RawRecord]) -> None:
        """Apply a batch of input records (any mix of partitions, each in offset order)."""


class InputPump:
    """Feeds one runner from its input topic, for the partitions assigned to this worker."""

    def __init__(
        self,
        runner: PumpedRunner,
        topic: str,
        assignment: HeldPartitions,
        consumer_config: Mapping[str, Any],
    ) -> None:
        self.runner = runner
        self.topic = topic
        self._assignment = assignment
        self._consumer_config = dict(consumer_config)  # bootstrap, group and engine.kafka
        self._next: dict[int, int] = {}  # the offset the consumer reads next, per partition
        # A thread of its own for the blocking fetch: an idle fetch waits 50 ms, and a worker
        # with many logs and views would otherwise queue them in the loop's small default pool.
        self._fetcher: ThreadPoolExecutor | None = None

    def positions(self) -> dict[int, int]:
        """Where each partition this worker owns and has loaded is to be read from; empty while
        faust rebalances or recovers (ownership is about to change)."""
        if not self._assignment.settled:
            return {}
        owned = self._assignment.partitions(self.topic) & set(self.runner.assigned())
        out: dict[int, int] = {}
        for partition in owned:
            at = self.runner.position(partition)
            if at is not None:
                out[partition] = at
        return out

    async def _step(self, consumer: Consumer) -> None:
        wanted = self.positions()
        if wanted != self._next:
            # A partition came or went, or its runner moved (a catch-up read, a reload after a
            # failure): read every partition from the runner's own position.
            consumer.assign([TopicPartition(self.topic, p, at) for p, at in sorted(wanted.items())])
            self._next = wanted
        if not wanted:
            await asyncio.sleep(IDLE_SECONDS)
            return
        msgs = await asyncio.get_running_loop().run_in_executor(self._fetcher, fetch, consumer)
        records = [as_record(m) for m in msgs if not m.error() and m.partition() in self._next]
        if not records:
            return
        await self.runner.handle(records)
        for rec in records:
            self._next[rec.partition] = rec.offset + 1

    def _forget_positions(self) -> None:
        """After a failure: every partition is read again from its runner's position."""
        self._next = {}

    async def run(self) -> None:
        """Fetch and apply until the worker stops; a failure is logged and the pump resumes
        from the runner's positions."""
        self._fetcher = ThreadPoolExecutor(1, thread_name_prefix=f"input-{self.topic}")
        try:
            await pump_forever(
                self._step,
                self._consumer_config,
                f"input {self.topic}",
                self._forget_positions,
                self._fetcher,
            )
        finally:
            self._fetcher.shutdown(wait=False)
