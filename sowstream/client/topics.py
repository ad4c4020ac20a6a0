"""What the client knows of the engine's topics: their definitions from the meta topic."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from typing import Any

from sowstream.errors import (
    InvalidCommandError,
)
from sowstream.messagetypes import (
    MessageType,
    TypeOptions,
    registry,
)
from sowstream.sow.enrich import PREPROCESSING, Stage, StageError, compile_stage
from sowstream.sow.patterns import literal_name, name_regex
from sowstream.wire.topics import JSON, topic_ident


@dataclass(frozen=True)
class TopicInfo:
    """A SOW topic as the engine described it on the meta topic."""

    name: str
    keys: tuple[str, ...]
    key_domain: str
    partitions: int
    log_topic: str
    control_topic: str
    sow: bool = True
    queue_of: tuple[str, ...] = ()  # a queue: the topics its messages come from
    key_generator: str | None = None
    key_generator_options: tuple[tuple[str, str], ...] = ()
    auto: bool = False  # in no configuration: created by the engine on first use
    message_type: str = JSON
    schema: str = ""  # an avro topic's record schema
    view_of: tuple[str, ...] = ()  # a view: the topics it is computed from (only the engine writes)
    pattern: str = ""  # a regular expression topic: the Pattern its topic names match
    # Preprocessing Fields, applied before computing a SowKey (and AMPS_INSTANCE_NAME() there).
    preprocessing: tuple[str, ...] = ()
    instance_name: str = ""
    # A view's or conflated topic's fields that name a record though it has no Key fields: its
    # Grouping fields, or the underlying record's key fields (see delta_keys).
    record_keys: tuple[str, ...] = ()
    # A queue whose publish target is one name of a Pattern topic (the fields are that topic's,
    # its Pattern left out so the queue is no Pattern topic itself): publishes go under it.
    publish_as: str = ""
    # How a command addresses a Pattern topic: the regex its records' topic names must match
    # (one name escaped); None: every name. Not part of the definition on the meta topic.
    topic_regex: str | None = None

    @property
    def queue(self) -> bool:
        """Whether this name is a queue (subscribe leases, sow browses)."""
        return bool(self.queue_of)

    @property
    def delta_keys(self) -> tuple[str, ...]:
        """The fields a delta carries to name its record (send_keys): the Key fields, else a
        view's Grouping fields or a conflated topic's underlying key fields."""
        return self.keys or self.record_keys

    @property
    def own_queue(self) -> bool:
        """Whether this is a queue's own record (not a topic's a queue shares its name with):
        its other fields are its publish target's, a Pattern included, but it is no topic."""
        return self.queue and self.name not in self.queue_of

    @property
    def ident(self) -> str:
        """The topic's identity: its name for json, ``<type>:<name>`` otherwise."""
        return topic_ident(self.name, self.message_type)

    @property
    def preprocessing_stage(self) -> Stage | None:
        """The compiled Preprocessing, or None (compiled once per definition)."""
        if not self.preprocessing:
            return None
        return _stage(self.preprocessing, self.instance_name)

    @functools.cached_property
    def codec(self) -> MessageType:
        """The topic's message type (an avro one with the schema the engine published); kept,
        as every publish reads it."""
        options = TypeOptions(topic=self.name, schema=self.schema or None)
        return registry.for_options(self.message_type, options)

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> TopicInfo:
        """Build from a decoded TopicInfo Avro record."""
        return cls(
            name=d["name"],
            keys=tuple(d["keys"]),
            key_domain=d["key_domain"],
            partitions=d["partitions"],
            log_topic=d["log_topic"],
            control_topic=d["control_topic"],
            sow=d.get("sow", True),
            queue_of=tuple(d.get("queue_of") or ()),
            key_generator=d.get("key_generator"),
            key_generator_options=tuple(sorted((d.get("key_generator_options") or {}).items())),
            auto=d.get("auto", False),
            message_type=d.get("message_type") or JSON,
            schema=d.get("schema") or "",
            view_of=tuple(d.get("view_of") or ()),
            pattern=d.get("pattern") or "",
            preprocessing=tuple(d.get("preprocessing") or ()),
            instance_name=d.get("instance_name") or "",
            record_keys=tuple(d.get("delta_keys") or ()),
            publish_as=d.get("publish_as") or "",
        )

    def refuse_writes(self) -> None:
        """Raise InvalidCommandError if the engine computes this topic (a view or a conflated
        topic): only the engine writes those."""
        if self.view_of:
            raise InvalidCommandError(
                f"topic {self.name!r} is computed by the engine from "
                f"{', '.join(self.view_of)} (a view or a conflated topic): it cannot be "
                "published to or deleted from; publish to the underlying topics instead"
            )

    def addressed_as(self, name: str) -> TopicInfo:
        """This topic as a command on ``name`` reads it: a Pattern topic addressed by a name its
        Pattern matches reads that name's records only; by its own Name otherwise, every name."""
        if self.pattern and re.fullmatch(self.pattern, name):
            return replace(self, topic_regex=name_regex(name))
        return self

    @property
    def published_name(self) -> str | None:
        """The one topic name a Pattern topic is addressed by (None: several or none)."""
        return literal_name(self.topic_regex) if self.topic_regex is not None else None


@functools.lru_cache(maxsize=256)
def _stage(fields: tuple[str, ...], instance_name: str) -> Stage:
    try:
        return compile_stage(PREPROCESSING, fields, instance_name=instance_name)
    except StageError as exc:  # the engine checked it: only a version mismatch gets here
        raise InvalidCommandError(f"the topic's Preprocessing cannot be used here: {exc}") from None


def type_name(message_type: str) -> str:
    """A message type's name as the engine spells it; InvalidCommandError if unknown."""
    name = message_type.strip().lower()
    if name not in registry.names():
        raise InvalidCommandError(
            f"message type {message_type!r} is not supported; supported: "
            f"{', '.join(registry.names())}"
        )
    return name


def codec_of(infos: list[TopicInfo]) -> MessageType | None:
    """The message type of the topics a command reads, None for json (messages parse as JSON)."""
    if not infos or infos[0].message_type == JSON:
        return None
    return infos[0].codec
