"""The queue state machine: the worked examples Q1-Q21 of chapter 06, section 15, the rules
behind them, and property tests over random command sequences.

Common setup as in the chapter: queue WQ over the topic ``work``; ``mN`` is the Nth publish to
``work`` (partition 0, offset N, log time N ms unless a test says otherwise); times are ms.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sowstream.config.queues import QueueConfig
from sowstream.filters import FilterError, compile_filter
from sowstream.queues import AckResult, Bookmark, Lease, QueueMachine, Removed

S = 1000  # one second in ms


def queue(**settings: Any) -> QueueMachine:
    return QueueMachine(QueueConfig(name="WQ", underlying_topic="work", **settings))


def m(n: int, partition: int = 0) -> Bookmark:
    return Bookmark("work", partition, n)


def publish(q: QueueMachine, n: int, body: dict[str, Any] | None = None, **kw: Any) -> bool:
    timestamp = kw.pop("timestamp_ms", n)
    return q.append(m(n), f"m{n}".encode(), body or {"n": n}, timestamp, **kw)


def sent(leases: list[Lease]) -> list[tuple[str, int]]:
    return [(lease.sub_key, lease.message.bookmark.offset) for lease in leases]


def deliver(q: QueueMachine, now: int = 0) -> list[tuple[str, int]]:
    leases, _ = q.dispatch(now)
    return sent(leases)


def reasons(removed: list[Removed]) -> list[tuple[int, str]]:
    return [(r.message.bookmark.offset, r.reason) for r in removed]


# --- Bookmarks ---


def test_bookmark_text_round_trip() -> None:
    b = Bookmark("orders.eu", 3, 42)
    assert b.text() == "orders.eu|3|42" == str(b)
    assert Bookmark.parse(" orders.eu|3|42 ") == b


@pytest.mark.parametrize("text", ["", "a|1", "a|x|1", "|1|2", "a|1|-2", "a|1|2|", "a|\u0661|2"])
def test_bookmark_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"topic\|partition\|offset") as caught:
        Bookmark.parse(text)
    assert repr(text) in str(caught.value)


# --- The worked examples ---


def test_q1_defaults_give_backlog_1() -> None:
    q = queue()
    assert q.subscribe("S1", client="C1") == 1
    publish(q, 1), publish(q, 2)
    assert deliver(q) == [("S1", 1)]
    stats = q.stats()
    assert (stats.depth, stats.leased, stats.backlog) == (2, 1, {"S1": 1})
    outcome = q.ack([m(1)], client="C1", now_ms=10)
    assert outcome.results == {m(1): AckResult.REMOVED}
    assert reasons(outcome.removed) == [(1, "")]
    assert deliver(q, 10) == [("S1", 2)]
    assert q.stats().depth == 1


def test_q2_backlog_clamp_with_round_robin() -> None:
    q = queue(max_per_subscription_backlog=5, fairness_model="round-robin")
    assert q.subscribe("S1", client="C1", max_backlog=10) == 5
    assert q.subscribe("S2", client="C2", max_backlog=2) == 2
    for n in range(1, 10):
        publish(q, n)
    assert deliver(q) == [
        ("S1", 1),
        ("S2", 2),
        ("S1", 3),
        ("S2", 4),
        ("S1", 5),
        ("S1", 6),
        ("S1", 7),
    ]
    assert [msg.bookmark.offset for msg in q.browse()] == [8, 9]


@pytest.mark.parametrize("leasing", ["sublet", "strict"])
def test_q3_lease_timeout_then_sublet_or_strict(leasing: str) -> None:
    # Round-robin so that the returned m1 goes to S2: under proportional both subscriptions are
    # empty at t=1 and the tie goes to S1, the first registered.
    q = queue(lease_period_ms=1 * S, leasing=leasing, fairness_model="round-robin")
    q.subscribe("S1", client="C1")
    q.subscribe("S2", client="C2")
    publish(q, 1)
    (lease,) = q.dispatch(0)[0]
    assert (lease.sub_key, lease.lease_expires_ms, lease.deliveries) == ("S1", 1 * S, 1)
    assert q.next_deadline() == 1 * S
    assert q.tick(999) == []
    assert q.tick(1 * S) == []
    assert q.stats().expired_leases == 1 and q.stats().backlog == {"S1": 0, "S2": 0}
    (lease,) = q.dispatch(1 * S)[0]
    assert (lease.sub_key, lease.deliveries) == ("S2", 2)

    late = q.ack([m(1)], client="C1", now_ms=1500)
    if leasing == "sublet":
        assert late.results[m(1)] == AckResult.REMOVED
        assert q.stats().backlog == {"S1": 0, "S2": 0}  # S2's unit freed by C1's ack
        assert q.ack([m(1)], client="C2", now_ms=1600).results[m(1)] == AckResult.GONE
    else:
        assert late.results[m(1)] == AckResult.IGNORED and late.removed == []
        assert q.ack([m(1)], client="C2", now_ms=1600).results[m(1)] == AckResult.REMOVED
    assert q.stats().depth == 0


def test_q4_disconnect_returns_leases_at_once_in_order() -> None:
    q = queue(lease_period_ms=60 * S, max_per_subscription_backlog=2)
    q.subscribe("S1", client="C1", max_backlog=2)
    publish(q, 1), publish(q, 2)
    assert deliver(q) == [("S1", 1), ("S1", 2)]
    q.subscribe("S2", client="C2")
    assert q.disconnect("C1", 5 * S) == []
    assert deliver(q, 5 * S) == [("S2", 1)]
    q.ack([m(1)], client="C2", now_ms=6 * S)
    assert deliver(q, 6 * S) == [("S2", 2)]


def test_q5_cancel_and_max_cancels() -> None:
    q = queue(max_cancels=2)
    q.subscribe("S1", client="C1")
    publish(q, 1)
    assert deliver(q) == [("S1", 1)]
    first = q.ack([m(1)], client="C1", action="cancel", now_ms=1)
    assert first.results[m(1)] == AckResult.RETURNED and first.removed == []
    assert deliver(q, 1) == [("S1", 1)]
    second = q.ack([m(1)], client="C1", action="cancel", now_ms=2)
    assert second.results[m(1)] == AckResult.EXPIRED
    assert reasons(second.removed) == [(1, "max_cancels")]
    assert second.removed[0].message.cancels == 2
    stats = q.stats()
    assert stats.depth == 0 and stats.expired == {"max_cancels": 1}
    # Publishing {"message": ..., "reason": "max_cancels"} to a DLQ topic is the engine's job.


@pytest.mark.parametrize("leased_again", [False, True])
def test_a_cancel_arriving_after_its_lease_lapsed_counts(leased_again: bool) -> None:
    """A cancel that reaches the queue after its lease timed out counts towards MaxCancels
    whether or not the message was leased again meanwhile (docs/queues.md): the count must not
    depend on the timing of the lapse and the next dispatch."""
    q = queue(max_cancels=2, lease_period_ms=1 * S)
    q.subscribe("S1", client="C1")
    publish(q, 1)
    assert deliver(q) == [("S1", 1)]
    # The first cancel is late: the lease lapsed, nobody has the message yet.
    assert q.tick(1 * S) == [] and q.stats().expired_leases == 1
    late = q.ack([m(1)], client="C1", action="cancel", now_ms=1 * S + 1)
    assert late.results[m(1)] == AckResult.RETURNED and late.removed == []
    held = q.message(m(1))
    assert held is not None and held.cancels == 1 and held.leased_to is None
    (lease,) = q.dispatch(1 * S + 1)[0]
    assert lease.deliveries == 2
    # The second one too: the lapse returned it, and maybe the next dispatch leased it again.
    assert q.tick(2 * S + 1) == []
    if leased_again:
        assert deliver(q, 2 * S + 1) == [("S1", 1)]
    second = q.ack([m(1)], client="C1", action="cancel", now_ms=2 * S + 2)
    assert second.results[m(1)] == AckResult.EXPIRED
    assert reasons(second.removed) == [(1, "max_cancels")]
    assert second.removed[0].message.cancels == 2
    assert q.stats().depth == 0 and q.stats().backlog == {"S1": 0}


def test_q6_max_deliveries_on_disconnect() -> None:
    q = queue(max_deliveries=2, lease_period_ms=1 * S, fairness_model="round-robin")
    q.subscribe("S1", client="C1")
    q.subscribe("S2", client="C2")
    publish(q, 1)
    assert deliver(q) == [("S1", 1)]
    q.tick(1 * S)
    assert deliver(q, 1 * S) == [("S2", 1)]
    removed = q.disconnect("C2", 1500)
    assert reasons(removed) == [(1, "max_deliveries")]
    assert deliver(q, 1500) == [] and q.stats().depth == 0


def test_q6_variant_ack_instead() -> None:
    q = queue(max_deliveries=2, lease_period_ms=1 * S, fairness_model="round-robin")
    q.subscribe("S1", client="C1")
    q.subscribe("S2", client="C2")
    publish(q, 1)
    deliver(q)
    q.tick(1 * S)
    deliver(q, 1 * S)
    outcome = q.ack([m(1)], client="C2", now_ms=1500)
    assert reasons(outcome.removed) == [(1, "")]


def test_q7_forced_expiry() -> None:
    q = queue()
    q.subscribe("S1", client="C1")
    publish(q, 1)
    deliver(q)
    outcome = q.ack([m(1)], client="C1", action="expire", now_ms=1)
    assert outcome.results[m(1)] == AckResult.EXPIRED
    assert reasons(outcome.removed) == [(1, "forced_expire")]
    assert deliver(q, 1) == [] and q.stats().expired == {"forced_expire": 1}


def test_q8_at_most_once() -> None:
    q = queue(semantics="at-most-once")
    assert q.config.fairness_model == "round-robin"
    q.subscribe("S1", client="C1")
    publish(q, 1)
    leases, removed = q.dispatch(0)
    assert sent(leases) == [("S1", 1)] and reasons(removed) == [(1, "sent")]
    assert leases[0].lease_expires_ms is None
    assert q.stats().depth == 0 and q.stats().backlog == {"S1": 1}
    publish(q, 2)
    assert deliver(q, 1) == []  # S1 still owes an ack for m1
    cancel = q.ack([m(1)], client="C1", action="cancel", now_ms=2)
    assert cancel.results[m(1)] == AckResult.FREED  # no redelivery; only the unit is freed
    assert cancel.removed == []
    assert deliver(q, 2) == [("S1", 2)]
    q.subscribe("S2", client="C2")
    publish(q, 3)
    assert q.disconnect("C1", 3) == []  # m2 is gone for good
    assert deliver(q, 3) == [("S2", 3)]
    assert q.stats().delivered == 3


def test_at_most_once_lease_period_frees_an_unacknowledged_unit() -> None:
    # sowstream's choice: a client that never acks at-most-once messages does not stall.
    q = queue(semantics="at-most-once", lease_period_ms=5 * S)
    q.subscribe("S1", client="C1")
    publish(q, 1), publish(q, 2)
    assert deliver(q) == [("S1", 1)]
    assert q.next_deadline() == 5 * S
    assert q.tick(5 * S) == []
    assert deliver(q, 5 * S) == [("S1", 2)]
    assert q.ack([m(1)], client="C1", now_ms=6 * S).results[m(1)] == AckResult.GONE


def test_at_most_once_ack_before_sending_removes_the_message() -> None:
    q = queue(semantics="at-most-once")
    publish(q, 1)
    outcome = q.ack([m(1)], client="C1", action="expire", now_ms=0)
    assert outcome.results[m(1)] == AckResult.IGNORED
    outcome = q.ack([m(1)], client="C1", now_ms=0)
    assert reasons(outcome.removed) == [(1, "")]


def test_q9_proportional_fairness() -> None:
    q = queue(max_per_subscription_backlog=10)
    for sub, backlog in (("A", 2), ("B", 4), ("C", 10)):
        q.subscribe(sub, client=sub, filter=f"/to = '{sub}'", max_backlog=backlog)
    n = 0
    for sub, count in (("A", 1), ("B", 3), ("C", 4)):
        for _ in range(count):
            n += 1
            publish(q, n, {"to": sub})
    deliver(q)
    assert q.stats().backlog == {"A": 1, "B": 3, "C": 4}
    for sub, backlog in (("A", 2), ("B", 4), ("C", 10)):  # replace: leases kept
        q.subscribe(sub, client=sub, max_backlog=backlog)
    publish(q, 100, {"to": "anyone"})
    assert deliver(q) == [("C", 100)]  # 40 % beats 50 % and 75 %

    q = queue(max_per_subscription_backlog=10)
    q.subscribe("A", client="A", filter="/to = 'A'", max_backlog=2)
    q.subscribe("B", client="B", filter="/to = 'B'", max_backlog=4)
    publish(q, 1, {"to": "A"}), publish(q, 2, {"to": "B"}), publish(q, 3, {"to": "B"})
    deliver(q)
    q.subscribe("A", client="A", max_backlog=2)
    q.subscribe("B", client="B", max_backlog=4)
    publish(q, 4, {"to": "anyone"})
    assert deliver(q) == [("A", 4)]  # both at 50 %: the first registered


def test_q10_round_robin_and_fast() -> None:
    q = queue(max_per_subscription_backlog=10, fairness_model="round-robin")
    for sub in ("S1", "S2", "S3"):
        q.subscribe(sub, client=sub, max_backlog=10)
    for n in range(1, 7):
        publish(q, n)
    assert [s for s, _ in deliver(q)] == ["S1", "S2", "S3", "S1", "S2", "S3"]

    q = queue(max_per_subscription_backlog=10, fairness_model="fast")
    for sub, backlog in (("S1", 2), ("S2", 10), ("S3", 10)):
        q.subscribe(sub, client=sub, max_backlog=backlog)
    for n in range(1, 7):
        publish(q, n)
    assert [s for s, _ in deliver(q)] == ["S1", "S1", "S2", "S2", "S2", "S2"]


def test_q11_per_subscriber_filters_never_block() -> None:
    q = queue()
    q.subscribe("S1", client="C1", filter="/region = 'EU'")
    q.subscribe("S2", client="C2", filter="/region = 'US'")
    publish(q, 1, {"region": "US"})
    publish(q, 2, {"region": "APAC"})
    publish(q, 3, {"region": "EU"})
    assert sorted(deliver(q)) == [("S1", 3), ("S2", 1)]
    assert q.stats().depth == 3
    assert [msg.bookmark.offset for msg in q.browse()] == [2]
    assert q.message(m(2)) is not None and q.message(m(2)).deliveries == 0  # type: ignore[union-attr]
    q.subscribe("S3", client="C3")
    assert deliver(q) == [("S3", 2)]


def test_q12_priority() -> None:
    q = queue(priority="/p")
    for n, body in enumerate([{"p": 1}, {"p": 5}, {"p": 5}, {}, {"p": 9}], start=1):
        publish(q, n, body)
    q.subscribe("S1", client="C1")
    order = []
    for now in range(1, 7):
        got = deliver(q, now)
        order += [n for _, n in got]
        q.ack([m(n) for _, n in got], client="C1", now_ms=now)
    assert order == [5, 2, 3, 1, 4]


def test_priority_values() -> None:
    q = queue(priority="/price * /qty")
    bodies = {
        1: {"price": 2, "qty": 3},  # 6
        2: {"price": "1.5", "qty": 3},  # 4.5 -> 4
        3: {"price": -5, "qty": 1},  # negative -> 0
        4: {"price": "x", "qty": 1},  # not a number -> lowest
        5: {"price": 2.0**70, "qty": 1},  # beyond 64 bits -> the largest
        6: {"price": [1, 2], "qty": 1},  # several values -> lowest
    }
    for n, body in bodies.items():
        publish(q, n, body)
    assert {n: q.message(m(n)).priority for n in bodies} == {  # type: ignore[union-attr]
        1: 6,
        2: 4,
        3: 0,
        4: None,
        5: 2**64 - 1,
        6: None,
    }
    assert [msg.bookmark.offset for msg in q.browse()] == [5, 1, 2, 3, 4, 6]


def test_returned_message_keeps_its_place() -> None:
    q = queue(max_per_subscription_backlog=3)
    q.subscribe("S1", client="C1", max_backlog=3)
    for n in (1, 2, 3):
        publish(q, n)
    deliver(q)
    q.ack([m(2)], client="C1", action="cancel", now_ms=1)
    publish(q, 4)
    assert [msg.bookmark.offset for msg in q.browse()] == [2, 4]
    assert deliver(q, 1) == [("S1", 2)]


def test_order_across_partitions_and_topics() -> None:
    q = queue()
    q.append(Bookmark("work", 1, 7), b"", {}, 50)
    q.append(Bookmark("work", 0, 9), b"", {}, 50)
    q.append(Bookmark("other", 3, 1), b"", {}, 50)
    q.append(Bookmark("work", 2, 0), b"", {}, 10)
    assert [msg.bookmark.text() for msg in q.browse()] == [
        "work|2|0",
        "other|3|1",
        "work|0|9",
        "work|1|7",
    ]


def test_q13_barrier() -> None:
    q = queue(barrier_expression="/sync IS NOT NULL", max_per_subscription_backlog=5)
    q.subscribe("S1", client="C1", max_backlog=5)
    q.subscribe("S2", client="C2", max_backlog=5)
    q.subscribe("S3", client="C3", filter="/kind = 'x'", max_backlog=5)
    publish(q, 1), publish(q, 2)
    publish(q, 3, {"sync": 1})  # B
    publish(q, 4, {"kind": "x"})  # m3 of the chapter
    assert q.message(m(3)).barrier  # type: ignore[union-attr]
    assert deliver(q) == [("S1", 1), ("S2", 2)]  # B and m3 held
    q.ack([m(1)], client="C1", now_ms=1)
    assert q.dispatch(1) == ([], [])
    q.ack([m(2)], client="C2", now_ms=2)
    leases, removed = q.dispatch(2)
    assert [(lease.sub_key, lease.barrier) for lease in leases[:2]] == [
        ("S1", True),
        ("S2", True),
    ]
    assert all(lease.lease_expires_ms is None for lease in leases[:2])
    assert reasons(removed) == [(3, "barrier")]
    assert sent(leases[2:]) == [("S1", 4)]  # delivered normally afterwards
    assert q.stats().backlog == {"S1": 1, "S2": 0, "S3": 0}  # the barrier counted for nobody
    assert q.ack([m(3)], client="C1", now_ms=3).results[m(3)] == AckResult.GONE


def test_barrier_held_is_browsable_and_cannot_be_acked() -> None:
    q = queue(barrier_expression="/sync = 1")
    publish(q, 1), publish(q, 2, {"sync": 1})
    assert [msg.bookmark.offset for msg in q.browse()] == [1, 2]
    assert q.ack([m(2)], client="C", now_ms=0).results[m(2)] == AckResult.IGNORED


def test_barrier_with_no_subscription_is_removed_when_due() -> None:
    q = queue(barrier_expression="/sync = 1")
    publish(q, 1, {"sync": 1})
    leases, removed = q.dispatch(0)
    assert leases == [] and reasons(removed) == [(1, "barrier")]


def test_consecutive_barriers_and_expiry_of_older_messages() -> None:
    q = queue(barrier_expression="/sync = 1", expiration_ms=10)
    q.subscribe("S1", client="C1")
    publish(q, 1), publish(q, 2, {"sync": 1}), publish(q, 3), publish(q, 4, {"sync": 1})
    assert deliver(q) == [("S1", 1)]
    removed = q.tick(11)  # m1 expires while leased: B2 goes out, then m3, B4 waits for m3
    assert reasons(removed) == [(1, "time_limit")]
    leases, removed = q.dispatch(11)
    assert [(lease.message.bookmark.offset, lease.barrier) for lease in leases] == [
        (2, True),
        (3, False),
    ]
    assert reasons(removed) == [(2, "barrier")]
    q.ack([m(3)], client="C1", now_ms=12)
    leases, removed = q.dispatch(12)
    assert [(lease.message.bookmark.offset, lease.barrier) for lease in leases] == [(4, True)]


def test_expired_barrier_is_not_broadcast() -> None:
    q = queue(barrier_expression="/sync = 1")
    q.subscribe("S1", client="C1")
    publish(q, 1), publish(q, 2, {"sync": 1}, expiration_ms=5), publish(q, 3)
    assert deliver(q) == [("S1", 1)]
    q.ack([m(1)], client="C1", now_ms=10)
    leases, removed = q.dispatch(10)  # no tick since the barrier expired: dispatch applies it
    assert reasons(removed) == [(2, "time_limit")]
    assert sent(leases) == [("S1", 3)]


def test_barrier_at_most_once_waits_for_acks_of_older_sends() -> None:
    q = queue(barrier_expression="/sync = 1", semantics="at-most-once")
    q.subscribe("S1", client="C1")
    publish(q, 1), publish(q, 2, {"sync": 1})
    assert deliver(q) == [("S1", 1)]
    assert q.dispatch(1) == ([], [])
    q.ack([m(1)], client="C1", now_ms=2)
    leases, _ = q.dispatch(2)
    assert [(lease.sub_key, lease.barrier) for lease in leases] == [("S1", True)]


def test_q14_max_backlog_is_queue_wide() -> None:
    q = queue(max_backlog=2, max_per_subscription_backlog=5, lease_period_ms=10)
    for sub in ("S1", "S2", "S3"):
        q.subscribe(sub, client=sub, max_backlog=5)
    for n in range(1, 6):
        publish(q, n)
    assert deliver(q) == [("S1", 1), ("S2", 2)]
    q.ack([m(1)], client="S1", now_ms=1)
    assert deliver(q, 1) == [("S1", 3)]
    assert q.stats().leased == q.stats().outstanding == 2
    q.ack([m(2)], client="S2", action="cancel", now_ms=2)  # a return frees the unit too
    assert deliver(q, 2) == [("S2", 2)]
    q.tick(100)  # so does a lease timeout
    assert q.stats().leased == 0
    assert deliver(q, 100) == [("S1", 2), ("S2", 3)]


def test_q15_time_expiration() -> None:
    q = queue(expiration_ms=10 * S, lease_period_ms=60 * S)
    publish(q, 1, timestamp_ms=0)
    publish(q, 2, timestamp_ms=0)
    publish(q, 3, timestamp_ms=0, expiration_ms=3 * S)  # the publish's own expiration
    publish(q, 4, timestamp_ms=0, expiration_ms=0)  # 0: never
    assert q.next_deadline() == 3 * S
    assert reasons(q.tick(3 * S)) == [(3, "time_limit")]
    q.subscribe("S1", client="C1")
    assert deliver(q, 9 * S) == [("S1", 1)]
    assert reasons(q.tick(10 * S)) == [(1, "time_limit"), (2, "time_limit")]
    assert q.stats().backlog == {"S1": 0}  # the unit is free at once
    assert q.ack([m(1)], client="C1", now_ms=12 * S).results[m(1)] == AckResult.GONE
    assert deliver(q, 12 * S) == [("S1", 4)]
    assert q.stats().expired == {"time_limit": 3}
    assert q.next_deadline() == 72 * S  # the lease of m4


def test_expired_message_met_by_dispatch_is_removed() -> None:
    q = queue(expiration_ms=10)
    publish(q, 1, timestamp_ms=0)
    q.subscribe("S1", client="C1")
    leases, removed = q.dispatch(20)
    assert leases == [] and reasons(removed) == [(1, "time_limit")]


def test_q16_browsing_sees_available_messages_only() -> None:
    q = queue()
    q.subscribe("S1", client="C1")
    for n in (1, 2, 3):
        publish(q, n, {"n": n})
    deliver(q)
    assert [msg.bookmark.offset for msg in q.browse()] == [2, 3]
    assert [msg.bookmark.offset for msg in q.browse("/n > 2")] == [3]
    assert [msg.bookmark.offset for msg in q.leases()] == [1]
    q.subscribe("S2", client="C2")
    assert deliver(q) == [("S2", 2)]  # browsing took nothing
    q.ack([m(1)], client="C1", action="cancel", now_ms=1)
    assert [msg.bookmark.offset for msg in q.browse()] == [1, 3]


def test_q17_replace_keeps_leases() -> None:
    q = queue(max_per_subscription_backlog=2, lease_period_ms=5 * S)
    assert q.subscribe("S1", client="C1", filter="/region = 'EU'", max_backlog=2) == 2
    publish(q, 1, {"region": "EU"}), publish(q, 2, {"region": "EU"})
    assert deliver(q) == [("S1", 1), ("S1", 2)]
    q.subscribe("S1", client="C1", filter="/region = 'US'", max_backlog=2)
    assert [msg.bookmark.offset for msg in q.leases("S1")] == [1, 2]
    q.subscribe("S2", client="C2")
    publish(q, 3, {"region": "EU"}), publish(q, 4, {"region": "US"})
    assert deliver(q) == [("S2", 3)]
    q.ack([m(1)], client="C1", now_ms=1)
    assert deliver(q, 1) == [("S1", 4)]


def test_replace_to_a_smaller_backlog_waits_until_below_it() -> None:
    q = queue(max_per_subscription_backlog=3)
    q.subscribe("S1", client="C1", max_backlog=3)
    for n in (1, 2, 3, 4):
        publish(q, n)
    assert len(deliver(q)) == 3
    assert q.subscribe("S1", client="C1", max_backlog=1) == 1
    q.ack([m(1)], client="C1", now_ms=1)
    assert deliver(q, 1) == []
    q.ack([m(2), m(3)], client="C1", now_ms=2)
    assert deliver(q, 2) == [("S1", 4)]


def test_q18_fan_out_each_queue_is_independent() -> None:
    # The routing of a publish into both queues (which topics feed which queue) is configuration
    # (test_queue_config) and the engine's; here one log record enters two queues' machines.
    analytics = QueueMachine(
        QueueConfig(
            name="ORDERS_ANALYTICS",
            underlying_topic="^ORDERS$|^ORDERS_ANALYTICS_DIRECT$",
            default_publish_target="ORDERS_ANALYTICS_DIRECT",
        )
    )
    risk = QueueMachine(
        QueueConfig(
            name="ORDERS_RISK",
            underlying_topic="^ORDERS$|^ORDERS_RISK_DIRECT$",
            default_publish_target="ORDERS_RISK_DIRECT",
        )
    )
    order = Bookmark("ORDERS", 0, 0)
    for machine in (analytics, risk):
        assert machine.append(order, b"{}", {"id": 1}, 0)
        machine.subscribe("S", client="C")
        assert [lease.message.bookmark for lease in machine.dispatch(0)[0]] == [order]
    assert analytics.ack([order], client="C", now_ms=1).results[order] == AckResult.REMOVED
    assert analytics.stats().depth == 0
    assert risk.stats().depth == 1 and risk.leases()[0].bookmark == order


def test_q19_deferred_ack() -> None:
    q = queue(deferred_ack_expiration_ms=10 * 60 * S)
    outcome = q.ack([m(1), m(2)], client="C1", now_ms=0)
    assert outcome.results == {m(1): AckResult.DEFERRED, m(2): AckResult.DEFERRED}
    assert q.stats().deferred_acks == 2
    assert q.next_deadline() == 10 * 60 * S
    q.tick(5 * 60 * S)
    assert not publish(q, 1)  # arrived 5 minutes later: counts as acknowledged
    assert q.stats().acked == 1 and q.stats().depth == 0
    q.tick(10 * 60 * S)  # the ack for m2 is forgotten
    assert q.stats().deferred_acks == 0
    assert publish(q, 2)
    q.subscribe("S1", client="C1")
    assert deliver(q, 10 * 60 * S) == [("S1", 2)]


def test_deferred_ack_past_its_time_is_ignored_even_before_a_tick() -> None:
    q = queue(deferred_ack_expiration_ms=100)
    q.ack([m(1)], client="C1", now_ms=0)
    q.ack([m(9)], client="C1", now_ms=500)  # the machine has now seen t=500
    assert publish(q, 1)


def test_q20_each_publish_to_a_sow_topic_is_its_own_message() -> None:
    # Deletes and out-of-focus events never reach the machine, and a delta_publish arrives as
    # the merged record: both are the engine's. Same key, three publishes, three messages.
    q = QueueMachine(QueueConfig(name="OQ", underlying_topic="orders"))
    for offset, body in enumerate([{"id": 1, "v": 1}, {"id": 1, "v": 2}, {"id": 1, "v": 3}]):
        assert q.append(Bookmark("orders", 0, offset), b"", body, offset)
    assert [msg.body["v"] for msg in q.browse()] == [1, 2, 3]


def test_q21_unsubscribe() -> None:
    q = queue()
    q.subscribe("S1", client="C1")
    publish(q, 1)
    deliver(q)
    assert q.unsubscribe("S1", 1) == []
    (msg,) = q.browse()
    assert msg.deliveries == 1 and msg.leased_to is None
    assert q.stats().returned == 1

    q = queue(max_deliveries=1)
    q.subscribe("S1", client="C1")
    publish(q, 1)
    deliver(q)
    assert reasons(q.unsubscribe("S1", 1)) == [(1, "max_deliveries")]
    assert q.unsubscribe("S1", 2) == []  # unknown now: nothing to do


# Q22 (a subscribe with a bookmark replays the log without leases) never reaches the machine:
# the engine serves it as a plain bookmark replay of the underlying topics.


# --- Acknowledgement details ---


def test_ack_filter_respects_strict_leasing() -> None:
    q = queue(leasing="strict", max_per_subscription_backlog=5)
    q.subscribe("S1", client="C1", max_backlog=5)
    for n in (1, 2, 3):
        publish(q, n, {"n": n})
    q.subscribe("S2", client="C2", filter="/n = 1")
    q.dispatch(0)  # m1 goes to S1 (registered first), m2 and m3 too
    publish(q, 4, {"n": 4})
    q.unsubscribe("S1", 1)
    q.subscribe("S1", client="C1", max_backlog=5)
    leases, _ = q.dispatch(1)
    holder = {lease.message.bookmark.offset: lease.sub_key for lease in leases}
    assert holder[1] == "S2"
    outcome = q.ack_filter("/n < 4", client="C1", now_ms=2)
    assert outcome.results == {
        m(1): AckResult.IGNORED,
        m(2): AckResult.REMOVED,
        m(3): AckResult.REMOVED,
    }
    assert reasons(outcome.removed) == [(2, ""), (3, "")]


def test_ack_unknown_action_and_bad_filters() -> None:
    q = queue()
    with pytest.raises(ValueError, match="unknown acknowledgement action"):
        q.ack([m(1)], client="C", action="drop", now_ms=0)
    with pytest.raises(FilterError):
        q.subscribe("S1", client="C", filter="/a = = 1")
    assert q.effective_backlog("S1") is None
    with pytest.raises(ValueError, match="at least 1"):
        q.subscribe("S1", client="C", max_backlog=0)


def test_cancel_of_an_unleased_message_does_nothing_and_expire_removes_it() -> None:
    q = queue()
    publish(q, 1), publish(q, 2)
    assert q.ack([m(1)], client="C", action="cancel", now_ms=0).results[m(1)] == (AckResult.IGNORED)
    outcome = q.ack([m(2)], client="C", action="expire", now_ms=0)
    assert reasons(outcome.removed) == [(2, "forced_expire")]


def test_max_cancels_wins_over_max_deliveries() -> None:
    q = queue(max_cancels=1, max_deliveries=1)
    q.subscribe("S1", client="C1")
    publish(q, 1)
    deliver(q)
    outcome = q.ack([m(1)], client="C1", action="cancel", now_ms=1)
    assert reasons(outcome.removed) == [(1, "max_cancels")]


def test_entitlements_limit_candidates() -> None:
    def entitled(identity: str, body: dict[str, Any]) -> bool:
        return identity == "admin" or body.get("public") is True

    q = QueueMachine(QueueConfig(name="WQ", underlying_topic="work"), entitled)
    q.subscribe("S1", client="C1", identity="guest")
    q.subscribe("S2", client="C2", identity="admin")
    publish(q, 1, {"public": False}), publish(q, 2, {"public": True})
    assert deliver(q) == [("S2", 1), ("S1", 2)]


# --- Replays and partitions ---


def test_append_is_idempotent_and_skips_replays() -> None:
    q = queue(filter="/keep = true")
    assert publish(q, 1, {"keep": True})
    assert not publish(q, 1, {"keep": True})  # the same record again
    assert not publish(q, 2, {"keep": False})  # filtered out
    assert publish(q, 3, {"keep": True})
    q.subscribe("S1", client="C1")
    deliver(q)
    q.ack([m(1)], client="C1", now_ms=1)
    assert not publish(q, 1, {"keep": True})  # acknowledged: never again
    assert q.ack([m(2)], client="C1", now_ms=1).results[m(2)] == AckResult.GONE
    assert [msg.bookmark.offset for msg in q.browse()] == [3]


def test_drop_partition_forgets_messages_leases_and_acks() -> None:
    q = queue(max_per_subscription_backlog=5, lease_period_ms=10)
    q.subscribe("S1", client="C1", max_backlog=5)
    publish(q, 1), publish(q, 2)
    q.append(m(5, partition=1), b"", {}, 5)
    deliver(q)
    q.ack([m(9)], client="C1", now_ms=0)  # deferred, on partition 0
    q.drop_partition("work", 0)
    assert [msg.bookmark for msg in q.leases()] == [m(5, partition=1)]
    stats = q.stats()
    assert (stats.depth, stats.outstanding, stats.deferred_acks) == (1, 1, 0)
    assert q.tick(100) == []  # no stale deadlines fire
    # The partition comes back: rebuilt from the log by the engine.
    assert publish(q, 1)
    assert deliver(q, 100)[0] == ("S1", 1)


def test_dispatch_with_nothing_new_does_no_work() -> None:
    q = queue(max_per_subscription_backlog=2)
    q.subscribe("S1", client="C1", filter="/x = 1", max_backlog=2)
    for n in range(1, 200):
        publish(q, n, {"x": 0})
    assert deliver(q) == []
    calls = 0

    def counting(identity: str, body: dict[str, Any]) -> bool:
        nonlocal calls
        calls += 1
        return True

    q._entitled = counting
    assert q.dispatch(1) == ([], [])
    publish(q, 500, {"x": 1})
    assert deliver(q, 2) == [("S1", 500)]
    assert calls == 1  # only the new message was examined
    publish(q, 501, {"x": 1})
    q.ack([m(500)], client="C1", now_ms=3)
    assert deliver(q, 3) == [("S1", 501)]
    assert calls == 2


# --- Properties ---

SUBS = ("A", "B", "C")
CLIENT = {"A": "c1", "B": "c2", "C": "c1"}
FILTERS = (None, "/k = 0", "/k < 2")

# Each step is one command; the engine dispatches after every event, and so does the test.
op = st.one_of(
    st.tuples(
        st.just("subscribe"), st.sampled_from(SUBS), st.sampled_from(FILTERS), st.integers(1, 4)
    ),
    st.tuples(st.just("append"), st.integers(0, 1), st.integers(0, 2), st.integers(0, 3)),
    st.tuples(st.just("append"), st.integers(0, 1), st.integers(0, 2), st.integers(0, 3)),
    st.tuples(
        st.just("ack"),
        st.sampled_from(("", "", "cancel", "expire")),
        st.integers(0, 50),
        st.booleans(),  # True: any bookmark seen so far; False: one that is leased now
        st.booleans(),  # True: sent by the holder's client; False: by the other client
    ),
    st.tuples(st.just("ack_filter"), st.sampled_from(SUBS)),
    st.tuples(st.just("tick"), st.integers(0, 12)),
    st.tuples(st.just("wait"), st.integers(0, 12)),  # time passes; only dispatch sees it
    st.tuples(st.just("unsubscribe"), st.sampled_from(SUBS)),
    st.tuples(st.just("disconnect"), st.sampled_from(("c1", "c2"))),
    st.tuples(st.just("replay"), st.integers(0, 50)),
)

config_settings = st.fixed_dictionaries(
    {
        "semantics": st.sampled_from(["at-least-once", "at-least-once", "at-most-once"]),
        "max_backlog": st.sampled_from([None, 1, 3]),
        "max_per_subscription_backlog": st.integers(1, 3),
        "lease_period_ms": st.sampled_from([None, 5, 20]),
        "expiration_ms": st.sampled_from([None, 40]),
        "max_deliveries": st.integers(0, 3),
        "max_cancels": st.integers(0, 2),
        "leasing": st.sampled_from(["strict", "sublet"]),
        "fairness": st.sampled_from(["fast", "round-robin", "proportional"]),
        "ordering": st.sampled_from(["plain", "priority", "barrier"]),
    }
)


def build(settings_: dict[str, Any]) -> QueueMachine:
    settings_ = dict(settings_)
    ordering = settings_.pop("ordering")
    fairness = settings_.pop("fairness")
    if settings_["semantics"] == "at-least-once":
        settings_["fairness_model"] = fairness
    if ordering == "priority":
        settings_["priority"] = "/p"
    elif ordering == "barrier":
        settings_["barrier_expression"] = "/p = 3"
    return queue(**settings_)


class Model:
    """What the test knows from the machine's answers alone."""

    def __init__(self, q: QueueMachine) -> None:
        self.q = q
        self.now = 0
        self.offsets = [0, 0]
        self.bookmarks: list[Bookmark] = []
        self.accepted: set[Bookmark] = set()
        self.removed: set[Bookmark] = set()
        self.acked: set[Bookmark] = set()
        self.effective: dict[str, int] = {}
        self.filters: dict[str, str | None] = {}
        self.holder: dict[Bookmark, str] = {}  # bookmark -> subscription, from the leases

    def note(self, gone: list[Removed]) -> None:
        for r in gone:
            b = r.message.bookmark
            assert b in self.accepted and b not in self.removed, f"{b} removed twice"
            self.removed.add(b)
            if r.reason == "":
                self.acked.add(b)

    def dispatch(self) -> None:
        leases, gone = self.q.dispatch(self.now)
        self.note(gone)
        keys = [lease.message.key for lease in leases if not lease.barrier]
        assert keys == sorted(set(keys)), "leases out of delivery order"
        granted: dict[str, int] = {}
        for lease in leases:
            b = lease.message.bookmark
            assert b in self.accepted
            assert b not in self.acked, "an acknowledged message was delivered again"
            if not lease.barrier:
                assert lease.sub_key in self.effective
                self.holder[b] = lease.sub_key
                granted[lease.sub_key] = granted.get(lease.sub_key, 0) + 1
        held = self.q.stats().backlog
        for sub in granted:
            # Leases only go to a subscription below its effective backlog (a replace may have
            # lowered it under what it already holds: then it gets nothing).
            assert held[sub] <= self.effective[sub]
        self.nothing_left_behind()

    def nothing_left_behind(self) -> None:
        """After a dispatch, no subscription with room matches a deliverable message."""
        q, stats = self.q, self.q.stats()
        if q.config.max_backlog is not None and stats.outstanding >= q.config.max_backlog:
            return
        waiting = []
        for msg in q.browse():  # delivery order; a held barrier blocks what follows it
            if msg.barrier:
                break
            waiting.append(msg)
        for sub, backlog in self.effective.items():
            if stats.backlog[sub] >= backlog:
                continue
            text = self.filters[sub]
            flt = compile_filter(text) if text else None
            for msg in waiting:
                assert flt is not None and not flt.matches(msg.body), (
                    f"{sub} has room but {msg.bookmark} was not delivered"
                )

    def check(self) -> None:
        q, stats = self.q, self.q.stats()
        if q.config.max_backlog is not None:
            assert stats.outstanding <= q.config.max_backlog
        available = {msg.bookmark for msg in q.browse()}
        leased = {msg.bookmark for msg in q.leases()}
        # Expired but not yet ticked: still in the queue, hidden from browsing.
        due = {
            b
            for b in self.accepted
            if (msg := q.message(b)) is not None
            and msg.leased_to is None
            and msg.expires_at_ms is not None
            and msg.expires_at_ms <= self.now
        }
        assert not available & leased
        assert not (available | leased | due) & self.removed
        assert available | leased | due | self.removed == self.accepted
        assert stats.depth == len(available | leased | due)
        assert stats.leased == len(leased)
        if q.config.semantics == "at-most-once":
            assert not leased
        else:
            assert stats.outstanding == len(leased)
            for sub, held in stats.backlog.items():
                assert held == len(q.leases(sub))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(settings_=config_settings, ops=st.lists(op, min_size=20, max_size=120))
def test_random_sequences_keep_the_invariants(
    settings_: dict[str, Any], ops: list[tuple[Any, ...]]
) -> None:
    q = build(settings_)
    model = Model(q)
    for step in ops:
        kind = step[0]
        if kind == "subscribe":
            _, sub, flt, want = step
            model.effective[sub] = q.subscribe(
                sub, client=CLIENT[sub], filter=flt, max_backlog=want
            )
            model.filters[sub] = flt
        elif kind == "append":
            _, partition, k, p = step
            b = Bookmark("work", partition, model.offsets[partition])
            model.offsets[partition] += 1
            model.bookmarks.append(b)
            if q.append(b, b.text().encode(), {"k": k, "p": p}, model.now):
                model.accepted.add(b)
        elif kind == "replay" and model.bookmarks:
            b = model.bookmarks[step[1] % len(model.bookmarks)]
            before = q.stats()
            assert not q.append(b, b"again", {"k": 0, "p": 3}, model.now)
            assert q.stats() == before
        elif kind == "ack" and model.bookmarks:
            _, action, index, anything, own = step
            leased = q.leases()
            pool = model.bookmarks if anything or not leased else [x.bookmark for x in leased]
            b = pool[index % len(pool)]
            sub = model.holder.get(b, "A")
            client = CLIENT[sub] if own else ("c2" if CLIENT[sub] == "c1" else "c1")
            model.note(q.ack([b], client=client, action=action, now_ms=model.now).removed)
        elif kind == "ack_filter":
            model.note(q.ack_filter("/k = 1", client=CLIENT[step[1]], now_ms=model.now).removed)
        elif kind == "tick":
            model.now += step[1]
            model.note(q.tick(model.now))
        elif kind == "wait":
            model.now += step[1]
        elif kind == "unsubscribe":
            model.effective.pop(step[1], None)
            model.note(q.unsubscribe(step[1], model.now))
        elif kind == "disconnect":
            for sub in [s for s in model.effective if CLIENT[s] == step[1]]:
                model.effective.pop(sub)
            model.note(q.disconnect(step[1], model.now))
        model.dispatch()
        model.check()


@settings(max_examples=200, deadline=None)
@given(
    appends=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), min_size=1, max_size=30),
    replay_from=st.integers(0, 29),
    acks=st.lists(st.integers(0, 29), max_size=5),
)
def test_replaying_the_log_changes_nothing(
    appends: list[tuple[int, int]], replay_from: int, acks: list[int]
) -> None:
    q = queue(filter="/k != 0", priority="/k", max_per_subscription_backlog=3)
    q.subscribe("S", client="C", max_backlog=3)
    offsets = [0, 0, 0]
    log = []
    for partition, k in appends:
        b = Bookmark("work", partition, offsets[partition])
        offsets[partition] += 1
        log.append((b, {"k": k}))
        q.append(b, b"", {"k": k}, len(log))
    q.dispatch(0)
    q.ack([log[i % len(log)][0] for i in acks], client="C", now_ms=1)
    q.dispatch(1)
    before = (q.stats(), [msg.bookmark for msg in q.browse()], [msg.bookmark for msg in q.leases()])
    for time, (b, body) in enumerate(log[replay_from % len(log) :]):
        assert not q.append(b, b"", body, time)
    assert q.dispatch(2) == ([], [])
    after = (q.stats(), [msg.bookmark for msg in q.browse()], [msg.bookmark for msg in q.leases()])
    assert after == before


def test_target_queue_depth_keeps_later_messages_inactive_until_room() -> None:
    """Beyond TargetQueueDepth messages wait, undeliverable and unbrowsable, in arrival order;
    each removal activates the next; an ack of an inactive one removes it before delivery."""
    q = QueueMachine(QueueConfig(name="TQ", underlying_topic="work", target_queue_depth=1000))
    for offset in range(1003):
        assert q.append(Bookmark("work", 0, offset), b"{}", {}, 1)
    assert q.stats().depth == 1000 and q.stats().inactive == 3
    assert len(q.browse()) == 1000
    outcome = q.ack([Bookmark("work", 0, 1001)], client="c", now_ms=2)
    assert [r.message.bookmark.offset for r in outcome.removed] == [1001]
    q.ack([Bookmark("work", 0, 0), Bookmark("work", 0, 1)], client="c", now_ms=3)
    assert q.stats().inactive == 0 and q.stats().depth == 1000
    offsets = [m.bookmark.offset for m in q.browse()]
    assert offsets[-2:] == [1000, 1002]


# --- ExpirationModel (AMPS 5.3.5): how a publish's own expiration and the queue's combine ---


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        # m1: no expiration of its own; m2: 3 s; m3: 30 s; m4: 0 (never). Queue: 10 s.
        ("default", {1: 10, 2: 3, 3: 30, 4: None}),
        ("queue", {1: 10, 2: 10, 3: 10, 4: 10}),
        ("latest", {1: 10, 2: 10, 3: 30, 4: None}),
        ("earliest", {1: 10, 2: 3, 3: 10, 4: 10}),
    ],
)
def test_expiration_model(model: str, expected: dict[int, int | None]) -> None:
    q = queue(expiration_ms=10 * S, expiration_model=model)
    publish(q, 1, timestamp_ms=0)
    publish(q, 2, timestamp_ms=0, expiration_ms=3 * S)
    publish(q, 3, timestamp_ms=0, expiration_ms=30 * S)
    publish(q, 4, timestamp_ms=0, expiration_ms=0)
    got = {}
    for n in expected:
        message = q.message(m(n))
        assert message is not None
        at = message.expires_at_ms
        got[n] = None if at is None else at // S
    assert got == expected
    removed = q.tick(10 * S)
    assert sorted(r.message.bookmark.offset for r in removed) == sorted(
        n for n, s in expected.items() if s is not None and s <= 10
    )


@pytest.mark.parametrize(
    ("model", "own", "queue_ms", "lifetime"),
    [
        ("default", None, None, None),
        ("latest", 5, None, None),  # no queue Expiration: never, which is later
        ("earliest", 5, None, 5),
        ("earliest", 0, None, None),
        ("queue", 5, None, None),
        ("latest", None, 7, 7),
    ],
)
def test_message_lifetime_without_a_queue_expiration(
    model: str, own: int | None, queue_ms: int | None, lifetime: int | None
) -> None:
    from sowstream.queues.machine import message_lifetime

    assert message_lifetime(model, own, queue_ms) == lifetime


# --- Monitoring figures: seconds_behind, age_of_oldest_lease, priority_count ---


def test_queue_ages_follow_leases_and_acks() -> None:
    from sowstream.queues.machine import queue_ages

    q = queue(priority="/p", max_per_subscription_backlog=5)
    publish(q, 1, {"p": 5}, timestamp_ms=1 * S)
    publish(q, 2, {"p": 5}, timestamp_ms=2 * S)
    publish(q, 3, {}, timestamp_ms=3 * S)  # no value: ranks as 0
    publish(q, 4, {"p": 9}, timestamp_ms=4 * S)

    def ages(now: int) -> tuple[float, float, int, tuple[int, ...] | None]:
        found = queue_ages(q.browse() + q.leases(), now, prioritised=True)
        return (
            found.seconds_behind,
            found.age_of_oldest_lease,
            found.priority_count,
            found.priorities,
        )

    assert ages(10 * S) == (9.0, 0.0, 3, (0, 5, 9))
    q.subscribe("S1", client="C1", max_backlog=2)
    assert deliver(q, 10 * S) == [("S1", 4), ("S1", 1)]
    assert ages(12 * S) == (11.0, 2.0, 3, (0, 5, 9))
    q.ack([m(1)], client="C1", now_ms=12 * S)
    assert deliver(q, 13 * S) == [("S1", 2)]
    assert ages(14 * S) == (12.0, 4.0, 3, (0, 5, 9))  # m2 (2 s) is the oldest now
    q.ack([m(4)], client="C1", now_ms=14 * S)
    assert ages(14 * S)[2:] == (2, (0, 5))
    q.ack([m(2), m(3)], client="C1", now_ms=14 * S)
    assert ages(15 * S) == (0.0, 0.0, 0, ())
    plain = queue()
    publish(plain, 1, {"p": 1})
    assert queue_ages(plain.browse(), 5, prioritised=False).priority_count == 0


def test_queue_ages_stop_listing_priorities_beyond_the_cap() -> None:
    from sowstream.queues.machine import PRIORITIES_LISTED, queue_ages

    q = queue(priority="/p")
    for n in range(PRIORITIES_LISTED + 1):
        publish(q, n + 1, {"p": n})
    found = queue_ages(q.browse(), 0, prioritised=True)
    assert (found.priority_count, found.priorities) == (PRIORITIES_LISTED + 1, None)


def test_a_subscription_over_several_queues_takes_the_smallest_limit() -> None:
    q = queue(max_per_subscription_backlog=5)
    assert q.subscribe("S1", client="C1", max_backlog=10, limit=2) == 2
    assert q.subscribe("S2", client="C1", max_backlog=10, limit=8) == 5
    assert q.subscribe("S3", client="C1", limit=8) == 1


def test_a_backlog_shared_by_two_queues_counts_what_both_lease() -> None:
    from sowstream.queues.machine import BacklogShare

    qa = QueueMachine(QueueConfig(name="QA", underlying_topic="a", max_per_subscription_backlog=5))
    qb = QueueMachine(QueueConfig(name="QB", underlying_topic="b", max_per_subscription_backlog=5))
    woken: list[str] = []
    qa.on_wake = lambda: woken.append("QA")
    qb.on_wake = lambda: woken.append("QB")
    share = BacklogShare()
    for q in (qa, qb):
        assert q.subscribe("S1", client="C1", max_backlog=2, share=share) == 2
    for n in range(1, 4):
        qa.append(Bookmark("a", 0, n), b"a", {"n": n}, n)
        qb.append(Bookmark("b", 0, n), b"b", {"n": n}, n)
    assert sent(qa.dispatch(0)[0]) == [("S1", 1), ("S1", 2)]
    assert qb.dispatch(0)[0] == []  # the subscription holds its 2 already
    assert woken == []
    qa.ack([Bookmark("a", 0, 1)], client="C1", now_ms=1)
    assert woken == ["QB"]  # room again: the other queue is told
    assert sent(qb.dispatch(1)[0]) == [("S1", 1)]
    assert qa.dispatch(1)[0] == []
    assert qa.stats().backlog == {"S1": 1} and qb.stats().backlog == {"S1": 1}
    qb.unsubscribe("S1", 2)  # its lease returns; the share counts QA's only
    assert woken == ["QB", "QA"]
    assert sent(qa.dispatch(2)[0]) == [("S1", 3)]
    assert share.held() == 2
    qa.unsubscribe("S1", 3)
    assert share.empty
