"""A queue on a worker: its leases and deliveries (:class:`~sowstream.engine.queues.QueueRuntime`),
fed by the processors of the topics it reads."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from sowstream.config.models import TopicConfig
from sowstream.config.queues import QueueConfig, publish_topic, queue_sources
from sowstream.config.root import SowstreamConfig
from sowstream.engine.meta import Infos, topic_info
from sowstream.engine.partition import PartitionMoved
from sowstream.engine.ports import LogReader
from sowstream.engine.queue_positions import POSITIONS_RETENTION_MS, PositionExchange
from sowstream.engine.queue_views import QueueViewFeed
from sowstream.engine.queues import Changes, QueueRuntime
from sowstream.engine.units.base import Context, Partitions
from sowstream.engine.units.topic import TopicUnit
from sowstream.errors import SowstreamError
from sowstream.queues.barriers import BarrierGate
from sowstream.wire.kafka import TopicSpec
from sowstream.wire.topics import topic_ident

log = logging.getLogger("sowstream.engine.queues")


def per_worker(queue: QueueConfig) -> list[str]:
    """What of ``queue`` holds per worker, not over the whole queue, when several workers serve
    it (backlogs and priority order hold over all of them, through credits)."""
    out = []
    if queue.max_backlog is not None:
        out.append(f"MaxBacklog {queue.max_backlog} caps the leases of each worker")
    if queue.target_queue_depth is not None:
        out.append(f"TargetQueueDepth {queue.target_queue_depth} counts each worker's messages")
    return out


def warn_per_worker(queue: QueueConfig) -> None:
    """Warn, naming the queue, about what holds per worker when several serve it."""
    for what in per_worker(queue):
        log.warning(
            "queue %s: served by several workers, %s, not the whole queue", queue.name, what
        )


class QueueUnit:
    """One queue on this worker."""

    kind = "queue"

    def __init__(
        self,
        config: SowstreamConfig,
        queue: QueueConfig,
        ctx: Context,
        topics: Mapping[str, TopicUnit],
    ) -> None:
        self._config = config
        self._ctx = ctx
        self._topics = topics
        self._readers: dict[str, LogReader] = {}  # per topic, for positions (barriers)
        # The queue's messages are of its topics' type (an avro or protobuf one with their schema).
        target = publish_topic(queue, config.topics)
        assert target is not None  # config.queues.check_queues saw to it
        unit = topics.get(target.ident)
        self.runtime = QueueRuntime(
            queue,
            ctx.names,
            ctx.sender,
            self._store_changes,
            config.entitlement_lookup(queue.name),
            codec=unit.compiled.codec if unit is not None else None,
        )
        fed = [unit.topic for unit in topics.values() if unit.feeds_queues]
        sources = queue_sources(queue, fed)
        for topic, only in sources:
            topics[topic.ident].proc.queues.append(self.runtime)
            if only is not None:
                self.runtime.scopes[topic.name] = only
        self.runtime.partitions = frozenset(
            (topic.name, p) for topic, _ in sources for p in range(topic.partitions)
        )
        self._positions: PositionExchange | None = None
        if len(self.runtime.partitions) > 1:
            warn_per_worker(queue)
            if queue.barrier_expression is not None:
                # Barriers wait for every partition's older messages, wherever they are.
                self.runtime.machine.gate = BarrierGate(self.runtime.partitions)
                self._positions = PositionExchange(
                    self.runtime,
                    ctx.names.queue_positions(queue.name),
                    ctx.sender,
                    ctx.bootstrap,
                    ctx.kafka,
                    self._caught_up,
                )
        # The topic the engine keeps of the queue's available messages, when a view reads it.
        self._available = config.queue_view_topics.get(queue.name)
        if self._available is not None:
            available = self._available
            topics[available.ident].proc.view_name = queue.name
            self.runtime.view_feed = QueueViewFeed(
                self.runtime.machine,
                queue.name,
                ctx.names.log(available.name, available.message_type),
                ctx.sender,
            )

    @staticmethod
    def sow_topics(config: SowstreamConfig) -> Sequence[TopicConfig]:
        """Per queue some view reads, the topic of its available messages."""
        return tuple(config.queue_view_topics.values())

    @classmethod
    def from_config(
        cls, config: SowstreamConfig, ctx: Context, topics: Mapping[str, TopicUnit]
    ) -> list[QueueUnit]:
        return [cls(config, queue, ctx, topics) for queue in config.queues]

    @property
    def name(self) -> str:
        return self.runtime.name

    def _unit(self, topic: str) -> TopicUnit:
        """The unit of ``topic``, one of the queue's (so of the queue's message type)."""
        return self._topics[topic_ident(topic, self.runtime.config.message_type)]

    async def _store_changes(self, topic: str, partition: int, changes: Changes) -> bool:
        return await self._unit(topic).proc.store_changes(partition, changes)

    # -- lifecycle --------------------------------------------------------------------------------

    def declare(self) -> None:
        self._ctx.wiring.task(self.run)
        if self._positions is not None:
            self._ctx.wiring.task(self._positions.report)
            self._ctx.wiring.task(self._positions.follow)

    async def _caught_up(self, topic: str, partition: int) -> bool:
        """Wait until the partition's log is applied up to the end it has now."""
        unit = self._unit(topic)
        assignment = self._ctx.assignment
        if not (assignment.settled and assignment.owns(unit.ctl_topic, partition)):
            return False  # a rebalance runs, or it moved: loading it here would be a ghost
        reader = self._readers.get(topic)
        if reader is None:
            reader = self._readers[topic] = self._ctx.log_reader(unit.proc.log_topic)
        end = await reader.end_offset(partition)
        try:
            await unit.proc.caught_up(partition, end)
        except (PartitionMoved, SowstreamError):
            return False
        return (topic, partition) in self.runtime.counts

    async def run(self) -> None:
        """Lease and deliver, once every subscription is known, until the worker stops."""
        await self._ctx.subscriptions_known.wait()
        await self.runtime.run()

    def assign(self, assigned: Partitions) -> None:
        """Nothing to do: the queue's messages are loaded with their log partitions."""

    async def drop(self, revoked: Partitions) -> None:
        if self.runtime.view_feed is not None:  # ours land before the next owner's
            await self.runtime.view_feed.settle()

    async def tick(self) -> None:
        """Nothing to do: the delivery loop keeps its own time."""

    # -- Kafka and meta topics --------------------------------------------------------------------

    def specs(self) -> list[TopicSpec]:
        specs = [TopicSpec(self._ctx.names.queue_expired(self.name), 1, {"retention.ms": "-1"})]
        if self._positions is not None:
            retention = {"retention.ms": str(POSITIONS_RETENTION_MS)}
            specs.append(TopicSpec(self._ctx.names.queue_positions(self.name), 1, retention))
        return specs

    def describe(self, infos: Infos) -> None:
        """The queue's own record (a queue named like one of its topics shares that topic's
        record: publishes go to the topic, subscriptions lease from the queue), and the record of
        its available messages' topic marked as the queue's."""
        config, queue = self._config, self.runtime.config
        kept = {t.name for t in config.queue_view_topics.values()}  # never a queue's own topic
        queued = [
            t for t in config.topics if t.message_type == queue.message_type and t.name not in kept
        ]
        target = publish_topic(queue, queued)
        assert target is not None  # config.queues.check_queues saw to it
        codec = self._topics[target.ident].compiled.codec if target.ident in self._topics else None
        ident = topic_ident(queue.name, queue.message_type)  # the meta record's key, as a topic's
        info = infos.get(ident) or {
            **topic_info(target, self._ctx.names, codec=codec),
            "name": queue.name,
        }
        if target.pattern is not None and target.matches_name(queue.publish_target):
            # The target is one name of a Pattern topic: publishes to the queue go under it
            # (the queue is no Pattern topic itself: its name is not one the Pattern owns).
            # A queue over the Pattern topic's Name keeps the Pattern: a publish to it must
            # name a topic the Pattern owns, and clients refuse one that does not.
            info = {**info, "pattern": "", "publish_as": queue.publish_target}
        sources = [t.name for t, _ in queue_sources(queue, queued)]
        infos[ident] = {**info, "queue_of": sources}
        if self._available is not None and self._available.ident in infos:
            own = self._available.ident
            infos[own] = {**infos[own], "view_of": [queue.name]}
