"""What every unit of a worker is and what it is given.

A *unit* is one thing the worker runs for the configuration: a SOW topic, a queue, a view, a
conflated topic. All have the same small lifecycle, driven by the worker: :meth:`Unit.declare`
once before the worker starts, :meth:`Unit.assign` and :meth:`Unit.drop` on every rebalance, and
:meth:`Unit.tick` every second. They reach the runtime (faust) only through :class:`Wiring` and
the ports, so no unit imports faust.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from sowstream.auth import Authenticator
from sowstream.config.models import NativeMode, RocksDBConfig
from sowstream.engine.commands import Acknowledge, CommandInbox, ControlRecord
from sowstream.engine.inputs import InputPump
from sowstream.engine.meta import Infos
from sowstream.engine.ports import LogReader, Sender, StateTable
from sowstream.engine.pump import HeldPartitions, KafkaLogReader
from sowstream.engine.registry import RegistryProgress
from sowstream.sow.ops import RawRecord
from sowstream.wire.kafka import TopicSpec
from sowstream.wire.topics import TopicNames

# The inbox of a control topic: records with what acknowledges each to the runtime.
ControlInbox = CommandInbox[Acknowledge, ControlRecord]


class Partitions:
    """Partitions of Kafka topics as one rebalance hands them over (assigned or revoked)."""

    __slots__ = ("_by_topic",)

    def __init__(self, pairs: Iterable[tuple[str, int]] = ()) -> None:
        by_topic: dict[str, set[int]] = {}
        for topic, partition in pairs:
            by_topic.setdefault(topic, set()).add(partition)
        self._by_topic = by_topic

    def __bool__(self) -> bool:
        """Whether any partition is handed over."""
        return bool(self._by_topic)

    def of(self, topic: str) -> list[int]:
        """The partitions of Kafka topic ``topic``, in order."""
        return sorted(self._by_topic.get(topic, ()))


class Wiring(Protocol):
    """What a unit declares with the runtime: tables, agents on Kafka topics, tasks."""

    def table(self, name: str, partitions: int, rocksdb: RocksDBConfig | None = None) -> StateTable:
        """A RocksDB table replicated to its changelog (``rocksdb``: its tuning, if any)."""

    def command_agent(self, topic: str, partitions: int, name: str, inbox: ControlInbox) -> None:
        """Forward the records of control topic ``topic`` to ``inbox``; each is acknowledged
        only when its acknowledgement is called (a worker that dies leaves the rest)."""

    def record_agent(
        self,
        topic: str,
        partitions: int,
        name: str,
        handle: Callable[[ControlRecord], Awaitable[None]],
    ) -> None:
        """Hand the records of control topic ``topic`` to ``handle`` one at a time."""

    def pumped_agent(
        self,
        topic: str,
        partitions: int,
        name: str,
        handle: Callable[[list[RawRecord]], Awaitable[None]],
    ) -> None:
        """Have the group assign input topic ``topic`` (and the tables co-partitioned with it)
        without the runtime ever fetching it: the unit reads it with an
        :class:`~sowstream.engine.inputs.InputPump`. ``handle`` gets what the runtime would
        fetch all the same."""

    def task(self, fun: Callable[[], Awaitable[None]]) -> None:
        """Run ``fun`` once the worker has started (after table recovery)."""

    def background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` soon, from the running worker (kept referenced until it ends)."""


@dataclass(frozen=True)
class Context:
    """What the units of one worker share: the runtime's ports and the worker's Kafka settings."""

    wiring: Wiring
    sender: Sender
    assignment: HeldPartitions
    names: TopicNames
    bootstrap: str
    app_id: str
    kafka: Mapping[str, str]  # engine.kafka: every Kafka client's extra settings
    rocksdb: RocksDBConfig
    native: NativeMode | None = None  # engine.native: who folds the SOW topics' logs
    # Makes the reader of a Kafka topic (rebuilds, catch-ups, gap reads): by default with
    # confluent-kafka, on ``bootstrap`` with ``kafka``.
    logs: Callable[[str], LogReader] | None = None
    # Set once every existing subscription is known: before, a change applied or a message
    # leased would miss subscribers.
    subscriptions_known: asyncio.Event = field(default_factory=asyncio.Event)
    # Set once the worker is settled for applying logs (subscriptions known, start-up garbage
    # frozen): the log pumps wait for it.
    logs_open: asyncio.Event = field(default_factory=asyncio.Event)
    # Checks the credentials of commands, registrations and publishes (None: asserted).
    authenticator: Authenticator | None = None
    # How far the worker has read the subscription registry (placements wait for theirs).
    registry: RegistryProgress = field(default_factory=RegistryProgress)

    def log_reader(self, topic: str) -> LogReader:
        """A reader of Kafka topic ``topic``, for rebuilds, catch-ups and gap reads."""
        if self.logs is not None:
            return self.logs(topic)
        return KafkaLogReader(self.bootstrap, topic, self.kafka)


class Unit(Protocol):
    """One thing the worker runs; the worker drives every unit through this lifecycle."""

    def declare(self) -> None:
        """Declare with the runtime what the unit runs (agents, tasks): once, before start."""

    def assign(self, assigned: Partitions) -> None:
        """A rebalance gave this worker ``assigned`` (of every Kafka topic)."""

    async def drop(self, revoked: Partitions) -> None:
        """A rebalance took ``revoked`` away: forget their state (it stays in Kafka)."""

    async def tick(self) -> None:
        """Housekeeping, every second while no rebalance runs: warm up, expire, prune."""


class DerivedUnit(Unit, Protocol):
    """A unit made of a topic of the configuration besides the SOW topics (a queue, a view, a
    conflated topic): it has Kafka topics of its own and a say in its topics' meta records."""

    def specs(self) -> list[TopicSpec]:
        """The Kafka topics the unit needs besides its SOW topic's log and control topic."""

    def describe(self, infos: Infos) -> None:
        """Complete the meta-topic records (``infos``, one per topic) with what it adds."""


@runtime_checkable
class InputUnit(DerivedUnit, Protocol):
    """A unit reading an input topic of its own (a view, a conflated topic): the worker is
    ready once each assigned input partition is loaded."""

    kind: str  # as the readiness probe names it: "view", "conflated topic"
    name: str

    def assigned(self) -> list[int]:
        """Input partitions assigned to this worker."""

    def loading(self) -> list[int]:
        """Assigned input partitions not loaded (or not caught up) yet."""


class InputRunner(Protocol):
    """What a view's or conflated topic's runner does with the input partitions it is given."""

    def assign(self, partitions: Iterable[int]) -> None: ...

    def position(self, partition: int) -> int | None: ...

    async def handle(self, records: Sequence[RawRecord]) -> None: ...

    async def drop(self, partitions: Iterable[int]) -> None: ...

    async def warm(self, partitions: Iterable[int]) -> None: ...

    def assigned(self) -> list[int]: ...

    def loading(self) -> list[int]: ...


class FedUnit:
    """The lifecycle a unit fed by an input topic of its own shares: its input partitions go
    to its runner as faust assigns and revokes them, each tick warms those held, and an input
    pump feeds the runner from the input topic in batches."""

    runner: InputRunner
    input_topic: str
    _ctx: Context

    def _declare_input(self, partitions: int, name: str) -> None:
        """The input topic assigned by the group, read by an :class:`InputPump`."""
        ctx = self._ctx
        consumer = {
            "bootstrap.servers": ctx.bootstrap,
            "group.id": f"{ctx.app_id}-input-pump",
            **ctx.kafka,
        }
        pump = InputPump(self.runner, self.input_topic, ctx.assignment, consumer)
        ctx.wiring.pumped_agent(self.input_topic, partitions, name, self.runner.handle)
        ctx.wiring.task(pump.run)

    def assign(self, assigned: Partitions) -> None:
        self.runner.assign(assigned.of(self.input_topic))

    async def drop(self, revoked: Partitions) -> None:
        await self.runner.drop(revoked.of(self.input_topic))

    async def tick(self) -> None:
        await self.runner.warm(self._ctx.assignment.partitions(self.input_topic))

    def assigned(self) -> list[int]:
        return self.runner.assigned()

    def loading(self) -> list[int]:
        return self.runner.loading()
