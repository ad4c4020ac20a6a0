"""``binary``: opaque bytes. Nothing is parsed, so records are identified by publisher SowKeys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from sowstream.messagetypes.base import MessageSerialiseError, MessageType


class BinaryType(MessageType):
    """No fields: no content filters, no Key fields; a delta_publish replaces the record and a
    delta subscription receives whole messages."""

    name: ClassVar[str] = "binary"
    has_fields: ClassVar[bool] = False
    supports_delta = False

    def parse(self, data: bytes) -> dict[str, Any]:
        return {}  # any bytes are a binary message, and they have no fields

    def serialise(self, record: Mapping[str, Any]) -> bytes:
        if record:
            raise MessageSerialiseError(
                f"binary messages have no fields to write (got {', '.join(map(str, record))})"
            )
        return b""

    def merge(self, stored: bytes, update: bytes) -> bytes:
        return update
