"""The root of a configuration: :class:`SowstreamConfig`, the top of ``sowstream.config``.

It holds the engine settings and every SOW topic, queue, view and conflated topic, and checks them
against each other; the models it holds and their own checks live in the modules below it.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import model_validator

from sowstream.config.conflated import (
    ConflatedProblem,
    ConflatedTopicConfig,
    check_conflated_topics,
    definition_order,
)
from sowstream.config.errors import FieldProblem
from sowstream.config.fields import Frozen
from sowstream.config.models import (
    EngineConfig,
    Entitlements,
    TopicConfig,
    ambiguous_pattern,
    match_topic_names,
)
from sowstream.config.queues import (
    QUEUE_MESSAGE_TYPES,
    QueueConfig,
    available_topic_name,
    check_queues,
    queue_sources,
)
from sowstream.config.views import (
    ViewConfig,
    ViewProblem,
    check_view_sources,
    check_views,
)
from sowstream.errors import InvalidCommandError, UnknownTopicError
from sowstream.filters import Filter, compile_filter


class SowstreamConfig(Frozen):
    """A whole configuration: engine settings, SOW topics and queues, read from ``source``."""

    engine: EngineConfig = EngineConfig()
    topics: tuple[TopicConfig, ...] = ()
    queues: tuple[QueueConfig, ...] = ()
    views: tuple[ViewConfig, ...] = ()
    conflated_topics: tuple[ConflatedTopicConfig, ...] = ()
    entitlements: Entitlements = Entitlements()
    # What each identity may publish: a publish must match the filter (checked as received).
    publish_entitlements: Entitlements = Entitlements()
    source: str = "<string>"

    def stamped(self) -> SowstreamConfig:
        """This configuration with each SOW topic given what its log records need from the rest
        of it (the loaders' last step): the instance name and the publish entitlements."""
        instance = self.engine.effective_instance_name
        rules = self.publish_entitlements.rules
        topics = tuple(
            t.model_copy(
                update={
                    "instance_name": instance,
                    "publish_filters": tuple(
                        sorted((who, on[t.name]) for who, on in rules.items() if t.name in on)
                    ),
                }
            )
            for t in self.topics
        )
        return self.model_copy(update={"topics": topics})

    def entitlement_lookup(self, topic: str) -> Callable[[str], Filter | None]:
        """identity -> compiled entitlement filter on ``topic`` (cached; None = all visible).

        The topic the engine keeps of a queue's available messages holds the queue's messages:
        without a rule of its own, the queue's rules apply to it."""
        cache: dict[str, Filter | None] = {}
        queue = next((q for q, t in self.queue_view_topics.items() if t.name == topic), None)

        def lookup(identity: str) -> Filter | None:
            if identity not in cache:
                text = self.entitlements.filter_text(identity, topic)
                if text is None and queue is not None:
                    text = self.entitlements.filter_text(identity, queue)
                cache[identity] = compile_filter(text) if text else None
            return cache[identity]

        return lookup

    @model_validator(mode="after")
    def _unique_names(self) -> SowstreamConfig:
        seen: dict[str, TopicConfig] = {}
        idents: set[str] = set()
        for topic in self.topics:
            if topic.ident in idents:
                raise FieldProblem(
                    "topics",
                    f"{topic.message_type} topic {topic.name!r} is defined more than once",
                )
            idents.add(topic.ident)
            other = seen.get(topic.kafka_name)
            if other is not None:
                raise FieldProblem(
                    "topics",
                    f"{other.message_type} topic {other.name!r} and {topic.message_type} topic "
                    f"{topic.name!r} would share the Kafka topic names {topic.kafka_name!r}: "
                    "rename one",
                )
            seen[topic.kafka_name] = topic
        check_queues(self.queues, self.topics)
        # Loaders check in document order first; here each kind keeps its own order, with
        # conflated topics placed right after what they read (definition_order).
        defined = definition_order(self.topics, self.queues, self.conflated_topics, self.views)
        unviewable = {q.name: q.message_type for q in self.queues}
        for index, view in enumerate(self.views):
            for ref in view.topics:
                kind = unviewable.get(ref.topic)
                if kind not in (None, *QUEUE_MESSAGE_TYPES) and not any(
                    t.name == ref.topic for t in self.topics
                ):
                    raise FieldProblem(
                        "views",
                        f"views[{index}]: view {view.name!r} reads queue {ref.topic!r}, a {kind} "
                        "queue: views read json queues only",
                    )
        try:
            check_views(self.views, defined)
            viewable = [q.name for q in self.queues if q.message_type in QUEUE_MESSAGE_TYPES]
            check_view_sources(self.views, self.topics, viewable)
        except ViewProblem as exc:
            raise FieldProblem("views", f"views[{exc.index}]: {exc}") from None
        try:
            check_conflated_topics(self.conflated_topics, self.topics, defined, self.views)
        except ConflatedProblem as exc:
            raise FieldProblem(
                "conflated_topics", f"conflated_topics[{exc.index}]: {exc}"
            ) from None
        return self

    @property
    def view_topics(self) -> tuple[TopicConfig, ...]:
        """Each view as the SOW topic readers see (:meth:`ViewConfig.topic_config`)."""
        return tuple(v.topic_config() for v in self.views)

    @property
    def queue_view_topics(self) -> dict[str, TopicConfig]:
        """Per queue some view reads, the SOW topic of its available messages that the engine
        keeps for the view (json, partitioned like the widest of the queue's topics)."""
        read = {name for view in self.views for name in view.underlying_names}
        ours = {available_topic_name(q.name) for q in self.queues}
        readable = [
            t for t in self.topics if t.message_type in QUEUE_MESSAGE_TYPES and t.name not in ours
        ]
        out: dict[str, TopicConfig] = {}
        for queue in self.queues:
            if queue.name not in read or any(t.name == queue.name for t in self.topics):
                continue  # a queue named like its topic: views read the topic
            if queue.message_type not in QUEUE_MESSAGE_TYPES:
                continue  # the view's check names the queue it cannot read
            partitions = [t.partitions for t, _ in queue_sources(queue, readable)]
            out[queue.name] = TopicConfig(
                name=available_topic_name(queue.name),
                message_type="json",
                partitions=max(partitions, default=1),
            )
        return out

    @property
    def conflated_topic_configs(self) -> tuple[TopicConfig, ...]:
        """Each conflated topic as the SOW topic readers see
        (:meth:`ConflatedTopicConfig.topic_config`)."""
        built: dict[str, tuple[TopicConfig, tuple[str, ...]]] = {}

        def build(c: ConflatedTopicConfig) -> tuple[TopicConfig, tuple[str, ...]]:
            # (the conflated topic, the key fields of the records it copies); views and
            # conflated topics first: an engine's copy of the config lists them as topics too.
            if c.name not in built:
                name = c.underlying_topic
                inner = next((i for i in self.conflated_topics if i.name == name), None)
                view = next((v for v in self.views if v.name == name), None)
                if inner is not None:
                    underlying, keys = build(inner)
                elif view is not None:
                    underlying = view.topic_config()
                    keys = view.compile().projection.grouping_outputs or ()
                else:
                    underlying = self.topic(name, c.message_type)
                    keys = underlying.keys
                own = c.topic_config(underlying, keys)
                # What AMPS_INSTANCE_NAME() gives in its Enrichment (as stamped on SOW topics).
                own = own.model_copy(update={"instance_name": self.engine.effective_instance_name})
                built[c.name] = (own, keys)
            return built[c.name]

        return tuple(build(c)[0] for c in self.conflated_topics)

    def view(self, name: str) -> ViewConfig:
        """The view called ``name``; UnknownTopicError if there is none."""
        for view in self.views:
            if view.name == name:
                return view
        raise UnknownTopicError(name)

    def topic(self, name: str, message_type: str | None = None) -> TopicConfig:
        """The topic called ``name`` of ``message_type``; UnknownTopicError if there is none.

        Without a message type: the one topic of that name, the json one if several share it.
        """
        found = [
            t
            for t in self.topics
            if t.name == name and (message_type is None or t.message_type == message_type)
        ]
        if len(found) > 1:
            found = [t for t in found if t.message_type == "json"] or found
            if len(found) > 1:
                kinds = ", ".join(t.message_type for t in found)
                raise InvalidCommandError(
                    f"topics of several message types are named {name!r} ({kinds}): "
                    "say which message type"
                )
        if not found:
            raise UnknownTopicError(name)
        return found[0]

    def queue(self, name: str) -> QueueConfig:
        """The queue called ``name``; UnknownTopicError if there is none."""
        for queue in self.queues:
            if queue.name == name:
                return queue
        raise UnknownTopicError(name)

    def pattern_topic_for(self, name: str, message_type: str = "json") -> TopicConfig | None:
        """The Pattern topic of ``message_type`` that topic name ``name`` belongs to, or None.

        A topic declared with exactly that name wins over any Pattern (so None); a name that
        several Pattern topics match is ambiguous: InvalidCommandError names them.
        """
        if any(t.name == name and t.message_type == message_type for t in self.topics):
            return None
        found = [t for t in self.topics if t.message_type == message_type and t.matches_name(name)]
        if len(found) > 1:
            raise InvalidCommandError(ambiguous_pattern(name, [t.name for t in found]))
        return found[0] if found else None

    def topics_matching(self, pattern: str) -> list[TopicConfig]:
        """Topics whose whole name matches the regular expression ``pattern``, as AMPS queries do.

        A plain name matches itself; an invalid pattern raises InvalidCommandError.
        """
        names = set(match_topic_names(pattern, [t.name for t in self.topics]))
        return [t for t in self.topics if t.name in names]
