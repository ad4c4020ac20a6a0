"""The conflation journal: what a conflated subscriber holds, kept with the partition's state.

A conflated subscription sends a record's change at the end of its interval, but the partition
stores the change (and moves its watermark past it) long before. Without a record of the
interval in progress, a worker that dies mid-interval takes the unsent changes with it, and the
record's next owner never sends them. So every change a conflated subscription buffers writes an
entry in the same store batch as the change: the subscription, the record, its conflation key,
where its latest change sits in the log, and the state the subscriber held before the interval.
The flush that sends the record removes the entry once Kafka has the message. A worker that takes
the partition over finds the entries still there and sends each record's current state at its
next flush, positioned at its latest change, so the client's de-duplication lets it through.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import orjson

from sowstream.sow.record import SowRecord

# Under the store's reserved prefix (never a record or index key), next to History's "\x00h/".
JOURNAL_PREFIX = b"\x00c/"

_LENGTH = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One record of one conflated subscription with a change not yet sent."""

    sub_key: str
    sow_key: str
    conflation_key: str
    offset: int
    seq: int
    timestamp: int
    base: SowRecord | None  # what the subscriber held before the interval: None if nothing

    @property
    def key(self) -> bytes:
        """The entry's store key: one per subscription and record."""
        return entry_key(self.sub_key, self.sow_key)

    def to_bytes(self) -> bytes:
        meta = {"c": self.conflation_key, "o": self.offset, "s": self.seq, "t": self.timestamp}
        head = orjson.dumps(meta)
        return head + b"\n" + (self.base.to_bytes() if self.base is not None else b"")

    @classmethod
    def from_store(cls, key: bytes, value: bytes) -> JournalEntry:
        """The entry stored under ``key`` (ValueError when it is not a journal entry)."""
        if not key.startswith(JOURNAL_PREFIX):
            raise ValueError(f"not a conflation journal key: {key!r}")
        at = len(JOURNAL_PREFIX)
        texts: list[str] = []
        for _ in range(2):
            (size,) = _LENGTH.unpack_from(key, at)
            at += _LENGTH.size
            texts.append(key[at : at + size].decode())
            at += size
        head, _, base = value.partition(b"\n")
        meta = orjson.loads(head)
        return cls(
            texts[0],
            texts[1],
            meta["c"],
            meta["o"],
            meta["s"],
            meta["t"],
            SowRecord.from_bytes(base) if base else None,
        )


def entry_key(sub_key: str, sow_key: str) -> bytes:
    """Store key of a journal entry; the texts are length-prefixed, so any text is safe."""
    parts = [JOURNAL_PREFIX]
    for text in (sub_key, sow_key):
        raw = text.encode()
        parts += [_LENGTH.pack(len(raw)), raw]
    return b"".join(parts)
