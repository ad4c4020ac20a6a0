"""Queue definitions (AMPS ``Queue``, ``LocalQueue``, ``GroupLocalQueue``): model and checks.

A queue reads the logs of one or more declared topics (its underlying topics); every publish that
passes its ``Filter`` becomes one queue message. :class:`QueueConfig` checks what can be checked
on one definition; :func:`check_queues` checks the definitions against the configured topics
(names, underlying topics, publish targets), so both loaders and direct construction agree.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any, Literal, get_args

from pydantic import ValidationInfo, field_validator, model_validator

from sowstream.config.errors import FieldProblem
from sowstream.config.fields import (
    KAFKA_NAME_CHARS,
    Frozen,
    MessageType,
    amps_topic_name,
    bounded_int,
    interval_millis,
    message_type_name,
    one_of,
    parse_recovery_point,
    recovery_point_ms,
)
from sowstream.config.models import TopicConfig
from sowstream.filters import FilterError, ast, parse_filter

# Views read a queue's available messages as a json SOW topic (root.queue_view_topics), so a
# view can read json queues only; a queue itself carries any message type.
QUEUE_MESSAGE_TYPES = ("json",)
QueueKind = Literal["queue", "local", "group_local"]
Semantics = Literal["at-least-once", "at-most-once"]
FairnessModel = Literal["fast", "round-robin", "proportional"]
Leasing = Literal["strict", "sublet"]
# How a message's own expiration and the queue's Expiration combine (AMPS 5.3.5).
ExpirationModel = Literal["default", "queue", "latest", "earliest"]

MIN_TARGET_QUEUE_DEPTH = 1000
DAY_MS = 86_400_000
_MAX_COUNT = 2**62

# Functions whose answer can differ between two reads of the same log record; a queue filter or
# barrier test must be repeatable because the queue state is rebuilt by replaying the log.
NON_DETERMINISTIC_FUNCTIONS = ("UNIX_TIMESTAMP", "LAST_READ", "VALUE_LOOKUP")
_UNKNOWN_FUNCTION = re.compile(r"unknown function '(\w+)'|(\w+) is only available in")

# AMPS element of each kind, and the kind of each element (QueueDefinition is an old synonym).
KIND_ELEMENTS: dict[str, str] = {
    "queue": "Queue",
    "local": "LocalQueue",
    "group_local": "GroupLocalQueue",
}
ELEMENT_KINDS: dict[str, str] = {
    "Queue": "queue",
    "QueueDefinition": "queue",
    "LocalQueue": "local",
    "GroupLocalQueue": "group_local",
}

# AMPS element name -> QueueConfig field (the YAML keys and the XML child elements).
QUEUE_ELEMENTS: dict[str, str] = {
    "Name": "name",
    "MessageType": "message_type",
    "UnderlyingTopic": "underlying_topic",
    "DefaultPublishTarget": "default_publish_target",
    "LeasePeriod": "lease_period_ms",
    "Semantics": "semantics",
    "MaxBacklog": "max_backlog",
    "MaxPerSubscriptionBacklog": "max_per_subscription_backlog",
    "TargetQueueDepth": "target_queue_depth",
    "Expiration": "expiration_ms",
    "ExpirationModel": "expiration_model",
    "Filter": "filter",
    "RecoveryPoint": "recovery_point",
    "FairnessModel": "fairness_model",
    "Leasing": "leasing",
    "MaxDeliveries": "max_deliveries",
    "MaxCancels": "max_cancels",
    "Priority": "priority",
    "BarrierExpression": "barrier_expression",
    "DeferredAckExpiration": "deferred_ack_expiration_ms",
    "FileBackedMetadata": "file_backed_metadata",
    "InitialOwner": "initial_owner",
    "GroupLocalQueueDomain": "group_local_queue_domain",
}
FIELD_ELEMENTS: dict[str, str] = {field: tag for tag, field in QUEUE_ELEMENTS.items()}

log = logging.getLogger("sowstream.config")


class QueueProblem(FieldProblem):
    """A check across definitions failed: ``index`` is the queue's position, ``field`` its field."""

    def __init__(self, index: int, field: str, message: str) -> None:
        super().__init__(field, message)
        self.index = index


def is_topic_pattern(text: str) -> bool:
    """Whether an UnderlyingTopic is a regular expression rather than one topic's name.

    A name made only of the characters a topic name may hold is taken literally (so ``a.b`` is
    the topic ``a.b``); anything else is a pattern matched against whole topic names.
    """
    return KAFKA_NAME_CHARS.fullmatch(text) is None


def checked_expression(text: object, what: str, *, predicate: bool) -> str:
    """``text`` if the filter language parses it, else a ValueError giving the position.

    Functions that are not repeatable on a log replay are named as such rather than as unknown.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{what} must be a non-empty expression, got {text!r}")
    try:
        tree = parse_filter(text)
    except FilterError as exc:
        match = _UNKNOWN_FUNCTION.match(exc.reason)
        name = (match[1] or match[2]).upper() if match else ""
        if name in NON_DETERMINISTIC_FUNCTIONS:
            raise ValueError(_non_deterministic(what, name, exc.position)) from None
        raise ValueError(f"bad {what}: {exc}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Func) and node.name in NON_DETERMINISTIC_FUNCTIONS:
            raise ValueError(_non_deterministic(what, node.name, node.pos))
    if predicate and not ast.is_predicate(tree) and not isinstance(tree, ast.Path):
        raise ValueError(f"{what} {text!r} is a value, not a condition")
    return text.strip()


def _non_deterministic(what: str, name: str, position: int) -> str:
    return (
        f"{what} calls {name} at position {position}: queue state is rebuilt by replaying the "
        "log, so its expressions must give the same answer every time; "
        f"{', '.join(NON_DETERMINISTIC_FUNCTIONS)} are not allowed here"
    )


def _optional_interval(value: object, what: str, *, zero_ok: bool) -> int | None:
    if value is None:
        return None
    millis = interval_millis(value, what)
    if millis < 0 or (millis == 0 and not zero_ok):
        raise ValueError(f"{what} must be longer than 0 (leave it out for no limit)")
    return millis


def _text_value(value: object, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return value.strip()


class QueueConfig(Frozen):
    """One queue: which log records it takes, and how they are leased, ordered and expired.

    Intervals are milliseconds (``None`` = no limit); ``default_publish_target`` is filled in
    from a plain ``underlying_topic``; ``fairness_model`` defaults by ``semantics``.
    """

    name: str
    kind: QueueKind = "queue"
    message_type: MessageType = "json"
    underlying_topic: str
    default_publish_target: str | None = None
    lease_period_ms: int | None = None
    semantics: Semantics = "at-least-once"
    max_backlog: int | None = None
    max_per_subscription_backlog: int = 1
    target_queue_depth: int | None = None
    expiration_ms: int | None = None
    expiration_model: ExpirationModel = "default"
    filter: str | None = None
    recovery_point: str = "epoch"
    fairness_model: FairnessModel
    leasing: Leasing = "sublet"
    max_deliveries: int = 0
    max_cancels: int = 0
    priority: str | None = None
    barrier_expression: str | None = None
    deferred_ack_expiration_ms: int = DAY_MS
    file_backed_metadata: bool = False  # accepted for AMPS files; state lives in memory here
    initial_owner: str | None = None
    group_local_queue_domain: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        # Defaults that depend on other settings; None means "not given", as in the loaders.
        if not isinstance(data, dict):
            return data
        data = {key: value for key, value in data.items() if value is not None}
        if "underlying_topic" not in data and "name" in data:
            data["underlying_topic"] = data["name"]
        underlying = data.get("underlying_topic")
        plain = isinstance(underlying, str) and not is_topic_pattern(underlying.strip())
        if "default_publish_target" not in data and plain:
            data["default_publish_target"] = underlying.strip()
        if "fairness_model" not in data:
            semantics = data.get("semantics")
            at_most_once = isinstance(semantics, str) and semantics.strip().lower() == (
                "at-most-once"
            )
            data["fairness_model"] = "round-robin" if at_most_once else "proportional"
        return data

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: object) -> str:
        return amps_topic_name(value, "queue name")

    @field_validator("kind", mode="before")
    @classmethod
    def _kind(cls, value: object) -> str:
        if isinstance(value, str) and value.strip() in ELEMENT_KINDS:
            return ELEMENT_KINDS[value.strip()]
        if isinstance(value, str) and value.strip() in get_args(QueueKind):
            return value.strip()
        raise ValueError(f"Kind must be one of {', '.join(KIND_ELEMENTS.values())}, got {value!r}")

    @field_validator("message_type", mode="before")
    @classmethod
    def _message_type(cls, value: object) -> str:
        return message_type_name(value)

    @field_validator("underlying_topic", mode="before")
    @classmethod
    def _underlying(cls, value: object) -> str:
        text = _text_value(value, "UnderlyingTopic")
        assert text is not None  # None never gets here: _defaults drops it
        if is_topic_pattern(text):
            try:
                re.compile(text)
            except re.error as exc:
                raise ValueError(
                    f"UnderlyingTopic {text!r} is neither a topic name nor a valid regular "
                    f"expression: {exc}"
                ) from None
        return text

    @field_validator("default_publish_target", mode="before")
    @classmethod
    def _publish_target(cls, value: object) -> str | None:
        text = _text_value(value, "DefaultPublishTarget")
        return None if text is None else amps_topic_name(text, "DefaultPublishTarget")

    @field_validator("lease_period_ms", mode="before")
    @classmethod
    def _lease(cls, value: object) -> int | None:
        return _optional_interval(value, "LeasePeriod", zero_ok=False)

    @field_validator("expiration_ms", mode="before")
    @classmethod
    def _expiration(cls, value: object) -> int | None:
        return _optional_interval(value, "Expiration", zero_ok=False)

    @field_validator("expiration_model", mode="before")
    @classmethod
    def _expiration_model(cls, value: object) -> str:
        return one_of(value, "ExpirationModel", get_args(ExpirationModel))

    @field_validator("deferred_ack_expiration_ms", mode="before")
    @classmethod
    def _deferred(cls, value: object) -> int:
        millis = _optional_interval(value, "DeferredAckExpiration", zero_ok=True)
        return DAY_MS if millis is None else millis

    @field_validator("semantics", mode="before")
    @classmethod
    def _semantics(cls, value: object) -> str:
        return one_of(value, "Semantics", get_args(Semantics))

    @field_validator("fairness_model", mode="before")
    @classmethod
    def _fairness(cls, value: object) -> str:
        return one_of(value, "FairnessModel", get_args(FairnessModel))

    @field_validator("leasing", mode="before")
    @classmethod
    def _leasing(cls, value: object) -> str:
        return one_of(value, "Leasing", get_args(Leasing))

    @field_validator("max_backlog", mode="before")
    @classmethod
    def _max_backlog(cls, value: object) -> int | None:
        return None if value is None else bounded_int(value, "MaxBacklog", 1, _MAX_COUNT)

    @field_validator("max_per_subscription_backlog", mode="before")
    @classmethod
    def _per_subscription(cls, value: object) -> int:
        return bounded_int(value, "MaxPerSubscriptionBacklog", 1, _MAX_COUNT)

    @field_validator("target_queue_depth", mode="before")
    @classmethod
    def _target_depth(cls, value: object) -> int | None:
        if value is None:
            return None
        return bounded_int(value, "TargetQueueDepth", MIN_TARGET_QUEUE_DEPTH, _MAX_COUNT)

    @field_validator("max_deliveries", "max_cancels", mode="before")
    @classmethod
    def _limits(cls, value: object, info: ValidationInfo) -> int:
        what = "MaxDeliveries" if info.field_name == "max_deliveries" else "MaxCancels"
        return bounded_int(value, what, 0, _MAX_COUNT)

    @field_validator("filter", mode="before")
    @classmethod
    def _filter(cls, value: object) -> str | None:
        return None if value is None else checked_expression(value, "Filter", predicate=True)

    @field_validator("barrier_expression", mode="before")
    @classmethod
    def _barrier(cls, value: object) -> str | None:
        if value is None:
            return None
        return checked_expression(value, "BarrierExpression", predicate=True)

    @field_validator("priority", mode="before")
    @classmethod
    def _priority(cls, value: object) -> str | None:
        return None if value is None else checked_expression(value, "Priority", predicate=False)

    @field_validator("recovery_point", mode="before")
    @classmethod
    def _recovery_point(cls, value: object) -> str:
        # A queue's creation is the moment it is first recovered.
        return parse_recovery_point(value, {"creation": "now"})

    @field_validator("file_backed_metadata", mode="before")
    @classmethod
    def _file_backed(cls, value: object) -> bool:
        if value is True or (isinstance(value, str) and value.strip().lower() == "enabled"):
            return True
        if value is False or (isinstance(value, str) and value.strip().lower() == "disabled"):
            return False
        raise ValueError(f"FileBackedMetadata must be 'enabled' or left out, got {value!r}")

    @field_validator("initial_owner", "group_local_queue_domain", mode="before")
    @classmethod
    def _owner(cls, value: object, info: ValidationInfo) -> str | None:
        return _text_value(value, FIELD_ELEMENTS[str(info.field_name)])

    @model_validator(mode="after")
    def _cross_checks(self) -> QueueConfig:
        if self.priority is not None and self.barrier_expression is not None:
            raise FieldProblem(
                "priority",
                "Priority cannot be combined with BarrierExpression: a barrier waits for every "
                "older message, which a priority order does not keep",
            )
        if self.target_queue_depth is not None:
            other = "Priority" if self.priority is not None else "BarrierExpression"
            if self.priority is not None or self.barrier_expression is not None:
                raise FieldProblem(
                    "target_queue_depth",
                    f"TargetQueueDepth cannot be combined with {other}: both need every message "
                    "of the queue in memory",
                )
        if self.semantics == "at-most-once" and self.fairness_model != "round-robin":
            raise FieldProblem(
                "fairness_model",
                f"an at-most-once queue only supports FairnessModel round-robin, "
                f"not {self.fairness_model}",
            )
        element = KIND_ELEMENTS[self.kind]
        if self.kind == "group_local" and self.initial_owner is None:
            # AMPS requires it, yet its own GroupQueue example leaves it out; on one Kafka
            # cluster it would not change delivery, so a missing one is only reported.
            log.warning(
                "GroupLocalQueue %s has no InitialOwner: AMPS requires one; sowstream "
                "delivers the same without it",
                self.name,
            )
        if self.kind != "group_local":
            for field in ("initial_owner", "group_local_queue_domain"):
                if getattr(self, field) is not None:
                    raise FieldProblem(
                        field,
                        f"{FIELD_ELEMENTS[field]} only applies to a GroupLocalQueue, not to a "
                        f"{element}",
                    )
        return self._check_publish_target()

    def _check_publish_target(self) -> QueueConfig:
        target = self.default_publish_target
        if self.underlying_is_pattern:
            if target is None:
                raise FieldProblem(
                    "default_publish_target",
                    f"is required because UnderlyingTopic {self.underlying_topic!r} is a regular "
                    "expression: publishes to the queue need one topic to go to",
                )
            if not self.matches_topic(target):
                raise FieldProblem(
                    "default_publish_target",
                    f"{target!r} is not matched by UnderlyingTopic {self.underlying_topic!r}; "
                    "it must be one of the queue's underlying topics",
                )
        elif target != self.underlying_topic:
            raise FieldProblem(
                "default_publish_target",
                f"{target!r} is not the underlying topic {self.underlying_topic!r}",
            )
        return self

    @property
    def element(self) -> str:
        """The AMPS element that declares this kind of queue (``Queue``, ``LocalQueue``, ...)."""
        return KIND_ELEMENTS[self.kind]

    @property
    def underlying_is_pattern(self) -> bool:
        """Whether ``underlying_topic`` is a regular expression (see :func:`is_topic_pattern`)."""
        return is_topic_pattern(self.underlying_topic)

    def reads(self, topic: TopicConfig) -> bool:
        """Whether publishes to ``topic`` feed this queue: its message type and a matching name."""
        return topic.message_type == self.message_type and self.matches_topic(topic.name)

    def matches_topic(self, topic: str) -> bool:
        """Whether publishes to ``topic`` feed this queue (a whole-name match for a pattern)."""
        if not self.underlying_is_pattern:
            return topic == self.underlying_topic
        return re.fullmatch(self.underlying_topic, topic) is not None

    def underlying_topics(self, names: Iterable[str]) -> list[str]:
        """The names among ``names`` that feed this queue, in the given order."""
        return [name for name in names if self.matches_topic(name)]

    @property
    def publish_target(self) -> str:
        """Where a publish addressed to the queue's own name is stored."""
        return self.default_publish_target or self.underlying_topic

    @property
    def recovery_point_ms(self) -> int | None:
        """The RecoveryPoint timestamp as epoch milliseconds; None for ``epoch`` and ``now``."""
        return recovery_point_ms(self.recovery_point)


def available_topic_name(queue: str) -> str:
    """The SOW topic the engine keeps of a queue's available messages when a view reads the
    queue (``sowstream.engine.queue_views``): the view reads it in the queue's place."""
    return f"{queue}.available"


def queue_sources(
    queue: QueueConfig, topics: Iterable[TopicConfig]
) -> list[tuple[TopicConfig, str | None]]:
    """The topics (of the queue's MessageType, in the given order) whose publishes feed
    ``queue``, each with the one published name it takes the records of (None: all of the
    topic's records).

    A topic counts when the queue's UnderlyingTopic names it or matches its name. A regular
    expression (Pattern) topic also counts when the UnderlyingTopic is its Pattern exactly (all
    of its records), or is a plain name its Pattern owns (no topic is declared with that name):
    then the records published under that name only.
    """
    ours = [t for t in topics if t.message_type == queue.message_type]
    declared = {t.name for t in ours}
    out: list[tuple[TopicConfig, str | None]] = []
    for topic in ours:
        if queue.matches_topic(topic.name) or (
            topic.pattern is not None and queue.underlying_topic == topic.pattern
        ):
            out.append((topic, None))
        elif (
            topic.pattern is not None
            and not queue.underlying_is_pattern
            and queue.underlying_topic not in declared
            and topic.matches_name(queue.underlying_topic)
        ):
            out.append((topic, queue.underlying_topic))
    return out


def publish_topic(queue: QueueConfig, topics: Iterable[TopicConfig]) -> TopicConfig | None:
    """The topic a publish addressed to ``queue`` goes to: its DefaultPublishTarget, declared,
    or the Pattern topic that owns that name (None: neither)."""
    ours = [t for t in topics if t.message_type == queue.message_type]
    target = queue.publish_target
    named = next((t for t in ours if t.name == target), None)
    if named is not None:
        return named
    return next((t for t in ours if t.pattern is not None and t.matches_name(target)), None)


def implicit_topics(
    queues: Iterable[QueueConfig], topics: Sequence[TopicConfig]
) -> list[TopicConfig]:
    """Plain topics for the DefaultPublishTargets that no topic of the configuration holds, of
    queues over a regular expression: AMPS needs no declaration for the topics a queue reads
    (chapter 05's ``MQ`` example names ``ORDERS_DIRECT`` only there), so the loaders declare
    the publish target (a topic without a SOW, its log kept) for such a queue to load as
    written. A plain UnderlyingTopic must still be declared: a misspelt one is more likely."""
    known = list(topics)
    out: list[TopicConfig] = []
    for queue in queues:
        if not queue.underlying_is_pattern or publish_topic(queue, known) is not None:
            continue
        topic = TopicConfig(name=queue.publish_target, message_type=queue.message_type, sow=False)
        log.info(
            "queue %s: DefaultPublishTarget %s is in no topic definition; declared as a topic "
            "without a SOW",
            queue.name,
            topic.name,
        )
        known.append(topic)
        out.append(topic)
    return out


def check_queues(queues: Sequence[QueueConfig], topics: Sequence[TopicConfig]) -> None:
    """Check the queues against each other and the topics; QueueProblem names the first problem.

    A queue may share its name only with its own underlying topic (the AMPS default, where the
    queue reads the topic of the same name); any other clash with a topic or queue is refused.
    """
    seen: dict[str, int] = {}
    for index, queue in enumerate(queues):
        # A queue reads the topics of its own message type: a topic of another type sharing a
        # name is not one of its.
        by_name = {t.name: t for t in topics if t.message_type == queue.message_type}
        if queue.name in seen:
            raise QueueProblem(index, "name", f"queue {queue.name!r} is defined twice")
        seen[queue.name] = index
        if queue.name in by_name and queue.underlying_topic != queue.name:
            raise QueueProblem(
                index,
                "name",
                f"{queue.name!r} is already a topic name; a queue may only share its name with "
                "its own UnderlyingTopic",
            )
        fed_by = queue_sources(queue, by_name.values())
        others = [t for t in topics if t.name not in by_name and queue.matches_topic(t.name)]
        if not fed_by and others:
            raise QueueProblem(
                index,
                "underlying_topic",
                f"topic {others[0].name!r} carries {others[0].message_type}, the queue "
                f"{queue.message_type}: give the queue the topic's MessageType",
            )
        if not fed_by and not queue.underlying_is_pattern:
            # A regular expression may match no topic yet: it takes topics as they come.
            raise QueueProblem(
                index,
                "underlying_topic",
                f"{queue.underlying_topic!r} matches no topic of this configuration; declare the "
                "topic (under sow or topics) so that its log exists",
            )
        for topic, _ in fed_by:
            if topic.message_type != queue.message_type:
                raise QueueProblem(
                    index,
                    "underlying_topic",
                    f"topic {topic.name!r} carries {topic.message_type}, the queue "
                    f"{queue.message_type}",
                )
        target = publish_topic(queue, by_name.values())
        if target is None:
            raise QueueProblem(
                index,
                "default_publish_target",
                f"{queue.publish_target!r} is not a topic of this configuration",
            )
        if all(topic is not target for topic, _ in fed_by):
            raise QueueProblem(
                index,
                "default_publish_target",
                f"{queue.publish_target!r} belongs to the regular expression topic "
                f"{target.name!r} (Pattern {target.pattern!r}), which the queue does not read: "
                "its UnderlyingTopic must be that topic's Name or Pattern, or the name itself",
            )
