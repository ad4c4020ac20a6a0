"""A queue's keys in the store of a log partition it reads, and its stored copies.

Most queue messages are read from the log (sowstream.queues.ledger); a message whose queued
form the log does not hold (a merged delta_publish, an enriched record) is stored as a *copy*
under its offset, in the batch that applied its publish, and deleted when it leaves the queue.
Leases are not stored: after a takeover every message is available again (AMPS does the same on
a restart).

The older layout stored a copy of every message and left an *ack marker* under an acknowledged
message's key; a worker reads both (:func:`read_ack_marker`) and writes neither.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import orjson

# Under the store's reserved prefix, beside History ("\x00h/") and conflation entries ("\x00c/").
QUEUE_PREFIX = b"\x00q/"
QUEUE_START_PREFIX = b"\x00Q/"
EPOCH_PREFIX = b"\x00E/"

# How long an acknowledgement is remembered with its client: longer than a takeover (session
# timeout plus restore) and than a client's command timeout, so the repeats it exists for find it.
ACK_MEMORY_MS = 120_000
# A stored copy's value starts with its JSON head ("{"); an older layout's marker with this byte.
_MARKER = b"\x00"

_LENGTH = struct.Struct(">I")
_OFFSET = struct.Struct(">q")


def queue_prefix(queue: str) -> bytes:
    """Key prefix of one queue's messages in a partition store."""
    raw = queue.encode()
    return QUEUE_PREFIX + _LENGTH.pack(len(raw)) + raw


def start_key(queue: str) -> bytes:
    """Store key of the first log offset a queue takes from the partition (its RecoveryPoint
    resolved when the queue first met the partition); outside :func:`queue_prefix`."""
    raw = queue.encode()
    return QUEUE_START_PREFIX + _LENGTH.pack(len(raw)) + raw


def epoch_key(queue: str) -> bytes:
    """Store key of the last credit epoch a queue's owner gave the partition
    (sowstream.queues.credits): a next owner takes a later one, whatever its clock says."""
    raw = queue.encode()
    return EPOCH_PREFIX + _LENGTH.pack(len(raw)) + raw


def entry_key(queue: str, offset: int) -> bytes:
    """Store key of the queue message made by the publish at log ``offset``: offset order."""
    return queue_prefix(queue) + _OFFSET.pack(offset)


def offset_of(key: bytes) -> int:
    """The log offset a stored queue key names."""
    offset: int = _OFFSET.unpack_from(key, len(key) - _OFFSET.size)[0]
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


def ack_marker(client: str, at_ms: int) -> bytes:
    """The value the older layout left under an acknowledged message's key."""
    return _MARKER + orjson.dumps({"c": client, "t": at_ms})


def read_ack_marker(value: bytes) -> tuple[str, int] | None:
    """``(client, acknowledged at)`` when ``value`` is an ack marker, None for a message."""
    if not value.startswith(_MARKER):
        return None
    meta = orjson.loads(value[1:])
    return str(meta["c"]), int(meta["t"])
