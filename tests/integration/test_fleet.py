"""The fleet: workers started as deploy/k8s's StatefulSet starts them (tests/support/fleet.py),
with the dev overlay's config, under a steady load: scaled 1→3→2, a pod SIGKILLed, a pod
deleted with its volume. After each step every pod passes its probes, faust's group members are
the pods (static membership by pod name), the workers' /status rows cover every partition once,
the SOW equals the fold of the log and a subscriber that was there all along holds exactly the
SOW."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from confluent_kafka import Producer

from sowstream.client import Client, Subscription
from sowstream.errors import SowstreamError
from sowstream.filters import compile_filter
from sowstream.sow.keys import generated_sow_key
from sowstream.wire.kafka import producer_config
from tests.integration.test_recovery import FILTER, fold_log
from tests.support.fleet import REPO, LocalStatefulSet
from tests.support.subscriber import Cache

pytestmark = pytest.mark.integration

DEV_CONFIG = REPO / "deploy" / "k8s" / "overlays" / "dev" / "sowstream.yaml"
TOPIC = "orders"
KEYS = 300
STEP_LOAD = 200  # records each step must see published while the fleet changes
CONFLATED_FILTER = "/qty < 500"  # about half the records, each update moving some in or out


def dev_config(prefix: str) -> tuple[str, int]:
    """The dev overlay's config with an app id and topic prefix of the test's own; and the
    topic's partition count."""
    doc = yaml.safe_load(DEV_CONFIG.read_text())
    doc["engine"]["app_id"] = doc["engine"]["topic_prefix"] = prefix
    topic = next(t for t in doc["sow"] if t["Name"] == TOPIC)
    return yaml.safe_dump(doc, sort_keys=False), int(topic["Partitions"])


class Load:
    """Publishes, delta publishes and deletes (by key, and by filter now and then) to the topic
    until paused; pausing waits until all of it is in Kafka."""

    def __init__(self, bootstrap: str, prefix: str, partitions: int) -> None:
        self.bootstrap, self.prefix, self.partitions = bootstrap, prefix, partitions
        self.published = 0
        self._go = threading.Event()
        self._idle = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._publish()
        except BaseException as exc:  # reported by pause()
            self._error = exc
            self._idle.set()

    def _publish(self) -> None:
        rng = random.Random(14)
        # Deletes go to the log as a plain producer would: no worker answer to wait for while a
        # partition has no owner.
        deleter = Producer(producer_config(self.bootstrap))
        with Client(self.bootstrap, prefix=self.prefix, timeout=10.0) as client:
            log = client.topic_info(TOPIC).log_topic
            keys = client.topic_info(TOPIC).keys
            while not self._stop.is_set():
                if not self._go.is_set():
                    client.flush()
                    deleter.flush(10)
                    self._idle.set()
                    self._go.wait(0.1)
                    continue
                time.sleep(0.004)  # a steady load the workers keep up with
                i = rng.randrange(KEYS)
                roll = rng.random()
                if roll < 0.6:
                    body = {"order": i, "customer": f"c{i % 7}", "qty": rng.randrange(1000)}
                    client.publish(TOPIC, {**body, "nested": {"a": rng.randrange(5)}})
                elif roll < 0.9:
                    client.delta_publish(TOPIC, {"order": i, "nested": {"b": self.published}})
                elif roll < 0.995:
                    key = generated_sow_key(TOPIC, TOPIC, keys, {"order": i})
                    deleter.produce(
                        log, key=key.encode(), value=None, headers=[("sow.cmd", b"sow_delete")]
                    )
                    deleter.poll(0)
                else:  # a delete by filter: one copy per partition
                    for p in range(self.partitions):
                        deleter.produce(
                            log,
                            value=None,
                            partition=p,
                            headers=[("sow.cmd", b"sow_delete"), ("sow.filter", FILTER.encode())],
                        )
                self.published += 1

    def resume(self) -> None:
        self._idle.clear()
        self._go.set()

    def pause(self) -> None:
        self._go.clear()
        assert self._idle.wait(60), "the load did not stop"
        if self._error is not None:
            raise AssertionError(f"the load failed: {self._error!r}") from self._error

    def stop(self) -> None:
        self._stop.set()
        self._go.set()
        self._thread.join(30)


class Subscriber:
    """An application's copy of the topic, built from one sow_and_subscribe as messages come.

    Every message is checked against what the copy holds at that point: an ``oof`` only for a
    record held, carrying (under conflation) the state last received; a delta only for a record
    held. The first message that breaks this is kept in ``error``.
    """

    def __init__(
        self, sub: Subscription, flt: str | None = None, *, conflated: bool = False
    ) -> None:
        self.sub = sub
        self.filter = compile_filter(flt) if flt else None
        self.cache = Cache(held_only=True, oof_last=conflated)
        self.error: AssertionError | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            msg = self.sub.next(timeout=0.2)
            if msg is not None and msg.command in ("sow", "publish", "oof"):
                with self._lock:
                    try:
                        self.cache.apply(msg)
                    except AssertionError as exc:
                        self.error = self.error or exc

    def wanted(self, sow: dict[str, Any]) -> dict[str, Any]:
        """What the subscriber must hold when the topic holds ``sow``."""
        return {k: v for k, v in sow.items() if self.filter is None or self.filter.matches(v)}

    def view(self) -> dict[str, Any]:
        with self._lock:
            return self.cache.view()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sub.close()


def snapshot(client: Client) -> dict[str, Any] | None:
    """The SOW as a query answers it; None while a partition cannot answer."""
    try:
        messages = list(client.sow(TOPIC, batch_size=500))
    except SowstreamError:
        return None
    return {m.sow_key: m.json() for m in messages if m.command == "sow"}


def eventually(what: str, probe: Callable[[], tuple[bool, str]], timeout: float = 90.0) -> None:
    """Wait until ``probe`` says yes (the last batches may still be applying); else fail with
    what it last said."""
    deadline = time.monotonic() + timeout
    while True:
        ok, detail = probe()
        if ok:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: {detail}")
        time.sleep(0.5)


def owners(fleet: LocalStatefulSet) -> dict[int, list[str]]:
    """Which worker each partition of the topic has, from every running pod's /status."""
    found: dict[int, list[str]] = {}
    for pod in fleet.running():
        code, body = fleet.get(pod, "/status")
        assert code == 200, f"{pod.name} /status answered {code}: {body}"
        for line in body.splitlines():
            row = orjson.loads(line)
            assert row["worker"] == pod.name  # --name=$(POD_NAME): the pod is the worker
            if row["topic"] == TOPIC:
                found.setdefault(row["partition"], []).append(row["worker"])
    return found


def holds(subscriber: Subscriber, sow: dict[str, Any]) -> Callable[[], tuple[bool, str]]:
    """A probe: does ``subscriber`` hold its part of ``sow``?"""
    wanted = subscriber.wanted(sow)

    def probe() -> tuple[bool, str]:
        held = subscriber.view()
        missing = wanted.keys() - held.keys()
        extra = held.keys() - wanted.keys()
        wrong = [k for k in wanted.keys() & held.keys() if wanted[k] != held[k]]
        return held == wanted, f"missing {len(missing)}, extra {len(extra)}, wrong {wrong[:5]}"

    return probe


def check(
    step: str,
    fleet: LocalStatefulSet,
    client: Client,
    subscribers: list[Subscriber],
    log_topic: str,
    partitions: int,
) -> dict[int, list[str]]:
    """Every pod ready and live, each partition owned once, SOW == fold of the log, the
    subscriber == SOW. Returns the partitions' owners."""
    fleet.wait_ready()
    running = {p.name for p in fleet.running()}

    def owned_once() -> tuple[bool, str]:
        found = owners(fleet)
        ok = sorted(found) == list(range(partitions)) and all(
            len(w) == 1 and w[0] in running for w in found.values()
        )
        return ok, f"owners {found}, running {sorted(running)}"

    eventually(f"{step}: partition owners", owned_once)

    def members_are_the_pods() -> tuple[bool, str]:
        # Static membership: faust's group members are the pods, by name (group.instance.id).
        desc = fleet.admin.describe_consumer_groups([fleet.group])[fleet.group].result(10)
        members = sorted(m.group_instance_id or "" for m in desc.members)
        return members == sorted(running), f"group members {members}, pods {sorted(running)}"

    eventually(f"{step}: group members", members_are_the_pods)
    expected = {k.decode(): v for k, v in fold_log(fleet.bootstrap, log_topic, partitions).items()}
    assert expected, "the log folds to an empty SOW: the load did nothing"
    last: dict[str, Any] | None = None

    def sow_is_fold() -> tuple[bool, str]:
        nonlocal last
        last = snapshot(client)
        if last is None:
            return False, "no answer from every partition"
        missing = expected.keys() - last.keys()
        extra = last.keys() - expected.keys()
        wrong = [k for k in expected.keys() & last.keys() if expected[k] != last[k]]
        return last == expected, f"missing {len(missing)}, extra {len(extra)}, wrong {wrong[:5]}"

    eventually(f"{step}: the SOW is the fold of the log", sow_is_fold)

    for n, subscriber in enumerate(subscribers):
        eventually(f"{step}: subscriber {n} holds its part of the SOW", holds(subscriber, expected))
        assert subscriber.error is None, f"{step}: subscriber {n}: {subscriber.error}"
    return owners(fleet)


@pytest.fixture
def prefix() -> str:
    return f"fleet{uuid.uuid4().hex[:8]}"


@pytest.fixture
def fleet(kafka_bootstrap: str, tmp_path: Path, prefix: str) -> Iterator[LocalStatefulSet]:
    pods = LocalStatefulSet(tmp_path, kafka_bootstrap, dev_config(prefix)[0])
    try:
        yield pods
    finally:
        pods.stop_all()


def test_the_statefulset_scales_and_loses_pods_and_volumes_without_losing_anything(
    fleet: LocalStatefulSet, prefix: str
) -> None:
    _, partitions = dev_config(prefix)
    fleet.scale(1)
    fleet.wait_ready()
    assert "--metrics-host=127.0.0.1" in fleet.pod(0).argv  # 0.0.0.0 in a pod, loopback here

    def kill_and_recreate() -> None:
        fleet.delete(1, kill=True)
        fleet.start(1)  # the controller recreates it: same name, same volume

    def lose_pod_and_volume() -> None:
        fleet.delete(0, kill=True)
        fleet.delete_volume(0)
        fleet.start(0)  # same name, an empty volume: restored from the changelogs

    steps: list[tuple[str, Callable[[], None]]] = [
        ("scaled 1→3", lambda: fleet.scale(3)),
        ("scaled 3→2", lambda: fleet.scale(2)),
        ("pod 1 SIGKILLed and recreated", kill_and_recreate),
        ("pod 0 deleted with its volume and recreated", lose_pod_and_volume),
    ]
    load = Load(fleet.bootstrap, prefix, partitions)
    with (
        Client(fleet.bootstrap, prefix=prefix, timeout=30.0) as client,
        Client(fleet.bootstrap, prefix=prefix, timeout=30.0) as listener,
    ):
        log_topic = client.topic_info(TOPIC).log_topic
        subscribers = [
            Subscriber(listener.sow_and_subscribe(TOPIC, options="oof")),
            # Conflated and filtered: records enter and leave its focus within an interval while
            # workers are killed, and the journal must tell it only about records it holds.
            Subscriber(
                listener.sow_and_subscribe(TOPIC, CONFLATED_FILTER, options="oof,conflation=200ms"),
                CONFLATED_FILTER,
                conflated=True,
            ),
        ]
        try:
            for step, change in steps:
                before = load.published
                load.resume()
                time.sleep(1.0)  # the change happens under load, not before it
                change()
                fleet.wait_ready()
                load.pause()
                assert load.published - before >= STEP_LOAD, f"{step}: too little load"
                found = check(step, fleet, client, subscribers, log_topic, partitions)
                assert {w[0] for w in found.values()} <= {p.name for p in fleet.running()}
            # The pod whose volume was lost said it was not ready until it had restored the
            # partitions it owns again, into its new volume.
            answers = [code for code, _ in fleet.pod(0).readiness]
            assert 503 in answers and answers[-1] == 200, fleet.pod(0).readiness
            assert answers.index(503) < answers.index(200), fleet.pod(0).readiness
            assert "sowstream-worker-0" in {w[0] for w in found.values()}
            assert any(fleet.pod(0).volume.rglob("CURRENT")), "no RocksDB in pod 0's new volume"
        finally:
            load.stop()
            for subscriber in subscribers:
                subscriber.stop()
