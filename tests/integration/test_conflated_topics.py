"""Conflated topics end to end on a real broker: at most one update per record per Interval with
the latest value, deletes at the next flush (with oof), ``sow`` equal to the underlying SOW,
Filter, refused publishes, and nothing lost when a worker is SIGKILLed mid-interval. The
chapter's worked examples are named Cn."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from sowstream.client import Client
from sowstream.errors import InvalidCommandError
from tests.support.engine import QUICK_SESSION_TIMEOUT, EngineProcesses, running_engine
from tests.support.messages import by_sow_key, drain, eventually, take

pytestmark = pytest.mark.integration

INTERVAL = 1.0
TOPICS: list[dict[str, Any]] = [
    {"Name": "orders", "Key": ["/id"], "Partitions": 2},
    {"Name": "px", "Key": ["/sym"], "Partitions": 2},
]
CONFLATED: list[dict[str, Any]] = [
    {"Name": "px-C", "UnderlyingTopic": "px", "MessageType": "json", "Interval": "1s"},
    {"Name": "orders-C", "UnderlyingTopic": "orders", "Interval": "1s", "Partitions": 2},
    {"Name": "orders-S", "UnderlyingTopic": "orders", "Interval": "8s", "Partitions": 2},
    {
        "Name": "big-C",
        "UnderlyingTopic": "orders",
        "Interval": "500ms",
        "Filter": "/qty > 10",
        "Partitions": 1,
    },
]


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    with running_engine(
        kafka_bootstrap,
        tmp_path_factory.mktemp("conflated"),
        TOPICS,
        workers=("w1",),
        conflated_topics=CONFLATED,
        session_timeout=QUICK_SESSION_TIMEOUT,  # w1 is SIGKILLed: its group gives up sooner
    ) as procs:
        yield procs


def reset(client: Client) -> None:
    client.sow_delete("orders", filter="1=1")
    eventually(lambda: by_sow_key(client, "orders-C"), {})


def test_200_updates_to_5_records_give_one_message_per_record_per_interval(
    client: Client, publisher: Client
) -> None:
    reset(publisher)
    sub = client.subscribe("orders-C")
    started = time.monotonic()
    for n in range(200):
        publisher.publish("orders", {"id": n % 5, "qty": n})
    got = drain(sub, 4 * INTERVAL)
    elapsed = time.monotonic() - started
    latest: dict[Any, Any] = {}
    for m in got:
        latest[m.json()["id"]] = m.json()["qty"]
    assert latest == {i: 195 + i for i in range(5)}
    # At most one message per record per Interval elapsed (plus the interval in progress).
    for i in range(5):
        count = sum(1 for m in got if m.json()["id"] == i)
        assert count <= int(elapsed / INTERVAL) + 1, (i, count, elapsed)
    assert len(got) < 200 / 4  # conflated, far from one message per update
    sub.close()


def test_sow_of_the_conflated_topic_equals_the_underlying_sow(client: Client) -> None:
    reset(client)
    for n in range(50):
        client.publish("orders", {"id": n % 7, "qty": n, "note": f"v{n}"})
    eventually(lambda: by_sow_key(client, "orders-C"), by_sow_key(client, "orders"))
    assert len(by_sow_key(client, "orders-C")) == 7


def test_a_delete_reaches_the_conflated_topic_at_the_next_flush_with_oof(
    client: Client, publisher: Client
) -> None:
    reset(publisher)
    publisher.publish("orders", {"id": 1, "qty": 1})
    publisher.publish("orders", {"id": 2, "qty": 2})
    eventually(lambda: len(by_sow_key(publisher, "orders-C")), 2)
    sub = client.sow_and_subscribe("orders-C", options="oof")
    snapshot = take(sub, 4)
    assert [m.command for m in snapshot] == ["group_begin", "sow", "sow", "group_end"]
    publisher.sow_delete("orders", filter="/id = 1")
    (gone,) = take(sub, 1, timeout=10)
    assert (gone.command, gone.reason) == ("oof", "deleted")
    assert gone.json() == {"id": 1, "qty": 1}
    assert list(by_sow_key(publisher, "orders-C").values()) == [{"id": 2, "qty": 2}]
    sub.close()


def test_filter_keeps_matching_records_and_deletes_one_that_stops_matching(
    client: Client,
) -> None:
    reset(client)
    client.publish("orders", {"id": 1, "qty": 50})
    client.publish("orders", {"id": 2, "qty": 5})
    eventually(lambda: list(by_sow_key(client, "big-C").values()), [{"id": 1, "qty": 50}])
    client.publish("orders", {"id": 1, "qty": 3})
    eventually(lambda: by_sow_key(client, "big-C"), {})


def test_publishing_to_a_conflated_topic_is_refused(client: Client) -> None:
    with pytest.raises(
        InvalidCommandError, match="'orders-C' is computed by the engine from orders"
    ):
        client.publish("orders-C", {"id": 9, "qty": 9})


def test_a_worker_killed_mid_interval_loses_nothing(engine: EngineProcesses) -> None:
    slow = "orders-S"  # Interval 8s: time enough to change records and kill within one
    with engine.client() as client:
        reset(client)
        for n in range(30):
            client.publish("orders", {"id": n % 6, "qty": n})
        # Seen equal just after a flush: the changes below fall in the next interval.
        eventually(lambda: by_sow_key(client, slow), by_sow_key(client, "orders"))
        for n in range(30, 60):
            client.publish("orders", {"id": n % 6, "qty": n})
        client.sow_delete("orders", filter="/id = 0")
        expected = by_sow_key(client, "orders")
        # Long enough for faust to commit the input offsets past the changes, so only the
        # stored flush position can bring them back.
        time.sleep(4)
        assert by_sow_key(client, slow) != expected  # not flushed yet when the worker dies
    engine.stop("w1", kill=True)
    engine.start("w1")
    engine.wait_ready([("orders", "json"), (slow, "json")])
    with engine.client() as client:
        eventually(lambda: by_sow_key(client, slow), expected, timeout=60)
        assert len(expected) == 5


# -- the chapter's worked examples (px keyed by /sym, px-C every 1s) --------------------------


def reset_px(client: Client) -> None:
    client.sow_delete("px", filter="1=1")
    eventually(lambda: by_sow_key(client, "px-C"), {})


def test_c1_three_updates_in_an_interval_give_one_publish_of_the_last(
    client: Client, publisher: Client
) -> None:
    reset_px(publisher)
    conflated = client.subscribe("px-C")
    # A first update marks a flush: the next three then fall inside one interval (1 s), not
    # across a flush boundary.
    publisher.publish("px", {"sym": "A", "p": 0})
    assert [m.json()["p"] for m in take(conflated, 1)] == [0]
    with publisher.subscribe("px") as raw:
        for p in (1, 2, 3):
            publisher.publish("px", {"sym": "A", "p": p})
            time.sleep(0.1)
        assert [m.json()["p"] for m in take(raw, 3)] == [1, 2, 3]
    got = drain(conflated, 2.5)
    assert [(m.command, m.json()) for m in got] == [("publish", {"sym": "A", "p": 3})]
    conflated.close()


def test_c2_records_not_updated_are_never_sent_again(client: Client, publisher: Client) -> None:
    reset_px(publisher)
    publisher.publish("px", {"sym": "A", "p": 1})
    publisher.publish("px", {"sym": "B", "p": 1})
    eventually(lambda: len(by_sow_key(publisher, "px-C")), 2)
    sub = client.subscribe("px-C")
    for p in range(2, 6):
        publisher.publish("px", {"sym": "A", "p": p})
        time.sleep(0.5)
    got = drain(sub, 2.0)
    assert {m.json()["sym"] for m in got} == {"A"}
    assert got[-1].json() == {"sym": "A", "p": 5}
    sub.close()


def test_c4_delete_is_an_oof_with_the_last_state_sent(client: Client, publisher: Client) -> None:
    reset_px(publisher)
    publisher.publish("px", {"sym": "A", "p": 4})
    eventually(lambda: len(by_sow_key(publisher, "px-C")), 1)
    sub = client.subscribe("px-C", options="oof")
    publisher.sow_delete("px", filter="/sym = 'A'")
    (gone,) = take(sub, 1, timeout=10)
    assert (gone.command, gone.reason, gone.json()) == ("oof", "deleted", {"sym": "A", "p": 4})
    sub.close()


def test_c5_delete_and_reinsert_within_an_interval_is_one_update_and_no_oof(
    client: Client, publisher: Client
) -> None:
    reset_px(publisher)
    sub = client.subscribe("px-C", options="oof")
    publisher.publish("px", {"sym": "A", "p": 1})
    # Just after a flush (its message arrived): the next two changes fall in one interval.
    assert [m.json() for m in take(sub, 1, timeout=10)] == [{"sym": "A", "p": 1}]
    publisher.sow_delete("px", filter="/sym = 'A'")
    publisher.publish("px", {"sym": "A", "p": 9})
    got = drain(sub, 2.5)
    assert [(m.command, m.json()) for m in got] == [("publish", {"sym": "A", "p": 9})]
    sub.close()


def test_c7_publish_to_the_conflated_topic_is_refused(client: Client) -> None:
    with pytest.raises(InvalidCommandError, match="'px-C' is computed by the engine from px"):
        client.publish("px-C", {"sym": "Z", "p": 1})


def test_c10_a_delta_of_the_conflated_topic_carries_the_key_field(
    client: Client, publisher: Client
) -> None:
    reset_px(publisher)
    publisher.publish("px", {"sym": "A", "p": 1, "v": 10})
    eventually(lambda: len(by_sow_key(publisher, "px-C")), 1)
    sub = client.delta_subscribe("px-C")
    publisher.publish("px", {"sym": "A", "p": 2, "v": 10})
    # Just after a flush (its message arrived): the next two changes fall in one interval.
    assert [(m.delta, m.json()) for m in take(sub, 1, timeout=10)] == [(True, {"sym": "A", "p": 2})]
    publisher.publish("px", {"sym": "A", "p": 3, "v": 10})
    publisher.publish("px", {"sym": "A", "p": 4, "v": 10})
    got = drain(sub, 2.5)
    assert [(m.command, m.delta, m.json()) for m in got] == [
        ("publish", True, {"sym": "A", "p": 4})
    ]
    sub.close()


def test_c10_sow_and_delta_subscribe_with_oof_names_each_record_by_its_key(
    client: Client, publisher: Client
) -> None:
    reset_px(publisher)
    publisher.publish("px", {"sym": "A", "p": 1, "v": 10})
    publisher.publish("px", {"sym": "B", "p": 1, "v": 20})
    eventually(lambda: len(by_sow_key(publisher, "px-C")), 2)
    sub = client.sow_and_delta_subscribe("px-C", options="oof")
    snapshot = take(sub, 4)
    assert sorted(m.json()["sym"] for m in snapshot if m.command == "sow") == ["A", "B"]
    publisher.publish("px", {"sym": "A", "p": 2, "v": 10})
    publisher.publish("px", {"sym": "B", "p": 1, "v": 21})
    publisher.publish("px", {"sym": "C", "p": 5, "v": 1})
    got = take(sub, 3, timeout=10)
    assert sorted((m.delta, m.json()["sym"], m.json()) for m in got) == [
        (False, "C", {"sym": "C", "p": 5, "v": 1}),  # new to the subscriber: whole
        (True, "A", {"sym": "A", "p": 2}),
        (True, "B", {"sym": "B", "v": 21}),
    ]
    publisher.sow_delete("px", filter="/sym = 'B'")
    (gone,) = take(sub, 1, timeout=10)
    assert (gone.command, gone.reason, gone.json()) == (
        "oof",
        "deleted",
        {"sym": "B", "p": 1, "v": 21},
    )
    sub.close()
