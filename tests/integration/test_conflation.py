"""Conflated subscriptions on a real broker: what a subscriber ends up holding equals the SOW.

Two workers, four partitions. The cache a subscriber builds from its messages (publish replaces,
delta merges, oof removes) is compared with a ``sow`` query of the same filter (and window) once
the publishers stop, for many subscriptions at once, with every option combination, placed while
several publishers run, across a worker killed with SIGKILL and started again.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from sowstream.client import Client, Message, Subscription
from sowstream.errors import CommandTimeoutError
from sowstream.subscriptions.delta import project
from tests.support.engine import QUICK_SESSION_TIMEOUT, EngineProcesses
from tests.support.subscriber import Cache, without_nulls

pytestmark = pytest.mark.integration

TOPICS: list[dict[str, Any]] = [
    {"Name": "orders", "Key": ["/order"], "Partitions": 4},
    {"Name": "mix", "Key": ["/id"], "Partitions": 4, "HashIndex": [["/g"]]},
]


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    # a worker is SIGKILLed mid-run: the group gives up on it sooner
    procs = EngineProcesses(
        kafka_bootstrap,
        tmp_path_factory.mktemp("conflation"),
        TOPICS,
        session_timeout=QUICK_SESSION_TIMEOUT,
    )
    procs.start("w1")
    procs.start("w2")
    try:
        procs.wait_ready([t["Name"] for t in TOPICS])
        yield procs
    finally:
        procs.stop_all()


def settle(watchers: list[Watcher], quiet: float) -> None:
    """Apply every watcher's messages until none has arrived for ``quiet`` seconds."""
    last = time.monotonic()
    while time.monotonic() - last < quiet:
        moved = False
        for w in watchers:
            while (msg := w.sub.next(timeout=0)) is not None:
                w.apply(msg)
                moved = True
        if moved:
            last = time.monotonic()
        time.sleep(0.05)


def read_into(cache: Cache, sub: Subscription, quiet: float) -> None:
    """Apply messages until none arrives for ``quiet`` seconds."""
    while (msg := sub.next(timeout=quiet)) is not None:
        cache.apply(msg)


def test_two_records_of_one_partition_changed_in_one_interval(
    client: Client, publisher: Client
) -> None:
    """The reported case: b's update was dropped because a's later offset was flushed first."""
    publisher.sow_delete("orders", filter="1=1")
    for k in range(100, 124):
        publisher.publish("orders", {"order": k, "v": 0})
    by_partition: dict[str, list[int]] = {}
    for m in publisher.sow("orders", "/order >= 100"):
        if m.command == "sow":
            by_partition.setdefault(m.bookmark.split("|")[1], []).append(m.json()["order"])
    a, b = next(sorted(ids)[:2] for ids in by_partition.values() if len(ids) >= 2)
    sub = client.sow_and_subscribe("orders", f"/order IN ({a}, {b})", options="oof,conflation=1s")
    cache = Cache()
    read_into(cache, sub, 0.5)
    for rec in ({"order": a, "v": 1}, {"order": b, "v": 1}, {"order": a, "v": 2}):
        publisher.publish("orders", rec)
    publisher.flush()
    read_into(cache, sub, 2.5)
    assert sorted(cache.view().values(), key=lambda r: r["order"]) == [
        {"order": a, "v": 2},
        {"order": b, "v": 1},
    ]
    sub.close()


def test_conflated_delta_right_after_a_publish_carries_only_changes(
    client: Client, publisher: Client
) -> None:
    """Placed with no wait after the record's publish: the first conflated delta holds the key
    and the changed field, and the record leaving the filter in the next interval is an oof."""
    publisher.publish("orders", {"order": 500, "a": 1, "b": 1, "status": "open"})
    sub = client.sow_and_delta_subscribe(
        "orders", "/order = 500 AND /status = 'open'", options="oof,conflation=500ms"
    )
    first = [m for m in (sub.next(10), sub.next(10), sub.next(10)) if m is not None]
    commands = [m.command for m in first]
    # Another client's publish is not read-your-writes: when the query runs before the worker
    # has applied it, the record arrives whole as the first live message instead of in the sow.
    assert commands in (
        ["group_begin", "sow", "group_end"],
        ["group_begin", "group_end", "publish"],
    )
    record = first[1] if commands[1] == "sow" else first[2]
    assert record.json() == {"order": 500, "a": 1, "b": 1, "status": "open"}
    publisher.publish("orders", {"order": 500, "a": 1, "b": 2, "status": "open"})
    update = sub.next(10)
    assert update is not None and update.delta and update.json() == {"order": 500, "b": 2}
    publisher.publish("orders", {"order": 500, "a": 1, "b": 3, "status": "closed"})
    gone = sub.next(10)
    assert gone is not None and gone.command == "oof" and gone.reason == "match"
    assert gone.json() == {"order": 500, "a": 1, "b": 2, "status": "open"}  # last received
    sub.close()


@dataclass
class Watcher:
    """One subscription of the random workload and the cache its application keeps."""

    sub: Subscription
    filter: str | None
    select: tuple[str, ...] | None
    window: tuple[int, int] | None
    oof: bool
    options: str
    cache: Cache = field(default_factory=Cache)
    seen: list[tuple[str, str, bytes, bool, str]] = field(default_factory=list)

    def apply(self, msg: Message) -> None:
        self.seen.append((msg.command, msg.sow_key, msg.data, msg.delta, msg.bookmark))
        self.cache.apply(msg)

    def history(self, keys: set[str]) -> str:
        """What this subscriber was told about ``keys``, for a failure message."""
        return "\n".join(str(m) for m in self.seen if m[1] in keys)

    def truth(self, client: Client) -> dict[str, Any]:
        if self.window is not None:
            top_n, skip_n = self.window
            found = client.sow("mix", self.filter, order_by="/id", top_n=top_n, skip_n=skip_n)
        else:
            found = client.sow("mix", self.filter)
        return {
            m.sow_key: without_nulls(
                m.json() if self.select is None else project(m.json(), self.select)
            )
            for m in found
            if m.command == "sow"
        }


FILTERS = [None, "/v > 4", "/g = 1", "/x/v >= 5 OR /v < 2"]


def subscribe_randomly(client: Client, rng: random.Random) -> Watcher:
    flt = rng.choice(FILTERS)
    options = ["oof"] if rng.random() < 0.8 else []
    options.append(f"conflation={rng.choice(['200ms', '500ms', '1s'])}")
    if rng.random() < 0.3:
        options.append("conflation_key=/ck")
    select = None
    if rng.random() < 0.3:
        select = ("/id", "/v", "/x/v")
        options.append("select=[/id,/v,/x/v]")
    window = (rng.randint(1, 5), rng.randint(0, 3)) if rng.random() < 0.25 else None
    delta = rng.random() < 0.5
    kwargs: dict[str, Any] = {"options": ",".join(options)}
    if window is not None:
        kwargs.update(order_by="/id", top_n=window[0], skip_n=window[1])
    place = client.sow_and_delta_subscribe if delta else client.sow_and_subscribe
    sub = place("mix", flt, **kwargs)
    oof = "oof" in options  # a window without it is not told what leaves the page either
    return Watcher(sub, flt, select, window, oof, f"{'delta ' if delta else ''}{kwargs}")


def publish_randomly(client: Client, rng: random.Random, stop: threading.Event) -> None:
    while not stop.is_set():
        i = rng.randrange(30)
        roll = rng.random()
        if roll < 0.5:
            body = {"id": i, "g": rng.randrange(2), "v": rng.randrange(10), "ck": f"c{i}"}
            client.publish("mix", body)
        elif roll < 0.8:
            client.delta_publish("mix", {"id": i, "x": {"v": rng.randrange(10)}})
        else:
            flt = f"/id = {i}" if roll < 0.97 else f"/g = {rng.randrange(2)}"
            # A timeout while a worker is replaced: the delete is in the log, applied later.
            with contextlib.suppress(CommandTimeoutError):
                client.sow_delete("mix", filter=flt)
        time.sleep(rng.random() * 0.01)


@pytest.mark.parametrize("failover", [False, True], ids=["steady", "worker-killed"])
def test_random_workload(engine: EngineProcesses, failover: bool) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    stop = threading.Event()
    # A command whose partition owner was just SIGKILLed is answered by the next owner: after the
    # session timeout (10 s), the rebalance and its table recovery, which on a loaded machine can
    # pass the client's default 30 s.
    timeout = 90.0 if failover else 30.0
    with (
        engine.client(timeout=timeout) as reader,
        engine.client(timeout=timeout) as p1,
        engine.client(timeout=timeout) as p2,
        engine.client(timeout=timeout) as p3,
    ):
        reader.sow_delete("mix", filter="1=1")
        publishers = [
            threading.Thread(target=publish_randomly, args=(c, random.Random(seed + n), stop))
            for n, c in enumerate((p1, p2, p3))
        ]
        for t in publishers:
            t.start()
        watchers: list[Watcher] = []
        try:
            for n in range(12):
                watchers.append(subscribe_randomly(reader, rng))
                time.sleep(rng.random() * 0.5)
                if failover and n == 5:
                    engine.stop("w1", kill=True)  # mid-interval: w2 takes its partitions
                if failover and n == 8:
                    engine.start("w1")
            time.sleep(2.0)
        finally:
            stop.set()
            for t in publishers:
                t.join()
        engine.wait_stable(time.monotonic() + 60)
        for c in (p1, p2, p3):
            c.flush()
        settle(watchers, quiet=3.0)
        for n, w in enumerate(watchers):
            truth = w.truth(reader)
            held = w.cache.view()
            wrong = {k for k in held.keys() | truth.keys() if held.get(k) != truth.get(k)}
            where = f"seed {seed}, watcher {n}: filter {w.filter!r}, {w.options}\n" + w.history(
                wrong
            )
            if w.oof:
                assert held == truth, where
            else:
                assert {k: held.get(k) for k in truth} == truth, where
            w.sub.close()
