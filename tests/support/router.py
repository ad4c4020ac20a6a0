"""A worker's units and command router as unit tests have them: the units are the worker's own (a
topology made from a configuration); the runtime is replaced by recording implementations of its
ports (wiring, assignment, sender, log readers).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from sowstream.config import load_config_text
from sowstream.config.models import RocksDBConfig
from sowstream.engine.commands import ControlRecord
from sowstream.engine.router import CommandRouter
from sowstream.engine.topology import Topology, serving_config
from sowstream.engine.units.base import Context, ControlInbox
from sowstream.sow.ops import RawRecord
from sowstream.wire.protocol import Command, Reply
from sowstream.wire.topics import TopicNames
from tests.support.sender import RecordingSender

# A client's reply topic, as the engine takes them (it writes replies nowhere else).
REPLY_TO = TopicNames().reply("c1")

CONFIG = """
sow:
  - {Name: orders, Key: /id}
queues:
  - {Name: work, UnderlyingTopic: orders}
"""


class Wiring:
    """The runtime's wiring as a unit test has it: no tables (memory stores), nothing run."""

    def __init__(self) -> None:
        self.agents: list[str] = []

    def table(self, name: str, partitions: int, rocksdb: RocksDBConfig | None = None) -> Any:
        return None

    def command_agent(self, topic: str, partitions: int, name: str, inbox: ControlInbox) -> None:
        self.agents.append(name)

    def record_agent(
        self, topic: str, partitions: int, name: str, handle: Callable[[ControlRecord], Any]
    ) -> None:
        self.agents.append(name)

    def pumped_agent(
        self, topic: str, partitions: int, name: str, handle: Callable[[list[RawRecord]], Any]
    ) -> None:
        self.agents.append(name)

    def task(self, fun: Callable[[], Awaitable[None]]) -> None:
        pass

    def background(self, work: Coroutine[Any, Any, None]) -> None:
        work.close()


class Held:
    """An assignment of the partitions given; ``settled`` as a rebalance leaves it."""

    def __init__(self, owned: set[tuple[str, int]], settled: bool = True) -> None:
        self.owned = owned
        self.settled = settled

    generation = 1
    current = True  # what the group's coordinator would answer (still at ``generation``)
    probes = 0  # how many times the coordinator was asked

    def owns(self, topic: str, partition: int) -> bool:
        return (topic, partition) in self.owned

    async def still_current(self, generation: int) -> bool:
        self.probes += 1
        return self.current and generation == self.generation

    def partitions(self, topic: str) -> set[int]:
        return {p for t, p in self.owned if t == topic}


class EmptyLog:
    """A Kafka topic with nothing in it."""

    async def end_offset(self, partition: int) -> int:
        return -1

    async def start_offset(self, partition: int) -> int:
        return 0

    async def offset_for_time(self, partition: int, at_ms: int) -> int:
        return 0

    async def batches(
        self, partition: int, until: int, start: int = 0
    ) -> AsyncIterator[list[RawRecord]]:
        for batch in ():
            yield batch


class Creation:
    """Topic auto-creation that refuses or accepts every name as told."""

    def __init__(self, problem: str | None = None) -> None:
        self.problem = problem
        self.declared: list[str] = []
        self.caught_up_calls = 0

    async def declare_topic(self, name: str, message_type: str = "json") -> str | None:
        self.declared.append(name if message_type == "json" else f"{message_type}:{name}")
        return self.problem

    async def caught_up(self) -> None:
        self.caught_up_calls += 1


class Setup:
    """One worker holding ``held`` of the topic ``orders`` (of ``config``) and every partition of
    the shared control topic."""

    def __init__(
        self,
        held: frozenset[int] = frozenset({0}),
        problem: str | None = None,
        log: EmptyLog | None = None,
        config: str = CONFIG,
    ) -> None:
        self.config = serving = serving_config(load_config_text(config, source="test"))
        self.names = TopicNames()
        self.sender = RecordingSender()
        # The shared control topic of topics created on first use: held whole.
        auto = {(self.names.auto_control, p) for p in range(8)}
        self.held = Held({(self.names.control("orders"), p) for p in held} | auto)
        ctx = Context(
            wiring=Wiring(),
            sender=self.sender,
            assignment=self.held,
            names=self.names,
            bootstrap="kafka.invalid:9092",
            app_id="test",
            kafka={},
            rocksdb=RocksDBConfig(),
            logs=lambda topic: log or EmptyLog(),
        )
        self.topology = Topology(serving, ctx)
        self.creation = Creation(problem)
        self.router = CommandRouter(self.topology, self.creation, self.sender, self.held, "w1")
        self.orders = self.topology.topics["orders"]

    def replies(self) -> list[Reply]:
        return [Reply.decode(value) for value, _ in self.sender.take()]


def command(name: str, topic: str = "orders", **fields: Any) -> Command:
    fields.setdefault("command_id", f"id-{name}")
    return Command(command=name, query_id="q1", reply_to=REPLY_TO, topic=topic, **fields)


def record(cmd: Command | bytes, partition: int = 0, offset: int = 0) -> ControlRecord:
    value = cmd if isinstance(cmd, bytes) else cmd.encode()
    return ControlRecord("sowstream.ctl.orders", partition, offset, value)
