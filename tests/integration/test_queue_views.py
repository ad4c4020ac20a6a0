"""Views over queues end to end on a real broker (V15): a view sees a queue's available
messages only, through the topic the engine keeps of them (``WQ.available``).

One worker, so the lease order is the queue's; the views chapter's worked example V15 is
followed step by step, then a join with a queue as one side, then a SIGKILL with a lease out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from sowstream.client import Client, QueueSubscription, Subscription
from tests.support.engine import QUICK_SESSION_TIMEOUT, EngineProcesses, running_engine
from tests.support.messages import eventually, take

pytestmark = pytest.mark.integration

TOPICS: list[dict[str, Any]] = [{"Name": "kinds", "Key": ["/kind"], "Partitions": 2}]
PLAIN = [{"Name": "work", "Partitions": 2}]
QUEUES = [{"Name": "WQ", "UnderlyingTopic": "work"}]  # backlog 1, leases never time out
VIEWS: list[dict[str, Any]] = [
    {
        "Name": "by_kind",
        "UnderlyingTopic": "WQ",
        "Projection": ["/kind AS /kind", "COUNT(/job) AS /n"],
        "Grouping": ["/kind"],
        "Partitions": 2,
    },
    {
        # A queue as one side of a join: what waits per kind, next to the kind's limit.
        "Name": "waiting",
        "UnderlyingTopic": {"Join": ["[kinds]./kind = [WQ]./kind"]},
        "Projection": [
            "[kinds]./kind AS /kind",
            "[kinds]./limit AS /limit",
            "COUNT([WQ]./job) AS /waiting",
        ],
        "Grouping": ["[kinds]./kind"],
        "Partitions": 2,
    },
]


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    with running_engine(
        kafka_bootstrap,
        tmp_path_factory.mktemp("queue-views"),
        TOPICS,
        workers=("w1",),
        session_timeout=QUICK_SESSION_TIMEOUT,  # a test kills the worker and starts it again
        plain_topics=PLAIN,
        queues=QUEUES,
        views=VIEWS,
    ) as procs:
        yield procs


def counts(client: Client, view: str = "by_kind", field: str = "n") -> dict[str, Any]:
    return {m.json()["kind"]: m.json().get(field) for m in client.sow(view) if m.command == "sow"}


def available(client: Client) -> dict[str, int]:
    """What the queue shows as available, counted by kind: the view must say the same."""
    return dict(Counter(m.json()["kind"] for m in client.sow("WQ") if m.command == "sow"))


def changes(sub: Subscription, n: int) -> list[tuple[str, str, Any]]:
    """The next ``n`` view messages as (command, kind, n)."""
    return [(m.command, m.json()["kind"], m.json().get("n")) for m in take(sub, n)]


def queue_sub(client: Client, filter: str) -> QueueSubscription:
    sub = client.subscribe("WQ", filter)
    assert isinstance(sub, QueueSubscription)
    return sub


def settle(sub: Subscription) -> None:
    """Nothing more arrives on the view subscription for a moment."""
    extra = sub.next(timeout=2.0)
    assert extra is None, f"unexpected view message {extra}"


def test_v15_leasing_cancelling_and_acknowledging_move_the_counts(
    client: Client, publisher: Client
) -> None:
    """V15: a lease decrements its kind, a cancel increments it again, an acknowledgement
    removes the message for good; the last message of a kind leased deletes the group, which
    an oof subscriber is told."""
    for job, kind in ((1, "a"), (2, "a"), (3, "b")):
        publisher.publish("work", {"job": job, "kind": kind})
    publisher.flush()
    eventually(lambda: counts(client), {"a": 2, "b": 1})
    view = client.sow_and_subscribe("by_kind", options="oof")
    assert [m.command for m in take(view, 4)].count("sow") == 2

    qa = queue_sub(client, "/kind = 'a'")
    first = take(qa, 1)[0]
    assert first.json() == {"job": 1, "kind": "a"}
    assert changes(view, 1) == [("publish", "a", 1)]  # leased: no longer available

    qa.cancel(first)
    qa.flush_acks()
    again = take(qa, 1)[0]  # back in the queue, and leased again at once (it is the oldest)
    assert again.bookmark == first.bookmark and again.deliveries == 2
    assert changes(view, 2) == [("publish", "a", 2), ("publish", "a", 1)]

    qa.ack(again)
    qa.flush_acks()
    second = take(qa, 1)[0]  # the acknowledged one is gone for good; job 2 is leased
    assert second.json() == {"job": 2, "kind": "a"}
    (gone,) = take(view, 1)
    assert (gone.command, gone.reason, gone.json()) == ("oof", "deleted", {"kind": "a", "n": 1})
    settle(view)
    assert counts(client) == {"b": 1} == available(client)

    qa.close()  # job 2 returns; job 1 stays acknowledged
    assert changes(view, 1) == [("publish", "a", 1)]
    eventually(lambda: available(client), {"a": 1, "b": 1})
    assert counts(client) == {"a": 1, "b": 1}
    assert {m.json()["job"] for m in client.sow("WQ") if m.command == "sow"} == {2, 3}
    view.close()


def test_a_join_with_a_queue_side_counts_what_waits(client: Client, publisher: Client) -> None:
    """A queue may be one side of a join: its available messages are the rows."""
    drain(client)
    publisher.publish("kinds", {"kind": "c", "limit": 5})
    for job in (10, 11):
        publisher.publish("work", {"job": job, "kind": "c"})
    publisher.flush()
    eventually(lambda: counts(client, "waiting", "waiting"), {"c": 2})
    qc = queue_sub(client, "/kind = 'c'")
    leased = take(qc, 1)[0]
    eventually(lambda: counts(client, "waiting", "waiting"), {"c": 1})
    qc.ack(leased)
    qc.flush_acks()
    last = take(qc, 1)[0]
    # No message of kind c is available: the preserved kinds row stays, with COUNT 0.
    eventually(lambda: counts(client, "waiting", "waiting"), {"c": 0})
    qc.ack(last)
    qc.close()
    eventually(lambda: counts(client, "waiting", "waiting"), {"c": 0})
    # Two other views over the same statements: each settles on its own.
    eventually(lambda: (counts(client), available(client)), ({}, {}))


def drain(client: Client) -> None:
    """Acknowledge whatever an earlier test left available."""
    left = [m.sow_key for m in client.sow("WQ") if m.command == "sow"]
    if left:
        client.ack("WQ", left)
    eventually(lambda: counts(client), {})


def test_a_lease_lost_with_its_worker_comes_back_to_the_view(
    engine: EngineProcesses, client: Client, publisher: Client
) -> None:
    """After a SIGKILL the restarted worker makes every stored message available again (leases
    are in memory only) and says so: the view counts the leased message again, never the
    acknowledged one."""
    drain(client)
    for job, kind in ((20, "d"), (21, "d"), (22, "e")):
        publisher.publish("work", {"job": job, "kind": kind})
    publisher.flush()
    eventually(lambda: counts(client), {"d": 2, "e": 1})
    holder = engine.client()
    qd = holder.subscribe("WQ", "/kind = 'd'")
    done = take(qd, 1)[0]
    assert client.ack("WQ", done.bookmark) == 1  # answered once the removal is stored
    assert take(qd, 1)[0].json() == {"job": 21, "kind": "d"}  # leased when the worker dies
    eventually(lambda: counts(client), {"e": 1})
    engine.stop("w1", kill=True)
    holder.close()  # its subscription leaves the registry: nobody leases job 21 again
    engine.start("w1")
    engine.wait_ready(["kinds", "by_kind", "WQ.available"])
    eventually(lambda: counts(client), {"d": 1, "e": 1}, timeout=60)
    assert available(client) == {"d": 1, "e": 1}
    assert {m.json()["job"] for m in client.sow("WQ") if m.command == "sow"} == {21, 22}


def test_a_rebalance_keeps_the_counts(
    engine: EngineProcesses, client: Client, publisher: Client
) -> None:
    """A second worker takes partitions over and states their messages again; nothing is
    counted twice, and leases and acknowledgements after the move still show."""
    drain(client)
    for job in range(30, 36):
        publisher.publish("work", {"job": job, "kind": "f"})
    publisher.flush()
    eventually(lambda: counts(client), {"f": 6})
    engine.start("w2")
    try:
        engine.wait_ready(["kinds", "by_kind", "WQ.available"])
        eventually(lambda: available(client), {"f": 6})
        assert counts(client) == {"f": 6}
        qf = queue_sub(client, "/kind = 'f'")
        leased = take(qf, 1)
        while (more := qf.next(timeout=2.0)) is not None:  # each worker may lease it one
            leased.append(more)
        eventually(lambda: counts(client), {"f": 6 - len(leased)})
        qf.close()
        done = leased[0]
        assert client.ack("WQ", done.bookmark) == 1
        eventually(lambda: counts(client), {"f": 5})
    finally:
        engine.stop("w2")
    engine.wait_ready(["kinds", "by_kind", "WQ.available"])
    eventually(lambda: counts(client), {"f": 5})
    assert available(client) == {"f": 5}
