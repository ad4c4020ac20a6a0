"""Message types: how a topic's bodies are parsed, written and merged (docs/message-types.md)."""

from sowstream.messagetypes.base import (
    MessageParseError,
    MessageSerialiseError,
    MessageType,
    MessageTypeConfigError,
    TypeOptions,
)
from sowstream.messagetypes.registry import JSON, get, names

__all__ = [
    "JSON",
    "MessageParseError",
    "MessageSerialiseError",
    "MessageType",
    "MessageTypeConfigError",
    "TypeOptions",
    "get",
    "names",
]
