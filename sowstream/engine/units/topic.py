"""A SOW topic on a worker: its processor, the pump feeding it from its log, its control inbox.

The unit compiles what the topic's records go through (its message type and its Preprocessing
and Enrichment stages) once, when the worker is assembled, and holds them for everything that
reads the topic's records.
"""

from __future__ import annotations

from sowstream.config.models import TopicConfig
from sowstream.engine.commands import CommandInbox
from sowstream.engine.processor import TopicProcessor
from sowstream.engine.pump import LogPump
from sowstream.engine.units.base import Context, ControlInbox, Partitions
from sowstream.messagetypes import MessageType, registry
from sowstream.sow.enrich import ENRICHMENT, NO_STAGES, PREPROCESSING, TopicStages, compile_stage
from sowstream.subscriptions.matcher import EntitlementLookup


def compile_stages(topic: TopicConfig) -> TopicStages:
    """The topic's compiled Preprocessing and Enrichment (:data:`NO_STAGES` when it has none)."""
    if not topic.preprocessing and not topic.enrichment:
        return NO_STAGES
    return TopicStages(
        compile_stage(PREPROCESSING, topic.preprocessing, instance_name=topic.instance_name)
        if topic.preprocessing
        else None,
        compile_stage(
            ENRICHMENT, topic.enrichment, instance_name=topic.instance_name, key_fields=topic.keys
        )
        if topic.enrichment
        else None,
    )


class TopicUnit:
    """One SOW topic (declared, derived or created on first use) on this worker."""

    def __init__(
        self,
        topic: TopicConfig,
        ctx: Context,
        *,
        entitlement: EntitlementLookup | None = None,
        feeds_queues: bool = False,
        auto: bool = False,
    ) -> None:
        self.topic = topic
        self.codec: MessageType = registry.get(topic.message_type, topic)
        self.stages = compile_stages(topic)
        # Queues take their messages from this topic's publishes (and keep them in its store).
        self.feeds_queues = feeds_queues
        # Created on first use: its commands come through the shared control topic.
        self.auto = auto
        self._ctx = ctx
        names = ctx.names
        self.ctl_topic = (
            names.auto_control if auto else names.control(topic.name, topic.message_type)
        )
        self.table = None
        if not auto and topic.durability == "persistent" and (topic.sow or feeds_queues):
            self.table = ctx.wiring.table(f"sow-{topic.kafka_name}", topic.partitions, ctx.rocksdb)
        log_topic = names.log(topic.name, topic.message_type)
        self.proc = TopicProcessor(
            topic,
            names,
            ctx.sender,
            table=self.table,
            log_reader=ctx.log_reader(log_topic),
            entitlement=entitlement,
        )
        consumer = {
            "bootstrap.servers": ctx.bootstrap,
            "group.id": f"{ctx.app_id}-log-pump",
            **ctx.kafka,
        }
        self.pump = LogPump(self.proc, self.ctl_topic, ctx.assignment, consumer)
        # Commands of the topic's own control topic, handled in batches by the command router.
        self.inbox: ControlInbox | None = None if auto else CommandInbox()

    @property
    def name(self) -> str:
        return self.topic.name

    def declare(self) -> None:
        if self.inbox is None:  # created on first use, the worker already runs
            self._ctx.wiring.background(self.run())
            return
        self._ctx.wiring.command_agent(
            self.ctl_topic, self.topic.partitions, f"sowstream.ctl.{self.topic.ident}", self.inbox
        )
        self._ctx.wiring.task(self.run)

    async def run(self) -> None:
        """Apply the topic's log, once the worker is open for it, until the worker stops."""
        await self._ctx.logs_open.wait()
        await self.pump.run()

    def assign(self, assigned: Partitions) -> None:
        """Nothing to do: the pump follows the assignment on every fetch."""

    async def drop(self, revoked: Partitions) -> None:
        await self.proc.drop(revoked.of(self.ctl_topic))

    async def tick(self) -> None:
        # Warm up newly assigned partitions (recovery, expiry of records that expired while no
        # worker held them), then expire what is due.
        for partition in self.pump.owned():
            await self.proc.ready(partition)
        await self.proc.expire_due()
        await self.proc.prune_history()
