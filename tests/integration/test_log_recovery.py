"""RecoveryPoint timestamps, and a transaction log deleted and made again under the SOW."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from sowstream.client import Client
from sowstream.engine.meta import log_topic_spec
from sowstream.sow.keys import generated_sow_key
from sowstream.sow.timestamps import format_timestamp
from sowstream.wire.kafka import delete_topics, ensure_topics, producer_config
from sowstream.wire.topics import TopicNames
from tests.support.engine import EngineProcesses

pytestmark = pytest.mark.integration


def snapshot(client: Client, topic: str) -> dict[Any, Any]:
    """The SOW of ``topic`` by /id."""
    return {
        m.json()["id"]: m.json() for m in client.sow(topic, batch_size=500) if m.command == "sow"
    }


def produce(bootstrap: str, log_topic: str, topic: str, bodies: list[dict[str, Any]]) -> None:
    """Publish straight to a log, as any Kafka producer may (keyed as the client keys)."""
    producer = Producer(producer_config(bootstrap))
    for body in bodies:
        key = generated_sow_key(topic, topic, ["/id"], body)
        producer.produce(log_topic, key=key.encode(), value=json.dumps(body).encode())
    assert producer.flush(30) == 0


def test_recovery_point_timestamp_keeps_only_later_records(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    names = TopicNames(prefix)
    topics = ("kept", "day", "dayt", "nowt")
    ensure_topics(kafka_bootstrap, [log_topic_spec(names, t, 2) for t in topics])
    for topic in topics:
        produce(
            kafka_bootstrap, names.log(topic), topic, [{"id": i, "old": True} for i in range(5)]
        )
    time.sleep(1.5)
    point = format_timestamp(int(time.time() * 1000))  # "recover only what came after this"
    time.sleep(0.5)
    for topic in topics:
        produce(kafka_bootstrap, names.log(topic), topic, [{"id": i, "old": False} for i in (3, 9)])

    config = [
        {"Name": "kept", "Key": "/id", "Partitions": 2},  # epoch (the default)
        {"Name": "day", "Key": "/id", "Partitions": 2, "RecoveryPoint": point},
        {
            "Name": "dayt",
            "Key": "/id",
            "Partitions": 2,
            "Durability": "transient",
            "RecoveryPoint": point,
        },
        {
            "Name": "nowt",
            "Key": "/id",
            "Partitions": 2,
            "Durability": "transient",
            "RecoveryPoint": "now",
        },
    ]
    engine = EngineProcesses(kafka_bootstrap, tmp_path, config, prefix=prefix)
    try:
        engine.start("w1")
        engine.wait_ready(list(topics))
        later = {3: {"id": 3, "old": False}, 9: {"id": 9, "old": False}}
        with engine.client() as client:
            everything = snapshot(client, "kept")
            assert len(everything) == 6 and everything[3] == later[3]
            assert snapshot(client, "day") == later  # persistent: a store started at the point
            assert snapshot(client, "dayt") == later  # transient: rebuilt from the point
            assert snapshot(client, "nowt") == {}
            client.publish("day", {"id": 10, "old": False})
            client.publish("nowt", {"id": 1, "old": False})
            assert set(snapshot(client, "day")) == {3, 9, 10}

        engine.stop("w1")
        engine.start("w1")
        engine.wait_ready(list(topics))
        with engine.client() as client:
            # the persistent store goes on from where it was; transient ones rebuild from the point
            assert set(snapshot(client, "day")) == {3, 9, 10}
            assert snapshot(client, "dayt") == later
            assert snapshot(client, "nowt") == {}
    finally:
        engine.stop_all()


TOPICS: list[dict[str, Any]] = [{"Name": "book", "Key": "/id", "Partitions": 2}]


@pytest.fixture
def engine(kafka_bootstrap: str, tmp_path: Path) -> Iterator[EngineProcesses]:
    procs = EngineProcesses(kafka_bootstrap, tmp_path, TOPICS)
    try:
        procs.start("w1")
        procs.wait_ready(["book"])
        yield procs
    finally:
        procs.stop_all()


def recreate(engine: EngineProcesses, topic: str, partitions: int) -> None:
    """Delete the log topic of ``topic`` and create it again (empty) with the same settings."""
    spec = log_topic_spec(TopicNames(engine.prefix), topic, partitions)
    delete_topics(engine.bootstrap, [spec.name])
    admin = AdminClient({"bootstrap.servers": engine.bootstrap})
    deadline = time.monotonic() + 60
    while spec.name in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, "the log topic was not deleted"
        time.sleep(0.2)
    while True:
        try:
            ensure_topics(engine.bootstrap, [spec])
            return
        except Exception:  # still marked for deletion
            assert time.monotonic() < deadline, "the log topic could not be created again"
            time.sleep(0.5)


def warnings_of(engine: EngineProcesses) -> list[str]:
    """The warnings `sowstream status --json` shows for the topic book."""
    result = engine.cli("status", "book", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["partitions"]
    assert sorted(row["partition"] for row in rows) == [0, 1]
    assert all(row["answered"] for row in rows), rows
    return [w["message"] for row in rows for w in row["warnings"]]


def publish_old(client: Client) -> None:
    for i in range(30):
        client.publish("book", {"id": i, "v": "old"})
    assert len(snapshot(client, "book")) == 30


def test_log_recreated_under_a_running_worker_is_applied_not_skipped(
    engine: EngineProcesses,
) -> None:
    with engine.client() as client:
        publish_old(client)
        sub = client.subscribe("book")
        assert warnings_of(engine) == []

        recreate(engine, "book", 2)
        time.sleep(2)  # the worker notices the topic went and came back
        for i in (0, 1, 100, 101):
            client.publish("book", {"id": i, "v": "new"})

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = snapshot(client, "book")
            if len(state) == 32 and state[0]["v"] == "new" and state[1]["v"] == "new":
                break
            time.sleep(0.5)
        state = snapshot(client, "book")
        # the SOW (newer than the log) is kept; the new log's first records are applied
        assert len(state) == 32, state
        assert {i for i, r in state.items() if r["v"] == "new"} == {0, 1, 100, 101}
        # a subscription placed before the recreation gets the new log's messages too
        got = {msg.json()["id"] for msg in (sub.next(timeout=10) for _ in range(4)) if msg}
        assert got == {0, 1, 100, 101}

    warnings = warnings_of(engine)
    assert warnings and all("recreated" in w and "'book'" in w for w in warnings), warnings
    assert "transaction log was recreated" in engine.log_tail("w1", 400)


def test_log_recreated_while_the_worker_was_down_is_detected_at_start(
    engine: EngineProcesses,
) -> None:
    with engine.client() as client:
        publish_old(client)
    engine.stop("w1")
    delete_topics(engine.bootstrap, [TopicNames(engine.prefix).log("book")])
    time.sleep(2)  # the worker creates the log again when it starts
    engine.start("w1")
    engine.wait_ready(["book"])
    with engine.client() as client:
        for i in (0, 100):
            client.publish("book", {"id": i, "v": "new"})
        state = snapshot(client, "book")
        assert len(state) == 31
        assert state[0]["v"] == "new" and state[100]["v"] == "new" and state[5]["v"] == "old"
        status = client.status("book")
    messages = [w["message"] for row in status for w in row["warnings"]]
    assert len(messages) == 2, status  # both partitions: the new log ends below the watermark
    assert all("ends at offset -1, below the stored watermark" in m for m in messages)
