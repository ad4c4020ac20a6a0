"""Where a queue's messages live in the underlying topic's partition store.

A queue message is stored in the store of the log partition its publish came from, in the same
batch as that partition's watermark, so a worker that takes the partition over finds exactly the
messages not yet removed and reads the log on from the watermark for the rest. Leases are not
stored: after a takeover every message is available again (AMPS does the same on a restart).

An acknowledged message leaves an *ack marker* under its key (who acknowledged it, and when)
for :data:`ACK_MEMORY_MS`: an acknowledgement repeated in that time (a client retrying after a
timeout, or a command read again by the worker that took the partition over after the first
answer was lost) is answered as done, not as an unknown bookmark.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

import orjson

# Under the store's reserved prefix, beside History ("\x00h/") and conflation entries ("\x00c/").
QUEUE_PREFIX = b"\x00q/"
QUEUE_START_PREFIX = b"\x00Q/"
EPOCH_PREFIX = b"\x00E/"

# How long an ack marker stays: longer than a takeover (session timeout plus restore) and than a
# client's command timeout, so the repeats it exists for find it.
ACK_MEMORY_MS = 120_000
# A stored message's value starts with its JSON head ("{"); a marker with this byte.
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
    """The value left under an acknowledged message's key."""
    return _MARKER + orjson.dumps({"c": client, "t": at_ms})


def read_ack_marker(value: bytes) -> tuple[str, int] | None:
    """``(client, acknowledged at)`` when ``value`` is an ack marker, None for a message."""
    if not value.startswith(_MARKER):
        return None
    meta = orjson.loads(value[1:])
    return str(meta["c"]), int(meta["t"])


class AckMemory:
    """The ack markers of one log partition in the order they were written, so the old ones
    can be deleted without scanning the store: two arrays of 8-byte integers, since a busy
    queue writes thousands a second."""

    def __init__(self) -> None:
        self._at = array("q")
        self._offsets = array("q")
        self._head = 0

    def __len__(self) -> int:
        return len(self._at) - self._head

    def remember(self, offset: int, at_ms: int) -> None:
        """A marker for the message at ``offset`` was written at ``at_ms``."""
        self._at.append(at_ms)
        self._offsets.append(offset)

    def due(self, now_ms: int, memory_ms: int = ACK_MEMORY_MS) -> Iterator[int]:
        """Offsets whose markers are older than ``memory_ms``; each is forgotten as it is
        yielded. Markers are visited in the order written, so one written late with an older
        time waits for the ones before it (it is at most ``memory_ms`` late)."""
        while self._head < len(self._at) and self._at[self._head] <= now_ms - memory_ms:
            yield self._offsets[self._head]
            self._head += 1
        if self._head > 4096 and self._head * 2 > len(self._at):
            del self._at[: self._head]
            del self._offsets[: self._head]
            self._head = 0
