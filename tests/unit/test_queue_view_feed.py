"""What a view over a queue is told: the machine records every bookmark whose availability may
have changed (``QueueMachine.touched``), and stating the current availability of those keeps a
copy equal to what the queue browses (V15's steps, then random command sequences)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sowstream.config.queues import QueueConfig
from sowstream.engine.queue_views import QueueViewFeed, available_records, available_sow_key
from sowstream.queues import Bookmark, QueueMachine
from sowstream.wire import headers as h
from tests.support.sender import RecordingSender

S = 1000


def machine(**options: Any) -> QueueMachine:
    q = QueueMachine(QueueConfig(name="WQ", underlying_topic="work", **options))
    q.touched = set()
    return q


def b(n: int, partition: int = 0) -> Bookmark:
    return Bookmark("work", partition, n)


def state(q: QueueMachine, copy: dict[Bookmark, bytes]) -> dict[Bookmark, bytes]:
    """Apply what a flush would state to ``copy`` (the available-messages topic)."""
    touched, q.touched = q.touched or set(), set()
    for bookmark, data in available_records(q, touched):
        if data is None:
            copy.pop(bookmark, None)
        else:
            copy[bookmark] = data
    return copy


def browsed(q: QueueMachine) -> dict[Bookmark, bytes]:
    return {m.bookmark: m.data for m in q.browse()}


def test_v15_steps_are_stated() -> None:
    q = machine()
    for n, kind in ((1, "a"), (2, "a"), (3, "b")):
        q.append(b(n), f"m{n}".encode(), {"kind": kind}, n)
    copy = state(q, {})
    assert set(copy) == {b(1), b(2), b(3)}
    q.subscribe("s", client="c", filter="/kind = 'a'")
    q.dispatch(10)
    assert set(state(q, copy)) == {b(2), b(3)}  # leased: not available
    q.ack([b(1)], client="c", action="cancel", now_ms=11)
    assert set(state(q, copy)) == {b(1), b(2), b(3)}  # cancelled: available again
    q.dispatch(12)
    q.ack([b(1)], client="c", now_ms=13)  # acknowledged while leased
    assert set(state(q, copy)) == {b(2), b(3)}
    q.dispatch(14)  # b(2) is leased: no kind a left
    assert set(state(q, copy)) == {b(3)}
    q.unsubscribe("s", 15)
    assert state(q, copy) == browsed(q) == {b(2): b"m2", b(3): b"m3"}


def test_a_deferred_acknowledgement_states_the_publish_unavailable() -> None:
    """A new owner replaying the log may meet a publish acknowledged in advance: the previous
    owner may have stated it available, so it is stated again, as unavailable."""
    q = machine()  # deferred acknowledgements are kept a day by default
    q.ack([b(5)], client="c", now_ms=1)
    assert not q.append(b(5), b"m5", {}, 2)
    assert available_records(q, q.touched or ()) == [(b(5), None)]


def test_the_sow_key_is_the_bookmark_in_base64() -> None:
    key = available_sow_key(b(1742, 1))
    assert base64.urlsafe_b64decode(key) == b"work|1|1742"


OPS = st.lists(
    st.tuples(
        st.sampled_from(["publish", "sub", "unsub", "dispatch", "ack", "cancel", "expire", "tick"]),
        st.integers(min_value=0, max_value=7),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(
    ops=OPS,
    options=st.sampled_from(
        [
            {},
            {"lease_period_ms": 1000, "max_cancels": 2},
            {"semantics": "at-most-once"},
            {"barrier_expression": "/sync IS NOT NULL", "max_per_subscription_backlog": 3},
            {"max_deliveries": 2, "lease_period_ms": 1000, "priority": "/p"},
        ]
    ),
)
def test_statements_keep_a_copy_equal_to_the_browsed_queue(
    ops: list[tuple[str, int]], options: dict[str, Any]
) -> None:
    q = machine(**options)
    copy: dict[Bookmark, bytes] = {}
    now = next_offset = 0
    for op, n in ops:
        now += 100
        if op == "publish":
            body = {"p": n, "sync": 1} if n == 7 else {"p": n}
            q.append(b(next_offset), f"m{next_offset}".encode(), body, now)
            next_offset += 1
        elif op == "sub":
            q.subscribe(f"s{n % 3}", client=f"c{n % 3}", filter="/p < 5" if n > 4 else None)
        elif op == "unsub":
            q.unsubscribe(f"s{n % 3}", now)
        elif op == "dispatch":
            q.dispatch(now)
        elif op == "tick":
            now += S
            q.tick(now)
        else:
            action = {"ack": "", "cancel": "cancel", "expire": "expire"}[op]
            q.ack([b(n)], client=f"c{n % 3}", action=action, now_ms=now)
        if n % 2:  # flushes come at any point, or several changes later
            assert state(q, copy) == browsed(q)
    assert state(q, copy) == browsed(q)


# --- The feed itself, with a sender that keeps what it is given (no Kafka) ---


def available(sender: RecordingSender) -> dict[str, bytes]:
    """The available-messages topic as its processor would end up: SowKey -> data."""
    records: dict[str, bytes] = {}
    for rec in sender.records:
        assert rec.key is not None and rec.headers.get(h.VIEW) == "WQ"
        if rec.headers.get(h.COMMAND) == h.SOW_DELETE:
            records.pop(rec.key.decode(), None)
        else:
            assert rec.value is not None
            records[rec.key.decode()] = rec.value
    return records


def keyed(q: QueueMachine) -> dict[str, bytes]:
    return {available_sow_key(k): v for k, v in browsed(q).items()}


def test_the_feed_states_changes_once_and_restates_what_kafka_refused() -> None:
    async def run() -> None:
        q = machine()
        topic = RecordingSender()
        feed = QueueViewFeed(q, "WQ", "log", topic)
        for n in range(3):
            q.append(b(n), f"m{n}".encode(), {}, n)
        assert await feed.flush() == 3 and available(topic) == keyed(q)
        q.subscribe("s", client="c")
        q.dispatch(10)  # b(0) leased
        assert await feed.flush(wait_for=[]) == 1 and available(topic) == keyed(q)
        q.ack([b(0)], client="c", now_ms=11)  # already stated unavailable: nothing to write
        assert await feed.flush(wait_for=[b(0)]) == 0
        topic.failing = True
        q.dispatch(12)  # b(1) leased, but the statement is lost
        await feed.flush()
        await asyncio.sleep(0)  # the refused future's callback runs
        assert available_sow_key(b(1)) in available(topic)
        topic.failing = False
        assert await feed.flush() == 1 and available(topic) == keyed(q)

    asyncio.run(run())


def test_a_dropped_partition_is_left_to_its_next_owner() -> None:
    async def run() -> None:
        q = machine()
        topic = RecordingSender()
        feed = QueueViewFeed(q, "WQ", "log", topic)
        q.append(b(0), b"m0", {}, 0)
        q.append(b(1, partition=1), b"n1", {}, 0)
        await feed.flush()
        q.drop_partition("work", 1)
        feed.drop("work", 1)
        q.touched = (q.touched or set()) | {b(1, partition=1)}  # e.g. a late refusal
        assert await feed.flush() == 0  # the next owner states it; a delete here could undo that
        assert available_sow_key(b(1, partition=1)) in available(topic)

    asyncio.run(run())
