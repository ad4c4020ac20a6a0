"""The command router: typed commands answered through the reply writer, queue acks together.

The units are the worker's own (a topology made from a configuration); the runtime is replaced
by recording implementations of its ports (wiring, assignment, sender, log readers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import orjson
import pytest

from sowstream.engine import table as table_module
from sowstream.engine.commands import ControlRecord
from sowstream.wire.protocol import Command
from tests.support.router import EmptyLog, Setup, command, record


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
    setup = Setup(held=frozenset({2}))
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
    setup = Setup(held=frozenset({1}))
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


# -- commands for partitions not held here: no ghost loads ----------------------------------------

PLACED = [
    command("sow"),
    command("sow_and_subscribe", sub_id="s1"),
    command("status"),
    command("sow", topic="work"),  # browsing a queue
    command("queue_status", topic="work"),
    command("queue_ack", topic="work", options={"bookmarks": "orders|0|5"}),
]


def test_a_command_read_during_a_rebalance_loads_nothing_and_its_owner_answers_it() -> None:
    """The test holds the rebalance (the assignment is not settled): a worker that read the
    commands before it loads nothing and answers nothing. Once partition 0 has moved to another
    worker, that worker reads them again (from the last committed offset) and answers each."""
    moving = Setup(held=frozenset({0}))
    moving.held.settled = False
    records = [record(cmd, 0, offset) for offset, cmd in enumerate(PLACED)]
    asyncio.run(moving.router.handle(moving.orders, records))
    assert moving.replies() == []
    assert moving.orders.proc.table.get(0) is None
    # The rebalance ends: partition 0 is the other worker's now.
    moving.held.owned.discard((moving.names.control("orders"), 0))
    moving.held.settled = True
    asyncio.run(moving.router.handle(moving.orders, records))
    assert moving.replies() == []
    assert moving.orders.proc.partitions == []
    owner = Setup(held=frozenset({0}))
    asyncio.run(owner.router.handle(owner.orders, records))
    answers = owner.replies()
    ends = [r for r in answers if r.command in ("part_end", "ack")]
    assert [r.command_id for r in ends] == [cmd.command_id for cmd in PLACED]
    assert all(r.partition == 0 and r.status == "success" for r in ends)
    assert owner.orders.proc.partitions == [0]


def test_a_command_for_a_partition_assigned_elsewhere_loads_nothing() -> None:
    setup = Setup(held=frozenset({0}))
    records = [record(cmd, 1, offset) for offset, cmd in enumerate(PLACED)]
    asyncio.run(setup.router.handle(setup.orders, records))
    asyncio.run(setup.router.answer(setup.orders, command("sow"), 1))
    assert setup.replies() == []
    assert setup.orders.proc.partitions == []


# -- schema versions -------------------------------------------------------------------------------


def versioned(cmd: Command | bytes, version: str | None, partition: int = 0) -> ControlRecord:
    value = cmd if isinstance(cmd, bytes) else cmd.encode()
    headers = {} if version is None else {"sow.schema": version}
    return ControlRecord("sowstream.ctl.orders", partition, 0, value, headers)


def test_a_command_of_a_newer_schema_version_is_refused_naming_both_versions() -> None:
    setup = Setup()
    # Version 2 as a later schema would write it: the version 1 fields, then one more (an int).
    newer = command("sow", command_id="v2").encode() + b"\x02"
    ack = command("queue_ack", topic="work", command_id="ack-v2").encode() + b"\x02"
    asyncio.run(setup.router.handle(setup.orders, [versioned(newer, "2"), versioned(ack, "2")]))
    end, refused_ack = setup.replies()
    assert (end.command, end.command_id, end.status, end.reason, end.topic, end.partition) == (
        "part_end",
        "v2",
        "failure",
        "schema_version",
        "orders",
        0,
    )
    assert end.message == (
        "the command was written with protocol schema version 2; this side reads versions 1 "
        "to 1: upgrade it, or write version 1"
    )
    assert (refused_ack.command, refused_ack.command_id, refused_ack.reason) == (
        "ack",
        "ack-v2",
        "schema_version",
    )


def test_a_schema_header_that_is_no_version_is_refused_naming_it() -> None:
    setup = Setup()
    asyncio.run(setup.router.handle(setup.orders, [versioned(command("sow"), "two")]))
    (end,) = setup.replies()
    assert (end.status, end.reason) == ("failure", "schema_version")
    assert end.message == "header sow.schema='two' is not a schema version (a positive integer)"


def test_commands_without_the_header_are_version_1_and_answers_say_their_version() -> None:
    setup = Setup()
    asyncio.run(
        setup.router.handle(
            setup.orders, [versioned(command("sow"), None), versioned(command("status"), "1")]
        )
    )
    assert [r.schema for r in setup.sender.replied] == ["1", "1", "1"]
    assert [(r.command, r.status) for r in setup.replies()] == [
        ("part_end", "success"),
        ("sow", "success"),
        ("part_end", "success"),
    ]


def test_a_command_the_engine_fails_on_is_answered_with_the_error() -> None:
    """Not a refusal but a failure of the engine (here: storing a batch failed): the client
    is told, rather than left waiting until it times out."""
    setup = Setup()
    ps = asyncio.run(setup.orders.proc.ready(0))
    ps.failure = OSError("disk full")
    asyncio.run(setup.router.handle(setup.orders, [record(command("sow"))]))
    (end,) = setup.replies()
    assert (end.command, end.status, end.reason, end.partition) == (
        "part_end",
        "failure",
        "internal_error",
        0,
    )
    assert end.message == "the engine failed: topic 'orders': storing a batch failed: disk full"


class UnappliedLog(EmptyLog):
    """A log whose records up to offset 10 exist but are never applied (the pump is stalled)."""

    async def end_offset(self, partition: int) -> int:
        return 10


def test_a_queue_ack_whose_messages_are_not_applied_in_time_is_answered_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(table_module, "APPLIED_WAIT_SECONDS", 0.05)
    setup = Setup(log=UnappliedLog())
    ack = command("queue_ack", topic="work", command_id="late", options={"bookmarks": "orders|0|5"})
    asyncio.run(setup.router.handle(setup.orders, [record(ack)]))
    (reply,) = setup.replies()
    assert (reply.command, reply.command_id, reply.status, reply.reason, reply.partition) == (
        "ack",
        "late",
        "failure",
        "timeout",
        0,
    )
    assert reply.message == "topic 'orders': the log was not applied up to offset 5 within 0s"


def test_records_read_while_their_partition_is_not_held_stay_unacknowledged() -> None:
    """Acknowledged, a record's offset could be committed before its partition's owner read it
    again after the rebalance: the command would never be answered."""
    setup = Setup(held=frozenset({0}))
    acked: list[int] = []

    def acknowledge(partition: int) -> Callable[[], Awaitable[None]]:
        async def ack() -> None:
            acked.append(partition)

        return ack

    async def go() -> None:
        inbox = setup.orders.inbox
        assert inbox is not None
        serving = asyncio.create_task(setup.router.run())
        for offset, partition in enumerate((0, 1, 0)):
            await inbox.put(acknowledge(partition), record(command("sow"), partition, offset))
        for _ in range(100):
            if len(acked) == 2:
                break
            await asyncio.sleep(0.01)
        setup.held.settled = False  # a rebalance starts: nothing is acknowledged meanwhile
        await inbox.put(acknowledge(0), record(command("sow"), 0, 3))
        await asyncio.sleep(0.1)
        serving.cancel()

    asyncio.run(go())
    assert acked == [0, 0]


def test_queue_commands_on_a_topic_that_is_no_queue_are_refused_in_their_answers_form() -> None:
    setup = Setup()
    for name in ("queue_ack", "queue_status"):
        asyncio.run(setup.router.answer(setup.orders, command(name), 0))
    ack, end = setup.replies()
    assert (ack.command, ack.topic, ack.status, ack.reason) == (
        "ack",
        "orders",
        "failure",
        "invalid",
    )
    assert ack.message == "queue_ack on 'orders', which is not a queue: it takes a queue's name"
    assert (end.command, end.status, end.reason) == ("part_end", "failure", "invalid")
    assert end.message == "queue_status on 'orders', which is not a queue: it takes a queue's name"


def test_queue_acks_stored_after_the_group_moved_on_are_left_unanswered() -> None:
    """A worker the group went on without (a missed rebalance) writes what no later owner
    reads: an answer would tell the client its ack is stored for good when it is not."""
    ack = command(
        "queue_ack", topic="work", command_id="fenced", options={"bookmarks": "orders|0|5"}
    )
    current = Setup()
    asyncio.run(current.router.handle(current.orders, [record(ack)]))
    (reply,) = current.replies()
    assert (reply.command_id, reply.status) == ("fenced", "success")

    moved = Setup()
    moved.held.current = False
    asyncio.run(moved.router.handle(moved.orders, [record(ack)]))
    assert moved.replies() == []
    # A refusal confirms nothing, so it needs no fence.
    bad = command("queue_ack", topic="work", command_id="bad", options={"bookmarks": "x"})
    asyncio.run(moved.router.handle(moved.orders, [record(bad, offset=1)]))
    (refused,) = moved.replies()
    assert (refused.command_id, refused.reason) == ("bad", "invalid")


def test_queue_acks_that_want_no_answer_do_not_ask_the_coordinator() -> None:
    """The generation check gates answers only: a client acking as it goes (ack_type none)
    costs no round trip to the group's coordinator; an answered ack still asks."""
    quiet = command(
        "queue_ack",
        topic="work",
        command_id="quiet",
        options={"bookmarks": "orders|0|5", "ack_type": "none"},
    )
    setup = Setup()
    asyncio.run(setup.router.handle(setup.orders, [record(quiet)]))
    assert setup.replies() == [] and setup.held.probes == 0
    answered = command(
        "queue_ack", topic="work", command_id="loud", options={"bookmarks": "orders|0|6"}
    )
    asyncio.run(setup.router.handle(setup.orders, [record(answered, offset=1)]))
    (reply,) = setup.replies()
    assert reply.command_id == "loud" and setup.held.probes == 1
