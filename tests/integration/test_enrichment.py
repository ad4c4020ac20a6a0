"""Preprocessing and Enrichment end to end on a real broker (chapter 08, part B).

The worked examples are named En where they are followed. One worker serves every topic; the
last test restarts it, so the log is applied again.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from sowstream.client import Client
from sowstream.errors import CommandFailedError
from sowstream.sow.keys import generated_sow_key
from sowstream.wire import headers as h
from sowstream.wire.avro import decode
from sowstream.wire.kafka import producer_config
from tests.support.engine import EngineProcesses, running_engine
from tests.support.messages import eventually, take

pytestmark = pytest.mark.integration

INSTANCE = "sowstream-test-east"
TOPICS: list[dict[str, Any]] = [
    {  # E1
        "Name": "Orders",
        "Key": "/order_key",
        "Partitions": 4,
        "Preprocessing": ['CONCAT(/customer_id, "-", /order_id) AS /order_key'],
        "Enrichment": [
            "IF(/qty < 0, /qty OF PREVIOUS, /qty) AS /qty",
            "IF(/price < 0, /price OF PREVIOUS, /price) AS /price",
        ],
    },
    {  # E2, E3, and a receive time; transient, so a restart applies its whole log again
        "Name": "Stamped",
        "Key": "/id",
        "Partitions": 2,
        "Durability": "transient",
        "Enrichment": [
            "AMPS_INSTANCE_NAME() AS /publishSource",
            "COALESCE(/important OF CURRENT, /important OF PREVIOUS, 'default') AS /important",
            "COALESCE(/n OF PREVIOUS, 0) + 1 AS /n",
            "UNIX_TIMESTAMP() AS /received",
        ],
    },
    {  # E4
        "Name": "Buckets",
        "Key": "/bucket",
        "Partitions": 2,
        "Preprocessing": ["CRC32(CONCAT(/name, /orderId)) % 10 AS /bucket"],
    },
    {  # E5 (with and without the hint) and E7
        "Name": "Sources",
        "Key": "/id",
        "Partitions": 1,
        "Preprocessing": [
            "IF(/source IN ('a','e','f'), /source, NULL) AS /source HINT OPTIONAL",
            "IF(/alt IN ('a','e','f'), /alt, NULL) AS /alt",
        ],
    },
    {  # E6
        "Name": "Chained",
        "Key": "/k",
        "Partitions": 1,
        "Enrichment": [
            "/a * 2 AS /b HINT SET_CURRENT",
            "/b + 1 AS /c",
            "/a * 3 AS /d",
            "/d + 1 AS /e",
        ],
    },
    {  # E10, and a Field that fails on some messages
        "Name": "Statuses",
        "Key": "/id",
        "Partitions": 2,
        "Enrichment": [
            "COALESCE(/status OF CURRENT, /status OF PREVIOUS, 'new') AS /status",
            "IF(/qty OF CURRENT IS NULL, 'missing', 'present') AS /seen",
            "/qty * 2 AS /totals/double",
        ],
    },
]
VIEWS = [  # E9
    {
        "Name": "ORDER_TOTALS",
        "UnderlyingTopic": "Orders",
        "Projection": ["/order_key", "SUM(/qty) AS /qty", "COUNT(/order_id) AS /n"],
        "Grouping": ["/order_key"],
        "Partitions": 1,
    }
]
QUEUES = [{"Name": "ORDERS_Q", "UnderlyingTopic": "Orders"}]  # E9
PLAIN = [{"Name": "Chat", "Partitions": 1}]
PUBLISH_ENTITLEMENTS = {"bob": {"Sources": "/source = 'z'", "Chat": "/from = 'bob'"}}  # E7


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    with running_engine(
        kafka_bootstrap,
        tmp_path_factory.mktemp("enrichment"),
        TOPICS,
        workers=("w1",),
        engine_extra={"instance_name": INSTANCE},
        views=VIEWS,
        queues=QUEUES,
        plain_topics=PLAIN,
        publish_entitlements=PUBLISH_ENTITLEMENTS,
    ) as procs:
        yield procs


def records(client: Client, topic: str, flt: str | None = None) -> list[dict[str, Any]]:
    return client.sow_records(topic, flt)


def one(client: Client, topic: str, flt: str) -> dict[str, Any]:
    (found,) = records(client, topic, flt)
    return found


def log_records(engine: EngineProcesses, topic: str, partitions: int) -> list[Any]:
    """Every record of ``topic``'s log so far."""
    consumer = Consumer(
        {
            "bootstrap.servers": engine.bootstrap,
            "group.id": uuid.uuid4().hex,
            "enable.auto.commit": False,
        }
    )
    log = f"{engine.prefix}.log.{topic}"
    ends = {
        p: consumer.get_watermark_offsets(TopicPartition(log, p), 10)[1] for p in range(partitions)
    }
    consumer.assign([TopicPartition(log, p, 0) for p in range(partitions)])
    out: list[Any] = []
    seen = dict.fromkeys(range(partitions), 0)
    deadline = time.monotonic() + 20
    while any(seen[p] < ends[p] for p in seen) and time.monotonic() < deadline:
        for msg in consumer.consume(500, 0.5):
            if not msg.error():
                out.append(msg)
                seen[msg.partition()] = msg.offset() + 1
    consumer.close()
    return out


def dead_letters(engine: EngineProcesses, topic: str, count: int) -> list[dict[str, Any]]:
    consumer = Consumer(
        {
            "bootstrap.servers": engine.bootstrap,
            "group.id": uuid.uuid4().hex,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(f"{engine.prefix}.deadletter", 0, 0)])
    letters: list[dict[str, Any]] = []
    deadline = time.monotonic() + 20
    try:
        while len(letters) < count and time.monotonic() < deadline:
            for msg in consumer.consume(100, 0.5):
                if not msg.error():
                    letter = decode("DeadLetter", msg.value())
                    if letter["topic"] == topic:
                        letters.append(letter)
    finally:
        consumer.close()
    return letters


# -- the examples ---------------------------------------------------------------------------


def test_e1_key_built_by_preprocessing_and_validation_by_enrichment(client: Client) -> None:
    first = {"customer_id": "A-111", "order_id": 1000, "qty": -1, "price": 100}
    key = client.publish("Orders", first, ack=True)
    assert key == generated_sow_key("Orders", "Orders", ["/order_key"], {"order_key": "A-111-1000"})
    flt = "/customer_id = 'A-111'"
    assert records(client, "Orders", flt) == [
        {
            "customer_id": "A-111",
            "order_id": 1000,
            "order_key": "A-111-1000",
            "qty": None,
            "price": 100,
        }
    ]
    client.publish("Orders", {**first, "qty": 5}, ack=True)
    assert one(client, "Orders", flt)["qty"] == 5
    client.publish("Orders", {**first, "qty": -2, "price": 101}, ack=True)
    assert one(client, "Orders", flt) == {
        "customer_id": "A-111",
        "order_id": 1000,
        "order_key": "A-111-1000",
        "qty": 5,
        "price": 101,
    }


def test_e8_subscribers_filter_on_enriched_fields(client: Client, publisher: Client) -> None:
    sub = client.subscribe("Orders", "/order_key = 'E8-1'")
    publisher.publish("Orders", {"customer_id": "E8", "order_id": 2, "qty": 1})
    publisher.publish("Orders", {"customer_id": "E8", "order_id": 1, "qty": 3, "price": 9})
    publisher.publish("Orders", {"customer_id": "E8", "order_id": 1, "qty": -1, "price": 10})
    got = [m.json() for m in take(sub, 2)]
    assert got == [
        {"customer_id": "E8", "order_id": 1, "qty": 3, "price": 9, "order_key": "E8-1"},
        {"customer_id": "E8", "order_id": 1, "qty": 3, "price": 10, "order_key": "E8-1"},
    ]
    sub.close()


def test_e9_views_and_queues_see_the_enriched_message(client: Client, publisher: Client) -> None:
    queue = client.subscribe("ORDERS_Q", "/customer_id = 'E9'")
    publisher.publish("Orders", {"customer_id": "E9", "order_id": 7, "qty": 4})
    publisher.publish("Orders", {"customer_id": "E9", "order_id": 7, "qty": -4})
    publisher.publish("Orders", {"customer_id": "E9", "order_id": 8, "qty": 1})
    enqueued = []
    for _ in range(3):  # a subscription holds one message at a time by default
        (message,) = take(queue, 1)
        enqueued.append(message.json())
        client.ack("ORDERS_Q", message.bookmark)
    # (no /price: the price Field writes its NULL result, as without HINT OPTIONAL it does)
    base = {"customer_id": "E9", "price": None}
    assert sorted(enqueued, key=lambda m: m["order_id"]) == [
        {**base, "order_id": 7, "qty": 4, "order_key": "E9-7"},
        {**base, "order_id": 7, "qty": 4, "order_key": "E9-7"},  # -4 refused
        {**base, "order_id": 8, "qty": 1, "order_key": "E9-8"},
    ]
    queue.close()
    eventually(
        lambda: sorted(
            (r["order_key"], r["qty"], r["n"])
            for r in records(client, "ORDER_TOTALS", "/order_key BEGINS WITH ('E9-')")
        ),
        [("E9-7", 4, 1), ("E9-8", 1, 1)],
    )


def test_e2_e3_instance_name_and_default_value(client: Client) -> None:
    client.publish("Stamped", {"id": 1}, ack=True)
    first = one(client, "Stamped", "/id = 1")
    assert first["publishSource"] == INSTANCE and first["important"] == "default"
    client.publish("Stamped", {"id": 1, "important": "x"}, ack=True)
    assert one(client, "Stamped", "/id = 1")["important"] == "x"
    client.publish("Stamped", {"id": 1}, ack=True)
    third = one(client, "Stamped", "/id = 1")
    assert third["important"] == "x" and third["n"] == 3
    assert third["received"] >= first["received"] > 1_700_000_000  # log time, in seconds


def test_e4_a_bucket_key_from_preprocessing(client: Client) -> None:
    import zlib

    for n in range(30):
        client.publish("Buckets", {"name": "n", "orderId": n}, ack=True)
    stored = records(client, "Buckets")
    assert sorted(r["bucket"] for r in stored) == sorted(
        {zlib.crc32(f"n{n}".encode()) % 10 for n in range(30)}
    )
    for r in stored:  # each bucket holds its last publish
        last = max(n for n in range(30) if zlib.crc32(f"n{n}".encode()) % 10 == r["bucket"])
        assert r["orderId"] == last


def test_e5_hint_optional_and_e7_entitlement_sees_the_raw_message(engine: EngineProcesses) -> None:
    with engine.client(identity="bob") as bob, engine.client(identity="ann") as ann:
        ann.publish("Sources", {"id": 1, "source": "a", "alt": "a"}, ack=True)
        ann.publish("Sources", {"id": 2, "source": "z", "alt": "z"}, ack=True)
        # bob may publish source 'z' only: checked as received, before Preprocessing removes it
        bob.publish("Sources", {"id": 3, "source": "z"}, ack=True)
        with pytest.raises(CommandFailedError) as refused:
            bob.publish("Sources", {"id": 4, "source": "a"}, ack=True)
        assert refused.value.reason == "entitlement"
        assert "identity 'bob' may not publish" in str(refused.value)
        assert sorted(ann.sow_records("Sources"), key=lambda r: r["id"]) == [
            {"id": 1, "source": "a", "alt": "a"},
            {"id": 2, "alt": None},  # source removed (HINT OPTIONAL), alt written as null
            {"id": 3, "alt": None},
        ]


def test_publish_entitlements_hold_on_topics_without_a_sow(engine: EngineProcesses) -> None:
    with engine.client(identity="bob") as bob:
        sub = bob.subscribe("Chat")
        bob.publish("Chat", {"from": "bob", "text": "hi"}, ack=True)
        with pytest.raises(CommandFailedError) as refused:
            bob.publish("Chat", {"from": "ann", "text": "hi"}, ack=True)
        assert refused.value.reason == "entitlement"
        bob.publish("Chat", {"from": "bob", "text": "bye"}, ack=True)
        assert [m.json()["text"] for m in take(sub, 2)] == ["hi", "bye"]
        sub.close()


def test_e6_set_current(client: Client) -> None:
    client.publish("Chained", {"k": 1, "a": 3}, ack=True)
    assert one(client, "Chained", "/k = 1") == {"k": 1, "a": 3, "b": 6, "c": 7, "d": 9, "e": None}


def test_e10_delta_publish_is_enriched_before_the_merge(client: Client) -> None:
    client.publish("Statuses", {"id": 1, "status": "open", "qty": 5}, ack=True)
    client.delta_publish("Statuses", {"id": 1, "qty": 6}, ack=True)
    after = one(client, "Statuses", "/id = 1")
    assert (after["status"], after["qty"]) == ("open", 6)
    # Chapter 08 B4's open order of steps 5-6, settled by chapter 03 (Understanding Delta
    # Publish): AMPS enriches the incoming message, then merges. /qty OF CURRENT reads the delta,
    # which has none: 'missing', and /qty * 2 is NULL, merged over the stored 12.
    client.delta_publish("Statuses", {"id": 1, "status": "x"}, ack=True)
    after = one(client, "Statuses", "/id = 1")
    assert after == {
        "id": 1,
        "status": "x",
        "qty": 6,
        "seen": "missing",
        "totals": {"double": None},
    }


def test_a_failing_enrichment_is_dead_lettered_and_the_topic_goes_on(
    engine: EngineProcesses, client: Client
) -> None:
    with pytest.raises(CommandFailedError) as failed:
        client.publish("Statuses", {"id": 9, "qty": 1, "totals": "n/a"}, ack=True)
    assert failed.value.reason == "enrichment_failed"
    # a plain producer's record gets the same treatment, and the next valid one is stored
    producer = Producer(producer_config(engine.bootstrap))
    bad = orjson.dumps({"id": 10, "qty": 2, "totals": [1]})
    producer.produce(f"{engine.prefix}.log.Statuses", value=bad)
    producer.flush(10)
    client.publish("Statuses", {"id": 11, "qty": 2}, ack=True)
    assert one(client, "Statuses", "/id = 11")["totals"] == {"double": 4}
    assert records(client, "Statuses", "/id IN (9, 10)") == []
    letters = dead_letters(engine, "Statuses", 2)
    assert sorted(x["reason"] for x in letters) == ["enrichment_failed", "enrichment_failed"]
    by_value = {orjson.loads(x["value"])["id"]: x for x in letters}
    assert by_value[10]["value"] == bad  # the record as published
    assert by_value[10]["error"] == (
        "topic 'Statuses': Enrichment/Field[3] '/qty * 2 AS /totals/double': cannot write "
        "/totals/double: /totals holds an array, not an object"
    )


def test_records_from_any_producer_go_to_the_preprocessed_keys_partition(
    engine: EngineProcesses, client: Client
) -> None:
    """B6: the client keys a publish by its preprocessed SowKey; a record a plain producer keyed
    otherwise (or not at all) is forwarded there by the worker, never stored where it landed."""
    key = client.publish("Orders", {"customer_id": "R", "order_id": 1, "qty": 1}, ack=True)
    assert key is not None
    home = {m.partition() for m in log_records(engine, "Orders", 4) if m.key() == key.encode()}
    assert len(home) == 1
    away = (next(iter(home)) + 1) % 4
    producer = Producer(producer_config(engine.bootstrap))
    log = f"{engine.prefix}.log.Orders"
    stored = lambda: [r["qty"] for r in records(client, "Orders", "/customer_id = 'R'")]  # noqa: E731
    # unkeyed, on another partition than the record's
    producer.produce(
        log, value=orjson.dumps({"customer_id": "R", "order_id": 1, "qty": 2}), partition=away
    )
    producer.flush(10)
    eventually(stored, [2])
    # keyed by the raw message's idea of the key, not the preprocessed SowKey
    producer.produce(
        log, value=orjson.dumps({"customer_id": "R", "order_id": 1, "qty": 3}), key=b"R-1"
    )
    producer.flush(10)
    eventually(stored, [3])
    keyed = [m for m in log_records(engine, "Orders", 4) if m.key() == key.encode()]
    assert {m.partition() for m in keyed} == home
    forwarded = [m for m in keyed if h.ORIGIN in dict(m.headers() or [])]
    assert len(forwarded) == 2


def test_a_restart_applies_the_log_again_without_enriching_twice(
    engine: EngineProcesses, client: Client
) -> None:
    """Stamped is transient: the restarted worker rebuilds it from its whole log, enriching each
    record once, with the log time it was first given; Orders (persistent) keeps its records."""
    for i in (21, 22):
        client.publish("Stamped", {"id": i}, ack=True)
        client.publish("Stamped", {"id": i, "important": "y"}, ack=True)
    before = {r["id"]: r for r in records(client, "Stamped")}
    orders = records(client, "Orders")
    engine.stop("w1")
    engine.start("w1")
    engine.wait_ready(["Stamped", "Orders"])
    assert {r["id"]: r for r in records(client, "Stamped")} == before
    assert before[21]["n"] == 2 and before[21]["important"] == "y"
    assert sorted(records(client, "Orders"), key=repr) == sorted(orders, key=repr)


def test_e11_and_bad_fields_stop_the_worker_at_start(tmp_path: Path, kafka_bootstrap: str) -> None:
    for text, element, problem in [
        (
            "sow:\n  - {Name: q, Key: /id, Pattern: '^q', Enrichment: ['1 AS /x']}\n",
            "sow[0].Enrichment",
            "cannot be used with Pattern",
        ),
        (
            "sow:\n  - {Name: q, Key: /id, Enrichment: ['SUM(/a) AS /x']}\n",
            "sow[0].Enrichment",
            "aggregate function SUM",
        ),
    ]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "sowstream",
                "worker",
                "--config",
                str(bad),
                "--bootstrap",
                kafka_bootstrap,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 1
        said = " ".join(proc.stderr.split())  # the CLI wraps long lines
        assert f"{bad}: {element}: " in said and problem in said
