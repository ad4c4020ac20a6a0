"""A view on a worker: its maintainer (:class:`~sowstream.engine.views.ViewRunner`) reading the
view's input topic, and the feeds that make its underlying topics' processors fill that topic."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sowstream.config.models import TopicConfig
from sowstream.config.root import SowstreamConfig
from sowstream.config.views import ViewConfig
from sowstream.engine.meta import Infos, input_topic_spec
from sowstream.engine.units.base import Context, FedUnit
from sowstream.engine.units.topic import TopicUnit
from sowstream.engine.views import ViewRunner
from sowstream.views.projection import TopicRef
from sowstream.views.routing import ViewFeed, input_partitions
from sowstream.wire.kafka import TopicSpec
from sowstream.wire.topics import topic_ident


def underlying(
    ref: TopicRef, topics: Mapping[str, TopicUnit], queue_views: Mapping[str, TopicConfig]
) -> TopicUnit:
    """The unit of a view's underlying topic (json when the reference names no type and topics
    of several types share the name); for a queue, the topic of its available messages."""
    if ref.topic in queue_views:
        return topics[queue_views[ref.topic].ident]
    if ref.message_type is not None:
        return topics[topic_ident(ref.topic, ref.message_type)]
    found = [u for u in topics.values() if u.topic.name == ref.topic]
    json = [u for u in found if u.topic.message_type == "json"]
    return (json or found)[0]


class ViewUnit(FedUnit):
    """One view on this worker."""

    kind = "view"

    def __init__(
        self,
        view: ViewConfig,
        ctx: Context,
        topics: Mapping[str, TopicUnit],
        queue_views: Mapping[str, TopicConfig],
    ) -> None:
        self.view = view
        self._ctx = ctx
        own = topics[view.topic_config().ident]  # the view as a SOW topic, to readers
        own.proc.view_name = view.name
        self.name = own.topic.ident
        self._partitions = input_partitions(view)
        names = ctx.names
        self.input_topic = names.view_input(view.name, view.message_type)
        table = ctx.wiring.table(f"view-{own.topic.kafka_name}", self._partitions, ctx.rocksdb)
        self.runner: ViewRunner = ViewRunner(
            view,
            ctx.sender,
            table,
            ctx.log_reader(self.input_topic),
            input_topic=self.input_topic,
            log_topic=names.log(view.name, view.message_type),
            codec=own.compiled.codec,
            log_partitions=view.partitions,
        )
        for ref in view.topics:
            # A queue's available messages change without a log of their own: only real
            # changes count (a restated message is no change, see engine.queue_views).
            feed = ViewFeed(
                view, ref.topic, self.input_topic, only_changes=ref.topic in queue_views
            )
            underlying(ref, topics, queue_views).proc.views.append(feed)

    @staticmethod
    def sow_topics(config: SowstreamConfig) -> Sequence[TopicConfig]:
        """Each view as the SOW topic readers see."""
        return config.view_topics

    @classmethod
    def from_config(
        cls, config: SowstreamConfig, ctx: Context, topics: Mapping[str, TopicUnit]
    ) -> list[ViewUnit]:
        queue_views = config.queue_view_topics
        return [cls(view, ctx, topics, queue_views) for view in config.views]

    def declare(self) -> None:
        self._declare_input(self._partitions, f"sowstream.view.{self.name}")

    def specs(self) -> list[TopicSpec]:
        return [input_topic_spec(self.input_topic, self._partitions)]

    def describe(self, infos: Infos) -> None:
        infos[self.name] = {**infos[self.name], "view_of": list(self.view.underlying_names)}
