"""Every refused command is answered with the reason, as a client in another language meets it.

The client here is raw confluent-kafka and the schema files, following docs/protocol.md only: it
makes its own reply topic, writes Avro ``Command`` records to control topics and ``Subscription``
records to the registry, and reads ``Reply`` records and live messages back. One test per command
kind the engine takes (sow, subscription placement, status, declare_topic, queue_ack,
queue_status, an unknown command, queue and topic registrations, a newer schema version).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from sowstream.errors import SubscriptionDroppedError
from sowstream.wire.topics import TopicNames
from tests.support.engine import EngineProcesses, running_engine
from tests.support.raw import SUBSCRIPTION, RawClient, avro

pytestmark = pytest.mark.integration

TOPICS: list[dict[str, Any]] = [{"Name": "orders", "Key": ["/id"], "Partitions": 2}]
PLAIN = [{"Name": "work", "Partitions": 1}]
QUEUES = [{"Name": "WQ", "UnderlyingTopic": "work"}]


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    with running_engine(
        kafka_bootstrap,
        tmp_path_factory.mktemp("refusals"),
        TOPICS,
        workers=("w1",),
        plain_topics=PLAIN,
        queues=QUEUES,
        engine_extra={"auto_create_topics": False},
    ) as procs:
        yield procs


@pytest.fixture
def raw(engine: EngineProcesses) -> Iterator[RawClient]:
    client = RawClient(engine)
    yield client
    client.close()


def refused_part_ends(raw: RawClient, command_id: str, partitions: int = 2) -> list[dict[str, Any]]:
    answers = raw.replies(command_id, partitions)
    assert sorted(a["partition"] for a in answers) == list(range(partitions))
    for a in answers:
        assert (a["command"], a["status"], a["topic"]) == ("part_end", "failure", "orders")
    return answers


def test_a_sow_with_a_bad_filter_names_the_position(raw: RawClient) -> None:
    cid = raw.command("sow", "orders", "ctl.orders", 0, filter="/a = = 1")
    raw.command("sow", "orders", "ctl.orders", 1, command_id=cid, filter="/a = = 1")
    for a in refused_part_ends(raw, cid):
        assert a["reason"] == "bad_filter"
        assert a["message"].startswith("filter error at position 5 (line 1, column 6)")


def test_a_sow_with_a_bad_option_names_the_field(raw: RawClient) -> None:
    cid = raw.command("sow", "orders", "ctl.orders", 0, skip_n=3)
    (a,) = raw.replies(cid, 1)
    assert (a["status"], a["reason"], a["partition"]) == ("failure", "bad_option", 0)
    assert a["message"] == "skip_n requires top_n: give top_n with skip_n"


def test_a_subscription_placement_with_bad_options_is_refused(raw: RawClient) -> None:
    cid = raw.command(
        "sow_and_subscribe", "orders", "ctl.orders", 1, sub_id="s1", sub_options="conflation=abc"
    )
    (a,) = raw.replies(cid, 1)
    assert (a["command"], a["status"], a["reason"], a["partition"]) == (
        "part_end",
        "failure",
        "bad_option",
        1,
    )
    assert a["message"].startswith("conflation value 'abc' at position 11")


def test_an_unknown_command_is_refused_naming_it(raw: RawClient) -> None:
    cid = raw.command("sow_everything", "orders", "ctl.orders", 0)
    (a,) = raw.replies(cid, 1)
    assert (a["status"], a["reason"], a["message"]) == (
        "failure",
        "unknown_command",
        "unknown command 'sow_everything'",
    )


def test_a_topic_declaration_is_refused_when_creation_is_off(raw: RawClient) -> None:
    cid = raw.command("declare_topic", "fresh", "ctl-auto", 0)
    (a,) = raw.replies(cid, 1)
    assert (a["command"], a["topic"], a["status"], a["reason"]) == (
        "ack",
        "fresh",
        "failure",
        "not_declared",
    )
    assert "auto_create_topics" in a["message"]


def test_a_queue_ack_with_a_malformed_bookmark_is_refused_naming_it(raw: RawClient) -> None:
    cid = raw.command(
        "queue_ack", "WQ", "ctl.work", 0, options={"bookmarks": "work|zero|1", "action": ""}
    )
    (a,) = raw.replies(cid, 1)
    assert (a["command"], a["topic"], a["status"], a["reason"]) == (
        "ack",
        "WQ",
        "failure",
        "invalid",
    )
    assert "work|zero|1" in a["message"]


def test_a_command_a_queue_does_not_take_is_refused(raw: RawClient) -> None:
    cid = raw.command("delta_subscribe", "WQ", "ctl.work", 0, sub_id="s1")
    (a,) = raw.replies(cid, 1)
    assert (a["command"], a["status"], a["reason"]) == ("part_end", "failure", "invalid")
    assert a["message"].startswith("delta_subscribe is not available on queue 'WQ'")
    status = raw.command("queue_status", "WQ", "ctl.work", 0, filter="/a = = 1")
    rows, end = raw.replies(status, 2)
    assert (rows["command"], end["command"], end["status"]) == ("sow", "part_end", "success")


def test_a_queue_subscription_with_a_bad_filter_is_told_why(raw: RawClient) -> None:
    """Was only logged: "queue empty" and "subscription refused" looked the same."""
    sub_id = raw.register("WQ", filter="/job = = 1")
    headers, text = raw.live(sub_id)
    assert (headers["sow.cmd"], headers["sow.topic"], headers["sow.reason"]) == (
        "failure",
        "WQ",
        "bad_filter",
    )
    assert text.startswith("queue 'WQ': filter error at position 7")


def test_a_topic_registration_with_bad_options_is_told_why(raw: RawClient) -> None:
    sub_id = raw.register("orders", options="max_backlog=-1")
    headers, text = raw.live(sub_id)
    assert (headers["sow.cmd"], headers["sow.reason"]) == ("failure", "bad_option")
    assert text == "max_backlog value '-1' at position 12 is negative: give 0 or more"


def test_a_newer_schema_version_is_refused_naming_both_versions(raw: RawClient) -> None:
    # Version 2 as a later schema might write it: the version 1 fields, then one more (an int).
    cid = raw.command("sow", "orders", "ctl.orders", 0, headers={"sow.schema": "2"}, extra=b"\x02")
    (a,) = raw.replies(cid, 1)
    assert (a["status"], a["reason"]) == ("failure", "schema_version")
    assert a["message"] == (
        "the command was written with protocol schema version 2; this side reads versions 1 to "
        "1: upgrade it, or write version 1"
    )
    sub_id = raw.register("orders", headers={"sow.schema": "2"})
    headers, text = raw.live(sub_id)
    assert (headers["sow.cmd"], headers["sow.reason"]) == ("failure", "schema_version")
    assert text.startswith("the registration was written with protocol schema version 2")


def test_sowstreams_client_raises_a_refused_subscription_and_removes_it(
    engine: EngineProcesses,
) -> None:
    """The Python client checks filters and options itself, so the engine refuses its
    registration only when another writer changed it: here the registration is overwritten with
    a bad filter. The application gets the reason as an exception, and the client tombstones
    the registration."""
    with engine.client() as client:
        sub = client.subscribe("WQ")
        spec = sub.specs[0]
        writer = Producer({"bootstrap.servers": engine.bootstrap})
        bad = {**spec.to_wire(), "filter": "/job = = 1"}
        writer.produce(f"{engine.prefix}.subs", avro(SUBSCRIPTION, bad), key=spec.key.encode())
        writer.flush(30)
        with pytest.raises(SubscriptionDroppedError) as refused:
            sub.next(timeout=30)
        assert str(refused.value).startswith(
            f"subscription {spec.sub_id}: bad_filter: queue 'WQ': filter error at position 7"
        )
        reader = Consumer(
            {"bootstrap.servers": engine.bootstrap, "group.id": uuid.uuid4().hex, "log_level": 3}
        )
        reader.assign([TopicPartition(f"{engine.prefix}.subs", 0, 0)])
        last: list[bytes | None] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and last[-1:] != [None]:
            msg = reader.poll(0.5)
            if msg is not None and not msg.error() and msg.key() == spec.key.encode():
                last.append(msg.value())
        reader.close()
        assert last[-1:] == [None], "the refused registration was not removed"


def test_replies_never_go_to_a_topic_that_is_no_clients_reply_topic(
    engine: EngineProcesses, raw: RawClient
) -> None:
    """A command, registration or publish naming the topic's own log as its reply topic gets no
    reply there (a warning says why): it would write engine records into the transaction log."""
    log_topic = TopicNames(engine.prefix).log("orders")
    raw.command("sow", "orders", "ctl.orders", 0, reply_to=log_topic)
    raw.register("orders", reply_to=log_topic)
    raw.command("sow_and_subscribe", "orders", "ctl.orders", 1, sub_id="s9", reply_to=log_topic)
    # A publish asking for its ack on the log (sow.reply_to): applied, its ack not sent there.
    raw.producer.produce(
        log_topic,
        b'{"id": 77}',
        key=b"77",
        partition=1,
        headers={"sow.reply_to": log_topic, "sow.cmd_id": "c1"},
    )
    raw.producer.flush(30)
    time.sleep(3.0)
    reader = Consumer({"bootstrap.servers": engine.bootstrap, "group.id": uuid.uuid4().hex})
    reader.assign([TopicPartition(log_topic, p, 0) for p in (0, 1)])
    records = [m for m in reader.consume(100, 5) if not m.error()]
    reader.close()
    # The publish, maybe again under its SowKey (the engine re-keys a misrouted publish): no
    # reply, which would be an Avro Reply record rather than the JSON published.
    assert records and all(orjson.loads(m.value()) == {"id": 77} for m in records)
    cid = raw.command("sow", "orders", "ctl.orders", 1)  # and the engine still answers
    (a,) = raw.replies(cid, 1)
    assert a["status"] == "success"
