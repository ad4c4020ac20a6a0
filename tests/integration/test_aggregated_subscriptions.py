"""Aggregated queries and subscriptions end to end: two workers, a topic whose groups span
partitions, a view of the same definition.

* the aggregated ``sow`` gives the records of a view with the same Projection and Grouping
  (IF, STDDEV, ANY and DISTINCT_LIST included), and chapter 07's ``SUM(IF(...))`` example works
  as a query;
* after a random workload (publishes, updates that move records between groups, deletes) the
  caches that ``sow_and_subscribe`` and ``sow_and_delta_subscribe`` subscribers build from their
  messages (publishes, deltas, oof) equal the aggregated ``sow`` of the same definition.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from sowstream.client import Client, Subscription
from sowstream.errors import InvalidCommandError
from sowstream.messagetypes.changes import merge_delta
from tests.support.engine import EngineProcesses, running_engine
from tests.support.messages import by_sow_key, eventually, take
from tests.support.subscriber import without_nulls

pytestmark = pytest.mark.integration

GROUPING = "[/region]"
FIELDS = [
    "/region",
    "SUM(/qty) AS /total",
    "COUNT(/id) AS /n",
    "STDDEV_POP(/qty) AS /sd",
    "STDDEV_SAMP(/qty) AS /ss",
    "ANY(/desk) AS /anyDesk",
    "DISTINCT_LIST(/desk) AS /desks",
    "SUM(IF((/qty % 10) == 0, 1, 0)) AS /tens",
    "MAX(/qty) AS /hi",
]
PROJECTION = "[" + ", ".join(FIELDS) + "]"
TOPICS: list[dict[str, Any]] = [
    {"Name": "orders", "Key": ["/id"], "Partitions": 4},
    {"Name": "oids", "Key": ["/id"], "Partitions": 2},
]
VIEWS: list[dict[str, Any]] = [
    {
        "Name": "ORDERS_BY_REGION",
        "UnderlyingTopic": "orders",
        "Projection": FIELDS,
        "Grouping": ["/region"],
        "Partitions": 2,
    }
]


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    with running_engine(
        kafka_bootstrap,
        tmp_path_factory.mktemp("aggregated"),
        TOPICS,
        workers=("w1", "w2"),
        views=VIEWS,
    ) as procs:
        yield procs


@pytest.fixture
def client(engine: EngineProcesses) -> Iterator[Client]:
    with engine.client() as c:
        yield c


@pytest.fixture
def publisher(engine: EngineProcesses) -> Iterator[Client]:
    with engine.client() as c:
        yield c


def canonical(records: Any) -> list[bytes]:
    return sorted(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) for r in records)


def aggregated_sow(client: Client) -> list[bytes]:
    rows = client.sow("orders", grouping=GROUPING, projection=PROJECTION)
    return canonical(m.json() for m in rows if m.command == "sow")


def test_chapter_07_sum_of_if_example_as_a_query(client: Client) -> None:
    for i, qty in enumerate((10, 10, 25)):
        client.publish("oids", {"id": i, "qty": qty, "oid": 1})
    client.flush()
    rows = client.sow(
        "oids",
        grouping="[/oid]",
        projection="[/oid, SUM(/qty) AS /totalOrderQty, "
        "SUM(IF((/qty % 10) == 0,1,0)) AS /evenTensOrderCount]",
    )
    assert [m.json() for m in rows if m.command == "sow"] == [
        {"oid": 1, "totalOrderQty": 45, "evenTensOrderCount": 2}
    ]


def workload(publisher: Client, seed: int, steps: int) -> None:
    rnd = random.Random(seed)
    for _ in range(steps):
        i = rnd.randrange(40)
        if rnd.random() < 0.15:
            publisher.sow_delete("orders", filter=f"/id = {i}")
        else:
            publisher.publish(
                "orders",
                {
                    "id": i,
                    "region": rnd.choice(["EU", "US", "APAC", None]),
                    "qty": rnd.choice([1, 5, 10, 20, 25, 2.5]),
                    "desk": rnd.choice(["a", "b", "c"]),
                },
            )
    publisher.flush()


def test_aggregated_sow_equals_the_view_of_the_same_definition(
    client: Client, publisher: Client
) -> None:
    workload(publisher, seed=7, steps=120)
    eventually(
        lambda: canonical(by_sow_key(client, "ORDERS_BY_REGION").values()),
        aggregated_sow(publisher),
        timeout=60,
    )


class Cache:
    """What an application builds from an aggregated subscription's messages."""

    def __init__(self, sub: Subscription) -> None:
        self.sub = sub
        self.records: dict[str, Any] = {}

    def drain(self) -> list[bytes]:
        while (msg := self.sub.next(timeout=0)) is not None:
            if msg.command == "oof":
                assert msg.reason == "deleted"
                assert msg.json() == self.records.pop(msg.sow_key)
            elif msg.command in ("sow", "publish"):
                if msg.delta:
                    # A field the group's record lost comes as null in the delta.
                    merged = merge_delta(self.records[msg.sow_key], msg.json())
                    self.records[msg.sow_key] = without_nulls(merged)
                else:
                    self.records[msg.sow_key] = msg.json()
        return canonical(self.records.values())


def test_subscribers_hold_the_aggregated_sow_after_a_random_workload(
    client: Client, publisher: Client
) -> None:
    workload(publisher, seed=11, steps=40)
    caches = []
    for subscribe in (client.sow_and_subscribe, client.sow_and_delta_subscribe):
        sub = subscribe("orders", options="oof", grouping=GROUPING, projection=PROJECTION)
        first = take(sub, 1)[0]
        assert first.command == "group_begin"
        caches.append(Cache(sub))
    # The snapshot alone equals the query.
    assert caches[0].drain() == aggregated_sow(publisher)
    for seed in (12, 13, 14):
        workload(publisher, seed=seed, steps=60)
        for cache in caches:
            eventually(lambda c=cache: c.drain(), aggregated_sow(publisher), timeout=60)
    # Every group empties: each subscriber is told with oof.
    publisher.sow_delete("orders", filter="1=1")
    publisher.flush()
    for cache in caches:
        eventually(lambda c=cache: c.drain(), [], timeout=60)
        cache.sub.close()


def test_refusals_name_the_problem(client: Client) -> None:
    with pytest.raises(InvalidCommandError, match="takes no bookmark"):
        client.sow_and_subscribe(
            "orders", grouping=GROUPING, projection=PROJECTION, bookmark="EPOCH"
        )
    with pytest.raises(InvalidCommandError, match="takes no select list"):
        client.subscribe(
            "orders", options="select=[/region]", grouping=GROUPING, projection=PROJECTION
        )
    with pytest.raises(InvalidCommandError, match="projection needs a grouping"):
        client.sow_and_subscribe("orders", projection=PROJECTION)
