"""The table of ends that raw scan batches (``wire.rawscan``) and lease batches (``wire.leases``)
share: after a batch's header, one big-endian u32 per item saying where it ends, counted from the
start of the items area that follows the table."""

from __future__ import annotations

import struct
from itertools import repeat
from operator import add, sub

from sowstream.errors import CorruptReplyError

END_SIZE = 4  # bytes each item adds to a batch besides its own


def locate(
    block: bytes, head: int, count: int, least: int, batch: str, item: str
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(starts, ends)``: where each of the ``count`` items of ``block`` lies (absolute), read
    from the table after its ``head``-byte header. CorruptReplyError naming the ``batch`` and
    ``item`` kinds when the table does not fit, the items do not end where the block does, or
    one is shorter than ``least`` bytes (its header)."""
    base = head + END_SIZE * count
    if count == 0 or len(block) < base:
        raise CorruptReplyError(
            f"{batch} says it holds {count} {item}s but its {len(block)} bytes cannot"
        )
    relative = struct.unpack_from(f">{count}I", block, head)
    # Absolute positions, with C-level maps: a batch holds up to 10,000 items.
    ends = tuple(map(add, relative, repeat(base, count)))
    starts = (base, *ends[:-1])
    if ends[-1] != len(block):
        raise CorruptReplyError(
            f"{batch} {item}s end at byte {ends[-1]}, but the batch has {len(block)} bytes"
        )
    if min(map(sub, ends, starts)) < least:
        raise CorruptReplyError(
            f"{batch} has a {item} shorter than a {item} header (ends out of order?)"
        )
    return starts, ends
