"""The command router: typed commands answered through the reply writer, queue acks together.

The units are the worker's own (a topology made from a configuration); the runtime is replaced
by recording implementations of its ports (wiring, assignment, sender, log readers).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import orjson

from sowstream.config import load_config_text
from sowstream.config.models import RocksDBConfig
from sowstream.engine.commands import ControlRecord
from sowstream.engine.router import CommandRouter
from sowstream.engine.topology import Topology, serving_config
from sowstream.engine.units.base import Context, ControlInbox
from sowstream.sow.ops import RawRecord
from sowstream.wire.protocol import Command, Reply
from sowstream.wire.topics import TopicNames
from tests.support.subscriber import RecordingSender

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

    def batch_agent(
        self, topic: str, partitions: int, name: str, handle: Callable[[list[RawRecord]], Any]
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
    """An assignment of the partitions given, settled."""

    def __init__(self, owned: set[tuple[str, int]]) -> None:
        self.owned = owned
        self.settled = True

    def owns(self, topic: str, partition: int) -> bool:
        return (topic, partition) in self.owned

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

    async def declare_topic(self, name: str) -> str | None:
        self.declared.append(name)
        return self.problem

    async def caught_up(self) -> None:
        self.caught_up_calls += 1


class Setup:
    def __init__(self, held: frozenset[int] = frozenset({0}), problem: str | None = None) -> None:
        config = serving_config(load_config_text(CONFIG, source="test"))
        self.names = TopicNames()
        self.sender = RecordingSender()
        self.held = Held({(self.names.control("orders"), p) for p in held})
        ctx = Context(
            wiring=Wiring(),
            sender=self.sender,
            assignment=self.held,
            names=self.names,
            bootstrap="kafka.invalid:9092",
            app_id="test",
            kafka={},
            rocksdb=RocksDBConfig(),
            logs=lambda topic: EmptyLog(),
        )
        self.topology = Topology(config, ctx)
        self.creation = Creation(problem)
        self.router = CommandRouter(self.topology, self.creation, self.sender, self.held, "w1")
        self.orders = self.topology.topics["orders"]

    def replies(self) -> list[Reply]:
        return [Reply.decode(value) for value, _ in self.sender.take()]


def command(name: str, topic: str = "orders", **fields: Any) -> Command:
    fields.setdefault("command_id", f"id-{name}")
    return Command(command=name, query_id="q1", reply_to="reply.c1", topic=topic, **fields)


def record(cmd: Command | bytes, partition: int = 0, offset: int = 0) -> ControlRecord:
    value = cmd if isinstance(cmd, bytes) else cmd.encode()
    return ControlRecord("sowstream.ctl.orders", partition, offset, value)


def test_status_answers_the_partition_row_then_its_end() -> None:
    setup = Setup()
    asyncio.run(setup.router.answer(setup.orders, command("status"), 0))
    rows, end = setup.replies()
    assert (rows.command, rows.topic, rows.partition, rows.query_id) == ("sow", "orders", 0, "q1")
    row = orjson.loads(rows.records[0].data)
    assert (row["topic"], row["partition"], row["worker"], row["records"]) == ("orders", 0, "w1", 0)
    assert (end.command, end.count, end.status) == ("part_end", 1, "success")
    assert end.answer_id == rows.answer_id != ""


def test_an_unknown_command_fails_naming_it() -> None:
    setup = Setup()
    asyncio.run(setup.router.answer(setup.orders, command("bogus"), 2))
    (reply,) = setup.replies()
    assert (reply.command, reply.status, reply.reason, reply.partition) == (
        "part_end",
        "failure",
        "unknown_command",
        2,
    )
    assert reply.message == "unknown command 'bogus'"


def test_a_queue_command_answers_for_its_underlying_topic_and_partition() -> None:
    """One answer per (underlying topic, partition): a queue over several topics gets one from
    each, told apart by the topic (docs/protocol.md, Browsing)."""
    setup = Setup()
    asyncio.run(setup.router.answer(setup.orders, command("queue_status", topic="work"), 1))
    rows, end = setup.replies()
    assert (rows.topic, rows.partition, orjson.loads(rows.records[0].data)) == (
        "orders",
        1,
        {"topic": "orders", "depth": 0, "leased": 0},
    )
    assert (end.command, end.count) == ("part_end", 1)
    asyncio.run(setup.router.answer(setup.orders, command("delta_subscribe", topic="work"), 1))
    (failed,) = setup.replies()
    assert (failed.status, failed.reason, failed.topic) == ("failure", "invalid", "orders")
    assert failed.message.startswith("delta_subscribe is not available on queue 'work'")


def test_undecodable_records_are_skipped_and_the_rest_answered_in_order() -> None:
    setup = Setup()
    records = [record(b"not a command"), record(command("bogus"), offset=1)]
    asyncio.run(setup.router.handle(setup.orders, records))
    assert [r.command_id for r in setup.replies()] == ["id-bogus"]


def test_queue_acks_are_answered_only_for_partitions_held_here() -> None:
    setup = Setup(held=frozenset({0}))
    # No bookmarks: each is refused by the queue, answered where its partition is held.
    acks = [
        command("queue_ack", topic="work", command_id="a0"),
        command("queue_ack", topic="work", command_id="a1"),
        command("queue_ack", topic="work", command_id="quiet", options={"ack_type": "none"}),
    ]
    records = [record(acks[0], 0), record(acks[1], 1, 1), record(acks[2], 0, 2)]
    asyncio.run(setup.router.handle(setup.orders, records))
    (reply,) = setup.replies()
    assert (reply.command, reply.command_id, reply.topic, reply.partition) == (
        "ack",
        "a0",
        "work",
        0,
    )
    assert (reply.status, reply.reason) == ("failure", "invalid")
    assert reply.message == "queue 'work': an acknowledgement needs bookmarks or a filter"


def test_a_command_for_a_topic_nobody_created_fails_after_catching_up() -> None:
    setup = Setup()
    auto = ControlRecord("sowstream.ctl-auto", 3, 0, command("sow", topic="nowhere").encode())
    asyncio.run(setup.router.auto_command(auto))
    (reply,) = setup.replies()
    assert (reply.status, reply.reason, reply.topic, reply.partition) == (
        "failure",
        "unknown_topic",
        "nowhere",
        3,
    )
    assert reply.message == "topic 'nowhere' is not known to the engine"
    assert setup.creation.caught_up_calls == 1


def test_declare_topic_is_acknowledged_or_refused_with_the_reason() -> None:
    for problem in (None, "not today"):
        setup = Setup(problem=problem)
        declare = ControlRecord(
            "sowstream.ctl-auto", 1, 0, command("declare_topic", topic="t").encode()
        )
        asyncio.run(setup.router.auto_command(declare))
        (reply,) = setup.replies()
        assert setup.creation.declared == ["t"]
        assert (reply.command, reply.topic, reply.partition) == ("ack", "t", 1)
        if problem is None:
            assert (reply.status, reply.count) == ("success", 1)
        else:
            assert (reply.status, reply.reason, reply.message, reply.count) == (
                "failure",
                "not_declared",
                "not today",
                0,
            )
