"""Finding a message type by name: the built-in ones, and any a package adds through the
entry-point group ``sowstream.message_types`` (the entry point's name is the type's name, its
object a :class:`~sowstream.messagetypes.base.MessageType` subclass)."""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points
from typing import Any

from sowstream.messagetypes.avro import AvroType
from sowstream.messagetypes.base import MessageType, MessageTypeConfigError, TypeOptions
from sowstream.messagetypes.bflat import BFlatType
from sowstream.messagetypes.binary import BinaryType
from sowstream.messagetypes.bson import BsonType
from sowstream.messagetypes.composite import (
    CompositeGlobalType,
    CompositeLocalType,
    use_part_types,
)
from sowstream.messagetypes.fix import FixType
from sowstream.messagetypes.json import JsonType
from sowstream.messagetypes.nvfix import NvfixType
from sowstream.messagetypes.protobuf import ProtobufType
from sowstream.messagetypes.xml import XmlType

ENTRY_POINT_GROUP = "sowstream.message_types"
JSON = "json"

BUILT_IN: dict[str, type[MessageType]] = {
    t.name: t
    for t in (
        JsonType,
        FixType,
        NvfixType,
        XmlType,
        BinaryType,
        AvroType,
        BsonType,
        BFlatType,
        ProtobufType,
        CompositeLocalType,
        CompositeGlobalType,
    )
}
COMPOSITE = (CompositeLocalType.name, CompositeGlobalType.name)
# The types a topic cannot have without its configuration (Schema, Parts): never created on
# first use.
CONFIGURED = (AvroType.name, ProtobufType.name, *COMPOSITE)


@cache
def _types() -> dict[str, type[MessageType]]:
    """Every known type by name (entry points read once; a built-in name cannot be replaced)."""
    found = dict(BUILT_IN)
    for point in entry_points(group=ENTRY_POINT_GROUP):
        name = point.name.strip().lower()
        if name in BUILT_IN:
            continue
        loaded = point.load()
        if not (isinstance(loaded, type) and issubclass(loaded, MessageType)):
            raise MessageTypeConfigError(
                f"entry point {point.name!r} in {ENTRY_POINT_GROUP} must name a MessageType "
                f"subclass, got {loaded!r}"
            )
        found[name] = loaded
    return found


def names() -> tuple[str, ...]:
    """The names of every message type available, built-in ones first."""
    return tuple(_types())


def type_class(name: str) -> type[MessageType]:
    """The class of message type ``name`` (any case); MessageTypeConfigError if unknown."""
    found = _types().get(name.strip().lower())
    if found is None:
        raise MessageTypeConfigError(
            f"message type {name!r} is not supported; supported: {', '.join(names())}"
        )
    return found


def get(name: str, topic_config: Any = None) -> MessageType:
    """The message type ``name`` set up for a topic config (its ``name``, ``schema_file`` and
    ``parts``).

    Instances are cached per (type, topic, schema), so an avro schema is parsed once.
    """
    # Only text counts: a pydantic model also has a ``schema`` method.
    topic = getattr(topic_config, "name", "")
    schema_file = getattr(topic_config, "schema_file", None)
    parts = getattr(topic_config, "parts", ())
    options = TypeOptions(
        topic=topic if isinstance(topic, str) else "",
        schema_file=schema_file if isinstance(schema_file, str) else None,
        parts=tuple(parts) if isinstance(parts, tuple | list) else (),
    )
    return _instance(name.strip().lower(), options)


def for_options(name: str, options: TypeOptions) -> MessageType:
    """The message type ``name`` set up with ``options`` (cached like :func:`get`)."""
    return _instance(name.strip().lower(), options)


@cache
def _instance(name: str, options: TypeOptions) -> MessageType:
    return type_class(name)(options)


use_part_types(for_options)
