"""``bflat``: AMPS's open binary tag/value format (BFlat), encoded and decoded here.

Layout, as the public BFlat description and reference libraries define it: a message is a run of
fields, each one header byte, the tag, then the value.

* Header byte: bit 7 set for an array; bits 6..3 the value type; bits 2..0 the tag's length in
  bytes (1-7), or 0 when an unsigned LEB128 length follows the header.
* Types: 0 null (no data), 1 string and 2 binary (unsigned LEB128 length, then the bytes), 3-6
  int8/16/32/64 and 7 double (little-endian, fixed width), 8 datetime (int64 milliseconds since
  the Unix epoch, little-endian), 9 signed LEB128 integer.
* An array has an unsigned LEB128 element count after the tag, then that many values of its type.

A parsed body is flat: tags are the field names (``/price`` reads tag ``price``), values are
None, str (UTF-8; bytes that are not UTF-8 stay bytes), bytes, int, float, :class:`Datetime` (an
int of milliseconds that writes back as a datetime) or lists of those. A tag that appears twice
reads as a list of its values, as the reference parsers do. Writing picks the most compact
integer type; bools are written as int8 0/1 (BFlat has no boolean); nested objects are refused.
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Mapping
from typing import Any, ClassVar

from sowstream.messagetypes.base import MessageParseError, MessageSerialiseError, MessageType

NULL, STRING, BINARY, INT8, INT16, INT32, INT64, DOUBLE, DATETIME, LEB128 = range(10)
_ARRAY = 0x80
_TYPE_SHIFT = 3
_FIXED = {
    INT8: struct.Struct("<b"),
    INT16: struct.Struct("<h"),
    INT32: struct.Struct("<i"),
    INT64: struct.Struct("<q"),
    DOUBLE: struct.Struct("<d"),
    DATETIME: struct.Struct("<q"),
}
_INT_RANGES = ((INT8, 1 << 7), (INT16, 1 << 15), (INT32, 1 << 31), (INT64, 1 << 63))
_INTEGERS = frozenset({INT8, INT16, INT32, INT64, LEB128})
_LEB128_LIMIT = 1 << 127  # the reference libraries hold LEB128 values up to 128 bits


class Datetime(int):
    """A BFlat datetime: milliseconds since the Unix epoch (UTC). An int for filters and sums;
    written back as a datetime field."""

    @classmethod
    def of(cls, moment: dt.datetime) -> Datetime:
        """The datetime ``moment`` (naive means UTC) in milliseconds."""
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
        return cls(round(moment.timestamp() * 1000))


def _problem(text: str, position: int) -> MessageParseError:
    return MessageParseError("bflat", text, position)


class _Reader:
    """A cursor over a BFlat body that names the byte where it went wrong."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, count: int, what: str) -> bytes:
        end = self.pos + count
        if end > len(self.data):
            left = len(self.data) - self.pos
            raise _problem(
                f"{what} needs {count} bytes but the message ends after {left}", self.pos
            )
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def uleb128(self, what: str) -> int:
        start, value, shift = self.pos, 0, 0
        while True:
            if self.pos >= len(self.data):
                raise _problem(f"{what}: the LEB128 number is cut off", start)
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value
            if shift > 133:
                raise _problem(f"{what}: the LEB128 number is longer than 128 bits", start)

    def sleb128(self, what: str) -> int:
        start = self.pos
        value = self.uleb128(what)
        bits = 7 * (self.pos - start)
        if value >> (bits - 1) & 1:  # the sign bit of the last group
            value -= 1 << bits
        return value


def decode(data: bytes) -> dict[str, Any]:
    """The fields of a BFlat message; MessageParseError naming the byte of the first problem."""
    reader = _Reader(data)
    body: dict[str, Any] = {}
    while reader.pos < len(data):
        at = reader.pos
        header = data[at]
        reader.pos += 1
        kind = (header & 0x7F) >> _TYPE_SHIFT
        if kind > LEB128:
            raise _problem(f"unknown value type {kind} in the field header 0x{header:02x}", at)
        length = header & 0x07 or reader.uleb128("tag length")
        if length == 0:
            raise _problem("a field has an empty tag", at)
        raw_tag = reader.take(length, "the tag")
        try:
            tag = raw_tag.decode()
        except UnicodeDecodeError:
            raise _problem(f"the tag {raw_tag!r} is not UTF-8", at + 1) from None
        if header & _ARRAY:
            count = reader.uleb128(f"the element count of {tag!r}")
            # Every element but a null takes a byte at least; a count beyond what the message can
            # hold is refused before anything is built for it.
            left = len(data) - reader.pos
            if count > (len(data) if kind == NULL else left):
                raise _problem(
                    f"array {tag!r} declares {count} elements but only {left} bytes follow", at
                )
            value: Any = [_value(reader, kind, tag) for _ in range(count)]
        else:
            value = _value(reader, kind, tag)
        if tag in body:  # a repeated tag reads as a list of its values
            before = body[tag]
            joined = before if isinstance(before, list) else [before]
            body[tag] = joined + (value if isinstance(value, list) else [value])
        else:
            body[tag] = value
    return body


def _value(reader: _Reader, kind: int, tag: str) -> Any:
    if kind == NULL:
        return None
    if kind in (STRING, BINARY):
        raw = reader.take(reader.uleb128(f"the length of {tag!r}"), f"the value of {tag!r}")
        if kind == BINARY:
            return raw
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return raw  # BFlat leaves a string's encoding to the application
    if kind == LEB128:
        return reader.sleb128(f"the value of {tag!r}")
    fixed = _FIXED[kind]
    (number,) = fixed.unpack(reader.take(fixed.size, f"the value of {tag!r}"))
    return Datetime(number) if kind == DATETIME else number


def encode(record: Mapping[str, Any]) -> bytes:
    """A BFlat message holding ``record``'s fields; MessageSerialiseError for what BFlat cannot
    hold (nested objects, lists of lists, integers beyond 128 bits)."""
    out = bytearray()
    for tag, value in record.items():
        name = str(tag).encode()
        if not name:
            raise MessageSerialiseError("BFlat tags cannot be empty")
        if isinstance(value, list | tuple):
            kinds = {_kind(tag, v) for v in value}
            if len(kinds) > 1 and kinds <= _INTEGERS:  # one integer type wide enough for all
                kinds = {LEB128 if LEB128 in kinds else max(kinds)}
            if len(kinds) > 1:  # mixed: repeated tags, which read back as the same list
                for item in value:
                    _field(out, name, _kind(tag, item), [item], array=False)
            else:
                _field(out, name, kinds.pop() if kinds else NULL, list(value), array=True)
        else:
            _field(out, name, _kind(tag, value), [value], array=False)
    return bytes(out)


def _kind(tag: object, value: Any) -> int:
    if value is None:
        return NULL
    if isinstance(value, Datetime | dt.datetime):
        return DATETIME
    if isinstance(value, bool):
        return INT8
    if isinstance(value, int):
        return _int_kind(tag, value)
    if isinstance(value, float):
        return DOUBLE
    if isinstance(value, str):
        return STRING
    if isinstance(value, bytes | bytearray | memoryview):
        return BINARY
    what = "a nested object" if isinstance(value, Mapping) else type(value).__name__
    raise MessageSerialiseError(f"BFlat is flat: field {tag!r} holds {what}, which it cannot write")


def _int_kind(tag: object, value: int) -> int:
    for kind, limit in _INT_RANGES:
        if -limit <= value < limit:
            return kind
    if -_LEB128_LIMIT <= value < _LEB128_LIMIT:
        return LEB128
    raise MessageSerialiseError(f"field {tag!r}: {value} does not fit BFlat's 128-bit integers")


def _uleb128(out: bytearray, value: int) -> None:
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return


def _sleb128(out: bytearray, value: int) -> None:
    while True:
        low = value & 0x7F
        value >>= 7  # arithmetic shift: -1 stays -1
        done = (value == 0 and not low & 0x40) or (value == -1 and low & 0x40)
        out.append(low if done else low | 0x80)
        if done:
            return


def _field(out: bytearray, name: bytes, kind: int, values: list[Any], *, array: bool) -> None:
    short = len(name) if len(name) <= 7 else 0
    out.append((_ARRAY if array else 0) | kind << _TYPE_SHIFT | short)
    if not short:
        _uleb128(out, len(name))
    out += name
    if array:
        _uleb128(out, len(values))
    for value in values:
        if kind == NULL:
            continue
        if kind in (STRING, BINARY):
            raw = value.encode() if isinstance(value, str) else bytes(value)
            _uleb128(out, len(raw))
            out += raw
        elif kind == LEB128:
            _sleb128(out, int(value))
        elif kind == DATETIME:
            millis = Datetime.of(value) if isinstance(value, dt.datetime) else int(value)
            out += _FIXED[DATETIME].pack(millis)
        elif kind == DOUBLE:
            out += _FIXED[DOUBLE].pack(float(value))
        else:
            out += _FIXED[kind].pack(int(value))


class BFlatType(MessageType):
    """BFlat messages: flat tag/value fields; a delta_publish carries the tags it updates."""

    name: ClassVar[str] = "bflat"

    def parse(self, data: bytes) -> dict[str, Any]:
        if not data:
            raise MessageParseError("bflat", "empty message body")
        return decode(data)

    def parse_delta(self, data: bytes) -> dict[str, Any]:
        return decode(data)  # an empty delta updates nothing

    def serialise(self, record: Mapping[str, Any]) -> bytes:
        return encode(record)
