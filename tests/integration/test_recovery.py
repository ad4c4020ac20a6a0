"""Restarts, rebuilds and SIGKILL: the SOW always equals a fold of the transaction log."""

from __future__ import annotations

import random
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from sowstream.client import Client
from sowstream.sow.keys import generated_sow_key
from sowstream.wire.kafka import producer_config
from tests.support.engine import QUICK_SESSION_TIMEOUT, EngineProcesses

pytestmark = pytest.mark.integration

TOPICS: list[dict[str, Any]] = [
    {"Name": "positions", "Key": ["/id"], "Partitions": 4},
    {"Name": "ticks", "Key": ["/id"], "Durability": "transient", "Partitions": 4},
    {"Name": "quotes", "Key": ["/id"], "Expiration": "enabled", "Partitions": 4},
    {
        "Name": "fresh",
        "Key": ["/id"],
        "Durability": "transient",
        "RecoveryPoint": "now",
        "Partitions": 4,
    },
]
NAMES = [t["Name"] for t in TOPICS]
FILTER = "/qty > 900"


def matches_filter(record: dict[str, Any]) -> bool:
    """The oracle's own reading of FILTER."""
    qty = record.get("qty")
    return isinstance(qty, int) and qty > 900


@pytest.fixture
def engine(kafka_bootstrap: str, tmp_path: Any) -> Iterator[EngineProcesses]:
    # its workers are SIGKILLed: the group gives up on them sooner
    procs = EngineProcesses(
        kafka_bootstrap, tmp_path, TOPICS, session_timeout=QUICK_SESSION_TIMEOUT
    )
    try:
        yield procs
    finally:
        procs.stop_all()


def snapshot(client: Client, topic: str) -> dict[str, Any]:
    return {m.sow_key: m.json() for m in client.sow(topic, batch_size=500) if m.command == "sow"}


def test_restart_keeps_the_sow_and_transient_topics_rebuild(engine: EngineProcesses) -> None:
    engine.start("w1")
    engine.wait_ready(NAMES)
    with engine.client() as client:
        for i in range(200):
            client.publish("positions", {"id": i, "qty": i})
            client.publish("ticks", {"id": i, "px": i})
            client.publish("fresh", {"id": i, "old": True})
        client.delta_publish("positions", {"id": 7, "qty": -1})
        client.sow_delete("ticks", filter="/id >= 150")
        before = snapshot(client, "positions")
        ticks_before = snapshot(client, "ticks")
        assert len(before) == 200 and len(ticks_before) == 150
        assert len(snapshot(client, "fresh")) == 200

    engine.stop("w1")
    engine.start("w1")
    engine.wait_ready(NAMES)
    with engine.client() as client:
        assert snapshot(client, "positions") == before  # RocksDB kept it
        assert snapshot(client, "ticks") == ticks_before  # rebuilt from the log (epoch)
        assert snapshot(client, "fresh") == {}  # RecoveryPoint now: only new publishes
        client.publish("fresh", {"id": 1, "old": False})
        assert list(snapshot(client, "fresh").values()) == [{"id": 1, "old": False}]

    # lose the local RocksDB entirely: the changelog brings the SOW back
    engine.stop("w1")
    shutil.rmtree(engine.workdir / "data" / engine.prefix / "w1")
    engine.start("w1")
    engine.wait_ready(NAMES)
    with engine.client() as client:
        assert snapshot(client, "positions") == before


def test_records_that_expired_while_no_worker_ran_are_removed_at_start(
    engine: EngineProcesses,
) -> None:
    engine.start("w1")
    engine.wait_ready(NAMES)
    with engine.client() as client:
        client.publish("quotes", {"id": "short"}, expiration=2)
        client.publish("quotes", {"id": "forever"}, expiration=0)
        client.publish("quotes", {"id": "long"}, expiration=3600)
        assert len(snapshot(client, "quotes")) == 3
    engine.stop("w1")
    time.sleep(3)
    engine.start("w1")
    engine.wait_ready(NAMES)
    with engine.client() as client:
        assert sorted(r["id"] for r in snapshot(client, "quotes").values()) == ["forever", "long"]
        time.sleep(1.5)  # one expiry sweep: the record is deleted, not just hidden
        assert client.sow_delete("quotes", filter="1=1") == 2


def fold_log(bootstrap: str, topic: str, partitions: int) -> dict[bytes, Any]:
    """An independent fold of the log: publish replaces, delta merges, delete removes."""

    def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
        out = dict(old)
        for k, v in new.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    state: dict[bytes, Any] = {}
    owned: dict[int, set[bytes]] = {p: set() for p in range(partitions)}
    for p in range(partitions):
        tp = TopicPartition(topic, p)
        _, high = consumer.get_watermark_offsets(tp, timeout=10)
        if high == 0:
            continue
        consumer.assign([TopicPartition(topic, p, 0)])
        done = False
        while not done:
            for msg in consumer.consume(1000, 1.0):
                if msg.error():
                    continue
                headers = dict(msg.headers() or [])
                cmd = (headers.get("sow.cmd") or b"publish").decode()
                key = msg.key()
                if key is None and cmd == "sow_delete" and "sow.filter" in headers:
                    for k in [k for k in owned[p] if matches_filter(state[k])]:
                        state.pop(k)
                        owned[p].discard(k)
                elif key is not None:
                    owned[p].add(key)
                    if cmd == "sow_delete":
                        state.pop(key, None)
                        owned[p].discard(key)
                    elif cmd == "delta_publish" and key in state:
                        state[key] = merge(state[key], orjson.loads(msg.value()))
                    else:
                        state[key] = orjson.loads(msg.value())
                if msg.offset() >= high - 1:
                    done = True
    consumer.close()
    return state


def test_sigkill_under_load_leaves_sow_equal_to_fold_of_log(engine: EngineProcesses) -> None:
    engine.start("w1")
    engine.start("w2")
    engine.wait_ready(NAMES)
    stop = threading.Event()
    published = [0]

    def load() -> None:
        rng = random.Random(7)
        # deletes go straight to the log as a plain producer would: no ack to wait for while a
        # partition has no worker
        deleter = Producer(producer_config(engine.bootstrap))
        with engine.client(timeout=10.0) as client:
            log = client.topic_info("positions").log_topic
            while not stop.is_set():
                time.sleep(0.0005)  # a steady load the workers keep up with
                i = rng.randrange(300)
                roll = rng.random()
                if roll < 0.6:
                    client.publish(
                        "positions",
                        {"id": i, "qty": rng.randrange(1000), "nested": {"a": rng.randrange(5)}},
                    )
                elif roll < 0.9:
                    client.delta_publish("positions", {"id": i, "nested": {"b": published[0]}})
                elif roll < 0.995:
                    key = generated_sow_key("positions", "positions", ["/id"], {"id": i})
                    deleter.produce(
                        log, key=key.encode(), value=None, headers=[("sow.cmd", b"sow_delete")]
                    )
                    deleter.poll(0)
                else:  # a delete by filter: one copy per partition
                    for p in range(4):
                        deleter.produce(
                            log,
                            value=None,
                            partition=p,
                            headers=[("sow.cmd", b"sow_delete"), ("sow.filter", FILTER.encode())],
                        )
                published[0] += 1
            client.flush()
        deleter.flush(10)

    worker = threading.Thread(target=load)
    worker.start()
    try:
        time.sleep(4)
        engine.stop("w2", kill=True)
        time.sleep(3)
        engine.start("w2")
        time.sleep(4)
        engine.stop("w1", kill=True)
        engine.start("w1")
        time.sleep(3)
    finally:
        stop.set()
        worker.join(60)
    assert published[0] > 2000
    engine.wait_ready(NAMES, timeout=180)
    expected = fold_log(engine.bootstrap, f"{engine.prefix}.log.positions", 4)
    with engine.client(timeout=60.0) as client:
        deadline = time.monotonic() + 60
        while True:
            actual = {k.encode(): v for k, v in snapshot(client, "positions").items()}
            if actual == expected or time.monotonic() > deadline:
                break
            time.sleep(1)
    assert actual == expected
