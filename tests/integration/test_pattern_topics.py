"""Regular expression (Pattern) topics end to end: two real workers, a real Kafka broker.

``orders`` holds every topic name ``orders\\..*`` matches (``orders.us``, ``orders.eu``, ...) in
one log and one store; ``orders.gb`` is declared as a topic of its own and wins over the Pattern.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from sowstream.client import Client, Message, QueueSubscription, Subscription
from sowstream.errors import CommandFailedError, InvalidCommandError
from sowstream.sow.keys import generated_sow_key
from sowstream.wire import headers as h
from sowstream.wire.avro import decode
from sowstream.wire.kafka import producer_config
from tests.support.engine import EngineProcesses, running_engine
from tests.support.messages import take

pytestmark = pytest.mark.integration

TOPICS: list[dict[str, Any]] = [
    {"Name": "orders", "Pattern": "orders\\..*", "Key": ["/id"], "Partitions": 4},
    {"Name": "orders.gb", "Key": ["/id"], "Partitions": 2},
    # publishers supply the SowKeys: one key in two names is two records
    {"Name": "quotes", "Pattern": "quotes/.*", "Partitions": 2},
]
REGEX = "orders\\..*"


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    with running_engine(kafka_bootstrap, tmp_path_factory.mktemp("patterns"), TOPICS) as procs:
        yield procs


def rows(client: Client, topic: str, filter: str | None = None, **kw: Any) -> list[Any]:
    """(topic, /id, /px) of every record a sow returns, sorted."""
    found = [m for m in client.sow(topic, filter, **kw) if m.command == "sow"]
    return sorted((m.topic, m.json()["id"], m.json().get("px")) for m in found)


def quiet(sub: Subscription | QueueSubscription, wait: float = 1.5) -> list[Message]:
    out: list[Message] = []
    while (msg := sub.next(timeout=wait)) is not None:
        out.append(msg)
    return out


def fill(client: Client) -> None:
    for name in ("orders.us", "orders.eu", "orders.gb", "orders.ca", "orders.mx"):
        client.sow_delete(name, filter="1=1")
    client.publish("orders.us", {"id": 1, "px": 10})
    client.publish("orders.us", {"id": 2, "px": 11})
    client.publish("orders.eu", {"id": 1, "px": 20})  # the same /id: another record
    client.publish("orders.gb", {"id": 1, "px": 30})  # the declared topic, not the pattern's
    client.flush()


def test_each_name_is_queried_apart_and_a_regex_reads_them_all(publisher: Client) -> None:
    fill(publisher)
    assert rows(publisher, "orders.us") == [("orders.us", 1, 10), ("orders.us", 2, 11)]
    assert rows(publisher, "orders.eu") == [("orders.eu", 1, 20)]
    assert rows(publisher, "orders.gb") == [("orders.gb", 1, 30)]
    assert rows(publisher, REGEX) == [
        ("orders.eu", 1, 20),
        ("orders.gb", 1, 30),
        ("orders.us", 1, 10),
        ("orders.us", 2, 11),
    ]
    # the Pattern topic by its own Name: every name it holds, not the declared orders.gb
    assert [r[0] for r in rows(publisher, "orders")] == ["orders.eu", "orders.us", "orders.us"]
    # a key lookup, a SowKey and a filter on one name stay within it
    assert rows(publisher, "orders.eu", "/id = 1") == [("orders.eu", 1, 20)]
    us_key = generated_sow_key("orders.us", "orders.us", ["/id"], {"id": 1})
    (found,) = [m for m in publisher.sow("orders.us", "/id = 1") if m.command == "sow"]
    assert found.sow_key == us_key
    assert rows(publisher, "orders.eu", sow_keys=[us_key]) == []
    assert rows(publisher, "orders.us", sow_keys=[us_key]) == [("orders.us", 1, 10)]
    assert rows(publisher, REGEX, "/px >= 11 AND /px <= 20") == [
        ("orders.eu", 1, 20),
        ("orders.us", 2, 11),
    ]


def test_sow_and_subscribe_on_one_name_with_delta_and_oof(
    client: Client, publisher: Client
) -> None:
    fill(publisher)
    sub = client.sow_and_delta_subscribe("orders.us", "/px < 100", options="oof")
    group = take(sub, 4)
    assert [m.command for m in group] == ["group_begin", "sow", "sow", "group_end"]
    assert {m.topic for m in group if m.command == "sow"} == {"orders.us"}
    publisher.publish("orders.eu", {"id": 1, "px": 21})  # another name: not for this one
    publisher.delta_publish("orders.us", {"id": 1, "px": 12})
    publisher.publish("orders.us", {"id": 2, "px": 500})  # leaves the filter
    publisher.sow_delete("orders.eu", filter="1=1")
    # two records, two partitions: no order between them
    live = sorted(take(sub, 2), key=lambda m: m.command != "publish")
    assert live[0].command == "publish" and live[0].delta and live[0].topic == "orders.us"
    assert live[0].json() == {"id": 1, "px": 12}
    assert live[0].sow_key == generated_sow_key("orders.us", "orders.us", ["/id"], {"id": 1})
    assert (live[1].command, live[1].reason, live[1].topic) == ("oof", "match", "orders.us")
    assert live[1].json()["id"] == 2
    assert quiet(sub) == []
    sub.close()


def test_a_regex_subscription_gets_every_name_with_its_own_topic(
    client: Client, publisher: Client
) -> None:
    fill(publisher)
    sub = client.sow_and_subscribe(REGEX, options="oof")
    group = take(sub, 6)
    assert sorted(m.topic for m in group if m.command == "sow") == [
        "orders.eu",
        "orders.gb",
        "orders.us",
        "orders.us",
    ]
    publisher.publish("orders.eu", {"id": 7, "px": 1})
    publisher.publish("orders.ca", {"id": 7, "px": 2})  # a name seen for the first time
    publisher.publish("orders.gb", {"id": 7, "px": 3})
    seven = publisher.publish("orders.us", {"id": 7})
    assert seven is not None
    publisher.sow_delete("orders.us", sow_keys=[seven])
    live = take(sub, 5)
    got = sorted((m.command, m.topic, m.json()["id"]) for m in live)
    assert got == [
        ("oof", "orders.us", 7),
        ("publish", "orders.ca", 7),
        ("publish", "orders.eu", 7),
        ("publish", "orders.gb", 7),
        ("publish", "orders.us", 7),
    ]
    assert quiet(sub) == []
    sub.close()
    plain = client.subscribe("orders.ca")
    publisher.publish("orders.eu", {"id": 8})
    publisher.publish("orders.ca", {"id": 8, "px": 4})
    (msg,) = take(plain, 1)
    assert (msg.topic, msg.json()) == ("orders.ca", {"id": 8, "px": 4})
    assert quiet(plain, 1.0) == []
    plain.close()


def test_sow_delete_by_filter_on_one_name_leaves_the_others(publisher: Client) -> None:
    fill(publisher)
    assert publisher.sow_delete("orders.us", filter="/id = 1") == 1
    assert publisher.sow_delete("orders.us", filter="1=1") == 1
    assert rows(publisher, REGEX) == [("orders.eu", 1, 20), ("orders.gb", 1, 30)]


def test_publisher_supplied_keys_are_per_name(publisher: Client) -> None:
    for name in ("quotes/a", "quotes/b"):
        publisher.sow_delete(name, filter="1=1")
        publisher.publish(name, {"id": name[-1]}, sow_key="K1")
    publisher.flush()
    found = [m for m in publisher.sow("quotes/.*") if m.command == "sow"]
    assert sorted((m.topic, m.sow_key) for m in found) == [("quotes/a", "K1"), ("quotes/b", "K1")]
    assert publisher.sow_delete("quotes/a", sow_keys=["K1"]) == 1
    assert [m.topic for m in publisher.sow("quotes/.*") if m.command == "sow"] == ["quotes/b"]


def test_the_pattern_topic_needs_a_matching_name(
    publisher: Client, engine: EngineProcesses
) -> None:
    with pytest.raises(InvalidCommandError, match="publish or delete under a topic name"):
        publisher.publish("orders", {"id": 1})
    # A plain Kafka producer: the name goes in the sow.topic header, else a dead letter.
    log = f"{engine.prefix}.log.orders"
    producer = Producer(producer_config(engine.bootstrap, engine.kafka))
    producer.produce(log, value=b'{"id": 9, "px": 90}', headers=[(h.TOPIC, b"orders.mx")])
    producer.produce(log, value=b'{"id": 9}')
    producer.produce(log, value=b'{"id": 9}', headers=[(h.TOPIC, b"trades.mx")])
    producer.flush(10)
    deadline = time.monotonic() + 30
    while rows(publisher, "orders.mx") != [("orders.mx", 9, 90)]:
        assert time.monotonic() < deadline, rows(publisher, "orders.mx")
        time.sleep(0.3)
    letters = dead_letters(engine, 2)
    assert sorted(x["reason"] for x in letters) == ["bad_topic", "missing_topic"]
    # The engine does not create a topic for a name a Pattern owns.
    with pytest.raises(CommandFailedError, match="matches the Pattern"):
        publisher._connection.declare("orders.zz")


def dead_letters(engine: EngineProcesses, count: int) -> list[dict[str, Any]]:
    consumer = Consumer(
        {"bootstrap.servers": engine.bootstrap, "group.id": uuid.uuid4().hex, **engine.kafka}
    )
    consumer.assign([TopicPartition(f"{engine.prefix}.deadletter", 0, 0)])
    letters: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    try:
        while len(letters) < count and time.monotonic() < deadline:
            letters += [decode("DeadLetter", m.value() or b"") for m in consumer.consume(100, 0.5)]
    finally:
        consumer.close()
    return [x for x in letters if x["topic"] == "orders"]


def test_a_worker_restart_keeps_every_name(engine: EngineProcesses) -> None:
    with engine.client() as client:
        fill(client)
        before = rows(client, REGEX)
    for name in ("w1", "w2"):
        engine.stop(name)
    for name in ("w1", "w2"):
        engine.start(name)
    engine.wait_ready(["orders", "orders.gb", "quotes"])
    with engine.client() as client:
        assert rows(client, REGEX) == before
        assert rows(client, "orders.us") == [("orders.us", 1, 10), ("orders.us", 2, 11)]
        client.publish("orders.us", {"id": 3, "px": 13})
        assert ("orders.us", 3, 13) in rows(client, "orders.us")
