"""Inline conflation of views (``Conflation: inline``) on a real broker: worked example V11.

The same view is defined twice over one topic, once with ``Conflation: none`` and once with
``inline``; a burst of updates to one order (moving it between groups too) must leave both views
with the same records, the inline view must send fewer messages, and the worker's
``sowstream_view_updates_total`` must show the conflation ratio (incoming / processed).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from sowstream.client import Client, Message, Subscription
from tests.support.engine import EngineProcesses, metric
from tests.support.fleet import free_port
from tests.support.messages import by_sow_key

pytestmark = pytest.mark.integration

TOPICS: list[dict[str, Any]] = [{"Name": "bursts", "Key": ["/orderId"], "Partitions": 2}]
VIEW: dict[str, Any] = {
    "UnderlyingTopic": "bursts",
    "Projection": ["/region AS /region", "SUM(/qty) AS /total", "COUNT(/orderId) AS /n"],
    "Grouping": ["/region"],
    "Partitions": 2,
}
VIEWS = [
    {**VIEW, "Name": "BURST_NONE"},
    {**VIEW, "Name": "BURST_INLINE", "Conflation": "inline"},
]
REGIONS = ("EU", "US", "APAC")


class Worker:
    """One worker with its metrics endpoint."""

    def __init__(self, engine: EngineProcesses) -> None:
        self.engine = engine
        self.port = free_port()

    def metric(self, name: str, **labels: str) -> float:
        return metric(self.port, name, **labels)


@pytest.fixture(scope="module")
def worker(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    procs = EngineProcesses(
        kafka_bootstrap, tmp_path_factory.mktemp("view-conflation"), TOPICS, views=VIEWS
    )
    w = Worker(procs)
    try:
        procs.start("w1", "--metrics-port", str(w.port))
        procs.wait_ready(["bursts", "BURST_NONE", "BURST_INLINE"])
        yield w
    finally:
        procs.stop_all()


@pytest.fixture(scope="module")
def engine(worker: Worker) -> EngineProcesses:
    return worker.engine


def follow(sub: Subscription, held: dict[str, dict[str, Any]], seen: list[Message]) -> None:
    """Read what the subscription has now into ``held`` (SowKey -> record), as an app would."""
    while (msg := sub.next(timeout=0.2)) is not None:
        if msg.command == "publish":
            held[msg.sow_key] = msg.json()
            seen.append(msg)
        elif msg.command == "oof":
            held.pop(msg.sow_key, None)
            seen.append(msg)


def test_v11_inline_view_ends_equal_and_sends_fewer(worker: Worker, client: Client) -> None:
    subs = {
        name: client.sow_and_subscribe(name, options="oof")
        for name in ("BURST_NONE", "BURST_INLINE")
    }
    held: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in subs}
    seen: dict[str, list[Message]] = {name: [] for name in subs}
    for name, sub in subs.items():
        follow(sub, held[name], [])  # the (empty) snapshot

    updates = 1000
    for i in range(updates):
        # Order 1 moves between regions; order 2 sits in EU so that group never empties.
        client.publish("bursts", {"orderId": 1, "region": REGIONS[i % 3], "qty": i})
    client.publish("bursts", {"orderId": 2, "region": "EU", "qty": 5})
    client.flush()
    last_region = REGIONS[(updates - 1) % 3]
    expected = {
        (last_region, updates - 1 + (5 if last_region == "EU" else 0)),
        *({("EU", 5)} if last_region != "EU" else set()),
    }

    deadline = time.monotonic() + 60
    done = False
    while not done and time.monotonic() < deadline:
        for name, sub in subs.items():
            follow(sub, held[name], seen[name])
        done = all(
            {(r["region"], r["total"]) for r in by_sow_key(client, name).values()} == expected
            for name in subs
        )
    assert done, {name: by_sow_key(client, name) for name in subs}
    for name, sub in subs.items():
        follow(sub, held[name], seen[name])
        # What each subscriber holds is the view's SOW.
        assert held[name] == by_sow_key(client, name)
    assert {(r["region"], r["total"]) for r in held["BURST_NONE"].values()} == expected
    assert sorted(held["BURST_NONE"].values(), key=str) == sorted(
        held["BURST_INLINE"].values(), key=str
    )

    # Without conflation every change moves order 1 out of one group and into another: two view
    # messages per update (the first creates a group). Inline conflation sends fewer.
    assert len(seen["BURST_NONE"]) >= updates
    assert len(seen["BURST_INLINE"]) < len(seen["BURST_NONE"])

    incoming = worker.metric("sowstream_view_updates_total", view="BURST_INLINE", stage="incoming")
    processed = worker.metric(
        "sowstream_view_updates_total", view="BURST_INLINE", stage="processed"
    )
    assert incoming >= updates + 1
    assert 0 < processed < incoming
    none_in = worker.metric("sowstream_view_updates_total", view="BURST_NONE", stage="incoming")
    none_done = worker.metric("sowstream_view_updates_total", view="BURST_NONE", stage="processed")
    assert none_in == none_done >= updates + 1
    for sub in subs.values():
        sub.close()
