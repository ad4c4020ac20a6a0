"""``json``: a JSON object per message, parsed with orjson (the default type)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import orjson

from sowstream.messagetypes.base import MessageParseError, MessageType
from sowstream.messagetypes.changes import merge_delta


class JsonType(MessageType):
    """Objects only: a top-level array or scalar has no fields to key, filter or merge."""

    name: ClassVar[str] = "json"
    empty: ClassVar[bytes] = b"{}"

    def parse(self, data: bytes) -> dict[str, Any]:
        if not data:
            raise MessageParseError("json", "empty message body")
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise MessageParseError("json", exc.msg, exc.pos) from None
        if type(body) is not dict:
            raise MessageParseError(
                "json", f"a JSON message must be an object, got {type(body).__name__}", 0
            )
        return body

    # A delta is an object like any other: no detour through the base class on the hot path.
    parse_delta = parse

    def serialise(self, record: Mapping[str, Any]) -> bytes:
        return orjson.dumps(record)

    def merge_fields(self, stored: dict[str, Any], update: dict[str, Any]) -> bytes:
        # the hot path of delta_publish: no detour through the generic serialise
        return orjson.dumps(merge_delta(stored, update))
