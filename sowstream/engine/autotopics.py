"""Topics in no configuration, created on first use (``engine.auto_create_topics``).

They are plain topics with one partition count, so one control topic (``<prefix>.ctl-auto``,
co-partitioned with their logs) serves them all, and faust's subscription never has to change.
The worker that owns the control partition a ``declare_topic`` arrives on creates the topic's log
and writes its definition to the meta topic (``auto`` set); every worker follows the meta topic
(:class:`~sowstream.engine.directory.TopicDirectory`) and serves each topic found there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from confluent_kafka import KafkaException

from sowstream.config.models import TopicConfig
from sowstream.config.root import SowstreamConfig
from sowstream.engine.commands import ControlRecord
from sowstream.engine.directory import TopicDirectory
from sowstream.engine.meta import log_topic_spec, topic_info, write_meta
from sowstream.engine.ports import StateTable
from sowstream.engine.queries import refusal
from sowstream.engine.queues import QueueRuntime
from sowstream.engine.registry import Refuse
from sowstream.engine.topology import Topology
from sowstream.engine.units.topic import TopicUnit
from sowstream.errors import InvalidCommandError, SowstreamError
from sowstream.filters import FilterError
from sowstream.subscriptions.model import SubscriptionSpec
from sowstream.wire import headers as h
from sowstream.wire.kafka import ensure_topics
from sowstream.wire.topics import JSON, kafka_topic_part, topic_ident

log = logging.getLogger("sowstream.engine")


class AutoTopics:
    """Creates topics on first use, and serves every topic created so (by any worker)."""

    def __init__(self, config: SowstreamConfig, topology: Topology) -> None:
        self._config = config
        self._topology = topology
        self._ctx = ctx = topology.ctx
        self._declared = {t.ident for t in config.topics} | {
            topic_ident(q.name, q.message_type) for q in config.queues
        }
        # Registrations for topics not known (yet): applied when the topic turns up.
        self._unplaced: dict[str, dict[str, SubscriptionSpec]] = {}
        self.directory = TopicDirectory(ctx.bootstrap, ctx.names.meta, ctx.kafka, self.add)
        # Tells a client its registration is refused (set by the worker's Clients).
        self.refuse: Refuse | None = None
        # Where topics created on first use that a queue's regular expression matches keep the
        # queue's messages and acknowledgements, each under its own prefix: one table,
        # co-partitioned with the shared control topic, declared now (faust adds none later).
        self._queued: StateTable | None = None
        if any(q.underlying_is_pattern for q in config.queues):
            self._queued = ctx.wiring.table(
                "auto-queued", config.engine.auto_topic_partitions, ctx.rocksdb
            )

    def declare(self, commands: Callable[[ControlRecord], Awaitable[None]]) -> None:
        """Hand the shared control topic's records to ``commands``; follow the meta topic."""
        ctx = self._ctx
        partitions = self._config.engine.auto_topic_partitions
        ctx.wiring.record_agent(ctx.names.auto_control, partitions, "sowstream.ctl-auto", commands)
        ctx.wiring.task(self.directory.run)

    def _topic(self, name: str, message_type: str = JSON) -> TopicConfig:
        """The definition every topic created on first use has: plain, no Key, of the message
        type it was first used with."""
        return TopicConfig(
            name=name,
            message_type=message_type,
            sow=False,
            partitions=self._config.engine.auto_topic_partitions,
        )

    # -- serving ----------------------------------------------------------------------------------

    def add(self, name: str, message_type: str = JSON) -> None:
        """Serve ``name``, a topic created on first use (found on the meta topic or just made)."""
        ident = topic_ident(name, message_type)
        if ident in self._topology.topics or ident in self._declared:
            return
        try:
            topic = self._topic(name, message_type)
        except ValueError as exc:  # a definition some other writer put on the meta topic
            log.warning("ignored auto-created topic %r: %s", name, exc)
            return
        readers = self._readers(name, message_type)
        unit = TopicUnit(
            topic,
            self._ctx,
            entitlement=self._config.entitlement_lookup(name),
            auto=True,
            feeds_queues=bool(readers),
            shared_table=self._queued if readers else None,
        )
        for queue in readers:  # before the unit starts: every publish reaches its queues
            unit.proc.queues.append(queue)
        self._topology.add(unit)
        for key, spec in self._unplaced.pop(ident, {}).items():
            try:
                unit.proc.subs.upsert(spec, held=unit.proc.partitions)
            except (FilterError, InvalidCommandError) as exc:
                # Refused on its own: the topic is served for every other subscriber.
                if self.refuse is not None:
                    self.refuse(key, spec.to_wire(), refusal(exc), f"topic {name!r}: {exc}")
        unit.declare()
        log.info("serving topic %s (created on first use)", ident)
        if readers:
            self._ctx.wiring.background(self._describe_queues(readers))

    async def _describe_queues(self, readers: list[QueueRuntime]) -> None:
        """Publish the definitions of ``readers`` with every topic created on first use that
        feeds them in ``queue_of`` (clients route acknowledgements and browses by it).

        Every worker does so as it learns of such a topic, so the record ends complete even when
        two workers create topics of one queue at once."""
        infos = self._topology.definitions()
        auto = [u.topic for u in self._topology.topics.values() if u.auto]
        update: dict[str, Any] = {}
        for runtime in readers:
            queue = runtime.config
            ident = topic_ident(queue.name, queue.message_type)
            if ident not in infos:
                continue
            extra = [t.name for t in auto if queue.reads(t)]
            listed = list(infos[ident].get("queue_of") or [])
            update[ident] = {
                **infos[ident],
                "queue_of": [*listed, *sorted(set(extra) - set(listed))],
            }
        if not update:
            return
        ctx = self._ctx
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, write_meta, ctx.bootstrap, ctx.kafka, ctx.names, update
            )
        except (SowstreamError, KafkaException) as exc:
            log.warning("could not publish the topics of queues %s: %s", sorted(update), exc)

    def _readers(self, name: str, message_type: str) -> list[QueueRuntime]:
        """The queues whose regular expression UnderlyingTopic matches topic ``name``."""
        return [
            runtime
            for runtime in self._topology.queues.values()
            if runtime.config.underlying_is_pattern
            and runtime.config.message_type == message_type
            and runtime.config.matches_topic(name)
        ]

    def hold(self, topic: str, key: str, spec: SubscriptionSpec | None) -> None:
        """A registration (None: its removal) for ``topic``, not known here (yet): kept until the
        topic turns up, maybe created on first use by another worker."""
        if spec is None:
            self._unplaced.get(topic, {}).pop(key, None)
        else:
            self._unplaced.setdefault(topic, {})[key] = spec

    async def caught_up(self) -> None:
        await self.directory.caught_up()

    # -- creating ---------------------------------------------------------------------------------

    async def declare_topic(self, name: str, message_type: str = JSON) -> str | None:
        """Create topic ``name`` of ``message_type`` unless it is served already; why it cannot
        be, or None."""
        ident = topic_ident(name, message_type)
        if ident in self._topology.topics or ident in self._declared:
            return None
        problem = self.refusal(name, message_type)
        if problem is None:
            try:
                await self._create(name, message_type)
            except (SowstreamError, KafkaException) as exc:
                problem = f"topic {name!r} could not be created: {exc}"
        return problem

    def refusal(self, name: str, message_type: str = JSON) -> str | None:
        """Why ``name`` may not be created on first use (as a ``message_type`` topic), or None."""
        config, names = self._config, self._ctx.names
        try:
            owner = config.pattern_topic_for(name)
        except InvalidCommandError as exc:
            return str(exc)
        if owner is not None:
            return (
                f"topic {name!r} matches the Pattern {owner.pattern!r} of topic {owner.name!r}: "
                "its records go to that regular expression topic (publish with the name in the "
                f"{h.TOPIC} header to {names.log(owner.name, owner.message_type)})"
            )
        if not config.engine.auto_create_topics:
            return (
                f"topic {name!r} is not declared and engine.auto_create_topics is false: declare "
                "it under sow: or topics: in the configuration, or set "
                "engine.auto_create_topics: true"
            )
        try:
            self._topic(name, message_type)
        except ValueError as exc:
            problem = "; ".join(e["msg"] for e in getattr(exc, "errors", lambda: [])())
            return f"topic {name!r} cannot be created: {problem or exc}"
        known = [*config.topics, *(u.topic for u in self._topology.topics.values())]
        taken = {t.kafka_name: t for t in known}
        other = taken.get(kafka_topic_part(name, message_type))
        if other is not None and other.ident != topic_ident(name, message_type):
            return (
                f"topic {name!r} cannot be created: it would share the Kafka topics of "
                f"{other.ident!r} ({names.log(other.name, other.message_type)})"
            )
        return None

    async def _create(self, name: str, message_type: str) -> None:
        """Create the log of topic ``name`` and publish its definition (``auto`` set)."""
        ctx, engine = self._ctx, self._config.engine
        loop = asyncio.get_running_loop()
        topic = self._topic(name, message_type)
        spec = log_topic_spec(ctx.names, name, topic.partitions, message_type)
        await loop.run_in_executor(
            None,
            lambda: ensure_topics(
                ctx.bootstrap,
                [spec],
                replication_factor=engine.replication_factor,
                extra=ctx.kafka,
            ),
        )
        info = {topic.ident: topic_info(topic, ctx.names, auto=True)}
        await loop.run_in_executor(None, write_meta, ctx.bootstrap, ctx.kafka, ctx.names, info)
        self.add(name, message_type)
        log.info("created topic %s on first use (engine.auto_create_topics)", topic.ident)
