"""One queue served by three workers behaves as one queue (docs/queues.md, "Several workers").

Each worker leases only within the credit a subscription grants it (sowstream.queues.credits),
so a subscription holds at most its backlog in total, and the best available message is leased
first whichever worker holds it. The chapter's worked examples that tests/integration/
test_queues.py runs on one worker run here again on three, over topics of three partitions
(each worker holds one, so every queue is in credit mode).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sowstream.client import Client
from tests.integration import test_queues as one_worker
from tests.integration.test_queues import (
    test_a_barrier_waits_for_everything_before_it_then_goes_to_every_subscriber,
    test_at_most_once_removes_on_delivery,
    test_cancel_returns_and_max_cancels_expires_to_the_dead_letter_topic,
    test_default_backlog_is_one_and_an_ack_brings_the_next,
    test_lease_timeout_redelivers_with_a_higher_count,
    test_priority_orders_delivery,
    test_strict_leasing_ignores_an_ack_from_another_client,
)
from tests.support.engine import EngineProcesses, running_engine
from tests.support.messages import take

pytestmark = pytest.mark.integration

WORKERS = ("w1", "w2", "w3")
SPREAD = 6  # partitions of the topics below: two per worker
PLAIN: list[dict[str, Any]] = [
    *({**topic, "Partitions": 3} for topic in one_worker.PLAIN),
    {"Name": "spread", "Key": ["/n"], "Partitions": SPREAD},
    {"Name": "spread3", "Key": ["/n"], "Partitions": SPREAD},
    {"Name": "ranked", "Key": ["/n"], "Partitions": SPREAD},
    {"Name": "barx", "Key": ["/n"], "Partitions": SPREAD},
]
QUEUES: list[dict[str, Any]] = [
    *one_worker.QUEUES,
    {"Name": "ONE", "UnderlyingTopic": "spread"},  # MaxPerSubscriptionBacklog 1, the default
    {"Name": "THREE", "UnderlyingTopic": "spread3", "MaxPerSubscriptionBacklog": 3},
    {"Name": "RANKED", "UnderlyingTopic": "ranked", "Priority": "/p"},
    {
        "Name": "BX",
        "UnderlyingTopic": "barx",
        "BarrierExpression": "/sync IS NOT NULL",
        "MaxPerSubscriptionBacklog": 10,
    },
]

__all__ = [  # the chapter's examples, collected here again against three workers
    "test_a_barrier_waits_for_everything_before_it_then_goes_to_every_subscriber",
    "test_at_most_once_removes_on_delivery",
    "test_cancel_returns_and_max_cancels_expires_to_the_dead_letter_topic",
    "test_default_backlog_is_one_and_an_ack_brings_the_next",
    "test_lease_timeout_redelivers_with_a_higher_count",
    "test_priority_orders_delivery",
    "test_strict_leasing_ignores_an_ack_from_another_client",
]


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    with running_engine(
        kafka_bootstrap,
        tmp_path_factory.mktemp("queue-workers"),
        one_worker.TOPICS,
        workers=WORKERS,
        plain_topics=PLAIN,
        queues=QUEUES,
        engine_extra={"slow_consumer": {"client_timeout": "4s", "check_interval": "500ms"}},
    ) as procs:
        yield procs


def wait_available(client: Client, queue: str, n: int) -> None:
    """Wait until ``n`` messages are available in ``queue``."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if sum(1 for m in client.sow(queue) if m.command == "sow") >= n:
            return
        time.sleep(0.2)
    pytest.fail(f"{queue} never had {n} messages available")


def publish_spread(publisher: Client, client: Client, topic: str, queue: str, n: int) -> None:
    """Publish ``n`` messages keyed over the partitions, and wait until the queue has them."""
    for i in range(n):
        publisher.publish(topic, {"n": i})
    publisher.flush()
    wait_available(client, queue, n)
    where = {m.sow_key.split("|")[1] for m in client.sow(queue) if m.command == "sow"}
    # Two partitions per worker: three of them are on two workers at least.
    assert len(where) >= 3, f"the messages should be spread over the workers: {where}"


@pytest.mark.parametrize(
    ("queue", "topic", "backlog"), [("ONE", "spread", 1), ("THREE", "spread3", 3)]
)
def test_a_subscription_holds_at_most_its_backlog_over_all_workers(
    client: Client, publisher: Client, queue: str, topic: str, backlog: int
) -> None:
    """Messages wait on every worker; the subscriber holds its backlog, not a backlog from
    each worker, and each acknowledgement brings exactly one more."""
    publish_spread(publisher, client, topic, queue, 12)
    sub = client.subscribe(queue, options=f"max_backlog={backlog}")
    seen: list[int] = []
    held = take(sub, backlog, timeout=20)
    assert sub.next(timeout=2.0) is None, "more than the backlog over the workers"
    assert client.queue_status(queue)["leased"] == backlog
    while len(seen) + len(held) < 12:
        done = held.pop(0)
        seen.append(done.json()["n"])
        assert client.ack(queue, done.bookmark) == 1
        held += take(sub, 1, timeout=20)
        assert sub.next(timeout=0.5) is None
        assert len(held) == backlog
    seen += [m.json()["n"] for m in held]
    assert sorted(seen) == list(range(12))
    client.ack(queue, [m.bookmark for m in held])
    sub.close()


def test_the_highest_priority_goes_first_whichever_worker_holds_it(
    client: Client, publisher: Client
) -> None:
    """Q12 over three workers: messages spread over six partitions with distinct priorities
    come to a backlog-1 subscriber highest first; a high one on one worker is not kept
    waiting behind lower ones on the others."""
    priorities = list(range(1, 13))
    random.Random(7).shuffle(priorities)
    for n, p in enumerate(priorities):
        publisher.publish("ranked", {"n": n, "p": p})
    publisher.flush()
    wait_available(client, "RANKED", 12)
    sub = client.subscribe("RANKED")
    order = []
    for _ in priorities:
        msg = take(sub, 1, timeout=20)[0]
        order.append(msg.json()["p"])
        assert client.ack("RANKED", msg.bookmark) == 1
    assert order == sorted(priorities, reverse=True)
    sub.close()


def test_q2_backlogs_clamped_by_the_queue_hold_over_the_workers(
    client: Client, publisher: Client
) -> None:
    """Q2 over three workers: MaxPerSubscriptionBacklog 5 clamps max_backlog=10, and each
    subscriber holds its backlog in total. Which subscriber gets which message is round-robin
    among those with credit where the message is, so the chapter's exact interleaving
    (docs/queues.md, "Several workers") is not checked here; the counts are."""
    one_worker.drain_queue(client, "JQ")
    s1 = client.subscribe("JQ", options="max_backlog=10")
    s2 = client.subscribe("JQ", options="max_backlog=2")
    time.sleep(1.0)  # both registered before the first message
    for n in range(1, 10):
        publisher.publish("jobs", {"n": n}, sow_key=None)
    publisher.flush()
    got1 = take(s1, 5, timeout=20)
    got2 = take(s2, 2, timeout=20)
    assert s1.next(timeout=1.0) is None and s2.next(timeout=0.5) is None
    client.ack("JQ", [m.bookmark for m in got1 + got2])
    rest = []
    deadline = time.monotonic() + 20
    while len(rest) < 2 and time.monotonic() < deadline:
        rest += [m for m in (s1.next(timeout=0.2), s2.next(timeout=0.2)) if m is not None]
    assert sorted(m.json()["n"] for m in got1 + got2 + rest) == list(range(1, 10))
    client.ack("JQ", [m.bookmark for m in rest])
    s1.close()
    s2.close()


def test_a_barrier_waits_for_older_messages_on_every_worker(
    client: Client, publisher: Client
) -> None:
    """Q13 over three workers: six messages spread over the partitions, a barrier, three more.
    The barrier goes out only once all six are acknowledged, wherever they are, and the three
    after it (on any partition) wait until it has gone."""
    sub = client.subscribe("BX", options="max_backlog=10")
    other = client.subscribe("BX", options="max_backlog=10")
    time.sleep(1.5)  # registered, and credit granted, before the first message
    for n in range(1, 7):
        publisher.publish("barx", {"n": n})
        time.sleep(0.02)  # distinct log times
    publisher.flush()
    time.sleep(0.05)
    publisher.publish("barx", {"n": 100, "sync": 1})
    publisher.flush()
    time.sleep(0.05)
    for n in range(7, 10):
        publisher.publish("barx", {"n": n})
        time.sleep(0.02)
    publisher.flush()
    first: list[Any] = []
    deadline = time.monotonic() + 30
    while len(first) < 6 and time.monotonic() < deadline:
        first += [m for m in (sub.next(timeout=0.2), other.next(timeout=0.2)) if m is not None]
    assert sorted(m.json()["n"] for m in first) == list(range(1, 7))
    assert len({m.bookmark.split("|")[1] for m in first}) >= 3, "spread over the workers"
    assert sub.next(timeout=2.0) is None and other.next(timeout=0.2) is None
    client.ack("BX", [m.bookmark for m in first[:5]])
    assert sub.next(timeout=2.0) is None and other.next(timeout=0.2) is None  # one still out
    client.ack("BX", first[5].bookmark)
    barriers = take(sub, 1, timeout=20) + take(other, 1, timeout=20)
    assert [m.json()["n"] for m in barriers] == [100, 100]
    rest: list[Any] = []
    deadline = time.monotonic() + 30
    while len(rest) < 3 and time.monotonic() < deadline:
        rest += [m for m in (sub.next(timeout=0.2), other.next(timeout=0.2)) if m is not None]
    assert sorted(m.json()["n"] for m in rest) == [7, 8, 9]
    client.ack("BX", [m.bookmark for m in rest])
    sub.close()
    other.close()
