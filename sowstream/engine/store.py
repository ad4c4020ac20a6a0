"""Per-partition state stores behind one small interface.

Persistent topics live in the runtime's RocksDB tables (rocksdict, a
:class:`~sowstream.engine.ports.StateTable` per topic) and replicate through the table's
changelog topic; transient topics live in memory and are rebuilt from the log. Writes are applied
as one batch per partition so RocksDB gets a single WriteBatch and the changelog keeps the order
the batch was written in (the applied-offset watermark goes last, see ``processor``).
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Iterator, Mapping, Sequence
from itertools import takewhile
from typing import Any, Protocol

from rocksdict import ReadOptions, WriteBatch

from sowstream.engine.ports import StateTable
from sowstream.errors import StateStoreError
from sowstream.sow.layout import (
    APPLIED_RECORD_KEY,
    FAUST_OFFSET_KEY,
    INDEX_PREFIX,
    RECORDS_START,
    RESERVED_PREFIX,
    WARNINGS_KEY,
    WATERMARK_KEY,
    is_record_key,
)

__all__ = [
    "APPLIED_RECORD_KEY",
    "FAUST_OFFSET_KEY",
    "INDEX_PREFIX",
    "RECORDS_START",
    "RESERVED_PREFIX",
    "WARNINGS_KEY",
    "WATERMARK_KEY",
    "ChangelogSender",
    "MemoryPartition",
    "PartitionStore",
    "PrefixedPartition",
    "RocksPartition",
    "commit",
    "is_record_key",
]

REPLICATE_TIMEOUT_SECONDS = 60.0


class ChangelogSender(Protocol):
    """What replicating needs of the worker's sender (``Sender.send_many``)."""

    async def send_many(
        self, topic: str, partition: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> list[tuple[asyncio.Future[Any], int]]: ...


class PartitionStore(Protocol):
    """What the processor needs from one partition's state."""

    def get(self, key: bytes) -> bytes | None:
        """The value under ``key`` or None."""

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The values under ``keys`` (None where absent), read at once."""

    def write(self, changes: Mapping[bytes, bytes | None]) -> None:
        """Apply puts (bytes) and deletes (None) atomically, in the mapping's order."""

    async def replicate(
        self, changes: Mapping[bytes, bytes | None], sender: ChangelogSender
    ) -> None:
        """Copy a written batch to wherever the partition is replicated (if anywhere)."""

    def scan(
        self, start: bytes = RECORDS_START, prefix: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Iterate ``(key, value)`` in key order from ``start`` (or over ``prefix``)."""

    def keys(self, start: bytes, stop: bytes | None) -> Iterator[bytes]:
        """Iterate the keys from ``start`` (inclusive) to ``stop`` (exclusive) in key order."""

    def values(self, start: bytes, stop: bytes | None) -> Iterator[bytes]:
        """Iterate the values of the keys from ``start`` (inclusive) to ``stop`` (exclusive),
        in key order."""


class RocksPartition:
    """One partition of a RocksDB table, written in batches and mirrored to its changelog."""

    def __init__(self, table: StateTable, partition: int) -> None:
        self._table = table
        self._partition = partition

    def _db(self) -> Any:
        # Looked up each time: the runtime closes and reopens partition databases on rebalances.
        try:
            return self._table.db(self._partition)
        except Exception as exc:  # rocksdict raises bare Exception (e.g. lock held)
            raise StateStoreError(
                f"cannot open RocksDB for table {self._table.name!r} partition "
                f"{self._partition}: {exc}"
            ) from exc

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self._db().get(key)
        return value

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        values: list[bytes | None] = self._db().get(keys)  # one multi-get
        return values

    def write(self, changes: Mapping[bytes, bytes | None]) -> None:
        if not changes:
            return
        batch = WriteBatch(raw_mode=True)
        for key, value in changes.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        db = self._db()
        try:
            db.write(batch)
        except Exception as exc:  # rocksdict raises bare Exception
            raise StateStoreError(f"RocksDB write failed for {self._table.name!r}: {exc}") from exc

    async def replicate(
        self, changes: Mapping[bytes, bytes | None], sender: ChangelogSender
    ) -> None:
        """Send the batch to the table's changelog, in write order, and return once Kafka has it.

        Sent straight through the producer rather than faust's one-at-a-time send buffer, which
        stalls on batches; like faust, the changelog offset is recorded in RocksDB on delivery so
        a restart replays only the changelog's tail.

        Waiting for delivery keeps the local store at most one batch ahead of the changelog. A
        restart re-applies the changelog's tail over the local store; if a later batch had been
        written locally meanwhile, that tail would put some of its keys back to older values
        while its watermark stayed ahead, and the log would not be replayed over them.
        """
        topic = self._table.changelog
        batches = await sender.send_many(topic, self._partition, list(changes.items()))
        if not batches:
            return
        sent = [fut for fut, _ in batches]
        _, late = await asyncio.wait(sent, timeout=REPLICATE_TIMEOUT_SECONDS)
        failed = next((f.exception() for f in sent if f.done() and f.exception()), None)
        if late or failed is not None:
            raise StateStoreError(
                f"changelog {topic!r} partition {self._partition}: "
                + (
                    f"{len(late)} records not acknowledged within {REPLICATE_TIMEOUT_SECONDS:.0f}s"
                    if late
                    else f"delivery failed: {failed}"
                )
            )
        last, count = batches[-1]
        meta = last.result()
        if meta is not None:
            # A batch's result carries the offset of its first record.
            self._table.set_changelog_offset(self._partition, meta.offset + count - 1)

    def scan(
        self, start: bytes = RECORDS_START, prefix: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        # items() steps the RocksDB iterator in Rust, one call per pair: about 3x faster than
        # seek/valid/key/value/next from Python, and a full scan visits every record. Handed
        # out as it is (no generator in between): the scan's loop is the only Python per pair.
        pairs: Iterator[tuple[bytes, bytes]] = self._db().items(
            from_key=prefix if prefix is not None else start
        )
        if prefix is None:
            return pairs
        return takewhile(lambda pair: pair[0].startswith(prefix), pairs)

    def keys(self, start: bytes, stop: bytes | None) -> Iterator[bytes]:
        # Bounded in RocksDB itself: no value is read and iteration ends at ``stop``.
        keys: Iterator[bytes] = self._db().keys(from_key=start, read_opt=_bounded(stop))
        return keys

    def values(self, start: bytes, stop: bytes | None) -> Iterator[bytes]:
        # Bounded in RocksDB itself, and no key is handed to Python (a raw scan needs none).
        values: Iterator[bytes] = self._db().values(from_key=start, read_opt=_bounded(stop))
        return values


async def commit(
    store: PartitionStore, changes: Mapping[bytes, bytes | None], sender: ChangelogSender
) -> None:
    """Store ``changes``: in the changelog first, then in the local store once Kafka has them.

    The other order left a worker killed in between with changes only its own store held; if it
    took the partition back they stayed, and a later owner restoring the changelog missed them
    while the watermark written after them said they were applied."""
    await store.replicate(changes, sender)
    store.write(changes)


def _bounded(stop: bytes | None) -> ReadOptions:
    """Read options ending iteration before ``stop`` (None: at the end)."""
    options = ReadOptions()
    if stop is not None:
        options.set_iterate_upper_bound(stop)
    return options


class MemoryPartition:
    """A transient partition: a dict plus its keys in order, so iteration matches RocksDB's.

    The sorted key list is made on the first read after a write and shared by the reads until the
    next write (queries read between batches; memo lookups read many small ranges).
    """

    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}
        self._sorted: list[bytes] | None = None

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return [self._data.get(key) for key in keys]

    def write(self, changes: Mapping[bytes, bytes | None]) -> None:
        if changes:
            self._sorted = None  # iterations in progress keep the list they started with
        for key, value in changes.items():
            if value is None:
                self._data.pop(key, None)
            else:
                self._data[key] = value

    async def replicate(
        self, changes: Mapping[bytes, bytes | None], sender: ChangelogSender
    ) -> None:
        """Transient state is not replicated: it is rebuilt from the log."""

    def _ordered(self) -> list[bytes]:
        if self._sorted is None:
            self._sorted = sorted(self._data)
        return self._sorted

    def scan(
        self, start: bytes = RECORDS_START, prefix: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        ordered = self._ordered()
        first = prefix if prefix is not None else start
        for i in range(bisect.bisect_left(ordered, first), len(ordered)):
            key = ordered[i]
            if prefix is not None and not key.startswith(prefix):
                return
            value = self._data.get(key)
            if value is not None:
                yield key, value

    def keys(self, start: bytes, stop: bytes | None) -> Iterator[bytes]:
        ordered = self._ordered()
        end = len(ordered) if stop is None else bisect.bisect_left(ordered, stop)
        return iter(ordered[bisect.bisect_left(ordered, start) : end])

    def values(self, start: bytes, stop: bytes | None) -> Iterator[bytes]:
        data = self._data
        return (value for key in self.keys(start, stop) if (value := data.get(key)) is not None)


def _after_prefix(prefix: bytes) -> bytes | None:
    """The first key after every key starting with ``prefix`` (None: there is none)."""
    trimmed = prefix.rstrip(b"\xff")
    return trimmed[:-1] + bytes([trimmed[-1] + 1]) if trimmed else None


class PrefixedPartition:
    """One topic's share of a partition store that several topics share, its keys under
    ``prefix``: topics created on first use that feed a queue keep their queue state in one
    table declared at start (faust's tables cannot be added while the worker runs)."""

    def __init__(self, inner: PartitionStore, prefix: bytes) -> None:
        self._inner = inner
        self._prefix = prefix
        self._end = _after_prefix(prefix)

    def _own(self, changes: Mapping[bytes, bytes | None]) -> dict[bytes, bytes | None]:
        p = self._prefix
        return {p + key: value for key, value in changes.items()}

    def get(self, key: bytes) -> bytes | None:
        return self._inner.get(self._prefix + key)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return self._inner.get_many([self._prefix + key for key in keys])

    def write(self, changes: Mapping[bytes, bytes | None]) -> None:
        self._inner.write(self._own(changes))

    async def replicate(
        self, changes: Mapping[bytes, bytes | None], sender: ChangelogSender
    ) -> None:
        await self._inner.replicate(self._own(changes), sender)

    def scan(
        self, start: bytes = RECORDS_START, prefix: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        p, cut = self._prefix, len(self._prefix)
        if prefix is not None:
            pairs = self._inner.scan(prefix=p + prefix)
        else:
            pairs = takewhile(lambda pair: pair[0].startswith(p), self._inner.scan(start=p + start))
        return ((key[cut:], value) for key, value in pairs)

    def keys(self, start: bytes, stop: bytes | None) -> Iterator[bytes]:
        cut = len(self._prefix)
        end = self._prefix + stop if stop is not None else self._end
        return (key[cut:] for key in self._inner.keys(self._prefix + start, end))

    def values(self, start: bytes, stop: bytes | None) -> Iterator[bytes]:
        end = self._prefix + stop if stop is not None else self._end
        return self._inner.values(self._prefix + start, end)
