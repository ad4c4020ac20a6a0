"""Packed leases: the messages one delivery pass leased to one subscription, in one reply record.

A client that registers a queue subscription with the header ``sow.packed = 1`` may get its
deliveries as ``publish_packed`` records instead of one ``publish`` record per message. The value
of such a record is a *lease batch*: the leases behind a table of where each ends, as the raw
scan batches (``sowstream.wire.rawscan``) lay out SOW records, so both ends handle a pass's
leases with a few bulk operations. ``docs/protocol.md`` describes the layout for clients in other
languages.

Layout version 1 (big-endian)::

    version  u8    1
    flags    u8    0 (no flag is defined; readers ignore the byte)
    count    u32   N, the number of leases (at least 1)
    ends     N x u32  where lease i ends, counted from the start of the leases area
    leases   the N leases back to back: lease i spans [ends[i-1], ends[i]) (ends[-1]=0)

Each lease::

    partition   u32   log partition of the publish the message is
    offset      i64   its log offset
    timestamp   i64   its log time, ms since the epoch
    deliveries  u32   leases of the message so far, this one included
    lease       i64   when this lease ends, ms since the epoch; 0: it never ends
    topic size  u16   T
    topic       T bytes, UTF-8: the underlying topic (the bookmark is topic|partition|offset)
    body        the message body, to the end of the lease
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import accumulate
from typing import NamedTuple

from sowstream.errors import CorruptReplyError
from sowstream.wire.batches import END_SIZE, locate

# The layout version this code writes; a registration's sow.packed header names it.
VERSION = 1
PACKED_V1 = str(VERSION)
# sow.cmd of a reply record holding a lease batch.
PUBLISH_PACKED = "publish_packed"

BATCH_HEAD = struct.Struct(">BBI")
LEASE_HEAD = struct.Struct(">IqqIqH")
# The most a packed record holds: the size the engine's SOW replies keep under (Kafka's default
# message.max.bytes is 1 MiB); a lease too big for it alone goes as a publish record.
MAX_PACKED_BYTES = 900_000


class PackedLease(NamedTuple):
    """One lease of a batch, as read."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    deliveries: int
    lease_expires: int | None  # None: the lease never ends
    data: bytes

    @property
    def bookmark(self) -> str:
        """``topic|partition|offset``: what the message is acknowledged with."""
        return f"{self.topic}|{self.partition}|{self.offset}"


def lease_entry(
    topic: bytes,
    partition: int,
    offset: int,
    timestamp: int,
    deliveries: int,
    lease_expires: int | None,
    data: bytes,
) -> bytes:
    """One lease as a batch holds it (``topic`` already UTF-8)."""
    head = LEASE_HEAD.pack(partition, offset, timestamp, deliveries, lease_expires or 0, len(topic))
    return head + topic + data


def batch_size(entry_sizes: int, count: int) -> int:
    """Bytes of a batch of ``count`` leases whose entries take ``entry_sizes`` bytes."""
    return BATCH_HEAD.size + END_SIZE * count + entry_sizes


def pack(entries: Sequence[bytes]) -> bytes:
    """A lease batch of ``entries`` (made by :func:`lease_entry`), in order."""
    count = len(entries)
    head = struct.pack(f">BBI{count}I", VERSION, 0, count, *accumulate(map(len, entries)))
    return head + b"".join(entries)


def split(sizes: Sequence[int], max_bytes: int = MAX_PACKED_BYTES) -> list[range]:
    """Entries of ``sizes`` bytes, in order, cut into runs whose batches stay within
    ``max_bytes``; an entry too big for a batch of its own makes a run of one (which the
    caller sends unpacked)."""
    runs: list[range] = []
    first = 0
    size = BATCH_HEAD.size
    for index, entry in enumerate(sizes):
        grown = size + END_SIZE + entry
        if index > first and grown > max_bytes:
            runs.append(range(first, index))
            first, grown = index, BATCH_HEAD.size + END_SIZE + entry
        size = grown
    if sizes:
        runs.append(range(first, len(sizes)))
    return runs


class LeaseBatch:
    """One lease batch read: where each lease lies in ``block``, checked in bulk.

    A lease's header, topic and body are read by :meth:`lease`, which checks what concerns that
    lease alone, so one damaged lease does not cost the others.
    """

    __slots__ = ("block", "count", "ends", "starts")
    block: bytes
    count: int
    ends: tuple[int, ...]
    starts: tuple[int, ...]

    def __init__(self, block: bytes) -> None:
        """Split ``block``; CorruptReplyError naming the problem when it is not a lease batch."""
        if len(block) < BATCH_HEAD.size:
            raise CorruptReplyError(f"lease batch of {len(block)} bytes is shorter than its header")
        version, _flags, count = BATCH_HEAD.unpack_from(block)
        if version != VERSION:
            raise CorruptReplyError(
                f"lease batch layout version {version} is not one this client reads ({VERSION})"
            )
        starts, ends = locate(
            block, BATCH_HEAD.size, count, LEASE_HEAD.size, "lease batch", "lease"
        )
        self.block = block
        self.count = count
        self.starts = starts
        self.ends = ends

    def lease(self, index: int) -> PackedLease:
        """Lease ``index``; CorruptReplyError naming it and the problem when it is damaged."""
        block = self.block
        start = self.starts[index]
        end = self.ends[index]
        partition, offset, timestamp, deliveries, lease, size = LEASE_HEAD.unpack_from(block, start)
        at = start + LEASE_HEAD.size
        if at + size > end:
            raise CorruptReplyError(
                f"lease batch lease {index}: its topic ({size} bytes) runs past the lease's end"
            )
        try:
            topic = block[at : at + size].decode()
        except UnicodeDecodeError as exc:
            raise CorruptReplyError(
                f"lease batch lease {index}: topic is not UTF-8: {exc}"
            ) from None
        if not topic:
            raise CorruptReplyError(f"lease batch lease {index}: its topic is empty")
        return PackedLease(
            topic, partition, offset, timestamp, deliveries, lease or None, block[at + size : end]
        )
