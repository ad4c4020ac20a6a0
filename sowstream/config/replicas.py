"""Conflated topics (AMPS ``ConflatedTopic``, old synonym ``ReplicaDefinition``, hence the
module name): model, checks and parsers.

A conflated topic is a copy of a SOW topic (or view) that changes at most once per record per
Interval, carrying the record's latest state. :class:`ConflatedTopicConfig` checks one
definition on its own (Interval bounds, the Filter compiles, TopicFormat shape);
:func:`check_conflated_topics` checks it against the other definitions (the underlying topic
exists, keeps a SOW and comes earlier; names are unique). :func:`conflated_from_yaml` and
:func:`conflated_from_xml` read one ``conflated_topics:`` item or ``<ConflatedTopic>`` element.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError, field_validator, model_validator

from sowstream.config.errors import (
    ConfigError,
    FieldProblem,
    Loc,
    child_texts,
    element_text,
    from_validation_error,
)
from sowstream.config.models import (
    MAX_PARTITIONS,
    MIN_PARTITIONS,
    SUPPORTED_MESSAGE_TYPES,
    TopicConfig,
    _bounded_int,
    _Frozen,
    _interval_ms,
    _topic_name,
)
from sowstream.filters import compile_filter
from sowstream.filters.parser import FilterError

__all__ = [
    "CONFLATED_ELEMENTS",
    "CONFLATED_TAGS",
    "DEFAULT_INTERVAL_MS",
    "MIN_INTERVAL_MS",
    "ConflatedProblem",
    "ConflatedTopicConfig",
    "check_conflated_topics",
    "conflated_from_xml",
    "conflated_from_yaml",
]

DEFAULT_INTERVAL_MS = 5_000
MIN_INTERVAL_MS = 100
CONFLATED_TAGS = ("ConflatedTopic", "ReplicaDefinition")
# AMPS element name -> ConflatedTopicConfig field (YAML keys and XML child elements).
CONFLATED_ELEMENTS: dict[str, str] = {
    "Name": "name",
    "MessageType": "message_type",
    "UnderlyingTopic": "underlying_topic",
    "Interval": "interval_ms",
    "Filter": "filter",
    "HashIndex": "hash_indexes",
    "TopicFormat": "topic_format",
    "Partitions": "partitions",  # sowstream's own, as on SOW topics
}
FIELD_ELEMENTS: dict[str, str] = {field: tag for tag, field in CONFLATED_ELEMENTS.items()}


class ConflatedTopicConfig(_Frozen):
    """One conflated topic: its underlying SOW topic, Interval (ms), Filter and indexes.

    ``message_type`` None means the underlying topic's; ``topic_format`` is only for a regular
    expression UnderlyingTopic, which is refused for now (see :func:`check_conflated_topics`).
    """

    name: str
    underlying_topic: str
    message_type: str | None = None
    interval_ms: int = DEFAULT_INTERVAL_MS
    filter: str | None = None
    hash_indexes: tuple[tuple[str, ...], ...] = ()
    topic_format: str | None = None
    partitions: int = 4

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: object) -> str:
        return _topic_name(value, "conflated topic name")

    @field_validator("underlying_topic", mode="before")
    @classmethod
    def _underlying(cls, value: object) -> str:
        return _topic_name(value, "UnderlyingTopic")

    @field_validator("message_type", mode="before")
    @classmethod
    def _message_type(cls, value: object) -> str | None:
        if value is None:
            return None
        if isinstance(value, str) and value.strip().lower() in SUPPORTED_MESSAGE_TYPES:
            return value.strip().lower()
        supported = ", ".join(SUPPORTED_MESSAGE_TYPES)
        raise ValueError(f"message type {value!r} is not supported; supported: {supported}")

    @field_validator("interval_ms", mode="before")
    @classmethod
    def _interval(cls, value: object) -> int:
        ms = _interval_ms(value, "Interval")
        if ms < MIN_INTERVAL_MS:
            raise ValueError(
                f"Interval {value!r} is shorter than the minimum of {MIN_INTERVAL_MS}ms"
            )
        return ms

    @field_validator("filter", mode="before")
    @classmethod
    def _filter(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                compile_filter(value)
            except FilterError as exc:  # its message names the position
                raise ValueError(f"Filter {value!r} does not compile: {exc}") from None
        return value

    @field_validator("hash_indexes", mode="before")
    @classmethod
    def _hash_indexes(cls, value: object) -> tuple[tuple[str, ...], ...]:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ValueError(f"HashIndex must be a list of Key lists, got {value!r}")
        out: list[tuple[str, ...]] = []
        for item in items:
            keys = (item,) if isinstance(item, str) else tuple(item)
            if not keys or not all(isinstance(k, str) and k.startswith("/") for k in keys):
                raise ValueError(f"a HashIndex holds Key paths like /region, got {item!r}")
            out.append(keys)
        return tuple(out)

    @field_validator("topic_format", mode="before")
    @classmethod
    def _topic_format(cls, value: object) -> object:
        if value is None:
            return None
        if not isinstance(value, str) or "%n" not in value:
            raise ValueError(f"TopicFormat must contain %n (the topic's name), got {value!r}")
        special = sorted({c for c in value.replace("%n", "") if c in ".^$*+?()[]{}|\\"})
        if special:
            raise ValueError(
                f"TopicFormat {value!r} holds regular expression characters {''.join(special)!r}"
            )
        return value

    @field_validator("partitions", mode="before")
    @classmethod
    def _partitions(cls, value: object) -> int:
        return _bounded_int(value, "Partitions", MIN_PARTITIONS, MAX_PARTITIONS)

    @model_validator(mode="after")
    def _consistent(self) -> ConflatedTopicConfig:
        if self.name == self.underlying_topic:
            raise FieldProblem("name", "a conflated topic needs a name of its own")
        return self

    @property
    def interval_seconds(self) -> float:
        return self.interval_ms / 1000

    def topic_config(self, underlying: TopicConfig) -> TopicConfig:
        """The conflated topic as a SOW topic for readers: the underlying topic's message type,
        no Key fields (records keep the underlying SowKeys), its own partitions, and its hash
        indexes after the underlying Key fields' one (as AMPS creates it)."""
        automatic = tuple(underlying.keys)
        extra = tuple(k for k in self.hash_indexes if k != automatic)
        return TopicConfig(
            name=self.name,
            message_type=underlying.message_type,
            partitions=self.partitions,
            hash_indexes=((automatic,) if automatic else ()) + extra,
        )


class ConflatedProblem(FieldProblem):
    """A check across definitions failed: ``index`` is the conflated topic's position."""

    def __init__(self, index: int, field: str, message: str) -> None:
        super().__init__(field, message)
        self.index = index


def check_conflated_topics(
    conflated: Sequence[ConflatedTopicConfig],
    topics: Sequence[TopicConfig],
    definitions: Sequence[str],
) -> None:
    """Check conflated topics against the SOW topics and every definition name (in order).

    The UnderlyingTopic must be a SOW topic defined earlier (views over them come later: a
    conflated topic over a view is not supported yet), of the given MessageType if one is given.
    A regular expression UnderlyingTopic is refused for now. Raises :class:`ConflatedProblem`.
    """
    names = list(definitions)
    for i, ct in enumerate(conflated):
        if names.count(ct.name) > 1:
            raise ConflatedProblem(
                i,
                "name",
                f"{ct.name!r} is defined more than once; a conflated topic needs its own Name",
            )
        found = [t for t in topics if t.name == ct.underlying_topic]
        if not found and ct.underlying_topic in names:
            raise ConflatedProblem(
                i,
                "underlying_topic",
                f"conflated topic {ct.name!r} reads {ct.underlying_topic!r}, which is a queue, "
                "view or conflated topic: conflated topics over those are not supported yet; "
                "conflate a SOW topic",
            )
        if not found:
            raise ConflatedProblem(
                i,
                "underlying_topic",
                f"conflated topic {ct.name!r} reads topic {ct.underlying_topic!r}, which is not "
                "defined: declare it as a SOW topic before the conflated topic",
            )
        if ct.message_type is not None:
            found = [t for t in found if t.message_type == ct.message_type]
            if not found:
                raise ConflatedProblem(
                    i,
                    "message_type",
                    f"topic {ct.underlying_topic!r} has no {ct.message_type} SOW topic; the "
                    "MessageType must be the UnderlyingTopic's",
                )
        if len(found) > 1:
            raise ConflatedProblem(
                i,
                "message_type",
                f"topic {ct.underlying_topic!r} is defined for several message types; give the "
                "MessageType to choose one",
            )
        underlying = found[0]
        if underlying.pattern is not None or ct.topic_format is not None:
            raise ConflatedProblem(
                i,
                "topic_format" if ct.topic_format is not None else "underlying_topic",
                f"conflated topic {ct.name!r}: a regular expression UnderlyingTopic (with "
                "TopicFormat) is not supported yet; conflate a topic without a Pattern",
            )
        if not underlying.sow:
            raise ConflatedProblem(
                i,
                "underlying_topic",
                f"topic {ct.underlying_topic!r} keeps no SOW (declared under topics:); a "
                "conflated topic copies a SOW topic, so declare it under sow:",
            )
        if names.index(ct.underlying_topic) > names.index(ct.name):
            raise ConflatedProblem(
                i,
                "underlying_topic",
                f"conflated topic {ct.name!r} reads {ct.underlying_topic!r}, which is defined "
                "after it; define the underlying topic first",
            )
        clash = [t for t in topics if t.kafka_name == ct.topic_config(underlying).kafka_name]
        if clash:
            raise ConflatedProblem(
                i,
                "name",
                f"conflated topic {ct.name!r} would share the Kafka topics of topic "
                f"{clash[0].name!r}; it needs a name of its own",
            )


# ---------------------------------------------------------------------------- YAML


def conflated_from_yaml(item: Any, element: str, source: str) -> ConflatedTopicConfig:
    """One ``conflated_topics:`` item (AMPS element names as keys) as a ConflatedTopicConfig.

    Raises ConfigError naming ``element`` (for example ``conflated_topics[0].Interval``).
    """
    if not isinstance(item, dict):
        raise ConfigError(
            source=source,
            element=element,
            problem="each conflated topic must be a mapping like '- Name: orders-C'",
        )
    fields: dict[str, Any] = {}
    for key, value in item.items():
        if key not in CONFLATED_ELEMENTS and key != "Topic":
            allowed = ", ".join([*CONFLATED_ELEMENTS, "Topic"])
            raise ConfigError(
                source=source,
                element=f"{element}.{key}",
                problem=f"unknown key; expected one of: {allowed}",
            )
        if value is None:
            continue
        if key == "HashIndex":
            items = value if isinstance(value, list) else [value]
            value = [i.get("Key") if isinstance(i, dict) else i for i in items]
        field = "name" if key == "Topic" else CONFLATED_ELEMENTS[key]
        if field in fields and fields[field] != value:
            raise ConfigError(
                source=source,
                element=f"{element}.{key}",
                problem=f"Name and Topic disagree ({fields[field]!r} and {value!r})",
            )
        fields[field] = value

    def element_of(loc: Loc) -> str:
        if not loc:
            return element
        return f"{element}.{FIELD_ELEMENTS.get(str(loc[0]), str(loc[0]))}"

    try:
        return ConflatedTopicConfig(**fields)
    except ValidationError as exc:
        raise from_validation_error(exc, source=source, element_of=element_of) from None


# ---------------------------------------------------------------------------- AMPS XML


def conflated_from_xml(
    element: ET.Element, section: str, position: int, source: str
) -> tuple[ConflatedTopicConfig, str]:
    """One ``<ConflatedTopic>`` / ``<ReplicaDefinition>`` as a config and its element path."""
    name = next(
        ((c.text or "").strip() for c in element if c.tag in ("Name", "Topic") and not len(c)),
        "",
    )
    path = f"{section}/{element.tag}[{name or f'#{position}'}]"
    for tag, count in Counter(c.tag for c in element).items():
        if count > 1 and tag != "HashIndex":
            raise ConfigError(
                source=source,
                element=f"{path}/{tag}",
                problem=f"<{tag}> appears {count} times; it may appear only once",
            )
    fields: dict[str, Any] = {}
    tag_of: dict[str, str] = {}
    for child in element:
        where = f"{path}/{child.tag}"
        if child.tag not in CONFLATED_ELEMENTS and child.tag != "Topic":
            raise ConfigError(
                source=source,
                element=where,
                problem=f"unknown element <{child.tag}> in a <{element.tag}>",
            )
        if child.tag == "HashIndex":
            keys = child_texts(child, "Key", where, source)
            fields.setdefault("hash_indexes", []).append(keys)
            continue
        field = "name" if child.tag == "Topic" else CONFLATED_ELEMENTS[child.tag]
        text = element_text(child, where, source)
        if field in fields and fields[field] != text:
            raise ConfigError(
                source=source,
                element=where,
                problem=f"<Name> and <Topic> disagree ({fields[field]!r} and {text!r})",
            )
        fields[field] = text
        tag_of.setdefault(field, child.tag)

    def element_of(loc: Loc) -> str:
        if not loc:
            return path
        field = str(loc[0])
        return f"{path}/{tag_of.get(field, FIELD_ELEMENTS.get(field, field))}"

    try:
        return ConflatedTopicConfig(**fields), path
    except ValidationError as exc:
        raise from_validation_error(exc, source=source, element_of=element_of) from None
