"""What a view over a queue is told: the machine records every bookmark whose availability may
have changed (``QueueMachine.touched``), and stating the current availability of those keeps a
copy equal to what the queue browses (V15's steps, then random command sequences)."""

from __future__ import annotations

import base64
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sowstream.config.queues import QueueConfig
from sowstream.queues import Bookmark, QueueMachine
from sowstream.queues.view_feed import available_records, available_sow_key

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
