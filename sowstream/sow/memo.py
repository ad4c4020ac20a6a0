"""Memo indexes: the values of one field of a topic, in store keys that sort as filters compare.

A memo index on a field path keeps one store entry per value a record holds there (several
through arrays), in the partition store next to the records, under the reserved prefix:

    MEMO_PREFIX + esc(path) + END + space + encoded value + record key

Each value is filed under the readings the filter language compares it by:

* ``N``, its number (numbers, and strings that spell one, as ``/qty > 900`` reads them), as
  8 bytes whose byte order is the numeric order (IEEE-754 with the sign bit flipped);
* ``T``, its text (strings, and numbers and booleans as spelled, which is what LIKE, BEGINS WITH
  and ENDS WITH see), UTF-8 with ``0x00`` escaped and an end mark, so byte order is the
  code-point order Python compares strings by and a prefix of the text is a prefix of the key.

So a range, an equality or a BEGINS WITH is an iteration over one or two key ranges, and a LIKE
reads the texts of the index instead of decoding records. Integers beyond a float's precision
share an encoding with their neighbours: ranges are taken inclusive, so the index always yields
a superset of the matches and the full filter re-checks every candidate. Values with neither
reading (NULL, objects) have no entry: no comparison, LIKE or BEGINS WITH can be true for them.

A marker per index says whether it is complete: ``building`` is written before the first entry
and ``ready`` after the last, so a store restored from its changelog in any state tells a whole
index from a partial one (which is dropped and built again).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sowstream.filters.values import scalar_text, to_number
from sowstream.sow.keys import field_values

__all__ = [
    "BUILDING",
    "MARKER_PREFIX",
    "MEMO_PREFIX",
    "NUMBER",
    "READY",
    "TEXT",
    "KeyRange",
    "decode_entry",
    "encode_number",
    "encode_text",
    "index_prefix",
    "marker_key",
    "memo_entries",
    "number_range",
    "path_of_marker",
    "successor",
    "text_prefix_range",
    "text_range",
    "value_keys",
]

MEMO_PREFIX = b"\x00m/"
MARKER_PREFIX = b"\x00M/"
# Marker values; a marker of another format version is treated as partial and rebuilt.
BUILDING = b"building"
READY = b"ready:1"
NUMBER = b"N"
TEXT = b"T"
_END = b"\x00\x01"
_SIGN = 1 << 63
_ALL = (1 << 64) - 1


def _escape(raw: bytes) -> bytes:
    return raw.replace(b"\x00", b"\x00\xff")


def _utf8(text: str) -> bytes:
    # surrogatepass: JSON may carry lone surrogates; their 3-byte form keeps code-point order.
    return text.encode("utf-8", "surrogatepass")


def index_prefix(path: str) -> bytes:
    """The key prefix of every entry of the memo index on ``path``."""
    return MEMO_PREFIX + _escape(_utf8(path)) + _END


def marker_key(path: str) -> bytes:
    """The key of the marker saying whether the index on ``path`` is building or ready."""
    return MARKER_PREFIX + _utf8(path)


def path_of_marker(key: bytes) -> str:
    """Inverse of :func:`marker_key`."""
    return key[len(MARKER_PREFIX) :].decode("utf-8", "surrogatepass")


def encode_number(value: int | float) -> bytes | None:
    """8 bytes that sort as the numbers do; None for NaN, which no comparison matches.

    Integers too large for a float go to the infinities, which keeps the order monotonic.
    """
    try:
        f = float(value)
    except OverflowError:
        f = math.inf if value > 0 else -math.inf
    if f != f:
        return None
    if f == 0.0:
        f = 0.0  # -0.0 equals 0.0 in every comparison: one encoding
    bits: int = struct.unpack(">Q", struct.pack(">d", f))[0]
    bits = bits ^ _ALL if bits & _SIGN else bits | _SIGN
    return bits.to_bytes(8, "big")


def encode_text(text: str) -> bytes:
    """The text as it appears in a key: escaped UTF-8 and the end mark."""
    return _escape(_utf8(text)) + _END


def value_keys(value: Any) -> list[bytes]:
    """The readings (space byte + encoding) under which one field value is filed."""
    out: list[bytes] = []
    text = scalar_text(value)
    if text is not None:
        out.append(TEXT + encode_text(text))
    number = to_number(value)
    if number is not None:
        encoded = encode_number(number)
        if encoded is not None:
            out.append(NUMBER + encoded)
    return out


def memo_entries(paths: Iterable[str], key: bytes, body: Mapping[str, Any] | None) -> set[bytes]:
    """The memo-index entries a record stored under ``key`` with ``body`` has."""
    if body is None:
        return set()
    entries: set[bytes] = set()
    for path in paths:
        base = index_prefix(path)
        for value in field_values(body, path):
            for reading in value_keys(value):
                entries.add(base + reading + key)
    return entries


def decode_entry(prefix_length: int, entry: bytes) -> tuple[str | None, bytes]:
    """``(text, record key)`` of an entry; the text is None for a numeric entry."""
    space = entry[prefix_length : prefix_length + 1]
    if space == NUMBER:
        return None, entry[prefix_length + 9 :]
    end = entry.index(_END, prefix_length + 1)
    raw = entry[prefix_length + 1 : end].replace(b"\x00\xff", b"\x00")
    return raw.decode("utf-8", "surrogatepass"), entry[end + 2 :]


def successor(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no such key)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


@dataclass(frozen=True)
class KeyRange:
    """Store keys from ``start`` (inclusive) to ``stop`` (exclusive)."""

    start: bytes
    stop: bytes | None


def number_range(path: str, low: int | float | None, high: int | float | None) -> KeyRange | None:
    """Numeric entries between ``low`` and ``high`` inclusive (None: unbounded); None if a
    bound is NaN (nothing compares true with it)."""
    space = index_prefix(path) + NUMBER
    start, stop = space, successor(space)
    if low is not None:
        encoded = encode_number(low)
        if encoded is None:
            return None
        start = space + encoded
    if high is not None:
        encoded = encode_number(high)
        if encoded is None:
            return None
        stop = successor(space + encoded)
    return KeyRange(start, stop)


def text_range(path: str, low: str | None, high: str | None) -> KeyRange:
    """Text entries between ``low`` and ``high`` inclusive (None: unbounded)."""
    space = index_prefix(path) + TEXT
    start = space if low is None else space + encode_text(low)
    stop = successor(space if high is None else space + encode_text(high))
    return KeyRange(start, stop)


def text_prefix_range(path: str, prefix: str) -> KeyRange:
    """Text entries whose text starts with ``prefix``."""
    start = index_prefix(path) + TEXT + _escape(_utf8(prefix))
    return KeyRange(start, successor(start))
