"""State batches that the next owner of a partition reads whole or not at all.

A view maintainer stores each batch as many changelog records, with the batch's commit record
(its input watermark) last. A worker killed while the batch is on its way leaves a prefix of it
in the changelog, and the next owner restores that prefix: some groups already hold the batch's
events while the watermark says they do not, and applying the batch again counts them twice.
Aggregates are not idempotent, so such a torn batch must be rolled back.

Each entry of a batch is therefore stored with the batch's mark and the entry's previous value:
``TAG, mark, new, previous``. A reader that knows the last committed mark takes ``new`` from
committed batches and ``previous`` from a batch past it. A deleted entry is kept as such a record
(new value absent) until its batch is committed, then removed for good by a later batch
(:func:`purgeable`). Values written before this format (no tag) read as they are.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping

__all__ = ["purgeable", "unwrap", "wrap", "wrap_batch"]

TAG = 0x02  # no JSON text starts with it, so older plain values are told apart
_HEAD = struct.Struct(">BqI")  # tag, mark, length of the new value (ABSENT: deleted)
ABSENT = 0xFFFFFFFF


def wrap(mark: int, new: bytes | None, previous: bytes | None) -> bytes:
    """One entry of batch ``mark``: its new value (None: deleted) and the value before it."""
    length = ABSENT if new is None else len(new)
    out = _HEAD.pack(TAG, mark, length) + (new or b"")
    if previous is not None:
        out += b"\x01" + previous
    return out


def _parts(value: bytes) -> tuple[int, bytes | None, bytes | None] | None:
    """(mark, new, previous) of a wrapped value, or None for a plain (older) one."""
    if not value or value[0] != TAG or len(value) < _HEAD.size:
        return None
    _, mark, length = _HEAD.unpack_from(value)
    at = _HEAD.size
    new = None
    if length != ABSENT:
        new = value[at : at + length]
        at += length
    previous = value[at + 1 :] if len(value) > at else None
    return mark, new, previous


def unwrap(value: bytes | None, committed: int) -> bytes | None:
    """The entry's value as of the last committed batch ``committed`` (None: no entry)."""
    if value is None:
        return None
    parts = _parts(value)
    if parts is None:
        return value
    mark, new, previous = parts
    return new if mark <= committed else previous


def purgeable(value: bytes, committed: int) -> bool:
    """Whether the stored ``value`` is a deletion whose batch is committed (safe to remove)."""
    parts = _parts(value)
    return parts is not None and parts[1] is None and parts[0] <= committed


def wrap_batch(
    entries: Mapping[bytes, bytes | None],
    mark: int,
    committed: int,
    stored: Callable[[bytes], bytes | None],
) -> dict[bytes, bytes]:
    """``entries`` (key -> new value or None) as the stored records of batch ``mark``, each
    with its committed value before the batch (read through ``stored``)."""
    return {key: wrap(mark, new, unwrap(stored(key), committed)) for key, new in entries.items()}
