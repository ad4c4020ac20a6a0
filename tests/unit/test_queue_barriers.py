"""Barriers over several workers (sowstream.queues.barriers): a barrier waits for every older
message on every partition, messages after it wait for it, and a partition nobody reports on
holds everything back. Two machines stand for two workers, each owning one partition of
``bar``; positions are carried between them by hand."""

from __future__ import annotations

import pytest

from sowstream.config.queues import QueueConfig
from sowstream.queues.barriers import BarrierGate, PartitionPosition
from sowstream.queues.machine import Bookmark, QueueMachine

BOTH = [("bar", 0), ("bar", 1)]


def worker(partition: int) -> QueueMachine:
    config = QueueConfig(
        name="BQ",
        underlying_topic="bar",
        barrier_expression="/sync IS NOT NULL",
        max_per_subscription_backlog=5,
    )
    q = QueueMachine(config)
    q.gate = BarrierGate(BOTH)
    q.gate.hold([("bar", partition)])
    q.subscribe("S", client="C", max_backlog=5)
    return q


def position(q: QueueMachine, partition: int, read_to: int) -> PartitionPosition:
    oldest, barrier = q.oldest("bar", partition)
    return PartitionPosition("BQ", "bar", partition, 1, read_to, oldest, barrier)


def tell(q: QueueMachine, about: PartitionPosition) -> None:
    assert q.gate is not None
    if q.gate.note(about):
        q.reopen()


def sent(q: QueueMachine, now: int = 0) -> list[tuple[int, bool]]:
    leases, _ = q.dispatch(now)
    return [(lease.message.bookmark.offset, lease.barrier) for lease in leases]


def test_position_round_trip_and_a_malformed_one_is_refused() -> None:
    p = PartitionPosition("BQ", "bar", 1, 5, 100, None, 90)
    assert PartitionPosition.from_bytes(p.to_bytes()) == p
    with pytest.raises(ValueError, match="malformed partition position"):
        PartitionPosition.from_bytes(b'{"queue": "BQ"}')


def test_a_barrier_waits_for_an_older_message_on_another_worker() -> None:
    a, b = worker(0), worker(1)
    b.append(Bookmark("bar", 1, 0), b"", {"n": 1}, 10)  # m1 on worker b
    a.append(Bookmark("bar", 0, 0), b"", {"n": "B", "sync": 1}, 20)  # the barrier on a
    a.append(Bookmark("bar", 0, 1), b"", {"n": 3}, 30)  # m3 after it
    assert sent(a) == []  # a has not heard from b's partition: B waits
    tell(b, position(a, 0, 40))
    assert sent(b) == [(0, False)]  # m1: published before the barrier
    tell(a, position(b, 1, 40))
    assert sent(a) == []  # B waits for m1 (leased), m3 behind B
    b.ack([Bookmark("bar", 1, 0)], client="C", now_ms=0)
    tell(a, position(b, 1, 50))
    assert sent(a) == [(0, True), (1, False)]  # B goes out, then m3


def test_a_message_waits_for_a_barrier_published_before_it_on_another_worker() -> None:
    a, b = worker(0), worker(1)
    a.append(Bookmark("bar", 0, 0), b"", {"n": 1}, 10)  # m1 on a, leased
    a.append(Bookmark("bar", 0, 1), b"", {"n": "B", "sync": 1}, 20)  # the barrier on a
    b.append(Bookmark("bar", 1, 0), b"", {"n": 3}, 30)  # m3 on b, after the barrier
    tell(a, position(b, 1, 40))
    assert sent(a) == [(0, False)]
    tell(b, position(a, 0, 40))
    assert sent(b) == []  # B is waiting on a: m3 waits too
    a.ack([Bookmark("bar", 0, 0)], client="C", now_ms=0)
    assert sent(a) == [(1, True)]
    tell(b, position(a, 0, 50))
    assert sent(b) == [(0, False)]


def test_a_partition_not_read_far_enough_holds_a_later_message() -> None:
    a, b = worker(0), worker(1)
    b.append(Bookmark("bar", 1, 0), b"", {"n": 1}, 100)
    tell(b, position(a, 0, 50))  # a has read its log up to 50 only: a barrier may come
    assert sent(b) == []
    tell(b, position(a, 0, 150))
    assert sent(b) == [(0, False)]
    gate = BarrierGate(BOTH)
    old = PartitionPosition("BQ", "bar", 0, 5, 200, None, None)
    assert gate.note(old) and not gate.note(old)  # the same again changes nothing
    assert not gate.note(PartitionPosition("BQ", "bar", 0, 4, 300, None, None))  # stale epoch
    assert not gate.note(PartitionPosition("BQ", "other", 0, 9, 300, None, None))
