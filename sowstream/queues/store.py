"""Where a queue's messages live in the underlying topic's partition store.

A queue message is stored in the store of the log partition its publish came from, in the same
batch as that partition's watermark, so a worker that takes the partition over finds exactly the
messages not yet removed and reads the log on from the watermark for the rest. Leases are not
stored: after a takeover every message is available again (AMPS does the same on a restart).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import orjson

# Under the store's reserved prefix, beside History ("\x00h/") and conflation entries ("\x00c/").
QUEUE_PREFIX = b"\x00q/"

_LENGTH = struct.Struct(">I")
_OFFSET = struct.Struct(">q")


def queue_prefix(queue: str) -> bytes:
    """Key prefix of one queue's messages in a partition store."""
    raw = queue.encode()
    return QUEUE_PREFIX + _LENGTH.pack(len(raw)) + raw


def entry_key(queue: str, offset: int) -> bytes:
    """Store key of the queue message made by the publish at log ``offset``: offset order."""
    return queue_prefix(queue) + _OFFSET.pack(offset)


def offset_of(key: bytes) -> int:
    """The log offset a stored queue key names."""
    (offset,) = _OFFSET.unpack_from(key, len(key) - _OFFSET.size)
    return offset


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A queue message as stored: its body and what delivery order and expiry need."""

    data: bytes
    timestamp_ms: int
    expiration_ms: int | None  # the publish's own expiration, None for the queue's

    def to_bytes(self) -> bytes:
        head = orjson.dumps({"t": self.timestamp_ms, "e": self.expiration_ms})
        return head + b"\n" + self.data

    @classmethod
    def from_bytes(cls, value: bytes) -> StoredMessage:
        head, _, data = value.partition(b"\n")
        meta = orjson.loads(head)
        return cls(data, meta["t"], meta["e"])
