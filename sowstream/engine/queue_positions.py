"""Barriers over several workers: each worker tells the others how far the partitions of a
queue it owns are, and follows what they tell it (sowstream.queues.barriers).

Every ``REPORT_INTERVAL`` the worker takes, per partition of the queue it holds, the time now,
waits until its log is applied up to the end it had then, and writes a
:class:`~sowstream.queues.barriers.PartitionPosition` (read up to that time; the oldest
message and barrier not yet acknowledged) to ``<prefix>.queue.<queue>.positions``. Every worker
reads that topic from its end onwards and hands each position to the queue's gate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from confluent_kafka import OFFSET_END, Consumer, TopicPartition

from sowstream.engine.ports import Sender
from sowstream.engine.queues import QueueRuntime
from sowstream.engine.registry import poll_batch
from sowstream.queues.barriers import PartitionPosition

log = logging.getLogger("sowstream.engine.queues")

REPORT_INTERVAL = 0.25  # seconds between two reports of a partition
APPLY_WAIT = 2.0  # how long a report waits for the log to be applied before it is skipped
POSITIONS_RETENTION_MS = 600_000  # old reports are of no use: a worker reads from the end

# Waits until a held partition's log is applied up to the end it has now; False when the
# partition is not held, or not applied that far in time.
CatchUp = Callable[[str, int], Awaitable[bool]]


class PositionExchange:
    """The positions of one queue's partitions between the workers serving it."""

    def __init__(
        self,
        runtime: QueueRuntime,
        topic: str,
        sender: Sender,
        bootstrap: str,
        kafka: Mapping[str, str],
        catch_up: CatchUp,
    ) -> None:
        self._runtime = runtime
        self._topic = topic
        self._sender = sender
        self._bootstrap = bootstrap
        self._kafka = dict(kafka)
        self._catch_up = catch_up

    async def report(self) -> None:
        """Report the held partitions' positions, for as long as the worker runs."""
        while True:
            try:
                await self.report_once()
            except Exception:
                log.exception("queue %s: reporting positions failed", self._runtime.name)
            await asyncio.sleep(REPORT_INTERVAL)

    async def report_once(self) -> int:
        """One report per partition held now (skipping one not applied in time), unless this
        worker holds them all."""
        runtime = self._runtime
        sent = 0
        if runtime.credits.whole:
            return 0  # every partition is here: nobody else needs to know
        for topic, partition in list(runtime.counts):
            at = int(time.time() * 1000)
            try:
                caught_up = await asyncio.wait_for(self._catch_up(topic, partition), APPLY_WAIT)
            except TimeoutError:
                caught_up = False
            epoch = runtime.credits.epoch(topic, partition)
            if not caught_up or epoch is None:
                continue
            oldest, barrier = runtime.machine.oldest(topic, partition)
            position = PartitionPosition(runtime.name, topic, partition, epoch, at, oldest, barrier)
            runtime.note_position(position)  # its own partitions change hands too
            await self._sender.send(
                self._topic, position.to_bytes(), key=f"{topic}|{partition}".encode()
            )
            sent += 1
        return sent

    async def follow(self) -> None:
        """Hand every position the workers report from now on to the queue's gate."""
        loop = asyncio.get_running_loop()
        consumer = Consumer(
            {
                "bootstrap.servers": self._bootstrap,
                "group.id": "sowstream-queue-positions",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 20,
                "log_level": 4,
                **self._kafka,
            }
        )
        try:
            consumer.assign([TopicPartition(self._topic, 0, OFFSET_END)])
            while True:
                for msg in await loop.run_in_executor(None, poll_batch, consumer):
                    if msg.error() or msg.value() is None:
                        continue
                    try:
                        position = PartitionPosition.from_bytes(msg.value())
                    except ValueError as exc:
                        log.warning("queue %s: %s", self._runtime.name, exc)
                        continue
                    self._runtime.note_position(position)
        finally:
            with contextlib.suppress(Exception):
                await loop.run_in_executor(None, consumer.close)
