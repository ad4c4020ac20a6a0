"""The log side of a worker: reading a topic's transaction log with confluent-kafka.

:class:`LogPump` feeds a topic's processor from its log in batches, for the partitions faust
assigned the worker; :class:`KafkaLogReader` reads a partition's log (or a view's input) from
a given offset, for rebuilds, catch-ups and gap reads. Neither commits consumer offsets: each
partition's position is the watermark stored with its state.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Protocol, cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError

from sowstream.engine import metrics
from sowstream.engine.ports import Assignment
from sowstream.engine.processor import PartitionState, RawRecord, TopicProcessor
from sowstream.errors import SowstreamError
from sowstream.wire import headers as h

log = logging.getLogger("sowstream.engine")

LOG_BATCH_MAX = 2_000  # records one fetch takes from the log
APPLY_CHUNK = 500  # records folded in one go (one event-loop step) out of a fetched batch
# ... when the fetch came back short of LOG_BATCH_MAX (the pump is caught up with the log): a
# chunk's messages go out before the next chunk folds, so the first records of a burst do not
# wait for the fold of the whole fetch (about 2 ms of fold per 100 records).
CAUGHT_UP_CHUNK = 100
PUMP_RETRY_SECONDS = 1.0

# Fetch errors that mean the log partition we read may no longer be the one we applied.
_LOG_GONE = frozenset(
    {
        RdKafkaError.UNKNOWN_TOPIC_OR_PART,
        RdKafkaError.UNKNOWN_TOPIC_ID,
        RdKafkaError._UNKNOWN_PARTITION,
        RdKafkaError._UNKNOWN_TOPIC,
        RdKafkaError.OFFSET_OUT_OF_RANGE,
        RdKafkaError._AUTO_OFFSET_RESET,
    }
)


def as_record(msg: Any) -> RawRecord:
    """A confluent-kafka log message as the processor's RawRecord."""
    return RawRecord(
        msg.partition() or 0,
        msg.offset() or 0,
        msg.timestamp()[1],
        msg.key(),
        msg.value(),
        h.header_map(cast(h.RawHeaders, msg.headers())),
    )


class KafkaLogReader:
    """Reads a log partition from the beginning with confluent-kafka, off the event loop."""

    def __init__(self, bootstrap: str, topic: str, extra: Mapping[str, str]) -> None:
        self._bootstrap = bootstrap
        self._topic = topic
        self._extra = dict(extra)

    def _consumer(self) -> Consumer:
        return Consumer(
            {
                "bootstrap.servers": self._bootstrap,
                "group.id": "sowstream-rebuild",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                **self._extra,
            }
        )

    async def _watermarks(self, partition: int) -> tuple[int, int]:
        """The partition's (first offset, offset after its last record), read off the loop."""

        def read() -> tuple[int, int]:
            consumer = self._consumer()
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(self._topic, partition), timeout=30
                )
                return int(low), int(high)
            finally:
                consumer.close()

        return await asyncio.get_running_loop().run_in_executor(None, read)

    async def end_offset(self, partition: int) -> int:
        return (await self._watermarks(partition))[1] - 1

    async def start_offset(self, partition: int) -> int:
        return (await self._watermarks(partition))[0]

    async def offset_for_time(self, partition: int, at_ms: int) -> int:
        def read() -> int:
            consumer = self._consumer()
            try:
                tp = TopicPartition(self._topic, partition, at_ms)
                found = consumer.offsets_for_times([tp], timeout=30)[0].offset
                if found >= 0:
                    return int(found)
                _, high = consumer.get_watermark_offsets(tp, timeout=30)
                return int(high)
            finally:
                consumer.close()

        return await asyncio.get_running_loop().run_in_executor(None, read)

    async def batches(
        self, partition: int, until: int, start: int = 0
    ) -> AsyncIterator[list[RawRecord]]:
        if until < 0 or start > until:
            return
        loop = asyncio.get_running_loop()
        consumer = self._consumer()
        first = start if start > 0 else OFFSET_BEGINNING
        consumer.assign([TopicPartition(self._topic, partition, first)])
        following = start  # the offset expected next
        try:
            while True:
                # consume() returns early only with as many records as asked for: asking for
                # more than are left made every read of a log's last record (the check of a
                # loaded partition's watermark) wait out the timeout.
                want = max(1, min(5_000, until - following + 1))
                msgs = await loop.run_in_executor(None, consumer.consume, want, 1.0)
                batch: list[RawRecord] = []
                done = False
                for msg in msgs:
                    if msg.error():
                        continue
                    offset = msg.offset() or 0
                    if offset > until:
                        done = True
                        break
                    batch.append(as_record(msg))
                    following = offset + 1
                    done = offset >= until
                if batch:
                    yield batch
                if done:
                    return
        finally:
            consumer.close()


class HeldPartitions(Assignment, Protocol):
    """The assignment, also asked for all of one topic's partitions at once (the pump asks on
    every fetch: one set per topic, not one lookup per partition)."""

    def partitions(self, topic: str) -> set[int]:
        """Partitions of Kafka topic ``topic`` assigned to this worker (whether settled or not)."""


def fetch(consumer: Consumer) -> list[Any]:
    """Up to LOG_BATCH_MAX records, returning as soon as any are there.

    consume(n, timeout) waits for n records or the timeout, which would add its timeout to the
    latency of every quiet-time publish; poll() returns with the first record.
    """
    first = consumer.poll(0.05)
    if first is None:
        return []
    return [first, *consumer.consume(LOG_BATCH_MAX - 1, 0)]


async def pump_forever(
    step: Callable[[Consumer], Awaitable[None]],
    consumer_config: Mapping[str, Any],
    what: str,
    reset: Callable[[], None],
    executor: Executor | None = None,
) -> None:
    """Run a pump's ``step`` on a consumer of its own until cancelled. A failing step is logged
    and retried after ``reset`` has dropped the pump's positions: a dead pump would leave the
    worker up but applying nothing."""
    loop = asyncio.get_running_loop()
    consumer = Consumer(
        {
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 5,
            "log_level": 4,
            **consumer_config,
        }
    )
    try:
        while True:
            try:
                await step(consumer)
            except Exception:
                log.exception("%s: applying failed; retrying", what)
                reset()
                await asyncio.sleep(PUMP_RETRY_SECONDS)
    finally:
        await loop.run_in_executor(executor, consumer.close)


class LogPump:
    """Feeds one topic's processor from its transaction log, in batches, with confluent-kafka.

    faust assigns the control topic's partitions (co-partitioned with the table's changelog); the
    pump reads the same partition numbers of the log. faust's own stream machinery moves one event
    at a time and caps a worker at about 16k events/s here (docs/benchmarks.md), so the log does
    not go through it. No consumer offsets are committed for the log: each partition's position is
    its watermark, stored in the state store itself, so state and position can never disagree.
    """

    def __init__(
        self,
        proc: TopicProcessor,
        ctl_topic: str,
        assignment: HeldPartitions,
        consumer_config: Mapping[str, Any],
    ) -> None:
        self.proc = proc
        self.ctl_topic = ctl_topic
        self._assignment = assignment
        self._consumer_config = dict(consumer_config)  # bootstrap, group and engine.kafka
        # The partition state each position belongs to: a rebalance can drop a partition's state
        # and hand the partition straight back, and the new state starts from its own watermark.
        self._states: dict[int, PartitionState] = {}
        self._next: dict[int, int] = {}
        # Partitions whose log may have been deleted and created again: nothing of theirs is
        # applied until the processor has compared the log with what it applied.
        self._suspect: set[int] = set()
        self._fetcher: ThreadPoolExecutor | None = None  # made by run()

    def owned(self) -> set[int]:
        """Partitions this worker owns now; empty while faust rebalances or recovers."""
        if not self._assignment.settled:
            return set()
        return self._assignment.partitions(self.ctl_topic)

    def _current(self, partition: int) -> bool:
        """Whether the pump's position for ``partition`` belongs to the partition's live state."""
        ps = self._states.get(partition)
        return ps is not None and self.proc.state(partition) is ps

    async def _sync(self, consumer: Consumer, owned: set[int]) -> None:
        """Point the consumer at every owned partition's position, loading new states."""
        if owned == set(self._states) and all(self._current(p) for p in owned):
            return
        for partition in set(self._states) - owned:
            del self._states[partition]
            self._next.pop(partition, None)
        for partition in sorted(owned):
            if not self._current(partition):
                ps = await self.proc.ready(partition)
                self._states[partition] = ps
                self._next[partition] = ps.folded + 1
        consumer.assign(
            [TopicPartition(self.proc.log_topic, p, self._next[p]) for p in sorted(self._states)]
        )

    def _signals_recreation(self, msg: Any) -> bool:
        """Whether a fetched message says the log may have been recreated: its topic or
        partition vanished, the position fell off its end, or offsets went back."""
        error = msg.error()
        if error is not None:
            return bool(error.code() in _LOG_GONE)
        return (msg.offset() or 0) < self._next.get(msg.partition(), 0)

    async def _verify(self, consumer: Consumer, owned: set[int]) -> bool:
        """Let the processor check each suspect partition's log; True once none is left.

        While the log topic is gone the check fails and is tried again on the next step.
        """
        for partition in sorted(self._suspect & owned):
            try:
                await self.proc.verify_log(partition)
            except (KafkaException, SowstreamError) as exc:
                log.info(
                    "topic %s partition %d: cannot check the log yet (%s)",
                    self.proc.topic.name,
                    partition,
                    exc,
                )
                continue
            self._suspect.discard(partition)
            ps = self.proc.state(partition)
            if ps is not None and self._current(partition):
                self._next[partition] = ps.folded + 1
        self._suspect &= owned
        consumer.assign(
            [TopicPartition(self.proc.log_topic, p, self._next[p]) for p in sorted(self._states)]
        )
        return not self._suspect

    async def _step(self, consumer: Consumer) -> None:
        owned = self.owned()
        await self._sync(consumer, owned)
        if not owned:
            await asyncio.sleep(0.05)
            return
        if self._suspect and not await self._verify(consumer, owned):
            await asyncio.sleep(PUMP_RETRY_SECONDS)
            return
        msgs = await asyncio.get_running_loop().run_in_executor(self._fetcher, fetch, consumer)
        suspect = {m.partition() for m in msgs if self._signals_recreation(m)}
        if suspect - owned:
            suspect = set(owned)  # a topic-level error: every partition may be concerned
        if suspect:
            # Nothing of this fetch is applied: after the check every partition is read again
            # from its own position.
            self._suspect |= suspect & owned
            return
        # Ownership may have changed while we waited: apply only what is still ours, and nothing
        # once a rebalance has begun (the partition may be on its way to another worker).
        owned = self.owned()
        records = [
            as_record(m)
            for m in msgs
            if not m.error() and m.partition() in owned and self._current(m.partition())
        ]
        if not records:
            return
        fetched = metrics.fetched(min(rec.timestamp for rec in records))
        size = APPLY_CHUNK if len(msgs) >= LOG_BATCH_MAX else CAUGHT_UP_CHUNK
        for start in range(0, len(records), size):
            chunk = records[start : start + size]
            await self.proc.process(chunk, fetched)
            for rec in chunk:
                self._next[rec.partition] = rec.offset + 1
            # A big fetch must not hold the event loop in one piece: acknowledgements, commits
            # and commands get their turn between chunks.
            await asyncio.sleep(0)

    async def run(self) -> None:
        """Fetch and apply until the worker stops; a failure is logged and the pump resumes
        (nothing is lost: every partition is read again from its own state)."""
        # A fetch thread of its own: a fetch blocks its thread for up to a poll's timeout, and
        # pumps sharing a pool queued behind each other's polls (hundreds of ms of latency with
        # a dozen topics).
        self._fetcher = ThreadPoolExecutor(1, thread_name_prefix=f"log-{self.proc.topic.name}")
        try:
            await pump_forever(
                self._step,
                self._consumer_config,
                f"topic {self.proc.topic.name}",
                self._states.clear,
                self._fetcher,
            )
        finally:
            self._fetcher.shutdown(wait=False)
