"""From a configuration to the units a worker runs, and what Kafka must hold for them.

Every SOW topic becomes a :class:`~sowstream.engine.units.topic.TopicUnit` (views, conflated
topics and queue-read queues are SOW topics to readers, so theirs too); then each kind of derived
topic in :data:`DERIVED` makes its units, in order, linking them to the topic units they read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from sowstream.config.models import TopicConfig
from sowstream.config.queues import queue_sources
from sowstream.config.root import SowstreamConfig
from sowstream.engine.meta import Infos, control_topic_spec, log_topic_spec, topic_info
from sowstream.engine.security import expand_environment
from sowstream.engine.units.base import Context, DerivedUnit, InputUnit, Unit
from sowstream.engine.units.conflated import ConflatedUnit
from sowstream.engine.units.queue import QueueUnit
from sowstream.engine.units.topic import TopicUnit
from sowstream.engine.units.view import ViewUnit
from sowstream.wire.kafka import TopicSpec
from sowstream.wire.topics import topic_ident


class DerivedKind(Protocol):
    """A kind of derived topic: its unit class, read from the configuration."""

    def sow_topics(self, config: SowstreamConfig) -> Sequence[TopicConfig]:
        """The SOW topics readers see of this kind (served like declared topics)."""

    def from_config(
        self, config: SowstreamConfig, ctx: Context, topics: Mapping[str, TopicUnit]
    ) -> Sequence[DerivedUnit]:
        """The kind's units, linked to the topic units they read or write (``topics``)."""


# Every kind of derived topic, in the order their units are made and driven (a queue's
# available messages feed views; a view can be the underlying topic of a conflated topic).
DERIVED: tuple[DerivedKind, ...] = (QueueUnit, ViewUnit, ConflatedUnit)


def serving_config(config: SowstreamConfig) -> SowstreamConfig:
    """``config`` as a worker serves it: each derived topic also a SOW topic (readers query and
    subscribe to a view like any topic: its log, control topic, table and processor are made
    like a declared topic's), and ``${NAME}`` in engine.kafka read from the environment (secrets
    stay out of the file)."""
    # Listed last kind first, as the worker always has (conflated topics, views, queues).
    derived = [topic for kind in reversed(DERIVED) for topic in kind.sow_topics(config)]
    if derived:
        config = config.model_copy(update={"topics": (*config.topics, *derived)})
    engine = config.engine.model_copy(update={"kafka": expand_environment(config.engine.kafka)})
    return config.model_copy(update={"engine": engine})


def queue_fed(config: SowstreamConfig) -> set[str]:
    """The topics whose publishes become queue messages (they keep a store for them): topics a
    queue reads (of its message type), not a queue's available messages."""
    kept = {t.ident for t in config.queue_view_topics.values()}
    readable = [t for t in config.topics if t.ident not in kept]
    return {t.ident for q in config.queues for t, _ in queue_sources(q, readable)}


class Topology:
    """The units of one worker, made from its (serving) configuration, and how to find them."""

    def __init__(self, config: SowstreamConfig, ctx: Context) -> None:
        self.config = config
        self.ctx = ctx
        # Every SOW topic's unit by identity, those created on first use included.
        self.topics: dict[str, TopicUnit] = {}
        fed = queue_fed(config)
        for topic in config.topics:
            self.add(
                TopicUnit(
                    topic,
                    ctx,
                    entitlement=config.entitlement_lookup(topic.name),
                    feeds_queues=topic.ident in fed,
                )
            )
        self.derived: list[DerivedUnit] = [
            unit for kind in DERIVED for unit in kind.from_config(config, ctx, self.topics)
        ]
        # By identity, like topics: the name for a json queue, <type>:<name> for another type.
        self.queues = {
            topic_ident(u.name, u.runtime.config.message_type): u.runtime
            for u in self.derived
            if isinstance(u, QueueUnit)
        }
        self.inputs = [u for u in self.derived if isinstance(u, InputUnit)]

    def add(self, unit: TopicUnit) -> None:
        """Serve one more SOW topic (one created on first use, once the worker runs)."""
        self.topics[unit.topic.ident] = unit

    @property
    def units(self) -> list[Unit]:
        """Every unit, SOW topics first (the order of every lifecycle step)."""
        return [*self.topics.values(), *self.derived]

    @property
    def static_topics(self) -> list[TopicUnit]:
        """The units of topics in the configuration (not created on first use)."""
        return [u for u in self.topics.values() if not u.auto]

    def conflated(self) -> list[ConflatedUnit]:
        return [u for u in self.derived if isinstance(u, ConflatedUnit)]

    # -- what Kafka holds -------------------------------------------------------------------------

    def topic_specs(self) -> list[TopicSpec]:
        """Kafka topics the engine expects, with their settings."""
        names, engine = self.ctx.names, self.config.engine
        specs = [
            TopicSpec(names.meta, 1, {"cleanup.policy": "compact"}),
            TopicSpec(names.dead_letter, 1, {"retention.ms": "-1"}),
            TopicSpec(names.subscriptions, 1, {"cleanup.policy": "compact"}),
            TopicSpec(names.workers, 1, {"cleanup.policy": "compact"}),
            control_topic_spec(names.auto_control, engine.auto_topic_partitions),
        ]
        for t in self.config.topics:
            specs.append(log_topic_spec(names, t.name, t.partitions, t.message_type))
            specs.append(control_topic_spec(names.control(t.name, t.message_type), t.partitions))
        for unit in self.derived:
            specs.extend(unit.specs())
        return specs

    def definitions(self) -> Infos:
        """Every meta-topic record: one per topic, completed by the derived topics' units."""
        infos: Infos = {}
        for t in self.config.topics:
            unit = self.topics.get(t.ident)
            infos[t.ident] = topic_info(
                t, self.ctx.names, codec=unit.compiled.codec if unit else None
            )
        for derived in self.derived:
            derived.describe(infos)
        return infos
