"""Queues end to end: leases, acknowledgements, expiry and browsing on a real broker.

One worker unless a test says otherwise (so AMPS's single-instance numbers hold exactly); the
worked examples of the queue chapter (section 15) are named Qn where they are followed.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition

from sowstream.broker.local import free_port
from sowstream.client import Client
from sowstream.errors import CommandFailedError, InvalidCommandError
from sowstream.wire import protocol
from sowstream.wire.avro import decode
from tests.support.engine import QUICK_SESSION_TIMEOUT, EngineProcesses, running_engine
from tests.support.messages import drain, take

pytestmark = pytest.mark.integration

TOPICS: list[dict[str, Any]] = [
    {"Name": "orders", "Key": ["/id"], "Partitions": 2},
]
PLAIN = [
    {"Name": "work", "Partitions": 2},
    {"Name": "jobs", "Partitions": 2},
    {"Name": "tasks", "Partitions": 2},
    {"Name": "prio", "Partitions": 1},
    {"Name": "bar", "Partitions": 1},
    {"Name": "strict", "Partitions": 1},
    {"Name": "few", "Partitions": 1},
    {"Name": "short", "Partitions": 1},
    {"Name": "capped", "Partitions": 1},
    {"Name": "cancelled", "Partitions": 1},
    {"Name": "late", "Partitions": 1},
    {"Name": "lapsing", "Partitions": 1},
    {"Name": "multi_a", "Partitions": 1},
    {"Name": "multi_b", "Partitions": 1},
]
QUEUES: list[dict[str, Any]] = [
    {
        "Name": "MT",
        "UnderlyingTopic": "multi_.*",
        "DefaultPublishTarget": "multi_a",
        "MaxPerSubscriptionBacklog": 10,
    },
    {"Name": "WQ", "UnderlyingTopic": "work", "LeasePeriod": "1s", "MaxCancels": 2},
    {
        "Name": "JQ",
        "UnderlyingTopic": "jobs",
        "MaxPerSubscriptionBacklog": 5,
        "FairnessModel": "round-robin",
    },
    {"Name": "AMO", "UnderlyingTopic": "tasks", "Semantics": "at-most-once"},
    {
        "Name": "OQ",
        "UnderlyingTopic": "orders",
        "Filter": "/status = 'new'",
        "MaxPerSubscriptionBacklog": 10,
    },
    {"Name": "PQ", "UnderlyingTopic": "prio", "Priority": "/p"},
    {
        "Name": "BQ",
        "UnderlyingTopic": "bar",
        "BarrierExpression": "/sync IS NOT NULL",
        "MaxPerSubscriptionBacklog": 5,
    },
    {"Name": "SQ", "UnderlyingTopic": "strict", "Leasing": "strict", "LeasePeriod": "1s"},
    {"Name": "DQ", "UnderlyingTopic": "few", "MaxDeliveries": 1, "LeasePeriod": "60s"},
    {"Name": "EQ", "UnderlyingTopic": "short", "Expiration": "2s"},
    {"Name": "MB", "UnderlyingTopic": "capped", "MaxBacklog": 2, "MaxPerSubscriptionBacklog": 5},
    # Q5 as the chapter has it, with a lease long enough for a cancel to arrive in time on a
    # loaded machine: with WQ's 1s a lease could lapse first and redeliver the message.
    {"Name": "CQ", "UnderlyingTopic": "cancelled", "LeasePeriod": "60s", "MaxCancels": 2},
    # Lease timeouts with a lease long enough for an acknowledgement to land before the second
    # lease lapses too (WQ's 1s could lapse first on a loaded machine: a third delivery).
    {"Name": "TQ", "UnderlyingTopic": "lapsing", "LeasePeriod": "2s"},
    {
        "Name": "LQ",
        "UnderlyingTopic": "late",
        "Priority": "/p",
        "LeasePeriod": "1s",
        "MaxCancels": 1,
    },
]


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    with running_engine(
        kafka_bootstrap,
        tmp_path_factory.mktemp("queues"),
        TOPICS,
        workers=("w1",),
        plain_topics=PLAIN,
        queues=QUEUES,
        engine_extra={"slow_consumer": {"client_timeout": "4s", "check_interval": "500ms"}},
    ) as procs:
        yield procs


def drain_queue(client: Client, queue: str) -> None:
    """Acknowledge whatever an earlier test left available."""
    left = [m.sow_key for m in client.sow(queue) if m.command == "sow"]
    if left:
        client.ack(queue, left)


def test_default_backlog_is_one_and_an_ack_brings_the_next(
    client: Client, publisher: Client
) -> None:
    """Q1: with both backlogs at their default of 1 a subscriber holds one message at a time."""
    sub = client.subscribe("JQ")
    publisher.publish("jobs", {"n": 1})
    publisher.publish("jobs", {"n": 2})
    first = take(sub, 1)[0]
    assert first.json() == {"n": 1} and first.deliveries == 1 and first.lease_expires is None
    assert sub.next(timeout=1.5) is None  # m2 waits: backlog 1
    assert client.ack("JQ", first.bookmark) == 1
    assert take(sub, 1)[0].json() == {"n": 2}
    sub.close()


def test_lease_timeout_redelivers_with_a_higher_count(client: Client, publisher: Client) -> None:
    """A lease that lapses redelivers the message with a higher count; acknowledged within the
    second lease, it is not delivered again. Whether the acknowledgement beat the second lease
    is known (flush_acks(wait=True) returns once it is applied; the lease end is on the
    message): when the machine was too slow it did not, and the attempt is made again with a
    new message, so the last assertion is made only when its premise holds."""
    sub = client.subscribe("TQ")
    for attempt in range(3):
        publisher.publish("lapsing", {"job": "a", "attempt": attempt})
        first = take(sub, 1)[0]
        assert first.deliveries == 1 and first.lease_expires is not None
        again = take(sub, 1, timeout=15)[0]  # LeasePeriod 2s, not acknowledged
        assert again.bookmark == first.bookmark and again.deliveries == 2
        assert again.lease_expires is not None
        sub.ack(again)
        sub.flush_acks(wait=True)
        if time.time() * 1000 < again.lease_expires:
            assert sub.next(timeout=2.0) is None
            break
        # Applied after the second lease lapsed: a third delivery may be on its way.
        for late in drain(sub, 3.0):
            sub.ack(late)
        sub.flush_acks(wait=True)
    else:
        pytest.fail("no acknowledgement was applied within its 2s lease in three attempts")
    sub.close()


def test_cancel_returns_and_max_cancels_expires_to_the_dead_letter_topic(
    engine: EngineProcesses, client: Client, publisher: Client
) -> None:
    """Q5: the second cancel expires the message (reason max_cancels)."""
    sub = client.subscribe("CQ")
    publisher.publish("cancelled", {"job": "cancel-me"})
    msg = take(sub, 1)[0]
    sub.cancel(msg)
    again = take(sub, 1)[0]
    assert again.bookmark == msg.bookmark
    sub.cancel(again)
    assert sub.next(timeout=2.0) is None
    event = expiry_event(engine, "CQ", msg.bookmark)
    assert event["reason"] == "max_cancels" and event["message"] == {"job": "cancel-me"}
    sub.close()


def expiry_event(engine: EngineProcesses, queue: str, bookmark: str) -> dict[str, Any]:
    """The event the queue's dead-letter topic received for ``bookmark`` (StopIteration if
    none came within 20 s)."""
    consumer = Consumer({"bootstrap.servers": engine.bootstrap, "group.id": "dlq-reader"})
    topic = f"{engine.prefix}.queue.{queue}.expired"
    consumer.assign([TopicPartition(topic, 0, 0)])
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(e["bookmark"] == bookmark for e in events):
        for m in consumer.consume(100, 0.5):
            if not m.error():
                events.append(orjson.loads(m.value()))
    consumer.close()
    return next(e for e in events if e["bookmark"] == bookmark)


def test_a_cancel_after_the_lease_lapsed_counts_towards_max_cancels(
    engine: EngineProcesses, client: Client, publisher: Client
) -> None:
    """A cancel that arrives after its lease lapsed, the message waiting in the queue, counts
    (docs/queues.md): LQ has MaxCancels 1, so it expires the message."""
    sub = client.subscribe("LQ")  # backlog 1
    publisher.publish("late", {"job": "slow", "p": 1})
    slow = take(sub, 1)[0]
    publisher.publish("late", {"job": "urgent", "p": 9})
    # Only once slow's lease lapsed has the subscription room for urgent, which goes first by
    # priority: slow waits in the queue, leased to nobody, when its cancel arrives.
    urgent = take(sub, 1, timeout=10)[0]
    assert urgent.json()["job"] == "urgent"
    assert client.ack("LQ", slow.bookmark, action="cancel") == 1
    event = expiry_event(engine, "LQ", slow.bookmark)
    assert event["reason"] == "max_cancels" and event["cancels"] == 1
    assert client.ack("LQ", urgent.bookmark) == 1
    # urgent may have lapsed and come again meanwhile; slow never comes back.
    while (again := sub.next(timeout=2.0)) is not None:
        assert again.bookmark == urgent.bookmark
    sub.close()


def test_round_robin_with_backlogs_clamped_by_the_queue(client: Client, publisher: Client) -> None:
    """Q2: MaxPerSubscriptionBacklog 5 clamps max_backlog=10; round-robin spreads the rest."""
    drain_queue(client, "JQ")
    s1 = client.subscribe("JQ", options="max_backlog=10")
    s2 = client.subscribe("JQ", options="max_backlog=2")
    time.sleep(1.0)  # both registered before the first message
    for n in range(1, 10):
        publisher.publish("jobs", {"n": n}, sow_key=None)
    publisher.flush()
    got1 = take(s1, 5)
    got2 = take(s2, 2)
    assert s1.next(timeout=1.0) is None and s2.next(timeout=0.5) is None
    # One publisher's messages share a partition, so they are offered in publish order.
    assert [m.json()["n"] for m in got1] == [1, 3, 5, 6, 7]
    assert [m.json()["n"] for m in got2] == [2, 4]
    client.ack("JQ", [m.bookmark for m in got1 + got2])
    rest = take(s1, 1) + take(s2, 1)
    assert sorted(m.json()["n"] for m in rest) == [8, 9]
    client.ack("JQ", [m.bookmark for m in rest])
    s1.close()
    s2.close()


def test_at_most_once_removes_on_delivery(client: Client, publisher: Client) -> None:
    """Q8: the message leaves the queue when sent; a subscriber that drops it loses it."""
    sub = client.subscribe("AMO")
    publisher.publish("tasks", {"t": 1})
    msg = take(sub, 1)[0]
    assert [m for m in client.sow("AMO") if m.command == "sow"] == []
    sub.close()  # without an ack
    other = client.subscribe("AMO")
    assert other.next(timeout=2.0) is None
    other.close()
    assert msg.json() == {"t": 1}


def test_sow_topic_underneath_each_publish_is_a_message_and_browse_shows_available(
    client: Client, publisher: Client
) -> None:
    """Q20 and Q16: two publishes to one key are two messages, a delta enqueues the merged
    record, the queue Filter applies, and sow on the queue browses what is available."""
    publisher.publish("orders", {"id": 1, "status": "new", "v": 1})
    publisher.publish("orders", {"id": 1, "status": "new", "v": 2})
    publisher.publish("orders", {"id": 2, "status": "done"})  # filtered out
    publisher.delta_publish("orders", {"id": 1, "v": 3})
    publisher.flush()
    deadline = time.monotonic() + 20
    browsed: list[Any] = []
    while time.monotonic() < deadline and len(browsed) < 3:
        browsed = [m.json() for m in client.sow("OQ") if m.command == "sow"]
        time.sleep(0.2)
    assert sorted(b["v"] for b in browsed) == [1, 2, 3]
    assert {"id": 1, "status": "new", "v": 3} in browsed
    publisher.sow_delete("orders", filter="/id = 1")  # the SOW record goes, the messages stay
    sub = client.subscribe("OQ", options="max_backlog=10")
    got = take(sub, 3)
    assert sorted(m.json()["v"] for m in got) == [1, 2, 3]
    assert [m for m in client.sow("OQ") if m.command == "sow"] == []  # leased: not available
    client.ack("OQ", [m.bookmark for m in got])
    sub.close()


def test_publishing_to_the_queue_name_goes_to_its_topic(client: Client, publisher: Client) -> None:
    sub = client.subscribe("WQ")
    publisher.publish("WQ", {"job": "direct"})
    msg = take(sub, 1)[0]
    assert msg.json() == {"job": "direct"} and msg.bookmark.startswith("work|")
    sub.ack(msg)
    sub.close()


def test_bad_input_is_refused_and_nothing_is_lost(client: Client, publisher: Client) -> None:
    with pytest.raises(InvalidCommandError, match="not available on queue"):
        client.sow_and_subscribe("WQ")
    with pytest.raises(InvalidCommandError, match="max_backlog"):
        client.subscribe("WQ", options="max_backlog=0")
    with pytest.raises(InvalidCommandError, match="not a message of queue"):
        client.ack("WQ", "jobs|0|1")
    with pytest.raises(InvalidCommandError):
        client.ack("WQ", "nonsense")
    with pytest.raises(InvalidCommandError, match="not a queue"):
        client.ack("orders", "orders|0|1")
    with pytest.raises(InvalidCommandError, match="unknown ack action"):
        client.ack("WQ", "work|0|1", action="drop")
    # An ack for a message the queue has not seen is remembered (deferred), not an error.
    assert client.ack("WQ", "work|0|999999") == 0
    # The engine keeps going: a message published now is delivered.
    sub = client.subscribe("WQ")
    publisher.publish("work", {"job": "after-bad-input"})
    msg = take(sub, 1)[0]
    assert msg.json() == {"job": "after-bad-input"}
    sub.ack(msg)
    sub.close()


def test_engine_refuses_a_malformed_ack_with_the_reason(
    engine: EngineProcesses, client: Client
) -> None:
    """A client that skips the checks gets the engine's answer naming the bookmark."""
    info = client.topic_info("WQ")
    assert info.queue_of == ("work",)
    with pytest.raises(CommandFailedError, match="bad-bookmark"):
        _raw_ack(client, "bad-bookmark")


def test_acks_read_together_are_each_answered_for_themselves(
    engine: EngineProcesses, client: Client
) -> None:
    """Commands that reach the worker together are handled as one batch; a malformed one in
    the middle is refused alone, and the others still get their own answers."""
    sends = [
        _raw_ack_command(client, b) for b in ("work|0|999998", "bad-bookmark", "work|0|999999")
    ]
    first, bad, last = (command.command_id for _, _, command in sends)
    connection = client._connection
    connection.send(sends)  # one produce request: the worker reads the three in one poll
    assert connection.await_acks(first, 1) == 0  # not in the queue (yet): nothing removed
    with pytest.raises(CommandFailedError, match="bad-bookmark"):
        connection.await_acks(bad, 1)
    assert connection.await_acks(last, 1) == 0


def test_acks_sent_as_the_subscription_goes_take_effect_without_an_answer(
    engine: EngineProcesses, client: Client, publisher: Client
) -> None:
    """A subscription's batched acknowledgements ask for no answer (ack_type=none): the
    messages still leave the queue, and nothing comes back on the reply topic for them."""
    drain_queue(publisher, "JQ")  # its answers go to the publisher, not to `client`
    sub = client.subscribe("JQ", options="max_backlog=5", ack_batch_size=5, ack_interval=30)
    for n in range(10):
        publisher.publish("jobs", {"batch": n})
    for msg in take(sub, 5):
        sub.ack(msg)  # the fifth sends all five in one command
    rest = take(sub, 5)  # the backlog was freed: the acknowledgements were applied
    assert sorted(m.json()["batch"] for m in rest) == [5, 6, 7, 8, 9]
    for msg in rest:
        sub.ack(msg)
    deadline = time.monotonic() + 20
    while [m for m in client.sow("JQ") if m.command == "sow"] or client.queue_status("JQ")[
        "leased"
    ]:
        assert time.monotonic() < deadline, "the last acknowledgements were not applied"
        time.sleep(0.2)
    sub.close()
    reader = Consumer(
        {"bootstrap.servers": engine.bootstrap, "group.id": uuid.uuid4().hex, "log_level": 3}
    )
    reader.assign([TopicPartition(client.reply_topic, 0, 0)])
    answers = []
    while (msg := reader.poll(3.0)) is not None:
        headers = dict(msg.headers() or [])
        if not msg.error() and "sow.cmd" not in headers:  # an engine reply, not a lease
            answers.append(decode("Reply", msg.value())["command"])
    reader.close()
    assert answers and "ack" not in answers, answers


def test_acks_batched_when_a_subscription_closes_are_applied_before_its_leases_return(
    client: Client, publisher: Client
) -> None:
    """Acknowledge, then close at once: the close waits until the engine has applied the
    acknowledgement. Sent without waiting, it raced the unsubscribe (another topic): a lease
    returned first put the acknowledged message back in the queue, available to others."""
    drain_queue(publisher, "JQ")
    for n in range(10):
        sub = client.subscribe("JQ", ack_batch_size=100, ack_interval=30)
        publisher.publish("jobs", {"closing": n})
        publisher.flush()
        msg = take(sub, 1)[0]
        assert msg.json() == {"closing": n}
        # Subscribed once the message is leased: it can only get it if the lease comes back.
        watcher = publisher.subscribe("JQ", ack_batch_size=100, ack_interval=30)
        sub.ack(msg)  # batched: goes out with the close
        sub.close()
        assert [m.json() for m in client.sow("JQ") if m.command == "sow"] == []
        again = watcher.next(timeout=0.5)
        assert again is None, f"acknowledged message leased again: {again.json()}"
        watcher.close()


def _raw_ack(client: Client, bookmark: str) -> int:
    """Send an ack command straight to the control topic, as a foreign client might."""
    send = _raw_ack_command(client, bookmark)
    client._connection.send([send])
    return client._connection.await_acks(send[2].command_id, 1)


def _raw_ack_command(client: Client, bookmark: str) -> tuple[str, int, protocol.Command]:
    """An ack command for partition 0 of the control topic, unchecked by the client."""
    command = protocol.Command(
        command="queue_ack",
        command_id=uuid.uuid4().hex,
        query_id="",
        reply_to=client.reply_topic,
        topic="WQ",
        options={"bookmarks": bookmark, "action": ""},
    )
    return (client.names.control("work"), 0, command)


def test_priority_orders_delivery(client: Client, publisher: Client) -> None:
    """Q12: highest priority first, equal priorities oldest first, no priority last."""
    for name, p in (("m1", 1), ("m2", 5), ("m3", 5), ("m4", None), ("m5", 9)):
        publisher.publish("prio", {"name": name} if p is None else {"name": name, "p": p})
    publisher.flush()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(list(client.sow("PQ"))) < 7:
        time.sleep(0.2)
    sub = client.subscribe("PQ")
    order = []
    for _ in range(5):
        msg = take(sub, 1)[0]
        order.append(msg.json()["name"])
        sub.ack(msg)
    assert order == ["m5", "m2", "m3", "m1", "m4"]
    sub.close()


def test_a_barrier_waits_for_everything_before_it_then_goes_to_every_subscriber(
    client: Client, publisher: Client
) -> None:
    """Q13: B is held until m1 and m2 are acknowledged, then broadcast; m3 waits behind it."""
    s1 = client.subscribe("BQ", options="max_backlog=5")
    s2 = client.subscribe("BQ", options="max_backlog=5")
    time.sleep(1.0)
    for body in ({"n": 1}, {"n": 2}, {"n": "B", "sync": 1}, {"n": 3}):
        publisher.publish("bar", body)
    publisher.flush()
    first = take(s1, 1) + take(s2, 1)
    assert sorted(m.json()["n"] for m in first) == [1, 2]
    assert s1.next(timeout=1.0) is None and s2.next(timeout=0.2) is None  # B and m3 held
    client.ack("BQ", first[0].bookmark)
    assert s1.next(timeout=1.0) is None and s2.next(timeout=0.2) is None  # m2 still out
    client.ack("BQ", first[1].bookmark)
    barrier1, barrier2 = take(s1, 1)[0], take(s2, 1)[0]
    assert barrier1.json()["n"] == barrier2.json()["n"] == "B"
    last = s1.next(timeout=5.0) or s2.next(timeout=5.0)
    assert last is not None and last.json() == {"n": 3}
    client.ack("BQ", last.bookmark)
    s1.close()
    s2.close()


def test_strict_leasing_ignores_an_ack_from_another_client(
    engine: EngineProcesses, client: Client, publisher: Client
) -> None:
    """Q3 (strict): after the lease moved to S2, S1's late ack does nothing; S2's removes it."""
    s1 = client.subscribe("SQ")
    publisher.publish("strict", {"job": 1})
    m1 = take(s1, 1)[0]
    s1.close()  # returns the lease at once
    with engine.client() as other:
        s2 = other.subscribe("SQ")
        again = take(s2, 1)[0]
        assert again.bookmark == m1.bookmark
        assert client.ack("SQ", m1.bookmark) == 0  # leased to the other client: ignored
        assert other.ack("SQ", again.bookmark) == 1
        s2.close()


def test_a_repeated_ack_is_answered_as_done_and_only_for_its_client(
    engine: EngineProcesses, client: Client, publisher: Client
) -> None:
    """A client that repeats an acknowledgement (after a timeout, or because the worker that
    took the partition over read the command again) is told it is done; a message a client
    never acknowledged is not, and strict leasing keeps another client's repeat out."""
    s1 = client.subscribe("SQ")
    publisher.publish("strict", {"job": "repeat"})
    m1 = take(s1, 1)[0]
    assert client.ack("SQ", m1.bookmark) == 1
    assert client.ack("SQ", m1.bookmark) == 1  # the same client again: acked already
    with engine.client() as other:
        assert other.ack("SQ", m1.bookmark) == 0  # strict: not its acknowledgement
    # Sublet leasing (WQ): anyone's repeat is answered as done.
    s2 = client.subscribe("WQ")
    publisher.publish("work", {"job": "repeat"})
    m2 = take(s2, 1)[0]
    assert client.ack("WQ", m2.bookmark) == 1
    with engine.client() as other:
        assert other.ack("WQ", m2.bookmark) == 1
    # Nothing was delivered again.
    assert s1.next(timeout=1.5) is None and s2.next(timeout=0.1) is None
    s1.close()
    s2.close()


def test_a_repeated_ack_survives_a_restart_of_the_worker(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The ack marker is stored with the removal: a worker started again on the same store (or
    restored from the changelog) still answers a repeat as done, and delivers nothing again."""
    with running_engine(
        kafka_bootstrap,
        tmp_path_factory.mktemp("queue-repeat"),
        [],
        workers=("w1",),
        session_timeout=QUICK_SESSION_TIMEOUT,
        plain_topics=[{"Name": "rjobs", "Partitions": 1}],
        queues=[{"Name": "RQ", "UnderlyingTopic": "rjobs"}],
    ) as procs:
        procs.wait_ready(["RQ"])
        with procs.client() as c:
            sub = c.subscribe("RQ")
            c.publish("rjobs", {"n": 1})
            c.publish("rjobs", {"n": 2})
            first = take(sub, 1)[0]
            assert c.ack("RQ", first.bookmark) == 1
            sub.close()
        procs.stop("w1", kill=True)
        procs.start("w1")
        procs.wait_ready(["RQ"])
        with procs.client() as c:
            assert c.ack("RQ", first.bookmark) == 1
            sub = c.subscribe("RQ")
            (msg,) = take(sub, 1)
            assert msg.json() == {"n": 2}  # the acknowledged one is not delivered again
            sub.close()


def test_queue_metrics_count_deliveries_acks_and_expiries_and_show_the_depth(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The worker's Prometheus endpoint: messages per queue and event, and the depth by state."""
    port = free_port()
    with running_engine(
        kafka_bootstrap,
        tmp_path_factory.mktemp("queue-metrics"),
        [],
        workers=("w1",),
        plain_topics=[{"Name": "mjobs", "Partitions": 1}],
        queues=[{"Name": "MQ", "UnderlyingTopic": "mjobs", "MaxPerSubscriptionBacklog": 2}],
        engine_extra={"web_port": port},
    ) as procs:
        procs.wait_ready(["MQ"])
        with procs.client() as c:
            for n in range(4):
                c.publish("mjobs", {"n": n})
            c.flush()
            sub = c.subscribe("MQ", options="max_backlog=2")
            first, second = take(sub, 2)
            assert c.ack("MQ", first.bookmark) == 1
            assert c.ack("MQ", second.bookmark, action="expire") == 1
            take(sub, 2)  # the other two, leased now

            def metrics() -> dict[str, float]:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
                return {
                    line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith("sowstream_queue_") and 'queue="MQ"' in line
                }

            deadline = time.monotonic() + 10
            while True:  # the depth gauges are set by the delivery loop, within a second
                found = metrics()
                depth = found.get('sowstream_queue_depth{queue="MQ",state="leased"}')
                waiting = found.get('sowstream_queue_depth{queue="MQ",state="available"}')
                # Both: leased is 2 already while the expired message's successor is available.
                if (depth, waiting) == (2, 0) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert found['sowstream_queue_messages_total{event="delivered",queue="MQ"}'] == 4
            assert found['sowstream_queue_messages_total{event="acked",queue="MQ"}'] == 1
            assert found['sowstream_queue_messages_total{event="forced_expire",queue="MQ"}'] == 1
            assert found['sowstream_queue_depth{queue="MQ",state="leased"}'] == 2
            assert found['sowstream_queue_depth{queue="MQ",state="available"}'] == 0
            sub.close()


def test_entitlements_decide_which_messages_a_subscriber_leases_and_browses(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The `entitlements:` filter of the queue's name applies to leases and to browsing, as
    for a SOW topic: alice gets only her jobs, the others stay for someone entitled."""
    with running_engine(
        kafka_bootstrap,
        tmp_path_factory.mktemp("queue-entitlements"),
        [],
        workers=("w1",),
        plain_topics=[{"Name": "ejobs", "Partitions": 1}],
        queues=[{"Name": "EQ2", "UnderlyingTopic": "ejobs", "MaxPerSubscriptionBacklog": 10}],
        entitlements={"alice": {"EQ2": "/owner = 'alice'"}},
    ) as procs:
        procs.wait_ready(["EQ2"])
        with procs.client(identity="alice") as alice, procs.client() as anyone:
            for n, owner in enumerate(["bob", "alice", "bob", "alice"]):
                anyone.publish("ejobs", {"n": n, "owner": owner})
            anyone.flush()
            # Another client's publishes are browsable once the worker applied them (no
            # read-your-writes across clients): browse until two show, which must be hers (with
            # bob's visible too, the first two to show would include one of his).
            deadline = time.monotonic() + 30
            browsed: list[int] = []
            while len(browsed) < 2 and time.monotonic() < deadline:
                browsed = [m.json()["n"] for m in alice.sow("EQ2") if m.command == "sow"]
                time.sleep(0.2)
            assert sorted(browsed) == [1, 3]
            sub = alice.subscribe("EQ2", options="max_backlog=10")
            got = take(sub, 2)
            assert sorted(m.json()["n"] for m in got) == [1, 3]
            assert sub.next(timeout=1.5) is None  # bob's jobs are not hers
            alice.ack("EQ2", [m.bookmark for m in got])
            sub.close()
            other = anyone.subscribe("EQ2", options="max_backlog=10")
            assert sorted(m.json()["n"] for m in take(other, 2)) == [0, 2]
            other.close()


def test_max_deliveries_expires_a_message_whose_holder_unsubscribes(
    client: Client, publisher: Client
) -> None:
    """Q21: with MaxDeliveries 1 an unacknowledged message is expired, not returned."""
    sub = client.subscribe("DQ")
    publisher.publish("few", {"job": 1})
    take(sub, 1)
    sub.close()
    other = client.subscribe("DQ")
    assert other.next(timeout=2.0) is None
    assert client.queue_status("DQ").get("max_deliveries") == 1
    other.close()


def test_time_expiration_removes_unconsumed_messages(client: Client, publisher: Client) -> None:
    """Q15: Expiration 2s; a publish's own expiration (seconds) overrides it."""
    publisher.publish("short", {"job": "queue-default"})
    publisher.publish("short", {"job": "own"}, expiration=60)
    publisher.flush()
    time.sleep(3.5)
    sub = client.subscribe("EQ")
    msg = take(sub, 1)[0]
    assert msg.json() == {"job": "own"}
    sub.ack(msg)
    assert client.queue_status("EQ").get("time_limit") == 1
    sub.close()


def test_a_client_that_goes_away_returns_its_leases_at_once(
    engine: EngineProcesses, client: Client, publisher: Client
) -> None:
    """Q4: JQ's leases never time out, so only the departure can give the message back."""
    drain_queue(client, "JQ")
    with engine.client() as leaving:
        sub = leaving.subscribe("JQ")
        publisher.publish("jobs", {"job": "abandoned"})
        held = take(sub, 1)[0]
    other = client.subscribe("JQ")
    again = take(other, 1, timeout=10)[0]
    assert again.bookmark == held.bookmark and again.deliveries == 2
    other.ack(again)
    other.close()


def test_an_ack_that_arrives_before_its_message_is_remembered(
    engine: EngineProcesses, client: Client, publisher: Client
) -> None:
    """Q19: an acknowledgement for a bookmark not in the queue yet (DeferredAckExpiration, 1 day
    by default) makes that message count as acknowledged when it arrives: never delivered."""
    info = publisher.topic_info("work")
    partition = publisher._publishing.plain_partition(info)  # where this publisher's messages go
    consumer = Consumer({"bootstrap.servers": engine.bootstrap, "group.id": uuid.uuid4().hex})
    _, end = consumer.get_watermark_offsets(TopicPartition(info.log_topic, partition), timeout=10)
    consumer.close()
    assert client.ack("WQ", f"work|{partition}|{end}") == 0  # deferred: nothing removed yet
    sub = client.subscribe("WQ")
    publisher.publish("work", {"job": "pre-acknowledged"})
    publisher.publish("work", {"job": "normal"})
    msg = take(sub, 1)[0]
    assert msg.json() == {"job": "normal"}
    sub.ack(msg)
    sub.close()


def test_max_backlog_caps_leases_across_the_queue(
    engine: EngineProcesses, publisher: Client
) -> None:
    """Q14: MaxBacklog 2, three subscribers with backlog 5: two leased in all; an ack frees one."""
    with engine.client() as a, engine.client() as b, engine.client() as c:
        subs = [x.subscribe("MB", options="max_backlog=5") for x in (a, b, c)]
        time.sleep(1.0)
        for n in range(5):
            publisher.publish("capped", {"n": n})
        publisher.flush()
        time.sleep(2.0)
        held = [m for s in subs for m in iter(lambda s=s: s.next(timeout=0.2), None)]
        assert len(held) == 2
        a.ack("MB", held[0].bookmark)
        more = [m for s in subs for m in iter(lambda s=s: s.next(timeout=1.0), None)]
        assert len(more) == 1
        a.ack("MB", [m.bookmark for m in held[1:] + more])
        for s in subs:
            s.close()


def test_a_bookmark_subscription_on_a_queue_replays_without_leasing(
    client: Client, publisher: Client
) -> None:
    """Q22: with a bookmark, subscribe replays the underlying topic; nothing is leased."""
    publisher.publish("work", {"job": "replayed"})
    publisher.flush()
    time.sleep(1.0)
    before = client.queue_status("WQ")
    replay = client.subscribe("WQ", bookmark="EPOCH")
    jobs = [m.json()["job"] for m in iter(lambda: replay.next(timeout=2.0), None)]
    assert "replayed" in jobs and "pre-acknowledged" in jobs  # acknowledged ones too
    replay.close()
    assert client.queue_status("WQ")["depth"] == before["depth"]
    sub = client.subscribe("WQ")
    msg = take(sub, 1)[0]  # still in the queue, for a consumer
    assert msg.json() == {"job": "replayed"}
    sub.ack(msg)
    sub.close()


def test_browse_orders_and_pages_and_acks_by_the_bookmarks_it_shows(
    client: Client, publisher: Client
) -> None:
    """sow on a queue takes a filter, OrderBy and top_n; each message's bookmark acks it."""
    drain_queue(client, "JQ")
    for n in (5, 3, 9, 1):
        publisher.publish("jobs", {"n": n})
    publisher.flush()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(list(client.sow("JQ"))) < 6:
        time.sleep(0.2)
    page = [
        m for m in client.sow("JQ", "/n > 1", order_by="/n DESC", top_n=2) if m.command == "sow"
    ]
    assert [m.json()["n"] for m in page] == [9, 5]
    assert all(m.bookmark.startswith("jobs|") for m in page)
    assert client.ack("JQ", [m.bookmark for m in page]) == 2
    with pytest.raises(InvalidCommandError, match="browsed with a filter"):
        list(client.sow("JQ", bookmark="EPOCH"))
    with pytest.raises(InvalidCommandError, match="not a queue"):
        client.queue_status("orders")
    drain_queue(client, "JQ")


def test_cancel_by_filter_returns_instead_of_removing(client: Client, publisher: Client) -> None:
    drain_queue(client, "JQ")
    sub = client.delta_subscribe("JQ")  # accepted on a queue: whole messages, as AMPS does
    publisher.publish("jobs", {"kind": "retry"})
    held = take(sub, 1)[0]
    assert not held.delta
    assert client.ack("JQ", filter="/kind = 'retry'", action="cancel") == 1
    again = take(sub, 1)[0]
    assert again.bookmark == held.bookmark and again.deliveries == 2
    sub.ack(again)
    sub.close()


KILLED_CONSUMER = """
import sys, time
from sowstream.client import Client
with Client(sys.argv[1], prefix=sys.argv[2]) as client:
    sub = client.subscribe("JQ")
    msg = sub.next(timeout=30)
    print(msg.bookmark if msg else "", flush=True)
    time.sleep(600)
"""


def test_a_killed_consumer_process_gives_its_leases_back(
    engine: EngineProcesses, client: Client, publisher: Client
) -> None:
    """A consumer killed with SIGKILL leaves its reply topic behind; once it has missed its
    heartbeats for client_timeout (4s here) its lease returns, though JQ's never times out."""
    drain_queue(client, "JQ")
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_CONSUMER, engine.bootstrap, engine.prefix],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3.0)  # subscribed
        publisher.publish("jobs", {"job": "orphaned"})
        assert proc.stdout is not None
        held = proc.stdout.readline().strip()
        assert held, "the consumer got nothing"
        proc.kill()
        proc.wait(10)
        sub = client.subscribe("JQ")
        again = take(sub, 1, timeout=30)[0]
        assert again.bookmark == held and again.deliveries == 2
        sub.ack(again)
        sub.close()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_browse_and_status_of_a_queue_over_two_topics_answer_for_both(
    client: Client, publisher: Client
) -> None:
    """Both topics have a partition 0: each answers for its own (topic, partition), and the
    client keeps both answers instead of taking one for the other."""
    publisher.publish("multi_a", {"from": "a"})
    publisher.publish("multi_b", {"from": "b"})
    publisher.flush()
    deadline = time.monotonic() + 20
    browsed: list[Any] = []
    while time.monotonic() < deadline and len(browsed) < 2:
        browsed = [m for m in client.sow("MT") if m.command == "sow"]
        time.sleep(0.2)
    assert sorted(m.json()["from"] for m in browsed) == ["a", "b"]
    assert {m.topic for m in browsed} == {"MT"}
    assert sorted(m.bookmark.split("|")[0] for m in browsed) == ["multi_a", "multi_b"]
    assert client.queue_status("MT")["depth"] == 2
    assert client.ack("MT", [m.bookmark for m in browsed]) == 2
    assert client.queue_status("MT").get("depth", 0) == 0
