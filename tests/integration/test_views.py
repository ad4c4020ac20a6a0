"""Maintained views end to end on a real broker: lifecycle, filters, joins, views of views,
subscriptions with oof, refused publishes, and recovery after SIGKILL.

The worked examples of the views chapter (section 11) are named Vn where they are followed.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from sowstream.client import Client, Message
from sowstream.errors import InvalidCommandError
from sowstream.messagetypes.changes import merge_delta
from sowstream.wire.kafka import producer_config
from tests.support.engine import EngineProcesses, running_engine
from tests.support.messages import by_sow_key, drain, eventually, take

pytestmark = pytest.mark.integration

TOPICS: list[dict[str, Any]] = [
    {"Name": "orders", "Key": ["/orderId"], "Partitions": 2},
    {"Name": "tasks", "Key": ["/orderId"], "Partitions": 2},
    {"Name": "example", "Key": ["/id"], "Partitions": 1},
]
BY_REGION: dict[str, Any] = {
    "Name": "BY_REGION",
    "UnderlyingTopic": "orders",
    "Projection": ["/region", "SUM(/qty) AS /total", "COUNT(/orderId) AS /n"],
    "Grouping": ["/region"],
    "Partitions": 2,
}
VIEWS: list[dict[str, Any]] = [
    BY_REGION,
    {
        "Name": "CompleteByRegion",
        "UnderlyingTopic": "tasks",
        "Projection": ["COUNT(/orderId) AS /completedOrders", "/region AS /region"],
        "Grouping": ["/region"],
        "Filter": "/status = 'complete'",
        "Partitions": 2,
    },
    {
        # A view of a view: how many regions have a total above 10, and their sum.
        "Name": "BIG_REGIONS",
        "UnderlyingTopic": "BY_REGION",
        "Projection": ["/big AS /big", "COUNT(/region) AS /regions", "SUM(/total) AS /total"],
        "Grouping": ["/big"],
        "Filter": "/total > 10",
        "Partitions": 1,
    },
]
VIEWS.append(
    {
        # V12: an nvfix view named like the json topic it reads; they are two topics.
        "Name": "example",
        "MessageType": "nvfix",
        "UnderlyingTopic": "[json].[example]",
        "Projection": ["[json].[example]./id AS /id"],
        "Grouping": ["[json].[example]./id"],
        "Partitions": 1,
    }
)
# /big is not a field of BY_REGION: every row of BIG_REGIONS falls in the one NULL group.
VIEWS.append(
    {
        # Two Grouping fields, one shown under another name: deltas carry /area and /desk.
        "Name": "DESKS",
        "UnderlyingTopic": "orders",
        "Projection": ["/region AS /area", "/desk", "SUM(/qty) AS /total"],
        "Grouping": ["/region", "/desk"],
        "Partitions": 2,
    }
)
# A conflated topic over a view: its deltas carry the view's Grouping fields.
CONFLATED: list[dict[str, Any]] = [
    {"Name": "BY_REGION-C", "UnderlyingTopic": "BY_REGION", "Interval": "500ms", "Partitions": 2}
]


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    with running_engine(
        kafka_bootstrap,
        tmp_path_factory.mktemp("views"),
        TOPICS,
        workers=("w1",),
        views=VIEWS,
        conflated_topics=CONFLATED,
    ) as procs:
        yield procs


def by(records: dict[str, dict[str, Any]], field: str) -> dict[Any, dict[str, Any]]:
    return {r.get(field): r for r in records.values()}


def regions(client: Client, view: str = "BY_REGION") -> dict[Any, dict[str, Any]]:
    return by(by_sow_key(client, view), "region")


def reset(client: Client, *topics: str) -> None:
    for topic in topics:
        client.sow_delete(topic, filter="1=1")


# -- single-topic views ---------------------------------------------------------------------


def test_v1_lifecycle_seen_by_sow(client: Client) -> None:
    reset(client, "orders")
    eventually(lambda: regions(client), {})
    steps: list[tuple[Callable[[], Any], dict[Any, dict[str, Any]]]] = [
        (
            lambda: client.publish("orders", {"orderId": 1, "region": "EU", "qty": 10}),
            {"EU": {"region": "EU", "total": 10, "n": 1}},
        ),
        (
            lambda: client.publish("orders", {"orderId": 2, "region": "EU", "qty": 5}),
            {"EU": {"region": "EU", "total": 15, "n": 2}},
        ),
        (
            lambda: client.publish("orders", {"orderId": 1, "region": "EU", "qty": 7}),
            {"EU": {"region": "EU", "total": 12, "n": 2}},
        ),
        (
            lambda: client.publish("orders", {"orderId": 2, "region": "US", "qty": 5}),
            {
                "EU": {"region": "EU", "total": 7, "n": 1},
                "US": {"region": "US", "total": 5, "n": 1},
            },
        ),
        (
            lambda: client.sow_delete("orders", filter="/orderId = 1"),
            {"US": {"region": "US", "total": 5, "n": 1}},
        ),
    ]
    for act, expected in steps:
        act()
        client.flush()
        eventually(lambda: regions(client), expected)
    reset(client, "orders")
    eventually(lambda: regions(client), {})


def test_v1_seen_by_sow_and_subscribe_with_oof(client: Client, publisher: Client) -> None:
    reset(publisher, "orders")
    eventually(lambda: regions(publisher), {})
    sub = client.sow_and_subscribe("BY_REGION", options="oof")
    snapshot = take(sub, 2)
    assert [m.command for m in snapshot] == ["group_begin", "group_end"]
    publisher.publish("orders", {"orderId": 1, "region": "EU", "qty": 10})
    (m1,) = take(sub, 1)
    publisher.publish("orders", {"orderId": 2, "region": "EU", "qty": 5})
    (m2,) = take(sub, 1)
    publisher.publish("orders", {"orderId": 1, "region": "EU", "qty": 7})
    (m3,) = take(sub, 1)
    assert [(m.command, m.json()) for m in (m1, m2, m3)] == [
        ("publish", {"region": "EU", "total": 10, "n": 1}),
        ("publish", {"region": "EU", "total": 15, "n": 2}),
        ("publish", {"region": "EU", "total": 12, "n": 2}),
    ]
    publisher.publish("orders", {"orderId": 2, "region": "US", "qty": 5})
    step4 = take(sub, 2)
    assert sorted((m.command, m.json()["region"], m.json()["total"]) for m in step4) == [
        ("publish", "EU", 7),
        ("publish", "US", 5),
    ]
    publisher.sow_delete("orders", filter="/orderId = 1")
    (gone,) = take(sub, 1)
    assert (gone.command, gone.reason) == ("oof", "deleted")
    assert gone.json() == {"region": "EU", "total": 7, "n": 1}
    assert gone.sow_key == m1.sow_key
    sub.close()


def test_v1_seen_by_sow_and_delta_subscribe_with_oof(client: Client, publisher: Client) -> None:
    # A view's SowKey is made from its Grouping values, so the Grouping fields are its key
    # fields: every delta carries /region besides what changed (send_keys).
    reset(publisher, "orders")
    eventually(lambda: regions(publisher), {})
    sub = client.sow_and_delta_subscribe("BY_REGION", options="oof")
    assert [m.command for m in take(sub, 2)] == ["group_begin", "group_end"]
    got = []
    for record in (
        {"orderId": 1, "region": "EU", "qty": 10},
        {"orderId": 2, "region": "EU", "qty": 5},
        {"orderId": 1, "region": "EU", "qty": 7},
    ):
        publisher.publish("orders", record)
        got.extend(take(sub, 1))
    assert [(m.command, m.json()) for m in got] == [
        ("publish", {"region": "EU", "total": 10, "n": 1}),  # a new record comes whole
        ("publish", {"region": "EU", "total": 15, "n": 2}),
        ("publish", {"region": "EU", "total": 12}),  # n did not change
    ]
    assert [m.delta for m in got] == [False, True, True]
    publisher.publish("orders", {"orderId": 2, "region": "US", "qty": 5})
    step4 = sorted((m.json()["region"], m.json(), m.delta) for m in take(sub, 2))
    assert [(body, delta) for _, body, delta in step4] == [
        ({"region": "EU", "total": 7, "n": 1}, True),
        ({"region": "US", "total": 5, "n": 1}, False),
    ]
    publisher.sow_delete("orders", filter="/orderId = 1")
    (gone,) = take(sub, 1)
    assert (gone.command, gone.reason, gone.json()) == (
        "oof",
        "deleted",
        {"region": "EU", "total": 7, "n": 1},
    )
    sub.close()


def test_view_deltas_in_a_page_window_carry_the_grouping_fields(
    client: Client, publisher: Client
) -> None:
    # With top_n the client computes the deltas itself, from the keys the meta topic gives.
    reset(publisher, "orders")
    eventually(lambda: regions(publisher), {})
    publisher.publish("orders", {"orderId": 1, "region": "EU", "qty": 1})
    eventually(lambda: len(regions(publisher)), 1)
    sub = client.sow_and_delta_subscribe("BY_REGION", options="oof", order_by="/region", top_n=5)
    assert [m.command for m in take(sub, 3)] == ["group_begin", "sow", "group_end"]
    publisher.publish("orders", {"orderId": 1, "region": "EU", "qty": 4})
    (update,) = take(sub, 1)
    assert (update.delta, update.json()) == (True, {"region": "EU", "total": 4})
    sub.close()


def test_deltas_of_a_view_carry_each_grouping_field_as_the_view_names_it(
    client: Client, publisher: Client
) -> None:
    reset(publisher, "orders")
    eventually(lambda: by_sow_key(publisher, "DESKS"), {})
    publisher.publish("orders", {"orderId": 1, "region": "EU", "desk": "fx", "qty": 2})
    eventually(lambda: len(by_sow_key(publisher, "DESKS")), 1)
    sub = client.delta_subscribe("DESKS")
    publisher.publish("orders", {"orderId": 2, "region": "EU", "desk": "fx", "qty": 3})
    (update,) = take(sub, 1)
    assert (update.delta, update.json()) == (True, {"area": "EU", "desk": "fx", "total": 5})
    sub.close()


def held_by_keys(messages: list[Message], keys: tuple[str, ...]) -> dict[Any, dict[str, Any]]:
    """What an application holds that names records by their key fields in the body (never by
    SowKey): a publish replaces or (a delta) merges into the record those fields name, an oof
    removes it."""
    held: dict[Any, dict[str, Any]] = {}
    for m in messages:
        if m.command not in ("sow", "publish", "oof"):
            continue
        body = m.json()
        assert all(k in body for k in keys), f"{m.command} {body} lacks a key field of {keys}"
        name = tuple(body[k] for k in keys)
        if m.command == "oof":
            held.pop(name, None)
        elif m.delta:
            assert name in held, f"a delta {body} for a record never received"
            held[name] = merge_delta(held[name], body)
        else:
            held[name] = body
    return held


def test_a_delta_subscriber_of_views_holds_what_their_sow_holds(
    client: Client, publisher: Client
) -> None:
    reset(publisher, "orders")
    eventually(lambda: by_sow_key(publisher, "DESKS"), {})
    for i in range(20):
        publisher.publish("orders", {"orderId": i, "region": f"R{i % 3}", "desk": "a", "qty": i})
    # The SOW parts hold the groups, so the changes below reach the subscribers as deltas (to a
    # subscriber placed before the view has them, every group is new: whole records only).
    eventually(lambda: len(by_sow_key(publisher, "DESKS")), 3)
    eventually(lambda: len(by_sow_key(publisher, "BY_REGION-C")), 3)
    subs = {
        ("DESKS", ("area", "desk")): client.sow_and_delta_subscribe("DESKS", options="oof"),
        ("BY_REGION-C", ("region",)): client.sow_and_delta_subscribe("BY_REGION-C", options="oof"),
    }
    messages: dict[str, list[Message]] = {name: [] for name, _ in subs}
    for i in range(0, 60, 2):  # updates, group moves, and groups emptied by deletes
        n = i % 20
        desk = "b" if i % 4 else "a"
        publisher.publish("orders", {"orderId": n, "region": f"R{i % 4}", "desk": desk, "qty": i})
    for i in range(0, 20, 3):
        publisher.sow_delete("orders", filter=f"/orderId = {i}")
    publisher.publish("orders", {"orderId": 3, "region": "R9", "desk": "z", "qty": 1})
    publisher.flush()

    def caught_up(name: str, keys: tuple[str, ...]) -> bool:
        messages[name].extend(drain(subs[(name, keys)], 0.5))
        want = {tuple(r[k] for k in keys): r for r in by_sow_key(publisher, name).values()}
        return held_by_keys(messages[name], keys) == want

    for name, keys in subs:
        eventually(lambda: caught_up(name, keys), True)  # noqa: B023
        assert any(m.delta for m in messages[name])
        subs[(name, keys)].close()


def test_v2_filtered_view(client: Client) -> None:
    reset(client, "tasks")
    view = "CompleteByRegion"
    eventually(lambda: regions(client, view), {})
    steps = [
        ({"orderId": 1, "region": "A", "status": "open"}, {}),
        (
            {"orderId": 1, "region": "A", "status": "complete"},
            {"A": {"completedOrders": 1, "region": "A"}},
        ),
        (
            {"orderId": 2, "region": "A", "status": "complete"},
            {"A": {"completedOrders": 2, "region": "A"}},
        ),
        (
            {"orderId": 1, "region": "A", "status": "open"},
            {"A": {"completedOrders": 1, "region": "A"}},
        ),
        ({"orderId": 2, "region": "A", "status": "cancelled"}, {}),
    ]
    for record, expected in steps:
        client.publish("tasks", record)
        client.flush()
        eventually(lambda: regions(client, view), expected)


def test_v12_an_nvfix_view_of_a_json_topic_of_the_same_name(client: Client) -> None:
    client.sow_delete("example", filter="1=1")
    client.publish("example", {"id": 5})
    eventually(lambda: client.sow_records("example", message_type="nvfix"), [b"id=5\x01"])
    assert client.sow_records("example") == [{"id": 5}]
    with pytest.raises(InvalidCommandError, match="view"):
        client.publish("example", b"id=6\x01", message_type="nvfix")


def test_v14_aggregated_query_equals_the_view_and_a_view_of_the_view(client: Client) -> None:
    reset(client, "orders")
    eventually(lambda: regions(client), {})
    for i in range(200):
        client.publish("orders", {"orderId": i, "region": f"R{i % 7}", "qty": i % 13})
    for i in range(0, 200, 3):
        client.publish("orders", {"orderId": i, "region": f"R{i % 5}", "qty": i % 11})
    for i in range(0, 200, 10):
        client.sow_delete("orders", filter=f"/orderId = {i}")
    client.flush()
    aggregated = lambda: {  # noqa: E731
        m.json()["region"]: m.json()
        for m in client.sow(
            "orders",
            grouping="[/region]",
            projection="[/region, SUM(/qty) AS /total, COUNT(/orderId) AS /n]",
        )
        if m.command == "sow"
    }
    expected = aggregated()
    assert len(expected) == 7
    eventually(lambda: regions(client), expected)
    big = [r for r in expected.values() if r["total"] > 10]
    eventually(
        lambda: list(by_sow_key(client, "BIG_REGIONS").values()),
        [{"regions": len(big), "total": sum(r["total"] for r in big)}],
    )
    # The view is a SOW topic for queries: filters, OrderBy and top_n.
    top = [
        m.json()
        for m in client.sow("BY_REGION", "/n > 0", order_by="/total DESC", top_n=2)
        if m.command == "sow"
    ]
    assert top == sorted(expected.values(), key=lambda r: -r["total"])[:2]


def test_publish_to_a_view_is_refused(engine: EngineProcesses, client: Client) -> None:
    with pytest.raises(
        InvalidCommandError, match="'BY_REGION' is computed by the engine from orders"
    ):
        client.publish("BY_REGION", {"region": "XX", "total": 1})
    with pytest.raises(InvalidCommandError, match="is computed by the engine"):
        client.sow_delete("BY_REGION", filter="1=1")
    # A plain Kafka producer writing the view's log is refused by the engine.
    marker = f"X{uuid.uuid4().hex[:6]}"
    producer = Producer(producer_config(engine.bootstrap, engine.kafka))
    producer.produce(
        f"{engine.prefix}.log.BY_REGION",
        orjson.dumps({"region": marker, "total": 1}),
        key=marker.encode(),
    )
    assert producer.flush(10) == 0
    client.publish("orders", {"orderId": 999_999, "region": marker, "qty": 3})
    client.flush()
    eventually(lambda: regions(client).get(marker), {"region": marker, "total": 3, "n": 1})
    assert marker.encode() not in {k.encode() for k in by_sow_key(client, "BY_REGION")}
    client.sow_delete("orders", filter="/orderId = 999999")
