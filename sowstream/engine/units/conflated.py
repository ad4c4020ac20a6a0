"""A conflated topic on a worker: its runner (:class:`~sowstream.engine.conflated.ConflatedRunner`)
folding its input topic and flushing every Interval, and the feed that makes its underlying
topic's processor (a SOW topic's, a view's or another conflated topic's) fill that input."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sowstream.config.conflated import ConflatedTopicConfig
from sowstream.config.models import TopicConfig
from sowstream.config.root import SowstreamConfig
from sowstream.engine.conflated import ConflatedRunner
from sowstream.engine.meta import Infos, input_topic_spec
from sowstream.engine.units.base import Context, FedUnit
from sowstream.engine.units.topic import TopicUnit
from sowstream.views.conflated import ConflatedFeed
from sowstream.wire.kafka import TopicSpec


class ConflatedUnit(FedUnit):
    """One conflated topic on this worker (``own``: the conflated topic as a SOW topic)."""

    kind = "conflated topic"

    def __init__(
        self,
        conflated: ConflatedTopicConfig,
        own: TopicConfig,
        underlying: TopicConfig,
        ctx: Context,
        topics: Mapping[str, TopicUnit],
    ) -> None:
        self.conflated = conflated
        self._ctx = ctx
        unit = topics[own.ident]
        unit.proc.view_name = conflated.name
        self.name = own.ident
        names = ctx.names
        self.input_topic = names.view_input(conflated.name, own.message_type)
        table = ctx.wiring.table(f"conflated-{own.kafka_name}", conflated.partitions)
        self.runner: ConflatedRunner = ConflatedRunner(
            conflated,
            ctx.sender,
            table,
            ctx.log_reader(self.input_topic),
            input_topic=self.input_topic,
            log_topic=names.log(conflated.name, own.message_type),
            codec=unit.compiled.codec,
            pattern=own.pattern is not None,
            log_partitions=own.partitions,
        )
        topics[underlying.ident].proc.views.append(ConflatedFeed(conflated, self.input_topic))

    @staticmethod
    def sow_topics(config: SowstreamConfig) -> Sequence[TopicConfig]:
        """Each conflated topic as the SOW topic readers see."""
        return config.conflated_topic_configs

    @classmethod
    def from_config(
        cls, config: SowstreamConfig, ctx: Context, topics: Mapping[str, TopicUnit]
    ) -> list[ConflatedUnit]:
        return [
            cls(
                conflated,
                own,
                config.topic(conflated.underlying_topic, own.message_type),
                ctx,
                topics,
            )
            for conflated, own in zip(
                config.conflated_topics, config.conflated_topic_configs, strict=True
            )
        ]

    def declare(self) -> None:
        self._declare_input(self.conflated.partitions, f"sowstream.conflated.{self.name}")
        self._ctx.wiring.task(self.runner.run)  # the flush every Interval

    def specs(self) -> list[TopicSpec]:
        return [input_topic_spec(self.input_topic, self.conflated.partitions)]

    def describe(self, infos: Infos) -> None:
        # Only the engine writes a conflated topic: clients refuse publishes as for a view.
        infos[self.name] = {**infos[self.name], "view_of": [self.conflated.underlying_topic]}
