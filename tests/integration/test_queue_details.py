"""Queue details of issue 27 on a real broker: one subscription over several queues (a regular
expression), the effective backlog in the subscribe's processed ack, ExpirationModel, the queue
statistics (seconds_behind, age_of_oldest_lease, priority_count), queues over a Pattern topic,
and chapter 05's MQ example (a regular expression over declared topics and topics created on
first use).

One worker, so AMPS's single-instance numbers hold exactly.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from sowstream.client import Client
from sowstream.client.messages import Message
from sowstream.errors import SowstreamError
from tests.support.engine import QUICK_SESSION_TIMEOUT, EngineProcesses, running_engine
from tests.support.messages import drain, take

pytestmark = pytest.mark.integration

TOPICS: list[dict[str, Any]] = [
    # A Pattern topic: every name px.<anything> is stored in it.
    {"Name": "px", "Pattern": "px\\..*", "Key": ["/id"], "Partitions": 2},
]
PLAIN = [
    {"Name": "ra", "Partitions": 2},
    {"Name": "rb", "Partitions": 1},
    {"Name": "jobs", "Partitions": 1},
    {"Name": "prio", "Partitions": 1},
    {"Name": "soon", "Partitions": 1},
    {"Name": "ORDERS_B", "Partitions": 1},
]
QUEUES: list[dict[str, Any]] = [
    {"Name": "RA", "UnderlyingTopic": "ra", "MaxPerSubscriptionBacklog": 3},
    {"Name": "RB", "UnderlyingTopic": "rb", "MaxPerSubscriptionBacklog": 2},
    {"Name": "JQ", "UnderlyingTopic": "jobs", "MaxPerSubscriptionBacklog": 5},
    {"Name": "PQ", "UnderlyingTopic": "prio", "Priority": "/p", "MaxPerSubscriptionBacklog": 2},
    {
        "Name": "XQ",
        "UnderlyingTopic": "soon",
        "Expiration": "60s",
        "ExpirationModel": "earliest",
    },
    {
        "Name": "LQ",
        "UnderlyingTopic": "soon",
        "Expiration": "1s",
        "ExpirationModel": "latest",
    },
    # Chapter 05's MQ, as printed: ORDERS_DIRECT is declared nowhere else.
    {
        "Name": "MQ",
        "UnderlyingTopic": "ORDERS_.*",
        "DefaultPublishTarget": "ORDERS_DIRECT",
        "LeasePeriod": "60s",
        "Expiration": "1d",
        "MaxBacklog": 3,
    },
    # Over the Pattern topic: all of its names, and one of them.
    {"Name": "PXQ", "UnderlyingTopic": "px", "MaxPerSubscriptionBacklog": 10},
    {"Name": "PUS", "UnderlyingTopic": "px.us", "MaxPerSubscriptionBacklog": 10},
]


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    with running_engine(
        kafka_bootstrap,
        tmp_path_factory.mktemp("queue-details"),
        TOPICS,
        workers=("w1",),
        session_timeout=QUICK_SESSION_TIMEOUT,  # a test kills the worker and starts it again
        plain_topics=PLAIN,
        queues=QUEUES,
    ) as procs:
        yield procs


def wait_for(check: Any, timeout: float = 20.0) -> Any:
    """``check()`` once it is truthy; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found or time.monotonic() > deadline:
            assert found, "condition not met in time"
            return found
        time.sleep(0.2)


def test_the_processed_ack_reports_the_effective_backlog(client: Client) -> None:
    """Q1/Q2: the engine acknowledges a queue subscription with max_backlog=<n>: the smaller of
    what was asked (1 without asking) and MaxPerSubscriptionBacklog."""
    asked = client.subscribe("JQ", options="max_backlog=10")
    plain = client.subscribe("JQ")
    fewer = client.subscribe("JQ", options="max_backlog=2")
    assert asked.wait_processed(20) == 5
    assert plain.wait_processed(20) == 1
    assert fewer.wait_processed(20) == 2
    for sub in (asked, plain, fewer):
        sub.close()


def test_one_subscription_leases_from_every_queue_its_regex_matches(
    client: Client, publisher: Client
) -> None:
    """AMPS lets one subscription cover several queues; its backlog is capped by the smallest
    MaxPerSubscriptionBacklog among them (RB: 2) and counts what it holds from all of them."""
    sub = client.subscribe("R[AB]", options="max_backlog=5")
    assert sub.queues == ("RA", "RB")
    assert sub.wait_processed(20) == 2
    for n in range(3):
        publisher.publish("ra", {"q": "a", "n": n})
        publisher.publish("rb", {"q": "b", "n": n})
    publisher.flush()
    got: list[Message] = []
    while len(got) < 6:
        held = take(sub, 2)
        assert drain(sub, 1.0) == []  # two at a time, whichever queues they come from
        for message in held:
            assert message.topic == {"a": "RA", "b": "RB"}[message.json()["q"]]
            sub.ack(message)  # each acknowledgement goes to its message's queue
        got.extend(held)
    assert sorted(m.json()["q"] for m in got) == ["a", "a", "a", "b", "b", "b"]
    sub.flush_acks(wait=True)
    wait_for(lambda: client.queue_status("RA")["depth"] == 0)
    wait_for(lambda: client.queue_status("RB")["depth"] == 0)
    assert client.queue_status("RA")["acked"] == 3
    assert client.queue_status("RB")["acked"] == 3
    sub.close()


def test_a_regex_matching_queues_and_other_topics_is_refused(client: Client) -> None:
    with pytest.raises(
        SowstreamError, match=r"matches queues \(RA, RB\) and topics that are not queues \(ra\)"
    ):
        client.subscribe("R[AB]|ra")


def test_expiration_model_combines_a_publish_expiration_with_the_queue(
    client: Client, publisher: Client
) -> None:
    """XQ (earliest): a publish's 1 s beats the queue's 60 s. LQ (latest): the queue's 1 s
    loses to a publish's 60 s, and applies to a publish without one (so two expire there)."""
    publisher.publish("soon", {"n": 1}, expiration=1)
    publisher.publish("soon", {"n": 2}, expiration=60)
    publisher.publish("soon", {"n": 3})
    publisher.flush()

    def expired(queue: str) -> int:
        return int(client.queue_status(queue).get("time_limit", 0))

    wait_for(lambda: expired("XQ") == 1 and expired("LQ") == 2)
    time.sleep(1.5)
    assert expired("XQ") == 1  # n=2 (60 s) and n=3 (the queue's 60 s) stay
    assert sorted(m.json()["n"] for m in client.sow("XQ") if m.command == "sow") == [2, 3]
    assert [m.json()["n"] for m in client.sow("LQ") if m.command == "sow"] == [2]


def test_queue_status_reports_ages_and_priority_levels(client: Client, publisher: Client) -> None:
    for p in (1, 5, 5, 9):
        publisher.publish("prio", {"p": p})
    publisher.flush()
    wait_for(lambda: client.queue_status("PQ")["depth"] == 4)
    status = client.queue_status("PQ")
    assert status["priority_count"] == 3
    assert status["age_of_oldest_lease"] == 0.0
    sub = client.subscribe("PQ", options="max_backlog=2")
    held = take(sub, 2)
    assert [m.json()["p"] for m in held] == [9, 5]
    time.sleep(1.2)
    status = client.queue_status("PQ")
    assert status["leased"] == 2
    assert status["age_of_oldest_lease"] >= 1.0
    assert status["seconds_behind"] >= status["age_of_oldest_lease"]
    for message in held:
        sub.ack(message)
    sub.close()  # what it was leased meanwhile goes back: acknowledge whatever is available

    def emptied() -> bool:
        left = [m.sow_key for m in client.sow("PQ") if m.command == "sow"]
        if left:
            client.ack("PQ", left)
        return bool(client.queue_status("PQ")["depth"] == 0)

    wait_for(emptied)
    status = client.queue_status("PQ")
    assert (status["priority_count"], status["seconds_behind"]) == (0, 0.0)


def test_chapter_05_mq_example_takes_its_undeclared_publish_target(
    client: Client, publisher: Client
) -> None:
    """MQ's UnderlyingTopic ORDERS_.* matches ORDERS_DIRECT (declared by the queue itself) and
    ORDERS_B (declared)."""
    sub = client.subscribe("MQ", options="max_backlog=1")
    publisher.publish("MQ", {"o": 1})  # to the queue: stored under ORDERS_DIRECT
    publisher.publish("ORDERS_B", {"o": 2})
    publisher.flush()
    first = take(sub, 1)[0]
    sub.ack(first)
    second = take(sub, 1)[0]
    sub.ack(second)
    where = sorted((m.bookmark.split("|")[0], m.json()["o"]) for m in (first, second))
    assert where == [("ORDERS_B", 2), ("ORDERS_DIRECT", 1)]
    sub.close()


def test_a_regex_queue_takes_topics_created_on_first_use_and_keeps_their_acks(
    engine: EngineProcesses, client: Client, publisher: Client
) -> None:
    """A publish to ORDERS_NEW, declared nowhere, creates the topic and feeds MQ; its messages
    are browsed and acknowledged like any, and what was acknowledged stays so over a restart of
    the worker while what was not comes back."""
    publisher.publish("ORDERS_NEW", {"o": 10})
    publisher.publish("ORDERS_NEW", {"o": 11})
    publisher.flush()
    wait_for(lambda: "ORDERS_NEW" in client.refresh_topics()["MQ"].queue_of)
    browsed = wait_for(lambda: [m for m in client.sow("MQ") if m.command == "sow"])
    assert sorted(m.json()["o"] for m in browsed if m.bookmark.startswith("ORDERS_NEW|")) == [
        10,
        11,
    ]
    subs = [client.subscribe("MQ") for _ in range(2)]  # MQ's backlog is 1: one each
    leased = {m.json()["o"]: (sub, m) for sub in subs for m in take(sub, 1)}
    assert sorted(leased) == [10, 11]
    holder, done = leased[10]
    holder.ack(done)
    for sub in subs:
        sub.close()  # o=11 goes back, unacknowledged
    # Past faust's commit interval: the worker would not read the ack's command again, so only
    # the store can remember it.
    time.sleep(8)
    engine.stop("w1", kill=True)
    engine.start("w1")
    again = client.subscribe("MQ")
    back = take(again, 1, timeout=90)
    assert [m.json()["o"] for m in back] == [11]
    again.ack(back[0])
    assert again.next(timeout=5) is None  # o=10 stayed acknowledged
    again.close()


def test_a_first_use_topic_a_queue_does_not_match_is_plain(
    client: Client, publisher: Client
) -> None:
    publisher.publish("OTHER_NEW", {"o": 1})
    publisher.flush()
    assert client.topic_info("OTHER_NEW").auto
    assert "OTHER_NEW" not in client.topic_info("MQ").queue_of


def test_queues_over_a_pattern_topic(client: Client, publisher: Client) -> None:
    """PXQ reads every name of the Pattern topic px; PUS reads px.us only, and a publish to PUS
    is stored under px.us."""
    whole = client.subscribe("PXQ", options="max_backlog=10")
    one = client.subscribe("PUS", options="max_backlog=10")
    publisher.publish("px.us", {"id": 1, "where": "us"})
    publisher.publish("px.eu", {"id": 2, "where": "eu"})
    publisher.publish("PUS", {"id": 3, "where": "via-queue"})
    publisher.flush()
    everything = take(whole, 3)
    assert sorted(m.json()["id"] for m in everything) == [1, 2, 3]
    assert all(m.bookmark.startswith("px|") and m.topic == "PXQ" for m in everything)
    mine = take(one, 2)
    assert sorted(m.json()["id"] for m in mine) == [1, 3]
    assert drain(one, 1.0) == []
    stored = {m.json()["id"] for m in client.sow("px.us") if m.command == "sow"}
    assert stored == {1, 3}  # the queue's publish went under px.us
    for message in everything:
        whole.ack(message)
    for message in mine:
        one.ack(message)
    whole.flush_acks(wait=True)
    one.flush_acks(wait=True)
    wait_for(lambda: client.queue_status("PXQ")["depth"] == 0)
    wait_for(lambda: client.queue_status("PUS")["depth"] == 0)
    whole.close()
    one.close()
