"""Control-topic commands in batches: what has arrived is handled together.

faust hands a control topic's records to its agent one at a time. Handled one by one, every
queue acknowledgement waited for its own store write before the next record was read, which
capped a worker at about 150 acknowledgement commands a second (docs/benchmarks.md). So the
agent only forwards records to a :class:`CommandInbox`; a task takes everything that has arrived
(up to ``COMMAND_BATCH``) and the engine handles consecutive acknowledgements of a batch together:
one pass over the queue's state, one store batch per log partition, one wait.

Records are acknowledged to faust (so their offsets may be committed) only once handled: a
worker that dies with commands in its inbox leaves them for the next owner to read again, as
before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Generic, NamedTuple, TypeVar

from sowstream.wire import headers as h

COMMAND_BATCH = 500  # records handled in one go at most
INBOX_SIZE = 2_000  # records forwarded but not yet handled; a full inbox holds the agent back

T = TypeVar("T")
A = TypeVar("A")
R = TypeVar("R")

# Tells the runtime a control-topic record is handled (its offset may then be committed).
Acknowledge = Callable[[], Awaitable[object]]


class ControlRecord(NamedTuple):
    """One control-topic record as the runtime hands it over (its value is a Command)."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    headers: Mapping[str, str] | None = None  # sow.schema (its version), sow.credential
    key: bytes | None = None
    timestamp_ms: int = 0

    @property
    def credential(self) -> str | None:
        """Its ``sow.credential`` header (sowstream.auth)."""
        return self.headers.get(h.CREDENTIAL) if self.headers else None


class CommandInbox(Generic[A, R]):
    """Records a control-topic agent has read, each with what acknowledges it once handled."""

    def __init__(self, size: int = INBOX_SIZE) -> None:
        self._queue: asyncio.Queue[tuple[A, R]] = asyncio.Queue(maxsize=size)

    async def put(self, ack: A, record: R) -> None:
        """Forward ``record`` (waits while the inbox is full)."""
        await self._queue.put((ack, record))

    async def take(self, limit: int = COMMAND_BATCH) -> list[tuple[A, R]]:
        """Wait for a record, then return it with every other one already there (up to
        ``limit``): a batch never waits for records that have not arrived."""
        batch = [await self._queue.get()]
        while len(batch) < limit and not self._queue.empty():
            batch.append(self._queue.get_nowait())
        return batch


class Run(Generic[T]):
    """Consecutive items of a batch that are handled together (``together``) or one item."""

    __slots__ = ("items", "together")

    def __init__(self, together: bool, items: list[T]) -> None:
        self.together = together
        self.items = items

    def __repr__(self) -> str:
        return f"Run({self.together}, {self.items!r})"


def runs(items: Sequence[T], together: Callable[[T], bool]) -> list[Run[T]]:
    """Split ``items`` in order into maximal runs of items ``together`` accepts, and single items
    it does not: handling the runs in order keeps each command's place relative to the others."""
    out: list[Run[T]] = []
    for item in items:
        if together(item):
            if out and out[-1].together:
                out[-1].items.append(item)
            else:
                out.append(Run(True, [item]))
        else:
            out.append(Run(False, [item]))
    return out
