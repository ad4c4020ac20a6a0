"""``bson``: one BSON document per message, read and written with pymongo's ``bson`` package.

Paths are field names as in JSON (``/order/id`` reads an embedded document's field). Values keep
their BSON types as pymongo decodes them (ints, floats, strings, documents, arrays, ``bytes`` for
binary subtype 0, ``datetime`` for UTC datetimes, ObjectId...). Deltas and the delta_publish
merge follow the JSON rule: embedded documents merge field by field, anything else is replaced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import bson
from bson.codec_options import CodecOptions
from bson.errors import BSONError

from sowstream.messagetypes.base import MessageParseError, MessageSerialiseError, MessageType

# Plain dicts (not SON), and binary subtype 0 as bytes, so bodies look like every other type's.
_OPTIONS: CodecOptions[dict[str, Any]] = CodecOptions(document_class=dict)
# An empty document: int32 length 5 and the terminating NUL.
_EMPTY = b"\x05\x00\x00\x00\x00"


class BsonType(MessageType):
    """BSON documents (https://bsonspec.org) through pymongo's codec."""

    name: ClassVar[str] = "bson"
    empty: ClassVar[bytes] = _EMPTY

    def parse(self, data: bytes) -> dict[str, Any]:
        if not data:
            raise MessageParseError("bson", "empty message body")
        if len(data) < 5:
            raise MessageParseError("bson", f"a BSON document is at least 5 bytes, got {len(data)}")
        declared = int.from_bytes(data[:4], "little", signed=True)
        if declared != len(data):
            raise MessageParseError(
                "bson",
                f"the document declares {declared} bytes but the message has {len(data)}",
                0,
            )
        try:
            return bson.decode(data, codec_options=_OPTIONS)
        except (BSONError, ValueError, OverflowError) as exc:
            raise MessageParseError("bson", str(exc) or type(exc).__name__) from None

    def serialise(self, record: Mapping[str, Any]) -> bytes:
        try:
            return bson.encode(dict(record), codec_options=_OPTIONS)
        except (BSONError, TypeError, ValueError, OverflowError) as exc:
            raise MessageSerialiseError(f"cannot write the fields as BSON: {exc}") from None
