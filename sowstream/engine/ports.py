"""What the engine's stages need from the outside world, as small protocols.

The stages (apply, ownership, queries, placement, maintenance, queues, views) are written against
these and nothing else: the worker supplies implementations backed by faust and confluent-kafka
(the faust ones in :mod:`~sowstream.engine.runtime`), tests supply recording ones. This module
imports nothing of the engine, so any stage can use it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from sowstream.sow.ops import RawRecord

REPLICATE_YIELD_EVERY = 256  # records sent before the event loop gets a turn


class LogReader(Protocol):
    """Reads a log partition directly, for rebuilding state that is not in a changelog."""

    async def end_offset(self, partition: int) -> int:
        """Offset of the last record in the partition (-1 when empty)."""

    def batches(self, partition: int, until: int, start: int = 0) -> AsyncIterator[list[RawRecord]]:
        """The partition's records from ``start`` (default: the beginning) up to ``until``."""

    async def offset_for_time(self, partition: int, at_ms: int) -> int:
        """The first offset whose log time is at or after ``at_ms`` (the end if none is)."""

    async def start_offset(self, partition: int) -> int:
        """Offset of the first record the partition still holds (its end when empty)."""


class Sender:
    """How the engine talks to Kafka; the worker supplies one backed by its producer.

    A base class rather than a Protocol because :meth:`send_many` has a working default.
    """

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[Any] | None:
        """Queue one record for production; returns its delivery future when there is one."""
        raise NotImplementedError

    async def send_reply(
        self, topic: str, value: bytes, headers: list[tuple[str, bytes]] | None = None
    ) -> asyncio.Future[Any] | None:
        """Queue a reply for a client; a client that has gone away must not hold the engine up.

        Returns the delivery future, or None when the reply was parked (its topic's metadata
        is not there yet: it goes out, in order, once it is) or dropped.
        """
        raise NotImplementedError

    async def send_replies(
        self, topic: str, messages: Sequence[tuple[bytes, list[tuple[str, bytes]]]]
    ) -> list[asyncio.Future[Any]]:
        """Queue ``(value, headers)`` replies for one client's reply topic, in order, in as few
        Kafka batches as they fit; returns the delivery futures (none when the client is gone).
        By default one send_reply per message."""
        out: list[asyncio.Future[Any]] = []
        for value, headers in messages:
            fut = await self.send_reply(topic, value, headers)
            if fut is not None:
                out.append(fut)
        return out

    def prepare(self, topic: str) -> None:
        """Replies to ``topic`` are coming: fetch what sending needs now, without waiting."""

    def forget(self, topic: str) -> None:
        """The client behind reply topic ``topic`` is gone: keep nothing for it."""

    async def release(self, topic: str) -> None:
        """The client behind ``topic`` has no subscription left: its topic need not be kept
        tracked (a later reply tracks it again)."""

    async def send_many(
        self,
        topic: str,
        partition: int,
        records: Sequence[tuple[bytes, bytes | None]],
        headers: Sequence[list[tuple[str, bytes]]] | None = None,
    ) -> list[tuple[asyncio.Future[Any], int]]:
        """Queue ``(key, value)`` records for one partition, in order, in as few Kafka batches
        as they fit (``headers``: each record's, in the same order); returns each batch's
        delivery future (whose result's ``offset`` is the batch's first) with its number of
        records. By default one send per record."""
        out: list[tuple[asyncio.Future[Any], int]] = []
        for i, (key, value) in enumerate(records, 1):
            fut = await self.send(
                topic,
                value,
                key=key,
                partition=partition,
                headers=None if headers is None else headers[i - 1],
            )
            if fut is not None:
                out.append((fut, 1))
            if i % REPLICATE_YIELD_EVERY == 0:
                await asyncio.sleep(0)  # many records must not hold the event loop
        return out


class Assignment(Protocol):
    """Which partitions this worker holds now, as the group's last rebalance decided."""

    def owns(self, topic: str, partition: int) -> bool:
        """Whether ``partition`` of Kafka topic ``topic`` is assigned to this worker."""

    @property
    def settled(self) -> bool:
        """False during a rebalance or a table recovery, when ownership is about to change."""

    @property
    def generation(self) -> int:
        """The consumer group generation this assignment belongs to (-1 before the first)."""

    async def still_current(self, generation: int) -> bool:
        """Whether the group is still at ``generation`` with this worker in it, asked of its
        coordinator now: what was written under it before is then in every later owner's
        restore (see :mod:`sowstream.engine.fence`)."""


class StateTable(Protocol):
    """A RocksDB table the runtime keeps: one database per partition, replicated to a compacted
    changelog topic, restored from it on assignment (faust's ``Table`` on a worker)."""

    @property
    def name(self) -> str:
        """The table's name (in errors)."""

    @property
    def changelog(self) -> str:
        """The name of the table's changelog topic."""

    def db(self, partition: int) -> Any:
        """The partition's database (a raw-mode ``rocksdict.Rdict``), opened if it is not;
        rocksdict's bare ``Exception`` when it cannot be (its lock is held, ...)."""

    def partition_path(self, partition: int) -> Path:
        """Where the partition's database lives (a seed is ingested there before it opens)."""

    def set_changelog_offset(self, partition: int, offset: int) -> None:
        """Record in the partition's database that the changelog holds it up to ``offset`` (a
        restart then replays only the changelog's tail); nothing if the database is closed."""


class Clock(Protocol):
    """Wall-clock time for expiry, leases and History (tests substitute their own)."""

    def now_ms(self) -> int:
        """Milliseconds since the epoch."""


class SystemClock:
    """The machine's clock."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)


def wall_clock_ms() -> int:
    """The machine's time in epoch milliseconds (for code that has no :class:`Clock` yet)."""
    return int(time.time() * 1000)
