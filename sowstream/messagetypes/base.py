"""What a message type is to the engine: parse, serialise, merge, and two capability flags.

Every place that reads or writes a record body goes through the topic's :class:`MessageType`, so
the engine, the client and the tests treat ``json``, ``fix``, ``nvfix``, ``xml``, ``avro`` and
``binary`` alike. A parsed body is a ``dict`` whose keys are the first step of a field path
(``/35`` reads ``body["35"]``, ``/order/id`` reads ``body["order"]["id"]``); filters, SowKeys,
hash indexes, deltas and aggregates all work on that dict.

A user adds a type by subclassing :class:`MessageType` and naming the class in the entry-point
group ``sowstream.message_types`` (see docs/message-types.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from sowstream.messagetypes.changes import changed_fields, merge_delta

# How errors spell the built-in types' names (as their specifications do).
_LABELS = {
    "json": "JSON",
    "fix": "FIX",
    "nvfix": "NVFIX",
    "xml": "XML",
    "avro": "Avro",
    "bson": "BSON",
    "bflat": "BFlat",
    "protobuf": "protobuf",
}


class MessageParseError(ValueError):
    """A body that is not a valid message of its type; ``str()`` says what is wrong and where.

    ``position`` is the byte offset of the problem when the type can tell (None otherwise).
    """

    def __init__(self, type_name: str, problem: str, position: int | None = None) -> None:
        where = f" at byte {position}" if position is not None else ""
        label = _LABELS.get(type_name, type_name)
        super().__init__(f"malformed {label} message{where}: {problem}")
        self.type_name = type_name
        self.problem = problem
        self.position = position


class MessageSerialiseError(ValueError):
    """Fields that a message type cannot write (an object inside a flat FIX message, say)."""


class MessageTypeConfigError(ValueError):
    """A message type cannot be set up for a topic (an avro topic without a readable schema)."""


@dataclass(frozen=True)
class TypeOptions:
    """What a message type may need from its topic's configuration.

    ``topic`` names the topic in errors; ``schema_file`` is the avro schema or protobuf
    ``.proto``/descriptor set file (the ``Schema`` element); ``schema`` is the schema itself, as a
    client receives it from the meta topic; ``parts`` are a composite type's part types (the
    ``Parts`` element).
    """

    topic: str = ""
    schema_file: str | None = None
    schema: str | None = None
    parts: tuple[str, ...] = ()


class MessageType(ABC):
    """A message type: how bodies of one topic are parsed, written and merged.

    ``has_fields`` is False for a type whose bodies are opaque (``binary``): such a topic takes no
    content filters and no Key fields. ``supports_delta`` is False where a delta subscription gets
    whole messages and a delta_publish replaces the record (``binary``). ``empty`` is the body of
    a message that carries no fields (an out-of-focus notice for a record no longer known).
    """

    name: ClassVar[str]
    has_fields: ClassVar[bool] = True
    # Not a ClassVar: a type may decide per topic (protobuf: proto2 schemas yes, proto3 no).
    supports_delta: bool = True
    empty: ClassVar[bytes] = b""
    # False where a delta_publish body is written in another form than a whole record (avro).
    delta_form_is_full: ClassVar[bool] = True

    def __init__(self, options: TypeOptions | None = None) -> None:
        self.options = options or TypeOptions()

    @abstractmethod
    def parse(self, data: bytes) -> dict[str, Any]:
        """The body's fields; MessageParseError when ``data`` is not a message of this type."""

    @abstractmethod
    def serialise(self, record: Mapping[str, Any]) -> bytes:
        """A body holding ``record``'s fields (the inverse of :meth:`parse`)."""

    def parse_delta(self, data: bytes) -> dict[str, Any]:
        """The fields of a delta_publish body (only those it updates)."""
        return self.parse(data)

    def serialise_delta(self, fields: Mapping[str, Any]) -> bytes:
        """A delta message: only the changed fields (and the key fields)."""
        return self.serialise(fields)

    def changed(self, before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
        """The body of a delta message: the fields of ``after`` that differ from ``before``
        (objects compared field by field; a removed field as None)."""
        return changed_fields(before, after)

    def merge(self, stored: bytes, update: bytes) -> bytes:
        """The record after the delta_publish ``update`` is merged into ``stored``."""
        return self.merge_fields(self.parse(stored), self.parse_delta(update))

    def merge_fields(self, stored: dict[str, Any], update: dict[str, Any]) -> bytes:
        """:meth:`merge` for bodies already parsed: the delta_publish rule
        (:func:`~sowstream.messagetypes.changes.merge_delta`; neither argument is modified)."""
        return self.serialise(merge_delta(stored, update))
