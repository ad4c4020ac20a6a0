"""Barriers over several workers: what each partition's owner tells the others, and the gate it
puts on leases and barriers (sowstream.queues.machine applies it).

A barrier message goes out once every message published before it, on every partition of the
queue, is acknowledged; messages published after it wait until it has gone. Within one worker
the machine sees its own partitions. For the partitions other workers own, each owner reports a
:class:`PartitionPosition` now and then: up to when it has read the partition's log, the log
time of its oldest message not yet acknowledged, and of its oldest barrier waiting. Log times
order messages across partitions; a message with the same log time as a barrier counts as
published after it. A partition nobody reports on (its owner is away) holds everything back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["BarrierGate", "PartitionPosition"]

Partition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class PartitionPosition:
    """One log partition of a queue, as its owner reports it to the queue's other workers (JSON
    on ``<prefix>.queue.<queue>.positions``, keyed ``topic|partition``)."""

    queue: str
    topic: str
    partition: int
    epoch: int  # when the owner took the partition (µs): a later one is a newer owner
    read_to: int  # log time (ms): every record the partition held at this time is read
    oldest: int | None  # log time of its oldest message not yet acknowledged (barriers too)
    barrier: int | None  # log time of its oldest barrier waiting to go out

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {
                "queue": self.queue,
                "topic": self.topic,
                "partition": self.partition,
                "epoch": self.epoch,
                "read_to": self.read_to,
                "oldest": self.oldest,
                "barrier": self.barrier,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> PartitionPosition:
        """The position ``data`` holds; ValueError naming what is wrong."""
        try:
            raw: Any = orjson.loads(data)
            return cls(
                queue=str(raw["queue"]),
                topic=str(raw["topic"]),
                partition=int(raw["partition"]),
                epoch=int(raw["epoch"]),
                read_to=int(raw["read_to"]),
                oldest=None if raw.get("oldest") is None else int(raw["oldest"]),
                barrier=None if raw.get("barrier") is None else int(raw["barrier"]),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed partition position {data[:200]!r}: {exc!r}") from None


class BarrierGate:
    """Per partition held elsewhere, its owner's latest position; whether a message (by log
    time) may be leased, and whether a barrier may go out, as far as those partitions go."""

    def __init__(self, partitions: Iterable[Partition]) -> None:
        self._partitions = frozenset(partitions)
        self._held: frozenset[Partition] = frozenset()
        self._positions: dict[Partition, PartitionPosition] = {}

    def hold(self, held: Iterable[Partition]) -> None:
        """The partitions this worker holds now (the machine sees those itself)."""
        self._held = frozenset(held)

    def note(self, position: PartitionPosition) -> bool:
        """Take a report (a later epoch replaces, an older one is stale); True if it changed
        what the gate lets through."""
        where = (position.topic, position.partition)
        if where not in self._partitions:
            return False
        old = self._positions.get(where)
        if old is not None and position.epoch < old.epoch:
            return False
        self._positions[where] = position
        return old != position

    def _elsewhere(self) -> Iterable[PartitionPosition | None]:
        for where in self._partitions - self._held:
            yield self._positions.get(where)

    def may_lease(self, log_time: int) -> bool:
        """Whether a message of log time ``log_time`` may be leased: every other partition is
        read past it and holds no barrier published at or before it."""
        for position in self._elsewhere():
            if position is None or position.read_to < log_time:
                return False
            if position.barrier is not None and position.barrier <= log_time:
                return False
        return True

    def may_release(self, log_time: int) -> bool:
        """Whether a barrier of log time ``log_time`` may go out: every other partition is read
        past it and holds nothing older not yet acknowledged."""
        for position in self._elsewhere():
            if position is None or position.read_to < log_time:
                return False
            if position.oldest is not None and position.oldest < log_time:
                return False
        return True
