"""Conflated topics over what is not a plain SOW topic, on a real broker: a regular expression
(Pattern) topic with TopicFormat (worked example C8: one conflated topic per name), a view
(throttled aggregates) and another conflated topic (chapter A4 chains); the conflation ratio in
the status document and the Prometheus metrics; and Enrichment on a conflated topic."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from rich.console import Console

from sowstream.broker.local import free_port
from sowstream.cli.main import status_tables
from sowstream.client import Client, Message
from sowstream.errors import InvalidCommandError
from tests.support.engine import EngineProcesses, metrics_text
from tests.support.messages import by_sow_key, drain, eventually

pytestmark = pytest.mark.integration

TOPICS: list[dict[str, Any]] = [
    {"Name": "Quotes", "Pattern": "/q/.*", "Key": ["/sym"], "Partitions": 2},
    {"Name": "pos", "Key": ["/id"], "Partitions": 2},
    {"Name": "burst", "Key": ["/sym"], "Partitions": 1},
]
VIEWS: list[dict[str, Any]] = [
    {
        "Name": "by_desk",
        "UnderlyingTopic": "pos",
        "Projection": ["/desk AS /desk", "SUM(/qty) AS /qty", "COUNT(/id) AS /n"],
        "Grouping": ["/desk"],
        "Partitions": 2,
    }
]
CONFLATED: list[dict[str, Any]] = [
    {"Name": "Quotes-C", "UnderlyingTopic": "Quotes", "TopicFormat": "%n-C", "Interval": "1s"},
    {"Name": "by_desk-C", "UnderlyingTopic": "by_desk", "Interval": "1s"},
    {"Name": "pos-C", "UnderlyingTopic": "pos", "Interval": "500ms", "Partitions": 2},
    {"Name": "pos-CC", "UnderlyingTopic": "pos-C", "Interval": "2s", "Partitions": 2},
    {"Name": "burst-C", "UnderlyingTopic": "burst", "Interval": "2s", "Partitions": 1},
    {
        "Name": "pos-E",
        "UnderlyingTopic": "pos",
        "Interval": "500ms",
        "Enrichment": ["/qty * 2 AS /double", "UPPER(/desk) AS /desk"],
    },
]


class Engine:
    """One worker with its metrics port."""

    def __init__(self, procs: EngineProcesses) -> None:
        self.procs = procs
        self.port = free_port()

    def metrics(self) -> str:
        return metrics_text(self.port)


@pytest.fixture(scope="module")
def engine(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    procs = EngineProcesses(
        kafka_bootstrap,
        tmp_path_factory.mktemp("conflated-sources"),
        TOPICS,
        views=VIEWS,
        conflated_topics=CONFLATED,
    )
    own = Engine(procs)
    try:
        procs.start("w1", "--metrics-port", str(own.port))
        names = [t["Name"] for t in TOPICS] + procs.views
        procs.wait_ready(names)
        yield own
    finally:
        procs.stop_all()


@pytest.fixture
def client(engine: Engine) -> Iterator[Client]:
    with engine.procs.client() as c:
        yield c


@pytest.fixture
def publisher(engine: Engine) -> Iterator[Client]:
    with engine.procs.client() as c:
        yield c


def at_most_one_per_interval(
    got: list[Message], field: str, elapsed: float, interval: float
) -> None:
    """No record got more than one update per Interval elapsed (plus the one in progress)."""
    counts: dict[Any, int] = {}
    for m in got:
        counts[m.json()[field]] = counts.get(m.json()[field], 0) + 1
    allowed = int(elapsed / interval) + 1
    assert counts and all(n <= allowed for n in counts.values()), (counts, elapsed)


# -- C8: a regular expression underlying topic --------------------------------------------------


def test_c8_each_name_of_a_regex_topic_gets_its_own_conflated_topic(
    client: Client, publisher: Client
) -> None:
    for name in ("/q/eu", "/q/us"):
        publisher.sow_delete(name, filter="1=1")
    eventually(lambda: by_sow_key(publisher, "Quotes-C"), {})
    publisher.publish("/q/eu", {"sym": "A", "p": 1})
    publisher.publish("/q/eu", {"sym": "B", "p": 2})
    publisher.publish("/q/us", {"sym": "A", "p": 3})
    eventually(lambda: by_sow_key(client, "/q/eu-C"), by_sow_key(publisher, "/q/eu"))
    eventually(lambda: by_sow_key(client, "/q/us-C"), by_sow_key(publisher, "/q/us"))
    assert sorted(by_sow_key(client, "/q/eu-C").values(), key=str) == [
        {"sym": "A", "p": 1},
        {"sym": "B", "p": 2},
    ]
    assert list(by_sow_key(client, "/q/us-C").values()) == [{"sym": "A", "p": 3}]
    # Each record is returned under its own conflated topic name; the family's Name reads all.
    every = [(m.topic, m.json()["p"]) for m in client.sow("Quotes-C") if m.command == "sow"]
    assert sorted(every) == [("/q/eu-C", 1), ("/q/eu-C", 2), ("/q/us-C", 3)]
    assert by_sow_key(client, "/q/eu-C").keys() == by_sow_key(client, "/q/eu").keys()


def test_c8_a_conflated_name_is_subscribed_alone_and_conflated(
    client: Client, publisher: Client
) -> None:
    publisher.sow_delete("/q/eu", filter="1=1")
    publisher.publish("/q/eu", {"sym": "A", "p": 0})
    publisher.publish("/q/eu", {"sym": "B", "p": 2})
    expected = by_sow_key(publisher, "/q/eu")  # read-your-writes: the publisher's own query
    assert len(expected) == 2
    eventually(lambda: by_sow_key(client, "/q/eu-C"), expected)
    sub = client.subscribe("/q/eu-C", options="oof")
    started = time.monotonic()
    for p in range(10, 40):
        publisher.publish("/q/eu", {"sym": "A", "p": p})
        publisher.publish("/q/us", {"sym": "A", "p": p})  # another name: not this subscription
    publisher.sow_delete("/q/eu", filter="/sym = 'B'")
    got = drain(sub, 3.5)
    elapsed = time.monotonic() - started
    assert {m.topic for m in got} == {"/q/eu-C"}
    publishes = [m for m in got if m.command == "publish"]
    at_most_one_per_interval(publishes, "sym", elapsed, 1.0)
    assert publishes[-1].json() == {"sym": "A", "p": 39}
    assert [(m.command, m.reason, m.json()) for m in got if m.command == "oof"] == [
        ("oof", "deleted", {"sym": "B", "p": 2})
    ]
    assert len(publishes) < 30 / 3
    eventually(lambda: by_sow_key(client, "/q/us-C"), by_sow_key(publisher, "/q/us"))
    sub.close()


def test_c8_publishing_to_a_conflated_name_is_refused(client: Client) -> None:
    with pytest.raises(InvalidCommandError, match="computed by the engine from Quotes"):
        client.publish("/q/eu-C", {"sym": "Z", "p": 1})
    with pytest.raises(InvalidCommandError, match="computed by the engine from Quotes"):
        client.sow_delete("/q/eu-C", filter="1=1")
    assert "Z" not in {r["sym"] for r in by_sow_key(client, "/q/eu-C").values()}


# -- A4 chains: over a view, over a conflated topic ---------------------------------------------


def by_desk(client: Client, topic: str) -> dict[str, dict[str, Any]]:
    return {r["desk"]: r for r in by_sow_key(client, topic).values()}


def test_a_conflated_view_updates_each_aggregate_at_most_once_per_interval(
    client: Client, publisher: Client
) -> None:
    publisher.sow_delete("pos", filter="1=1")
    eventually(lambda: by_sow_key(publisher, "by_desk-C"), {})
    sub = client.subscribe("by_desk-C")
    started = time.monotonic()
    for n in range(120):
        publisher.publish("pos", {"id": n % 12, "desk": f"d{n % 3}", "qty": n})
    got = drain(sub, 4.0)
    elapsed = time.monotonic() - started
    at_most_one_per_interval(got, "desk", elapsed, 1.0)
    assert len(got) < 120 / 4
    # id i ends with qty 108 + i on desk d(i % 3): four ids per desk.
    expected = {f"d{k}": {"desk": f"d{k}", "qty": 450 + 4 * k, "n": 4} for k in range(3)}
    eventually(lambda: by_desk(client, "by_desk"), expected)
    eventually(lambda: by_desk(client, "by_desk-C"), expected)
    assert by_sow_key(client, "by_desk-C") == by_sow_key(client, "by_desk")  # the view's SowKeys
    assert {m.json()["desk"]: m.json() for m in got} == expected
    sub.close()


def test_a_conflated_topic_over_a_conflated_topic_keeps_the_outer_interval(
    client: Client, publisher: Client
) -> None:
    publisher.sow_delete("pos", filter="1=1")
    eventually(lambda: by_sow_key(publisher, "pos-CC"), {})
    sub = client.subscribe("pos-CC")
    started = time.monotonic()
    for n in range(100):
        publisher.publish("pos", {"id": n % 4, "desk": "d", "qty": n})
        if n % 20 == 19:
            time.sleep(0.6)  # changes spread over several of the inner topic's intervals
    got = drain(sub, 6.0)
    elapsed = time.monotonic() - started
    at_most_one_per_interval(got, "id", elapsed, 2.0)
    assert {m.json()["id"]: m.json()["qty"] for m in got} == {i: 96 + i for i in range(4)}
    expected = by_sow_key(publisher, "pos")
    eventually(lambda: by_sow_key(client, "pos-C"), expected)
    eventually(lambda: by_sow_key(client, "pos-CC"), expected)
    sub.close()


# -- A3.11: the conflation ratio ----------------------------------------------------------------


def test_a_burst_shows_in_the_conflation_ratio_and_the_metrics(
    engine: Engine, client: Client
) -> None:
    for p in range(50):
        client.publish("burst", {"sym": "A", "p": p})
    eventually(lambda: list(by_sow_key(client, "burst-C").values()), [{"sym": "A", "p": 49}])

    def conflation() -> dict[str, Any] | None:
        doc = client.cluster_status(topic="burst-C")
        rows = [t for t in doc["topics"] if t["topic"] == "burst-C"]
        row: dict[str, Any] | None = rows[0]["conflation"] if rows else None
        return row

    deadline = time.monotonic() + 30
    row = conflation()
    # Workers announce their counts every couple of seconds: wait for one after the flush.
    while (row is None or row["incoming"] < 50 or not row["published"]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.5)
        row = conflation()
    assert row is not None and row["incoming"] == 50
    assert 1 <= row["published"] <= 5
    assert row["ratio"] == round(50 / row["published"], 2) and row["ratio"] >= 10
    # Topics that are not conflated show none.
    doc = client.cluster_status(topic="burst.*")
    assert [t["conflation"] for t in doc["topics"] if t["topic"] == "burst"] == [None]
    # `sowstream status` shows the ratio in its topics table.
    console = Console(record=True, width=200)
    for table in status_tables(doc):
        console.print(table)
    shown = [line for line in console.export_text().splitlines() if "burst-C" in line]
    assert any(f"({row['incoming']}/{row['published']})" in line for line in shown), shown
    text = engine.metrics()
    assert 'sowstream_conflated_incoming_total{topic="burst-C"} 50.0' in text
    published = f'sowstream_conflated_published_total{{topic="burst-C"}} {row["published"]}.0'
    assert published in text


# -- Enrichment -----------------------------------------------------------------------------------


def test_enrichment_rewrites_the_conflated_records_only(client: Client, publisher: Client) -> None:
    publisher.sow_delete("pos", filter="1=1")
    eventually(lambda: by_sow_key(publisher, "pos-E"), {})
    sub = client.subscribe("pos-E")
    for n in range(20):
        publisher.publish("pos", {"id": n % 2, "desk": "ny", "qty": n})
    raw = by_sow_key(publisher, "pos")
    assert sorted(r["qty"] for r in raw.values()) == [18, 19]
    assert all(r["desk"] == "ny" and "double" not in r for r in raw.values())
    expected = {k: {**r, "double": 2 * r["qty"], "desk": "NY"} for k, r in raw.items()}
    eventually(lambda: by_sow_key(client, "pos-E"), expected)
    got = drain(sub, 1.5)
    assert {m.json()["id"]: m.json() for m in got} == {r["id"]: r for r in expected.values()}
    sub.close()
