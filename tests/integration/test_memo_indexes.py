"""Memo indexes on a real worker: same answers as a scan, kept current, and kept across restarts.

One worker holds all partitions so its Prometheus counters show every plan; the expected answers
come from evaluating each filter over the records the test itself published.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sowstream.client import Client
from sowstream.filters import compile_filter
from tests.support.engine import EngineProcesses, metric
from tests.support.fleet import free_port

pytestmark = pytest.mark.integration

TOPICS: list[dict[str, Any]] = [
    {"Name": "orders", "Key": ["/id"], "Index": ["/px"], "Partitions": 4},
    {"Name": "quotes", "Key": ["/id"], "Expiration": "2s", "Partitions": 4},
]
NAMES = [t["Name"] for t in TOPICS]
FILTERS = [
    "/qty > 90",
    "/qty BETWEEN 10 AND 12",
    "/qty >= '95'",  # a numeric string: text order for strings, numbers numerically
    "/name LIKE '^n01'",
    "/name LIKE '5$'",
    "/name BEGINS WITH ('n02', 'x')",
    "/px < 5",
    "/qty > 95 OR /name BEGINS WITH ('n00')",
    "/qty > 50 AND /px < 20 AND /side = 'buy'",
]


class Worker:
    """The engine's one worker, with its metrics endpoint."""

    def __init__(self, engine: EngineProcesses) -> None:
        self.engine = engine
        self.port = free_port()

    def start(self) -> None:
        self.engine.start("w1", "--metrics-port", str(self.port))
        self.engine.wait_ready(NAMES)

    def metric(self, name: str, **labels: str) -> float:
        return metric(self.port, name, **labels)


@pytest.fixture
def worker(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Worker]:
    procs = EngineProcesses(kafka_bootstrap, tmp_path, TOPICS)
    try:
        w = Worker(procs)
        w.start()
        yield w
    finally:
        procs.stop_all()


def record(i: int) -> dict[str, Any]:
    qty: Any = i % 100
    if i % 7 == 0:
        qty = str(qty)  # numeric strings compare as numbers
    return {
        "id": i,
        "qty": qty,
        "px": round((i * 37 % 100) / 3, 2),
        "name": f"n{i:03d}" if i % 10 else f"x{i}",
        "side": "buy" if i % 2 else "sell",
    }


def sow(client: Client, flt: str) -> dict[str, Any]:
    return {
        m.sow_key: m.json() for m in client.sow("orders", flt, batch_size=500) if m.command == "sow"
    }


def check(client: Client, model: dict[str, dict[str, Any]]) -> None:
    for flt in FILTERS:
        f = compile_filter(flt)
        expected = {k: v for k, v in model.items() if f.matches(v)}
        assert sow(client, flt) == expected, flt


def test_indexed_queries_stay_right_through_updates_restarts_and_a_lost_data_dir(
    worker: Worker,
) -> None:
    engine = worker.engine
    model: dict[str, dict[str, Any]] = {}
    with engine.client() as client:
        for i in range(400):
            model[client.publish("orders", record(i))] = record(i)
        scans = worker.metric("sowstream_query_plans_total", topic="orders", plan="scan")
        check(client, model)
        # every filter above is answered from indexes: 4 partitions each, no scan
        memo = worker.metric("sowstream_query_plans_total", topic="orders", plan="memo")
        union = worker.metric("sowstream_query_plans_total", topic="orders", plan="union")
        assert memo + union == 4 * len(FILTERS)
        assert worker.metric("sowstream_query_plans_total", topic="orders", plan="scan") == scans
        # /px (Index) was built at load; /qty and /name by the first queries that needed them
        assert worker.metric("sowstream_memo_index_builds_total", topic="orders") == 4 * 3

        # updates move records between index entries, deletes remove them
        keys = list(model)
        for n, key in enumerate(keys[:60]):
            body = {**model[key], "qty": 99 - n % 100, "name": f"x{n}"}
            client.publish("orders", body)
            model[key] = body
        for key in keys[60:80]:
            client.delta_publish("orders", {"id": model[key]["id"], "px": 1.5})
            model[key] = {**model[key], "px": 1.5}
        for key in keys[80:90]:
            client.sow_delete("orders", sow_keys=[key])
            del model[key]
        deleted = client.sow_delete("orders", filter="/qty > 97")  # the index finds them too
        assert deleted == sum(1 for v in model.values() if compile_filter("/qty > 97").matches(v))
        model = {k: v for k, v in model.items() if not compile_filter("/qty > 97").matches(v)}
        check(client, model)

    # a restart keeps the indexes: nothing is built again
    engine.stop("w1")
    worker.start()
    with engine.client() as client:
        check(client, model)
        assert worker.metric("sowstream_memo_index_builds_total", topic="orders") == 0
        client.publish("orders", {"id": 1000, "qty": 99, "px": 0.5, "name": "n015", "side": "buy"})
        model[next(m.sow_key for m in client.sow("orders", "/id = 1000") if m.command == "sow")] = {
            "id": 1000,
            "qty": 99,
            "px": 0.5,
            "name": "n015",
            "side": "buy",
        }

    # losing the local RocksDB: the changelog brings the records and the indexes back
    engine.stop("w1")
    shutil.rmtree(engine.data_dir("w1"))
    worker.start()
    with engine.client() as client:
        check(client, model)
        assert worker.metric("sowstream_memo_index_builds_total", topic="orders") == 0
        assert worker.metric("sowstream_query_plans_total", topic="orders", plan="scan") == 0


def test_expired_records_leave_the_index(worker: Worker) -> None:
    with worker.engine.client() as client:
        for i in range(20):
            client.publish("quotes", {"id": i, "qty": i}, expiration=1 if i < 10 else 3600)
        assert len(client.sow_records("quotes", "/qty >= 5")) == 15
        time.sleep(2.5)  # past the expiration and at least one expiry sweep
        assert sorted(r["id"] for r in client.sow_records("quotes", "/qty >= 5")) == list(
            range(10, 20)
        )
        # a key that expired and is published again is found under its new value only
        client.publish("quotes", {"id": 3, "qty": 500}, expiration=3600)
        assert [r["id"] for r in client.sow_records("quotes", "/qty > 400")] == [3]
        assert client.sow_records("quotes", "/qty BETWEEN 3 AND 3") == []
