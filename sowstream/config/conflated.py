"""Conflated topics (AMPS ``ConflatedTopic``, old synonym ``ReplicaDefinition``): model, checks
and parsers.

A conflated topic is a copy of a SOW topic, view or other conflated topic that changes at most
once per record per Interval, carrying the record's latest state. :class:`ConflatedTopicConfig`
checks one definition on its own (Interval bounds, the Filter compiles, TopicFormat shape);
:func:`check_conflated_topics` checks it against the other definitions (the underlying topic
exists, keeps a SOW and comes earlier; a regular expression one comes with a TopicFormat; names
are unique). Over a regular expression (``Pattern``) topic the conflated topic is itself one:
:func:`conflated_pattern` is its Pattern, the TopicFormat applied to the underlying one.
:func:`conflated_from_yaml` and :func:`conflated_from_xml` read one ``conflated_topics:`` item
or ``<ConflatedTopic>`` element.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable, Sequence
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
from sowstream.config.fields import (
    MAX_PARTITIONS,
    MIN_PARTITIONS,
    Frozen,
    amps_topic_name,
    bounded_int,
    interval_millis,
    message_type_name,
)
from sowstream.config.models import TopicConfig
from sowstream.config.queues import QueueConfig
from sowstream.config.views import Definition, ViewConfig
from sowstream.filters import compile_filter
from sowstream.filters.parser import FilterError
from sowstream.messagetypes import registry
from sowstream.sow.enrich import ENRICHMENT, StageError, compile_stage
from sowstream.wire.topics import kafka_topic_part

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
    "conflated_pattern",
    "definition_order",
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
    "Enrichment": "enrichment",
}
FIELD_ELEMENTS: dict[str, str] = {field: tag for tag, field in CONFLATED_ELEMENTS.items()}


class ConflatedTopicConfig(Frozen):
    """One conflated topic: its underlying SOW topic, Interval (ms), Filter and indexes.

    ``message_type`` None means the underlying topic's; ``topic_format`` (required then) names
    the conflated topics of a regular expression UnderlyingTopic, one per name it holds.
    """

    name: str
    underlying_topic: str
    message_type: str | None = None
    interval_ms: int = DEFAULT_INTERVAL_MS
    filter: str | None = None
    hash_indexes: tuple[tuple[str, ...], ...] = ()
    topic_format: str | None = None
    partitions: int = 4
    # Field texts applied to the conflated topic's records (no OF PREVIOUS), as a SOW topic's
    # Enrichment is: its own processor enriches what the flushes write to its log.
    enrichment: tuple[str, ...] = ()

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: object) -> str:
        return amps_topic_name(value, "conflated topic name")

    @field_validator("underlying_topic", mode="before")
    @classmethod
    def _underlying(cls, value: object) -> str:
        return amps_topic_name(value, "UnderlyingTopic")

    @field_validator("message_type", mode="before")
    @classmethod
    def _message_type(cls, value: object) -> str | None:
        # Any type: a conflated topic holds its underlying topic's records, with its settings.
        return None if value is None else message_type_name(value)

    @field_validator("interval_ms", mode="before")
    @classmethod
    def _interval(cls, value: object) -> int:
        ms = interval_millis(value, "Interval")
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
        if value.count("%n") > 1:
            raise ValueError(f"TopicFormat {value!r} may contain %n only once")
        special = sorted({c for c in value.replace("%n", "") if c in ".^$*+?()[]{}|\\"})
        if special:
            raise ValueError(
                f"TopicFormat {value!r} holds regular expression characters {''.join(special)!r}"
            )
        return value

    @field_validator("partitions", mode="before")
    @classmethod
    def _partitions(cls, value: object) -> int:
        return bounded_int(value, "Partitions", MIN_PARTITIONS, MAX_PARTITIONS)

    @field_validator("enrichment", mode="before")
    @classmethod
    def _enrichment(cls, value: object) -> tuple[str, ...]:
        if isinstance(value, dict) and set(value) == {"Field"}:
            value = value["Field"]  # the AMPS shape, {Field: [...]}
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ValueError(
                f"Enrichment must be a list of Fields like '/a * 2 AS /b', got {value!r}"
            )
        try:
            stage = compile_stage(ENRICHMENT, value)
        except StageError as exc:
            raise ValueError(str(exc)) from None
        for field in stage.fields:
            if field.reads_previous:
                raise ValueError(
                    f"{field.element} {field.text!r}: OF PREVIOUS is not available on a "
                    "conflated topic (its records are copies made at each flush); read the "
                    "current record only"
                )
        return tuple(value)

    @model_validator(mode="after")
    def _consistent(self) -> ConflatedTopicConfig:
        if self.name == self.underlying_topic:
            raise FieldProblem("name", "a conflated topic needs a name of its own")
        return self

    @property
    def interval_seconds(self) -> float:
        return self.interval_ms / 1000

    def topic_config(
        self, underlying: TopicConfig, key_fields: tuple[str, ...] | None = None
    ) -> TopicConfig:
        """The conflated topic as a SOW topic for readers: the underlying topic's message type,
        no Key fields (records keep the underlying SowKeys), its own partitions, and its hash
        indexes after the one on the underlying records' key fields (``key_fields``, by default
        the underlying Key fields), as AMPS creates it. Over a Pattern topic it is a Pattern
        topic too, holding the names TopicFormat makes (:func:`conflated_pattern`). Its deltas
        name a record by the fields the underlying topic's deltas do (``delta_keys``)."""
        automatic = tuple(underlying.keys) if key_fields is None else key_fields
        extra = tuple(k for k in self.hash_indexes if k != automatic)
        pattern = None
        if underlying.pattern is not None and self.topic_format is not None:
            pattern = conflated_pattern(underlying.pattern, self.topic_format)
        fields: dict[str, Any] = {
            "name": self.name,
            "message_type": underlying.message_type,
            # a protobuf or composite type's settings: the records are the underlying ones
            "schema_file": underlying.schema_file,
            "parts": underlying.parts,
            "partitions": self.partitions,
            "hash_indexes": ((automatic,) if automatic else ()) + extra,
            "pattern": pattern,
            "record_keys": underlying.delta_keys,
        }
        if self.enrichment:  # an empty one is refused, so it is only given when there is one
            fields["enrichment"] = self.enrichment
        return TopicConfig.model_validate(fields)

    def topic_name(self, name: str) -> str:
        """The conflated topic name of the underlying topic name ``name`` (TopicFormat)."""
        return self.topic_format.replace("%n", name) if self.topic_format else self.name


_GLOBAL_FLAGS = re.compile(r"\(\?[aiLmsux]+\)")


def conflated_pattern(pattern: str, topic_format: str) -> str:
    """The Pattern matching (whole) exactly the names ``topic_format`` makes of the names
    ``pattern`` matches whole: ``%n-C`` over ``/q/.*`` gives ``(?:/q/.*)-C``.

    Anchors of ``pattern`` (``^``, ``$``, ``\\A``, ``\\Z``) are rewritten to mean the ends of the
    underlying name inside the formatted one; leading global flags such as ``(?i)`` stay first.
    """
    prefix, _, suffix = topic_format.partition("%n")
    flags = ""
    found = _GLOBAL_FLAGS.match(pattern)
    if found:
        flags, pattern = found.group(0), pattern[found.end() :]
    start = f"(?<=\\A{re.escape(prefix)})"
    end = f"(?={re.escape(suffix)}\\Z)"
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            pair = pattern[i : i + 2]
            out.append(
                start
                if pair == "\\A" and not in_class
                else end
                if pair == "\\Z" and not in_class
                else pair
            )
            i += 2
            continue
        if in_class:
            in_class = char != "]"
            out.append(char)
        elif char == "[":
            # A class: a leading ^ negates it and a ] right after that is a member.
            in_class = True
            out.append(char)
            for literal in ("^", "]"):
                if pattern[i + 1 : i + 2] == literal:
                    out.append(literal)
                    i += 1
        elif char == "^":
            out.append(start)
        elif char == "$":
            out.append(end)
        else:
            out.append(char)
        i += 1
    return f"{flags}{re.escape(prefix)}(?:{''.join(out)}){re.escape(suffix)}"


class ConflatedProblem(FieldProblem):
    """A check across definitions failed: ``index`` is the conflated topic's position."""

    def __init__(self, index: int, field: str, message: str) -> None:
        super().__init__(field, message)
        self.index = index


def definition_order(
    topics: Iterable[TopicConfig],
    queues: Iterable[QueueConfig],
    conflated: Sequence[ConflatedTopicConfig],
    views: Sequence[ViewConfig],
) -> list[Definition]:
    """Every definition, as (name, message type), in the order cross checks read them where the
    document gives none (YAML keeps each kind in its own list): SOW topics and queues, then views
    in their order, each conflated topic right after what it reads (so a view may read a
    conflated topic over a SOW topic or an earlier view). What reads nothing defined comes last."""
    order: list[Definition] = [(t.name, t.message_type) for t in topics]
    order += [(q.name, q.message_type) for q in queues]
    names = {name for name, _ in order}
    pending = list(conflated)

    def add(name: str, message_type: str | None) -> None:
        order.append((name, message_type))
        names.add(name)

    def place() -> None:
        placed = True
        while placed:
            placed = False
            for ct in list(pending):
                if ct.underlying_topic in names:
                    add(ct.name, ct.message_type)
                    pending.remove(ct)
                    placed = True

    place()
    for view in views:
        add(view.name, view.message_type)
        place()
    order.extend((ct.name, ct.message_type) for ct in pending)
    return order


def check_conflated_topics(
    conflated: Sequence[ConflatedTopicConfig],
    topics: Sequence[TopicConfig],
    definitions: Sequence[Definition],
    views: Sequence[ViewConfig] = (),
) -> None:
    """Check conflated topics against the SOW topics, views and every definition (in order,
    ``definition_order``).

    The UnderlyingTopic must be a SOW topic, view or conflated topic defined earlier, of the
    given MessageType if one is given; a regular expression one (a Pattern topic, or a conflated
    topic over one) needs a TopicFormat, which nothing else takes. Raises
    :class:`ConflatedProblem`.
    """
    names = [name for name, _ in definitions]
    by_view = {v.name: v for v in views}
    by_conflated = {c.name: c for c in conflated}

    def source(
        index: int, name: str, wanted: str | None, seen: frozenset[str]
    ) -> tuple[str, str, bool, tuple[str, ...]]:
        """(kind, message type, regular expression?, key fields of its records) of what
        conflated topic ``index`` reads through ``name`` (of message type ``wanted`` if given);
        ConflatedProblem if it reads nothing it can copy."""
        ct = conflated[index]
        found = [t for t in topics if t.name == name]
        if found:
            if wanted is not None:
                found = [t for t in found if t.message_type == wanted]
                if not found:
                    raise ConflatedProblem(
                        index,
                        "message_type",
                        f"topic {name!r} has no {wanted} SOW topic; the MessageType must be the "
                        "UnderlyingTopic's",
                    )
            if len(found) > 1:
                raise ConflatedProblem(
                    index,
                    "message_type",
                    f"topic {name!r} is defined for several message types; give the "
                    "MessageType to choose one",
                )
            if not found[0].sow:
                raise ConflatedProblem(
                    index,
                    "underlying_topic",
                    f"topic {name!r} keeps no SOW (declared under topics:); a conflated topic "
                    "copies a SOW topic, so declare it under sow:",
                )
            return "topic", found[0].message_type, found[0].pattern is not None, found[0].keys
        if name in by_view:
            view = by_view[name]
            try:
                keys = view.compile().projection.grouping_outputs or ()
            except FieldProblem:
                keys = ()  # the view's own check names its problem
            return "view", view.message_type, False, keys
        if name in seen:
            raise ConflatedProblem(
                index,
                "underlying_topic",
                f"conflated topic {ct.name!r} reads itself through {name!r}: conflated topics "
                "cannot form a cycle",
            )
        if name in by_conflated:
            inner = by_conflated[name]
            _, message_type, regex, keys = source(
                index, inner.underlying_topic, inner.message_type, seen | {name}
            )
            return "conflated topic", message_type, regex and inner.topic_format is not None, keys
        if name in names:
            raise ConflatedProblem(
                index,
                "underlying_topic",
                f"conflated topic {ct.name!r} reads {name!r}, which is a queue: conflated topics "
                "over queues are not supported; conflate the queue's underlying topic",
            )
        raise ConflatedProblem(
            index,
            "underlying_topic",
            f"conflated topic {ct.name!r} reads topic {name!r}, which is not defined: declare "
            "it as a SOW topic, view or conflated topic before the conflated topic",
        )

    for i, ct in enumerate(conflated):
        if names.count(ct.name) > 1:
            raise ConflatedProblem(
                i,
                "name",
                f"{ct.name!r} is defined more than once; a conflated topic needs its own Name",
            )
        if (
            ct.name in names
            and ct.underlying_topic in names
            and names.index(ct.underlying_topic) > names.index(ct.name)
        ):
            raise ConflatedProblem(
                i,
                "underlying_topic",
                f"conflated topic {ct.name!r} reads {ct.underlying_topic!r}, which is "
                "defined after it; define the underlying topic first",
            )
        kind, message_type, regex, keys = source(
            i, ct.underlying_topic, ct.message_type, frozenset({ct.name})
        )
        if ct.message_type is not None and ct.message_type != message_type:
            raise ConflatedProblem(
                i,
                "message_type",
                f"{kind} {ct.underlying_topic!r} is {message_type}, not {ct.message_type}; the "
                "MessageType must be the UnderlyingTopic's",
            )
        if regex and ct.topic_format is None:
            raise ConflatedProblem(
                i,
                "underlying_topic",
                f"conflated topic {ct.name!r} reads {kind} {ct.underlying_topic!r}, which holds "
                "the topics of a regular expression (Pattern): give a TopicFormat such as "
                "'%n-C' to name the conflated topic of each",
            )
        if not regex and ct.topic_format is not None:
            raise ConflatedProblem(
                i,
                "topic_format",
                f"conflated topic {ct.name!r}: TopicFormat only applies over a regular "
                f"expression (Pattern) topic, and {kind} {ct.underlying_topic!r} is not one; "
                "remove the TopicFormat",
            )
        if ct.enrichment:
            _check_enrichment(i, ct, kind, message_type, regex, keys)
        own = kafka_topic_part(ct.name, message_type)
        clash = [t for t in topics if t.kafka_name == own]
        if clash:
            raise ConflatedProblem(
                i,
                "name",
                f"conflated topic {ct.name!r} would share the Kafka topics of topic "
                f"{clash[0].name!r}; it needs a name of its own",
            )


def _check_enrichment(
    index: int,
    ct: ConflatedTopicConfig,
    kind: str,
    message_type: str,
    regex: bool,
    keys: tuple[str, ...],
) -> None:
    """What a conflated topic's Enrichment needs of what it reads: parsed messages, one topic
    (a Pattern topic has no Enrichment), and key fields left alone (the SowKeys are copied)."""
    if regex:
        raise ConflatedProblem(
            index,
            "enrichment",
            f"conflated topic {ct.name!r} reads {kind} {ct.underlying_topic!r}, a regular "
            "expression (Pattern) topic: Enrichment cannot be used over one",
        )
    if not registry.type_class(message_type).has_fields:
        raise ConflatedProblem(
            index,
            "enrichment",
            f"conflated topic {ct.name!r} is {message_type}: its messages are not parsed, so it "
            "cannot have Enrichment",
        )
    try:
        compile_stage(ENRICHMENT, ct.enrichment, key_fields=keys)
    except StageError as exc:
        raise ConflatedProblem(index, "enrichment", str(exc)) from None


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
        if child.tag == "Enrichment":
            fields["enrichment"] = child_texts(
                child, "Field", where, source, like="<Field>/qty * /price AS /total</Field>"
            )
            tag_of["enrichment"] = child.tag
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
