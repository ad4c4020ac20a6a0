"""Raw scan batches: many stored SOW records in one reply, exactly as the store holds them.

A client that puts ``raw = 1`` in a ``sow`` (or ``sow_and_*``) command's options may be answered
with ``sow_raw`` replies instead of ``sow`` ones. Such a reply has one ``ReplyRecord`` whose
``data`` is a *raw batch*: the stored values of up to ``BatchSize`` records, concatenated, behind
a table of where each ends. The worker copies the values out of RocksDB without decoding them
and the client splits a batch with a few bulk operations, reading a record's header only when
its message is used. ``docs/protocol.md`` describes the layout for clients in other languages.

Layout version 1 (big-endian)::

    version  u8    1
    flags    u8    bit 0 (PATTERN_KEYS): the records' keys are <topic name> 0x1F <SowKey>
    count    u32   N, the number of records (at least 1)
    rank     u32   position of the first record in the partition's answer (0 for the first batch)
    ends     N x u32  where record i ends, counted from the start of the records area
    records  the N stored values back to back: record i spans [ends[i-1], ends[i]) (ends[-1]=0)

Each stored value is a SOW record in the store's format 1 (``sowstream.sow.record``): marker
``0x01`` (no expiration) or ``0x03`` (an 8-byte expiration follows the header), log offset and
log timestamp in ms (8 bytes each, signed), the SowKey's length (4 bytes), [expiration], the
UTF-8 SowKey, then the body to the end of the record.
"""

from __future__ import annotations

import importlib
import os
import struct
from collections.abc import Callable, Sequence
from itertools import accumulate
from operator import itemgetter

from sowstream.errors import CorruptReplyError
from sowstream.wire.batches import END_SIZE as END_SIZE  # the engine sizes raw batches with it
from sowstream.wire.batches import locate

# The Command option that asks for raw batches, and the one layout version this code writes.
RAW_OPTION = "raw"
VERSION = 1
RAW_V1 = str(VERSION)
PATTERN_KEYS = 0x01  # flags bit 0: keys are "<name>\x1f<SowKey>" (a Pattern topic's store keys)

BATCH_HEAD = struct.Struct(">BBII")
# The record header of format 1, as sowstream.sow.record writes it: marker, log offset, log
# timestamp, SowKey length (then, for marker EXPIRING, an 8-byte expiration).
RECORD_HEAD = struct.Struct(">BqqI")
PLAIN = 0x01
EXPIRING = 0x03
EXPIRY = struct.Struct(">q")
# Bytes before the SowKey, by marker.
KEY_AT = {PLAIN: RECORD_HEAD.size, EXPIRING: RECORD_HEAD.size + EXPIRY.size}
BATCH_OVERHEAD = BATCH_HEAD.size  # bytes a batch adds besides its records' ends and values


# What RawBatch.record returns: (key, body, log offset, log timestamp, expiration).
Record = tuple[str, bytes, int, int, int | None]
Split = Callable[[bytes, Sequence[int], Sequence[int]], list[Record | None]]


def _compiled_split() -> Split | None:
    """The compiled splitter of native/ (``sowstream_native.raw_records``), unless it is not
    installed or $SOWSTREAM_NATIVE is ``off`` (the pure-Python reader is the reference)."""
    if os.environ.get("SOWSTREAM_NATIVE", "on").strip().lower() == "off":
        return None
    try:
        module = importlib.import_module("sowstream_native")
    except ImportError:
        return None
    split: Split | None = getattr(module, "raw_records", None)  # older builds lack it
    return split


COMPILED_SPLIT = _compiled_split()


def pack(values: Sequence[bytes], first_rank: int, flags: int = 0) -> bytes:
    """A raw batch of ``values`` (stored records in format 1), the first at ``first_rank``."""
    count = len(values)
    head = struct.pack(
        f">BBII{count}I", VERSION, flags, count, first_rank, *accumulate(map(len, values))
    )
    return head + b"".join(values)


class RawBatch:
    """One raw batch read: where each record lies in ``block``, checked in bulk.

    ``starts[i]`` and ``ends[i]`` are absolute positions in ``block``; ``markers`` holds each
    record's first byte. A record's header and key are read by :meth:`record`, on demand.
    """

    __slots__ = ("block", "count", "ends", "first_rank", "pattern", "starts")
    block: bytes
    count: int
    ends: tuple[int, ...]
    first_rank: int
    pattern: bool
    starts: tuple[int, ...]

    def __init__(self, block: bytes) -> None:
        """Split ``block``; CorruptReplyError naming the problem when it is not a raw batch."""
        if len(block) < BATCH_HEAD.size:
            raise CorruptReplyError(f"raw batch of {len(block)} bytes is shorter than its header")
        version, flags, count, first_rank = BATCH_HEAD.unpack_from(block)
        if version != VERSION:
            raise CorruptReplyError(
                f"raw batch layout version {version} is not one this client reads ({VERSION})"
            )
        starts, ends = locate(
            block, BATCH_HEAD.size, count, RECORD_HEAD.size, "raw batch", "record"
        )
        markers = (
            bytes(itemgetter(*starts)(block)) if count > 1 else block[starts[0] : starts[0] + 1]
        )
        if markers.translate(None, b"\x01\x03"):
            bad = next(m for m in markers if m not in KEY_AT)
            raise CorruptReplyError(f"raw batch has a record with unknown marker 0x{bad:02x}")
        self.block = block
        self.count = count
        self.first_rank = first_rank
        self.pattern = bool(flags & PATTERN_KEYS)
        self.starts = starts
        self.ends = ends

    def records(self, split: Split | None = COMPILED_SPLIT) -> list[Record | None]:
        """Every record as :meth:`record` reads it, in one call to ``split`` (the compiled
        splitter by default); None for a record :meth:`record` refuses, which names why."""
        if split is not None:
            return split(self.block, self.starts, self.ends)
        out: list[Record | None] = []
        for index in range(self.count):
            try:
                out.append(self.record(index))
            except CorruptReplyError:
                out.append(None)
        return out

    def record(self, index: int) -> Record:
        """Record ``index`` as ``(key, body, log offset, log timestamp, expiration)``; the key
        is the store key (``name\\x1fSowKey`` when :attr:`pattern`)."""
        block = self.block
        start = self.starts[index]
        end = self.ends[index]
        marker, offset, timestamp, size = RECORD_HEAD.unpack_from(block, start)
        at = start + KEY_AT[marker]
        if at + size > end:
            raise CorruptReplyError(
                f"raw batch record {index}: its SowKey ({size} bytes) runs past the record's end"
            )
        expiration = (
            EXPIRY.unpack_from(block, start + RECORD_HEAD.size)[0] if marker == EXPIRING else None
        )
        try:
            key = block[at : at + size].decode()
        except UnicodeDecodeError as exc:
            raise CorruptReplyError(
                f"raw batch record {index}: SowKey is not UTF-8: {exc}"
            ) from None
        return key, block[at + size : end], offset, timestamp, expiration
