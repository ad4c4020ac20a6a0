"""No reply dropped, nothing silently ended (issue 26).

Replies to a reply topic the workers have no metadata for yet are parked and sent once it
appears; past the bounds the client's subscriptions end and it is told. A client silent past
``client_timeout`` is told too, and the Python client places its subscriptions again from where
it was, so the application sees every message once. Reply topics of closed clients are
forgotten, so the workers do not log errors about them at every metadata refresh.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from sowstream.client import Client
from sowstream.subscriptions.model import SUBSCRIBE, SubscriptionSpec
from sowstream.subscriptions.options import parse_options
from sowstream.wire import headers as h
from sowstream.wire.avro import encode
from sowstream.wire.kafka import TopicSpec, ensure_topics, producer_config
from tests.support.engine import REPO, EngineProcesses, running_engine

pytestmark = pytest.mark.integration

TOPICS = [
    {"Name": "items", "Key": ["/id"], "Partitions": 4},
    {"Name": "resumed", "Key": ["/id"], "Partitions": 4},
    {"Name": "desks", "Key": ["/id"], "Partitions": 4},
]
POLICY = {
    "client_timeout": "4s",
    "check_interval": "500ms",
    "reply_topic_wait": "15s",
    "max_parked_bytes": "64KB",
}


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    with running_engine(
        kafka_bootstrap,
        tmp_path_factory.mktemp("replies"),
        TOPICS,
        engine_extra={"slow_consumer": POLICY},
    ) as procs:
        yield procs


def _register(engine: EngineProcesses, reply_to: str, topic: str = "items") -> SubscriptionSpec:
    """Register a plain subscription for ``reply_to`` on the registry topic, as a client does
    (docs/protocol.md), without creating the reply topic."""
    spec = SubscriptionSpec(
        sub_id=uuid.uuid4().hex[:12],
        reply_to=reply_to,
        topic=topic,
        command=SUBSCRIBE,
        filter=None,
        options=parse_options(None),
    )
    producer = Producer(producer_config(engine.bootstrap, engine.kafka))
    producer.produce(
        f"{engine.prefix}.subs", key=spec.key.encode(), value=encode("Subscription", spec.to_wire())
    )
    assert producer.flush(10) == 0
    return spec


def _read_all(engine: EngineProcesses, topic: str, settle: float = 3.0) -> list[Any]:
    """Every record of ``topic`` (one partition), reading until ``settle`` seconds bring none."""
    consumer = Consumer(
        {
            "bootstrap.servers": engine.bootstrap,
            "group.id": uuid.uuid4().hex,
            "enable.auto.commit": False,
            **engine.kafka,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[Any] = []
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < settle:
        batch = [m for m in consumer.consume(500, 0.5) if not m.error()]
        if batch:
            out.extend(batch)
            quiet_since = time.monotonic()
    consumer.close()
    return out


def _registry_removed(engine: EngineProcesses, key: str) -> bool:
    """Whether the registry's last record for ``key`` is a tombstone (read up to its end)."""
    consumer = Consumer(
        {
            "bootstrap.servers": engine.bootstrap,
            "group.id": uuid.uuid4().hex,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            **engine.kafka,
        }
    )
    consumer.assign([TopicPartition(f"{engine.prefix}.subs", 0, 0)])
    last: Any = "absent"
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if (error := msg.error()) is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    break
                continue
            if (msg.key() or b"").decode() == key:
                last = msg.value()
    finally:
        consumer.close()
    return last is None


def _publishes(msgs: list[Any]) -> list[dict[str, Any]]:
    return [
        json.loads(m.value())
        for m in msgs
        if h.header_map(m.headers() or []).get(h.COMMAND) == "publish"
    ]


def test_a_subscriber_whose_reply_topic_appears_late_receives_every_live_message(
    engine: EngineProcesses, publisher: Client
) -> None:
    """The reply topic appears 8 s after the subscription's first messages: more than the
    5 s after which workers used to drop every reply to it for a minute."""
    reply_to = f"{engine.prefix}.reply.late-{uuid.uuid4().hex[:8]}"
    _register(engine, reply_to)
    time.sleep(2.0)  # every worker has the registration
    run = uuid.uuid4().hex[:6]
    for i in range(20):
        publisher.publish("items", {"id": f"{run}-{i % 5}", "v": i})
    publisher.flush()
    time.sleep(8.0)
    ensure_topics(engine.bootstrap, [TopicSpec(reply_to, 1)], extra=engine.kafka)
    for i in range(20, 30):
        publisher.publish("items", {"id": f"{run}-{i % 5}", "v": i})
    publisher.flush()
    got = _publishes(_read_all(engine, reply_to, settle=5.0))
    assert sorted(m["v"] for m in got) == list(range(30))
    for k in range(5):  # each record's updates in log order
        versions = [m["v"] for m in got if m["id"] == f"{run}-{k}"]
        assert versions == sorted(versions)


def test_past_the_parking_bound_the_subscription_ends_and_the_client_is_told(
    engine: EngineProcesses, publisher: Client
) -> None:
    """More than max_parked_bytes (64 KB here) wait for a reply topic: the parked replies go,
    the subscription ends, and the client finds a failure naming the reason once its topic is
    there."""
    reply_to = f"{engine.prefix}.reply.flooded-{uuid.uuid4().hex[:8]}"
    spec = _register(engine, reply_to)
    time.sleep(2.0)
    run = uuid.uuid4().hex[:6]
    for i in range(200):  # about 400 KB over the two workers
        publisher.publish("items", {"id": f"{run}-{i}", "pad": "x" * 2000})
    publisher.flush()
    time.sleep(8.0)  # past the 5 s a reply waits for its topic before replies are parked
    ensure_topics(engine.bootstrap, [TopicSpec(reply_to, 1)], extra=engine.kafka)
    msgs = _read_all(engine, reply_to, settle=5.0)
    failures = [
        h.header_map(m.headers() or [])
        for m in msgs
        if h.header_map(m.headers() or []).get(h.COMMAND) == "failure"
    ]
    assert failures, "the client was not told its subscription ended"
    assert {f[h.REASON] for f in failures} == {"reply_topic_gone"}
    assert {f[h.SUB_ID] for f in failures} == {spec.sub_id}
    assert len(_publishes(msgs)) < 200
    assert _registry_removed(engine, spec.key)


def test_a_reply_topic_that_never_appears_ends_its_subscription(
    engine: EngineProcesses, publisher: Client
) -> None:
    reply_to = f"{engine.prefix}.reply.never-{uuid.uuid4().hex[:8]}"
    spec = _register(engine, reply_to)
    time.sleep(2.0)
    publisher.publish("items", {"id": f"never-{uuid.uuid4().hex[:6]}"})
    publisher.flush()
    deadline = time.monotonic() + 40  # reply_topic_wait is 15 s
    while not (removed := _registry_removed(engine, spec.key)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert removed


def start_client(script: str, engine: EngineProcesses, tmp_path: Path) -> subprocess.Popen[bytes]:
    """A client process running ``script``, its output in ``client.out``; returns once it
    printed that it is ready."""
    out = (tmp_path / "client.out").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-c", script, engine.bootstrap, engine.prefix], stdout=out, cwd=REPO
    )
    deadline = time.monotonic() + 60
    while '"ready"' not in (tmp_path / "client.out").read_text():
        assert time.monotonic() < deadline and proc.poll() is None, "client did not start"
        time.sleep(0.2)
    return proc


PAUSED_CLIENT = """
import json, sys
from sowstream.client import Client
with Client(sys.argv[1], prefix=sys.argv[2]) as client:
    sub = client.sow_and_subscribe("resumed")
    print(json.dumps({"ready": True}), flush=True)
    stopping = False
    # "stop" comes last on its partition only: read on until the others are quiet too.
    while (msg := sub.next(timeout=5 if stopping else 120)) is not None:
        if msg.command in ("group_begin", "group_end"):
            continue
        body = msg.json()
        print(json.dumps({"cmd": msg.command, "key": msg.sow_key, "body": body}), flush=True)
        stopping = stopping or body.get("id") == "stop"
    print(json.dumps({"interruptions": sub.interruptions}), flush=True)
"""


def test_a_paused_client_is_told_and_resumes_with_every_message_once(
    engine: EngineProcesses, publisher: Client, client: Client, tmp_path: Path
) -> None:
    """A client process stopped (SIGSTOP) past client_timeout loses its subscription; when it
    runs again it reads the failure, places the subscription again from its last positions and
    its application sees each message once, with a cache equal to the SOW."""
    published: list[tuple[str, int]] = []

    def publish(first: int, last: int) -> None:
        for i in range(first, last):
            key = f"r{i % 7}"
            publisher.publish("resumed", {"id": key, "v": i})
            published.append((key, i))
        publisher.flush()

    publish(0, 10)  # before: the SOW part
    proc = start_client(PAUSED_CLIENT, engine, tmp_path)
    try:
        publish(10, 20)  # live
        time.sleep(1.0)
        proc.send_signal(signal.SIGSTOP)
        publish(20, 30)  # paused, before the engine gives up on it
        time.sleep(8.0)  # client_timeout is 4 s, checked every 500 ms
        publish(30, 40)  # paused, after its subscription ended
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.5)
        publish(40, 50)  # while it places the subscription again
        time.sleep(3.0)
        publish(50, 60)  # after
        publisher.publish("resumed", {"id": "stop"})
        publisher.flush()
        proc.wait(90)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
    lines = [json.loads(line) for line in (tmp_path / "client.out").read_text().splitlines()]
    assert lines[-1] == {"interruptions": ["client_timeout"]} or (
        "interruptions" in lines[-1] and "client_timeout" in lines[-1]["interruptions"]
    ), lines[-1]
    seen = [(m["body"]["id"], m["body"]["v"]) for m in lines if "cmd" in m and "v" in m["body"]]
    # Every version the subscriber could see, once each (a SOW part shows each record's latest
    # state before it subscribed; everything after comes as its own message).
    sow_part = {(key, v) for key, v in published if v < 10 and v >= 3}
    assert len(seen) == len(set(seen)), "a message came twice"
    assert set(seen) == sow_part | {(k, v) for k, v in published if v >= 10}
    cache: dict[str, Any] = {}
    for m in lines:
        if m.get("cmd") in ("sow", "publish"):
            cache[m["key"]] = m["body"]
    sow = {m.sow_key: m.json() for m in client.sow("resumed") if m.command == "sow"}
    assert cache == sow


CONFLATED_CLIENT = """
import json, sys
from sowstream.client import Client
from tests.support.subscriber import Cache
with Client(sys.argv[1], prefix=sys.argv[2]) as client:
    sub = client.sow_and_subscribe("desks", "/desk = 'a'", options="oof,conflation=200ms")
    # Every oof must name a record held and carry the state held (chapter 04, conflation).
    cache = Cache(held_only=True, oof_last=True)
    print(json.dumps({"ready": True}), flush=True)
    stopping = False
    try:
        while (msg := sub.next(timeout=5 if stopping else 120)) is not None:
            cache.apply(msg)
            if msg.command in ("sow", "publish"):
                stopping = stopping or msg.json().get("id") == "stop"
    except AssertionError as exc:
        print(json.dumps({"wrong": str(exc)}), flush=True)
    print(json.dumps({"interruptions": sub.interruptions, "held": cache.view()}), flush=True)
"""


def test_a_paused_conflated_subscriber_is_sent_oofs_with_what_it_last_received(
    engine: EngineProcesses, publisher: Client, client: Client, tmp_path: Path
) -> None:
    """A conflated ``oof`` subscription that the engine ended for ``client_timeout`` is placed
    again from its bookmarks: the replay sends each change at once, and an oof in it carries the
    state the subscriber last received, as a conflated oof must; the subscriber ends up holding
    what the SOW holds for its filter."""
    n = 0

    def publish(count: int) -> None:
        # Six records moving between desks: two of every three turns on desk 'a'.
        nonlocal n
        for _ in range(count):
            desk = "b" if (n // 6) % 3 == 1 else "a"
            publisher.publish("desks", {"id": f"d{n % 6}", "desk": desk, "v": n})
            n += 1
        publisher.flush()

    publish(6)
    proc = start_client(CONFLATED_CLIENT, engine, tmp_path)
    try:
        publish(12)
        time.sleep(1.0)
        proc.send_signal(signal.SIGSTOP)
        publish(18)  # paused, buffered in conflation intervals the engine then drops
        time.sleep(8.0)  # client_timeout is 4 s, checked every 500 ms
        publish(18)  # paused, after its subscription ended
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.5)
        publish(12)  # while it places the subscription again
        time.sleep(3.0)
        publish(6)
        publisher.publish("desks", {"id": "stop", "desk": "a"})
        publisher.flush()
        proc.wait(90)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
    lines = [json.loads(line) for line in (tmp_path / "client.out").read_text().splitlines()]
    assert not [line for line in lines if "wrong" in line], lines
    last = lines[-1]
    assert "client_timeout" in last["interruptions"], last
    sow = {m.sow_key: m.json() for m in client.sow("desks", "/desk = 'a'") if m.command == "sow"}
    assert last["held"] == sow


UNRESUMED_CLIENT = """
import json, sys
from sowstream.client import Client
from sowstream.errors import SubscriptionDroppedError
with Client(sys.argv[1], prefix=sys.argv[2], resume=False) as client:
    sub = client.subscribe("resumed")
    print(json.dumps({"ready": True}), flush=True)
    try:
        while True:
            sub.next(timeout=60)
    except SubscriptionDroppedError as exc:
        print(json.dumps({"dropped": str(exc)}), flush=True)
"""


def test_a_paused_client_that_does_not_resume_is_told_by_an_exception(
    engine: EngineProcesses, tmp_path: Path
) -> None:
    proc = start_client(UNRESUMED_CLIENT, engine, tmp_path)
    try:
        proc.send_signal(signal.SIGSTOP)
        time.sleep(8.0)  # client_timeout is 4 s
        proc.send_signal(signal.SIGCONT)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
    last = json.loads((tmp_path / "client.out").read_text().splitlines()[-1])
    assert "client_timeout" in last["dropped"], last


def test_closed_clients_leave_no_reply_topic_errors_behind(
    engine: EngineProcesses, publisher: Client
) -> None:
    """Clients that subscribe, receive and close: their deleted reply topics are forgotten, so
    later metadata refreshes (each new client's topic makes one) log no error about them."""
    closed: list[str] = []
    for i in range(8):
        with engine.client() as c:
            sub = c.subscribe("items", f"/id = 'closing-{i}'")
            publisher.publish("items", {"id": f"closing-{i}"})
            publisher.flush()
            assert sub.next(timeout=30) is not None
            closed.append(c.reply_topic)
    # More clients come and get replies: the workers refresh their metadata for them.
    for _ in range(3):
        with engine.client() as c:
            list(c.sow("items", top_n=1))
        time.sleep(1.0)
    for name in engine.procs:
        text = (engine.workdir / f"{name}.log").read_text(errors="replace")
        errors = [
            line for line in text.splitlines() if "ERROR" in line and any(t in line for t in closed)
        ]
        assert not errors, f"{name}: " + "\n".join(errors[:5])
