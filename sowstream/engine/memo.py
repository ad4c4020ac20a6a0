"""Memo indexes in a partition store: which exist, building and dropping them, reading them.

The entry layout and value encoding are in :mod:`sowstream.sow.memo`; the processor keeps the
entries current in the same batch as each record change. Building and dropping write through the
store like any batch and are replicated to the changelog in write order, marker first and last,
so a store restored from the changelog holds each index either whole or visibly partial.
Callers hold the partition's lock with nothing in flight, so no record changes meanwhile.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sowstream.engine.store import ChangelogSender, PartitionStore, commit, is_record_key
from sowstream.messagetypes import MessageType
from sowstream.sow.memo import (
    BUILDING,
    MARKER_PREFIX,
    READY,
    decode_entry,
    index_prefix,
    marker_key,
    memo_entries,
    path_of_marker,
    successor,
)
from sowstream.sow.planner import MemoLookup
from sowstream.sow.record import SowRecord

__all__ = ["CHUNK", "MemoState", "build", "candidates", "count", "drop", "load"]

# Changes per store write while building or dropping; the event loop gets a turn between them.
CHUNK = 5_000


@dataclass
class MemoState:
    """What a partition store holds: complete indexes and partial ones (to drop or rebuild)."""

    ready: set[str] = field(default_factory=set)
    partial: set[str] = field(default_factory=set)


def load(store: PartitionStore) -> MemoState:
    """Read the index markers of a store."""
    state = MemoState()
    stop = successor(MARKER_PREFIX)
    for key in store.keys(MARKER_PREFIX, stop):
        path = path_of_marker(key)
        (state.ready if store.get(key) == READY else state.partial).add(path)
    return state


async def _write(
    store: PartitionStore,
    changes: dict[bytes, bytes | None],
    sender: ChangelogSender,
    alive: Callable[[], bool],
) -> bool:
    if not alive():
        return False
    await commit(store, changes, sender)
    await asyncio.sleep(0)
    return True


async def _clear(
    store: PartitionStore, path: str, sender: ChangelogSender, alive: Callable[[], bool]
) -> bool:
    """Delete every entry of the index on ``path`` (the marker stays)."""
    prefix = index_prefix(path)
    while True:
        # Re-read after each chunk: iterators need not survive the writes.
        chunk = dict.fromkeys(_first(store.keys(prefix, successor(prefix)), CHUNK))
        if not chunk:
            return True
        if not await _write(store, chunk, sender, alive):
            return False


def _first(keys: Iterator[bytes], n: int) -> list[bytes]:
    out: list[bytes] = []
    for key in keys:
        out.append(key)
        if len(out) >= n:
            break
    return out


async def build(
    store: PartitionStore,
    path: str,
    sender: ChangelogSender,
    alive: Callable[[], bool],
    mtype: MessageType,
) -> bool:
    """(Re)build the memo index on ``path`` from the records; True once it is ready.

    ``alive`` is asked before each write: a partition taken away meanwhile is left alone (its
    marker still says ``building``, so whoever loads it next builds the index again).
    """
    if not await _write(store, {marker_key(path): BUILDING}, sender, alive):
        return False
    if not await _clear(store, path, sender, alive):
        return False
    chunk: dict[bytes, bytes | None] = {}
    for key, raw in store.scan():
        if not is_record_key(key):
            continue
        for entry in memo_entries((path,), key, SowRecord.from_bytes(raw).parsed(mtype)):
            chunk[entry] = b""
        if len(chunk) >= CHUNK:
            # Entries sort before every record key, so writing them does not disturb the scan.
            if not await _write(store, chunk, sender, alive):
                return False
            chunk = {}
    chunk[marker_key(path)] = READY
    return await _write(store, chunk, sender, alive)


async def drop(
    store: PartitionStore, path: str, sender: ChangelogSender, alive: Callable[[], bool]
) -> bool:
    """Remove the memo index on ``path``: marker first (so it is not used), then the entries."""
    if not await _write(store, {marker_key(path): BUILDING}, sender, alive):
        return False
    if not await _clear(store, path, sender, alive):
        return False
    return await _write(store, {marker_key(path): None}, sender, alive)


def candidates(store: PartitionStore, lookup: MemoLookup) -> Iterator[bytes]:
    """The record keys of the entries ``lookup`` reads (repeats possible: several values)."""
    size = len(lookup.prefix)
    if lookup.like is None and lookup.suffixes is None:
        for rng in lookup.ranges:
            for entry in store.keys(rng.start, rng.stop):
                yield decode_entry(size, entry)[1]
        return
    search = re.compile(lookup.like).search if lookup.like is not None else None
    suffixes = lookup.suffixes or ()
    last: str | None = None
    hit = False
    for rng in lookup.ranges:
        for entry in store.keys(rng.start, rng.stop):
            text, key = decode_entry(size, entry)
            if text is None:
                continue
            if text != last:  # entries of one value are adjacent: test each text once
                last = text
                hit = search(text) is not None if search is not None else text.endswith(suffixes)
            if hit:
                yield key


def count(store: PartitionStore, lookup: MemoLookup, cap: int) -> int:
    """How many entries ``lookup``'s ranges hold, counting no further than ``cap``."""
    n = 0
    for rng in lookup.ranges:
        for _ in store.keys(rng.start, rng.stop):
            n += 1
            if n >= cap:
                return n
    return n
