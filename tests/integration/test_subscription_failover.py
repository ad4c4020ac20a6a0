"""Subscriptions survive worker crashes and restarts: at-least-once from the engine, exactly once
and in order for the application (the client drops replays by sequence)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sowstream.client import Client, Subscription
from tests.support.engine import QUICK_SESSION_TIMEOUT, EngineProcesses

pytestmark = pytest.mark.integration

TOPICS: list[dict[str, Any]] = [{"Name": "live", "Key": ["/id"], "Partitions": 4}]


@pytest.fixture
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    # workers are SIGKILLed: the group gives up on them sooner
    procs = EngineProcesses(
        kafka_bootstrap,
        tmp_path_factory.mktemp("failover"),
        TOPICS,
        session_timeout=QUICK_SESSION_TIMEOUT,
    )
    procs.start("w1")
    procs.start("w2")
    try:
        procs.wait_ready(["live"])
        yield procs
    finally:
        procs.stop_all()


def collect_until(
    sub: Subscription,
    seen: dict[int, list[int]],
    done: dict[int, int],
    timeout: float,
    engine: EngineProcesses,
) -> None:
    """Read until every key in ``done`` reached its final version."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(seen.get(k, [0])[-1] >= v for k, v in done.items()):
            return
        msg = sub.next(timeout=1.0)
        if msg is not None and msg.command in ("sow", "publish"):
            body = msg.json()
            seen.setdefault(body["id"], []).append(body["v"])
    missing = {k: seen.get(k, [None])[-1] for k, v in done.items() if seen.get(k, [0])[-1] < v}
    logs = "\n".join(f"--- {n}\n{engine.log_tail(n, 120)}" for n in ("w1", "w2", "w3"))
    raise AssertionError(f"subscriber did not catch up; last versions seen: {missing}\n{logs}")


def assert_complete_in_order(seen: dict[int, list[int]], rounds: int) -> None:
    for key, versions in seen.items():
        assert versions == list(range(versions[0], rounds + 1)), (key, versions)


def test_subscription_survives_a_killed_worker_and_a_full_restart(
    engine: EngineProcesses,
) -> None:
    keys, rounds = 30, 80
    with engine.client() as subscriber, engine.client() as publisher:
        sub = subscriber.sow_and_subscribe("live")
        assert [m.command for m in (sub.next(10), sub.next(10))] == ["group_begin", "group_end"]
        published: dict[int, int] = {}

        def publish(first: int, last: int) -> None:
            for version in range(first, last + 1):
                for k in range(keys):
                    publisher.publish("live", {"id": k, "v": version})
                    published[k] = version
                publisher.flush()
                time.sleep(0.05)

        seen: dict[int, list[int]] = {}
        thread = threading.Thread(target=publish, args=(1, rounds // 2))
        thread.start()
        time.sleep(1.0)
        engine.stop("w1", kill=True)  # mid-load: its partitions move to w2, which replays
        thread.join()
        collect_until(sub, seen, dict(published), 120, engine)
        assert_complete_in_order(seen, rounds // 2)

        # Both workers restart: the registry topic brings the subscription back.
        engine.stop("w2")
        engine.start("w1")
        engine.start("w2")
        engine.wait_ready(["live"])
        publish(rounds // 2 + 1, rounds)
        collect_until(sub, seen, dict(published), 120, engine)
        assert_complete_in_order(seen, rounds)
        assert sorted(seen) == list(range(keys))
        sub.close()


def test_unsubscribe_stops_delivery_everywhere(engine: EngineProcesses) -> None:
    with engine.client() as subscriber, engine.client() as publisher:
        sub = subscriber.subscribe("live")
        publisher.publish("live", {"id": 1, "v": 1})
        assert sub.next(20) is not None
        sub.close()
        other: Client
        with engine.client() as other:
            watcher = other.subscribe("live")
            publisher.publish("live", {"id": 2, "v": 1})
            assert watcher.next(20) is not None  # delivery goes on for others
            watcher.close()
        assert sub.next(1.0) is None


def test_rebalances_that_hand_partitions_back_lose_nothing(engine: EngineProcesses) -> None:
    """Workers joining and leaving under load: every rebalance revokes every partition and hands
    most of them straight back to the same worker, whose state is dropped and loaded again while
    its log pump may be mid-batch. Nothing may be skipped: the subscriber sees every version, in
    order, and the SOW ends at the last one."""
    keys = 24
    with engine.client() as subscriber, engine.client() as publisher:
        sub = subscriber.sow_and_subscribe("live")
        assert [m.command for m in (sub.next(10), sub.next(10))] == ["group_begin", "group_end"]
        published: dict[int, int] = {}
        stop = threading.Event()

        def publish() -> None:
            version = 0
            while not stop.is_set() and version < 2_000:
                version += 1
                for k in range(keys):
                    publisher.publish("live", {"id": k, "v": version})
                    published[k] = version
                publisher.flush()
                time.sleep(0.05)

        thread = threading.Thread(target=publish)
        thread.start()
        try:
            for _ in range(2):
                engine.start("w3")  # joins: a rebalance
                engine.wait_stable(time.monotonic() + 60)
                time.sleep(1.0)
                engine.stop("w3")  # leaves cleanly: another one
                engine.wait_stable(time.monotonic() + 60)
                time.sleep(1.0)
        finally:
            stop.set()
            thread.join()
        rounds = published[0]
        assert rounds > 20, "the load should span the rebalances"
        seen: dict[int, list[int]] = {}
        collect_until(sub, seen, dict(published), 120, engine)
        assert_complete_in_order(seen, rounds)
        assert sorted(seen) == list(range(keys))
        sow = {m.json()["id"]: m.json()["v"] for m in publisher.sow("live") if m.command == "sow"}
        assert sow == dict.fromkeys(range(keys), rounds)
        sub.close()
