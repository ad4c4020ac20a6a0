"""A SOW topic on a worker: its processor, the pump feeding it from its log, its control inbox.

The unit compiles what the topic's records go through (its message type and its Preprocessing
and Enrichment stages, :func:`~sowstream.sow.compiled.compile_topic`) once, when the worker is
assembled, and holds them (:attr:`TopicUnit.compiled`) for everything that reads the topic's
records: its processor and the derived topics' units.
"""

from __future__ import annotations

from sowstream.config.models import TopicConfig
from sowstream.engine.commands import CommandInbox
from sowstream.engine.ports import StateTable
from sowstream.engine.processor import TopicProcessor
from sowstream.engine.pump import LogPump
from sowstream.engine.units.base import Context, ControlInbox, Partitions
from sowstream.sow.compiled import CompiledTopic, compile_topic
from sowstream.subscriptions.matcher import EntitlementLookup


def shared_prefix(ident: str) -> bytes:
    """Where topic ``ident`` keeps its keys in a table it shares: a first byte no key of a
    table's own has (faust's offset key starts with ``_``) and a NUL no topic name holds."""
    return b"\x01" + ident.encode() + b"\x00"


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
        shared_table: StateTable | None = None,
    ) -> None:
        """``shared_table``: for a topic created on first use that feeds a queue, the table it
        keeps its queue state in, under its own key prefix (:func:`shared_prefix`)."""
        self.topic = topic
        # What every record of the topic goes through, compiled once for all that read them.
        self.compiled: CompiledTopic[TopicConfig] = compile_topic(topic)
        # Queues take their messages from this topic's publishes (and keep them in its store).
        self.feeds_queues = feeds_queues
        # Created on first use: its commands come through the shared control topic.
        self.auto = auto
        self._ctx = ctx
        names = ctx.names
        self.ctl_topic = (
            names.auto_control if auto else names.control(topic.name, topic.message_type)
        )
        self.table: StateTable | None = None
        if not auto and topic.durability == "persistent" and (topic.sow or feeds_queues):
            self.table = ctx.wiring.table(f"sow-{topic.kafka_name}", topic.partitions, ctx.rocksdb)
        log_topic = names.log(topic.name, topic.message_type)
        self.proc = TopicProcessor(
            self.compiled,
            names,
            ctx.sender,
            table=self.table if shared_table is None else shared_table,
            log_reader=ctx.log_reader(log_topic),
            key_prefix=None if shared_table is None else shared_prefix(topic.ident),
            registry=ctx.registry,
            entitlement=entitlement,
            native=ctx.native,
        )
        self.proc.applier.authenticator = ctx.authenticator
        self.proc.ownership.created_on_first_use = auto
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
