"""A stored SOW record and its encoding in RocksDB and the changelog.

Records are written as a fixed binary header and the raw body (format 1, below). Stores and
changelogs written before it hold Avro records (the state schema ``schemas/SowRecord.avsc``);
those are still read, so an existing store or changelog needs no migration. The first byte tells
the two apart: an Avro record starts with the zigzag varint of its SowKey's length, whose
first byte is always even, while format 1 starts with an odd marker.

Format 1 (big-endian): marker ``0x01`` (no expiration) or ``0x03`` (an 8-byte expiration
follows the header), log offset (8 bytes, signed), log timestamp in ms (8 bytes, signed),
length of the UTF-8 SowKey (4 bytes), [expiration in ms (8 bytes, signed)], the SowKey, the body.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sowstream.wire.avro import decode

if TYPE_CHECKING:
    from sowstream.messagetypes import MessageType

PLAIN = 0x01  # format 1 without an expiration
EXPIRING = 0x03  # format 1 with one
_HEADER = struct.Struct(">BqqI")
_EXPIRY = struct.Struct(">q")
_PLAIN_AT = _HEADER.size
_EXPIRING_AT = _HEADER.size + _EXPIRY.size


@dataclass(frozen=True, slots=True, init=False)
class SowRecord:
    """The current state of one SOW key plus what replay and expiry need to know about it."""

    sow_key: str
    data: bytes
    log_offset: int
    log_timestamp: int
    expiration: int | None

    def __init__(
        self,
        sow_key: str,
        data: bytes,
        log_offset: int,
        log_timestamp: int,
        expiration: int | None = None,
    ) -> None:
        # Through the slots' own setters: a frozen dataclass's generated __init__ goes through
        # object.__setattr__ per field, 3x slower, and two records are made per update.
        _set_sow_key(self, sow_key)
        _set_data(self, data)
        _set_log_offset(self, log_offset)
        _set_log_timestamp(self, log_timestamp)
        _set_expiration(self, expiration)

    def parsed(self, mtype: MessageType) -> dict[str, Any]:
        """The message body's fields, read by its topic's message type."""
        return mtype.parse(self.data)

    def to_bytes(self) -> bytes:
        """The stored form (format 1) for RocksDB and the changelog."""
        key = self.sow_key.encode()
        if self.expiration is None:
            head = _HEADER.pack(PLAIN, self.log_offset, self.log_timestamp, len(key))
        else:
            head = _HEADER.pack(
                EXPIRING, self.log_offset, self.log_timestamp, len(key)
            ) + _EXPIRY.pack(self.expiration)
        return head + key + self.data

    @classmethod
    def from_bytes(cls, payload: bytes) -> SowRecord:
        """Inverse of :meth:`to_bytes`; also reads the Avro records of earlier versions."""
        marker = payload[0]
        if marker == PLAIN:
            _, offset, timestamp, size = _HEADER.unpack_from(payload)
            end = _PLAIN_AT + size
            return cls(payload[_PLAIN_AT:end].decode(), payload[end:], offset, timestamp, None)
        if marker == EXPIRING:
            _, offset, timestamp, size = _HEADER.unpack_from(payload)
            (expiration,) = _EXPIRY.unpack_from(payload, _PLAIN_AT)
            end = _EXPIRING_AT + size
            key = payload[_EXPIRING_AT:end].decode()
            return cls(key, payload[end:], offset, timestamp, expiration)
        return cls.from_avro(payload)

    @classmethod
    def from_avro(cls, payload: bytes) -> SowRecord:
        """A record in the Avro form stores held before format 1."""
        d = decode("SowRecord", payload)
        return cls(d["sow_key"], d["data"], d["log_offset"], d["log_timestamp"], d["expiration"])


def normalised(value: bytes) -> bytes:
    """A stored value in format 1 (an Avro record of an earlier release is rewritten)."""
    return value if value[0] in (PLAIN, EXPIRING) else SowRecord.from_avro(value).to_bytes()


def stored_expiration(value: bytes) -> int | None:
    """The expiration (ms) of a stored value in format 1, read from its header alone."""
    return _EXPIRY.unpack_from(value, _PLAIN_AT)[0] if value[0] == EXPIRING else None


def stored_key(value: bytes) -> str:
    """The SowKey (store key) of a stored value in format 1, read without the body."""
    size = _HEADER.unpack_from(value)[3]
    at = _EXPIRING_AT if value[0] == EXPIRING else _PLAIN_AT
    return value[at : at + size].decode()


def stored_body(value: bytes) -> bytes:
    """The body of a stored value in format 1, without decoding the rest of the record."""
    size = _HEADER.unpack_from(value)[3]
    return value[(_EXPIRING_AT if value[0] == EXPIRING else _PLAIN_AT) + size :]


# The slot descriptors' setters (mypy sees the fields' types on the class, not descriptors).
_slot: Any = SowRecord
_set_sow_key = _slot.sow_key.__set__
_set_data = _slot.data.__set__
_set_log_offset = _slot.log_offset.__set__
_set_log_timestamp = _slot.log_timestamp.__set__
_set_expiration = _slot.expiration.__set__
