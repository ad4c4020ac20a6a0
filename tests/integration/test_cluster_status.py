"""``sowstream status``: the cluster (workers, partitions, lag, records, subscriptions, queues,
dead letters) from the client, the CLI (table and ``--json``) and a worker's ``/status/cluster``.

Two workers with metrics ports, two SOW topics, a plain topic with a queue, subscriptions and one
dead-lettered record. A worker stopped with SIGSTOP shows as not answering while the log grows
past its watermark, and the lag goes back to zero once it runs again.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from sowstream.broker.local import free_port
from sowstream.client import Client
from sowstream.errors import SowstreamError
from sowstream.wire.topics import TopicNames
from tests.support.engine import EngineProcesses

pytestmark = pytest.mark.integration

TOPICS = [
    {"Name": "orders", "Key": "/id", "Partitions": 4},
    {"Name": "prices", "Key": "/sym", "Partitions": 2},
]
PLAIN = [{"Name": "work", "Partitions": 2}]
QUEUES: list[dict[str, Any]] = [{"Name": "WQ", "UnderlyingTopic": "work", "LeasePeriod": "30s"}]
ORDERS, PRICES, WORK = 40, 6, 3


class Cluster:
    """The two workers, each with its HTTP port."""

    def __init__(self, engine: EngineProcesses) -> None:
        self.engine = engine
        self.ports = {name: free_port() for name in ("w1", "w2")}

    def start(self) -> None:
        for name, port in self.ports.items():
            self.engine.start(name, "--metrics-port", str(port))
        self.engine.wait_ready(["orders", "prices"])

    def http(self, name: str, path: str) -> tuple[int, bytes]:
        url = f"http://127.0.0.1:{self.ports[name]}{path}"
        try:
            with urllib.request.urlopen(url, timeout=60) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def pid(self, name: str) -> int:
        return self.engine.procs[name].pid


@pytest.fixture(scope="module")
def cluster(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    engine = EngineProcesses(
        kafka_bootstrap,
        tmp_path_factory.mktemp("cluster-status"),
        TOPICS,
        plain_topics=PLAIN,
        queues=QUEUES,
    )
    c = Cluster(engine)
    try:
        c.start()
        yield c
    finally:
        for name in c.ports:
            if engine.alive(name):
                os.kill(c.pid(name), signal.SIGCONT)  # a stopped process ignores SIGTERM
        engine.stop_all()


@pytest.fixture(scope="module")
def loaded(cluster: Cluster) -> Iterator[Client]:
    """The data the counts are checked against, and three live subscriptions."""
    engine = cluster.engine
    with engine.client() as client:
        for i in range(ORDERS):
            client.publish("orders", {"id": i, "qty": i})
        for i in range(PRICES):
            client.publish("prices", {"sym": f"S{i}", "px": i})
        for i in range(WORK):
            client.publish("work", {"job": i})
        client.flush()
        producer = Producer({"bootstrap.servers": engine.bootstrap})
        producer.produce(TopicNames(engine.prefix).log("orders"), value=b'{"id": ')  # malformed
        assert producer.flush(30) == 0
        subs = [client.subscribe("orders"), client.subscribe("orders", "/qty > 3")]
        subs.append(client.subscribe("prices"))
        yield client
        for sub in subs:
            sub.close()


def settled(doc: dict[str, Any]) -> bool:
    """Every worker answers, every partition answered and caught up, every count is in."""
    topics = {t["topic"]: t for t in doc["topics"]}
    return (
        len(doc["workers"]) == 2
        and all(w["answering"] and w["ready"] for w in doc["workers"])
        and all(p["answered"] and p["lag"] == 0 for p in doc["partitions"])
        and topics["orders"]["subscriptions"] == 2
        and topics["prices"]["subscriptions"] == 1
        and doc["dead_letters"]["count"] == 1
        and all("error" not in q for q in doc["queues"])
    )


def poll(read: Callable[[], dict[str, Any]], until: Callable[[dict[str, Any]], bool]) -> Any:
    """Read the status until ``until`` holds (a bounded wait, not a timed assertion)."""
    deadline = time.monotonic() + 120
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            doc = read()
        except SowstreamError:
            doc = {}
        if doc and until(doc):
            return doc
        time.sleep(1)
    raise AssertionError(f"status never settled: {orjson.dumps(doc, option=orjson.OPT_INDENT_2)}")


def check_counts(doc: dict[str, Any], engine: EngineProcesses) -> None:
    assert sorted(w["worker"] for w in doc["workers"]) == ["w1", "w2"]
    owned = [p for w in doc["workers"] for p in w["partitions"]]
    assert sorted(owned) == sorted(
        [f"orders/{p}" for p in range(4)]
        + [f"prices/{p}" for p in range(2)]
        + [f"work/{p}" for p in range(2)]
    )
    assert all(w["pid"] == engine.procs[w["worker"]].pid for w in doc["workers"])
    assert all(w["uptime_s"] >= 0 and w["restore"] == [] for w in doc["workers"])
    topics = {t["topic"]: t for t in doc["topics"]}
    assert sorted(topics) == ["orders", "prices", "work"]
    assert topics["orders"]["records"] == ORDERS
    assert topics["prices"]["records"] == PRICES
    assert topics["work"]["records"] is None  # a plain topic keeps no SOW
    assert [(q["queue"], q["depth"], q["leased"]) for q in doc["queues"]] == [("WQ", WORK, 0)]
    assert doc["dead_letters"] == {
        "count": 1,
        "by_reason": {"malformed_json": 1},
        "by_topic": {"orders": 1},
    }
    rows = [p for p in doc["partitions"] if p["topic"] == "orders"]
    assert sum(p["records"] for p in rows) == ORDERS
    # The dead-lettered record is in the log too, and applied (skipped) like any other.
    assert sum(p["log_end"] for p in rows) == ORDERS + 1


def test_status_counts_workers_records_subscriptions_queues_and_dead_letters(
    cluster: Cluster, loaded: Client
) -> None:
    doc = poll(loaded.cluster_status, settled)
    check_counts(doc, cluster.engine)

    result = cluster.engine.cli("status", "--json")
    assert result.returncode == 0, result.stderr
    cli_doc = orjson.loads(result.stdout)
    assert settled(cli_doc)
    check_counts(cli_doc, cluster.engine)

    table = cluster.engine.cli("status")
    assert table.returncode == 0, table.stderr
    for text in ("2 worker(s)", "8 partition(s)", "1 dead letter(s)", "malformed_json", "WQ"):
        assert text in table.stdout, table.stdout

    only = orjson.loads(cluster.engine.cli("status", "prices", "--json").stdout)
    assert [t["topic"] for t in only["topics"]] == ["prices"]
    assert {p["topic"] for p in only["partitions"]} == {"prices"}


def test_the_worker_http_endpoint_serves_the_same_document(
    cluster: Cluster, loaded: Client
) -> None:
    poll(loaded.cluster_status, settled)
    for name in ("w1", "w2"):
        code, body = cluster.http(name, "/status/cluster")
        assert code == 200, body
        doc = orjson.loads(body)
        assert settled(doc)
        check_counts(doc, cluster.engine)


def test_lag_grows_while_a_worker_is_stopped_and_returns_to_zero_after_catch_up(
    cluster: Cluster, loaded: Client
) -> None:
    engine = cluster.engine
    before = poll(loaded.cluster_status, settled)
    w2_orders = [
        int(p.split("/")[1])
        for w in before["workers"]
        if w["worker"] == "w2"
        for p in w["partitions"]
        if p.startswith("orders/")
    ]
    assert w2_orders, before["workers"]  # 8 partitions over two workers: w2 owns some orders
    os.kill(cluster.pid("w2"), signal.SIGSTOP)
    try:
        with engine.client() as publisher:
            for i in range(ORDERS, ORDERS + 200):
                publisher.publish("orders", {"id": i, "qty": i})
            publisher.flush()
        # The command comes back, and w2's partitions show its last watermark: behind the log.
        doc = loaded.cluster_status(1.0)
        stale = {p["partition"]: p for p in doc["partitions"] if p["topic"] == "orders"}
        for partition in w2_orders:
            row = stale[partition]
            assert row["answered"] is False and row["worker"] == "w2", row
            assert row["lag"] > 0, row
        # After five missed announcements w2 shows as not answering (and stays listed).
        silent = poll(
            lambda: loaded.cluster_status(1.0),
            lambda d: any(w["worker"] == "w2" and not w["answering"] for w in d["workers"]),
        )
        assert [w["ready"] for w in silent["workers"] if w["worker"] == "w2"] == [False]
    finally:
        os.kill(cluster.pid("w2"), signal.SIGCONT)
    after = poll(loaded.cluster_status, settled)
    orders = {t["topic"]: t for t in after["topics"]}["orders"]
    assert orders["records"] == ORDERS + 200 and orders["lag"] == 0
