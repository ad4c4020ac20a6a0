"""Message types end to end: fix, nvfix, xml, avro, binary, bson, bflat, protobuf and composite
topics next to json ones (and queues over them), on two real workers and a real Kafka broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from sowstream.client import Client
from sowstream.errors import CommandFailedError, InvalidMessageError, UnknownTopicError
from sowstream.messagetypes.bflat import encode as bflat
from sowstream.messagetypes.composite import frame
from sowstream.wire.avro import decode
from sowstream.wire.kafka import producer_config
from tests.support.engine import EngineProcesses, running_engine
from tests.support.messages import take

pytestmark = pytest.mark.integration

ORDER_SCHEMA = {
    "type": "record",
    "name": "Order",
    "namespace": "test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "sym", "type": "string"},
        {"name": "qty", "type": "int"},
    ],
}


ORDER_PROTO = """
syntax = "proto2";
package test;
message Order { required int64 id = 1; optional string sym = 2; optional int32 qty = 3; }
"""


def soh(text: str) -> bytes:
    """FIX/NVFIX bytes written with | for SOH."""
    return text.replace("|", "\x01").encode()


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    workdir = tmp_path_factory.mktemp("msgtypes")
    schema = workdir / "order.avsc"
    schema.write_text(orjson.dumps(ORDER_SCHEMA).decode())
    (workdir / "order.proto").write_text(ORDER_PROTO)
    topics: list[dict[str, Any]] = [
        {"Name": "orders", "Key": ["/id"], "Partitions": 2},
        {"Name": "orders", "MessageType": "nvfix", "Key": ["/id"], "Partitions": 2},
        {"Name": "fixorders", "MessageType": "fix", "Key": ["/11"], "Partitions": 2},
        {"Name": "alerts", "MessageType": "xml", "Key": ["/order/@id"], "Partitions": 2},
        {
            "Name": "avorders",
            "MessageType": "avro",
            "Key": ["/id"],
            "Schema": str(schema),
            "Partitions": 2,
        },
        {"Name": "blobs", "MessageType": "binary", "Partitions": 2},
        {"Name": "bsorders", "MessageType": "bson", "Key": ["/id"], "Partitions": 2},
        {"Name": "bforders", "MessageType": "bflat", "Key": ["/id"], "Partitions": 2},
        {
            "Name": "pborders",
            "MessageType": "protobuf",
            "Key": ["/id"],
            "Schema": str(workdir / "order.proto#test.Order"),
            "Partitions": 2,
        },
        {
            "Name": "pictures",
            "MessageType": "composite-local",
            "Parts": ["json", "binary"],
            "Key": ["/0/id"],
            "Partitions": 2,
        },
        {"Name": "bfwork", "MessageType": "bflat", "Key": ["/id"], "Partitions": 2},
    ]
    queues = [
        {
            "Name": "BQ",
            "UnderlyingTopic": "bfwork",
            "MessageType": "bflat",
            "MaxPerSubscriptionBacklog": 10,
        }
    ]
    with running_engine(kafka_bootstrap, workdir, topics, queues=queues) as procs:
        yield procs


@dataclass(frozen=True)
class Case:
    """One message type's messages for the publish / delta / sow / subscribe walk-through."""

    message_type: str
    topic: str
    first: Any  # in focus of FILTER
    second: Any  # out of focus
    delta: Any  # delta_publish to `first`: changes the quantity, stays in focus
    merged: dict[str, Any]  # `first` after `delta`, as fields
    live: Any  # delta_publish to `first` while subscribed
    changed: dict[str, Any]  # the delta message it gives, as fields
    leave: Any  # delta_publish that takes `first` out of focus
    filter: str


CASES = [
    Case(
        "fix",
        "fixorders",
        soh("11=A|55=IBM|38=100|"),
        soh("11=B|55=MSFT|38=5|"),
        soh("11=A|38=200|"),
        {"11": "A", "55": "IBM", "38": "200"},
        soh("11=A|38=300|"),
        {"38": "300", "11": "A"},
        soh("11=A|38=1|"),
        "/38 > 50",
    ),
    Case(
        "nvfix",
        "orders",
        soh("id=A|sym=IBM|qty=100|"),
        soh("id=B|sym=MSFT|qty=5|"),
        soh("id=A|qty=200|"),
        {"id": "A", "sym": "IBM", "qty": "200"},
        soh("id=A|qty=300|"),
        {"qty": "300", "id": "A"},
        soh("id=A|qty=1|"),
        "/qty > 50",
    ),
    Case(
        "xml",
        "alerts",
        b'<order id="A"><sym>IBM</sym><qty>100</qty></order>',
        b'<order id="B"><sym>MSFT</sym><qty>5</qty></order>',
        b'<order id="A"><qty>200</qty></order>',
        {"order": {"@id": "A", "sym": "IBM", "qty": "200"}},
        b'<order id="A"><qty>300</qty></order>',
        {"order": {"qty": "300", "@id": "A"}},
        b'<order id="A"><qty>1</qty></order>',
        "/order/qty > 50",
    ),
    Case(
        "avro",
        "avorders",
        {"id": 1, "sym": "IBM", "qty": 100},
        {"id": 2, "sym": "MSFT", "qty": 5},
        {"id": 1, "qty": 200},
        {"id": 1, "sym": "IBM", "qty": 200},
        {"id": 1, "qty": 300},
        {"qty": 300, "id": 1},
        {"id": 1, "qty": 1},
        "/qty > 50",
    ),
    Case(
        "bson",
        "bsorders",
        {"id": "A", "sym": "IBM", "qty": 100},
        {"id": "B", "sym": "MSFT", "qty": 5},
        {"id": "A", "qty": 200},
        {"id": "A", "sym": "IBM", "qty": 200},
        {"id": "A", "qty": 300},
        {"qty": 300, "id": "A"},
        {"id": "A", "qty": 1},
        "/qty > 50",
    ),
    Case(
        "bflat",
        "bforders",
        bflat({"id": "A", "sym": "IBM", "qty": 100}),
        bflat({"id": "B", "sym": "MSFT", "qty": 5}),
        bflat({"id": "A", "qty": 200}),
        {"id": "A", "sym": "IBM", "qty": 200},
        bflat({"id": "A", "qty": 300}),
        {"qty": 300, "id": "A"},
        bflat({"id": "A", "qty": 1}),
        "/qty > 50",
    ),
    Case(
        "protobuf",
        "pborders",
        {"id": 1, "sym": "IBM", "qty": 100},
        {"id": 2, "sym": "MSFT", "qty": 5},
        {"id": 1, "qty": 200},
        {"id": 1, "sym": "IBM", "qty": 200},
        {"id": 1, "qty": 300},
        {"qty": 300, "id": 1},
        {"id": 1, "qty": 1},
        "/qty > 50",
    ),
    Case(
        "composite-local",
        "pictures",
        frame([b'{"id":"A","qty":100}', b"\x89PNG-1"]),
        frame([b'{"id":"B","qty":5}', b"\x89PNG-2"]),
        frame([b'{"id":"A","qty":200}', b""]),  # an empty part: unchanged
        {"0": {"id": "A", "qty": 200}, "1": b"\x89PNG-1"},
        frame([b'{"id":"A","qty":300}', b""]),
        {"0": {"qty": 300, "id": "A"}},
        frame([b'{"id":"A","qty":1}', b""]),
        "/0/qty > 50",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.message_type)
def test_publish_delta_sow_and_delta_subscription(
    engine: EngineProcesses, case: Case, publisher: Client
) -> None:
    with engine.client(message_type=case.message_type) as client:
        client.sow_delete(case.topic, filter="1=1")
        key = client.publish(case.topic, case.first)
        client.publish(case.topic, case.second)
        client.delta_publish(case.topic, case.delta)
        found = [m for m in client.sow(case.topic, case.filter) if m.command == "sow"]
        assert [(m.sow_key, m.fields(), m.message_type) for m in found] == [
            (key, case.merged, case.message_type)
        ]
        if case.message_type != "avro":  # the stored body is the type's own text
            assert case.merged == client.topic_info(case.topic).codec.parse(found[0].data)

        with client.sow_and_delta_subscribe(case.topic, case.filter, options="oof") as sub:
            begin, record, end = take(sub, 3)
            assert (begin.command, record.fields(), end.command) == (
                "group_begin",
                case.merged,
                "group_end",
            )
            publisher.delta_publish(case.topic, case.live, message_type=case.message_type)
            publisher.delta_publish(case.topic, case.leave, message_type=case.message_type)
            update, oof = take(sub, 2)
        assert (update.command, update.delta, update.sow_key) == ("publish", True, key)
        assert update.fields() == case.changed
        assert (oof.command, oof.reason, oof.sow_key) == ("oof", "match", key)


def test_binary_topics_take_publisher_sow_keys_and_send_whole_messages(
    engine: EngineProcesses, publisher: Client
) -> None:
    with engine.client(message_type="binary") as client:
        client.sow_delete("blobs", filter="1=1")
        with pytest.raises(InvalidMessageError, match="the publisher must supply a SowKey"):
            client.publish("blobs", b"\x00\x01")
        client.publish("blobs", b"\x00one", sow_key="k1")
        client.publish("blobs", b"\x00two", sow_key="k2")
        client.delta_publish("blobs", b"\x00one-v2", sow_key="k1")  # replaces
        found = client.sow_records("blobs", sow_keys=["k1"])
        assert found == [b"\x00one-v2"]
        with pytest.raises(CommandFailedError, match="takes no content filter"):
            list(client.sow("blobs", "/a = 1"))

        with client.sow_and_delta_subscribe("blobs", options="oof") as sub:
            messages = take(sub, 4)
            assert sorted(m.data for m in messages if m.command == "sow") == [
                b"\x00one-v2",
                b"\x00two",
            ]
            publisher.delta_publish("blobs", b"\x00one-v3", sow_key="k1", message_type="binary")
            publisher.sow_delete("blobs", sow_keys=["k2"], message_type="binary")
            update, oof = take(sub, 2)
        assert (update.command, update.delta, update.data) == ("publish", False, b"\x00one-v3")
        assert (oof.command, oof.reason, oof.sow_key) == ("oof", "deleted", "k2")


def test_json_and_nvfix_topics_of_one_name_stay_apart(engine: EngineProcesses) -> None:
    with engine.client() as client:
        client.sow_delete("orders", filter="1=1")
        client.sow_delete("orders", filter="1=1", message_type="nvfix")
        client.publish("orders", {"id": "J", "from": "json"})
        client.publish("orders", soh("id=N|from=nvfix|"), message_type="nvfix")
        assert client.sow_records("orders") == [{"id": "J", "from": "json"}]
        assert client.sow_records("orders", message_type="nvfix") == [soh("id=N|from=nvfix|")]
        assert {i.ident: i.log_topic for i in client.topics.values() if i.name == "orders"} == {
            "orders": f"{engine.prefix}.log.orders",
            "nvfix:orders": f"{engine.prefix}.log.nvfix.orders",
        }


def test_fix_aggregate_sums_products_per_tag(engine: EngineProcesses) -> None:
    with engine.client(message_type="fix") as client:
        client.sow_delete("fixorders", filter="1=1")
        for text in ("11=1|109=C1|14=10|6=2.5|", "11=2|109=C1|14=4|6=10|", "11=3|109=C2|14=1|6=3|"):
            client.publish("fixorders", soh(text))
        rows = client.sow(
            "fixorders",
            grouping="[/109]",
            projection="[/109, SUM(/14 * /6) AS /71406]",
            order_by="/109",
        )
        records = [m for m in rows if m.command == "sow"]
    assert [m.data for m in records] == [soh("109=C1|71406=65|"), soh("109=C2|71406=3|")]


def _dead_letters(engine: EngineProcesses, count: int) -> list[dict[str, Any]]:
    consumer = Consumer(
        {"bootstrap.servers": engine.bootstrap, "group.id": uuid.uuid4().hex, **engine.kafka}
    )
    consumer.assign([TopicPartition(f"{engine.prefix}.deadletter", 0, 0)])
    letters: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    try:
        while len(letters) < count and time.monotonic() < deadline:
            letters += [decode("DeadLetter", m.value()) for m in consumer.consume(100, 0.5)]
    finally:
        consumer.close()
    return letters


def test_malformed_messages_go_to_the_dead_letter_topic_with_the_reason(
    engine: EngineProcesses,
) -> None:
    with engine.client(message_type="fix") as client:
        client.sow_delete("fixorders", filter="1=1")
        producer = Producer(producer_config(engine.bootstrap, engine.kafka))
        fix_log = f"{engine.prefix}.log.fix.fixorders"
        producer.produce(fix_log, value=soh("11=X|oops|"))
        producer.produce(fix_log, value=soh("11=OK|55=IBM|"))
        producer.produce(f"{engine.prefix}.log.xml.alerts", value=b'<order id="X"><qty>1</order>')
        producer.produce(f"{engine.prefix}.log.avro.avorders", value=b"\x02\x06")
        producer.produce(f"{engine.prefix}.log.binary.blobs", value=b"\x00no key")
        producer.flush(10)
        letters = {x["message_type"]: x for x in _dead_letters(engine, 4)}
        fix_letter = letters["fix"]
        assert (fix_letter["reason"], fix_letter["topic"], fix_letter["value"]) == (
            "malformed_fix",
            "fixorders",
            soh("11=X|oops|"),
        )
        assert "malformed FIX message at byte 5: field 'oops' has no '='" in fix_letter["error"]
        assert letters["xml"]["reason"] == "malformed_xml"
        assert "mismatched tag" in letters["xml"]["error"]
        assert letters["avro"]["reason"] == "malformed_avro"
        assert letters["binary"]["reason"] == "missing_sow_key"
        # the valid message next to the bad one is stored (re-keyed by the engine)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if client.sow_records("fixorders") == [soh("11=OK|55=IBM|")]:
                break
            time.sleep(0.2)
        assert client.sow_records("fixorders") == [soh("11=OK|55=IBM|")]


def test_cli_publishes_and_queries_fix_with_a_stand_in_for_soh(engine: EngineProcesses) -> None:
    with engine.client(message_type="fix") as client:
        client.sow_delete("fixorders", filter="1=1")
    done = engine.cli("publish", "fixorders", "11=Z|55=XYZ|38=7", "-m", "fix", "--soh", "|")
    assert done.returncode == 0, done.stderr
    found = engine.cli("sow", "fixorders", "--message-type", "fix", "--filter", "/38 = 7", "--json")
    assert found.returncode == 0, found.stderr
    (line,) = [orjson.loads(x) for x in found.stdout.splitlines()]
    assert line["data"] == {"11": "Z", "55": "XYZ", "38": "7"}


def test_a_queue_over_a_bflat_topic_leases_filters_and_acknowledges(
    engine: EngineProcesses,
) -> None:
    with engine.client(message_type="bflat") as client:
        for n in range(3):
            client.publish("bfwork", bflat({"id": n, "job": f"j{n}", "size": n * 10}))
        client.delta_publish("bfwork", bflat({"id": 2, "size": 99}))  # enqueues the merged record
        browsed: list[dict[str, Any]] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(browsed) < 4:
            browsed = [m.fields() for m in client.sow("BQ", "/size > 5") if m.command == "sow"]
            time.sleep(0.2)
        assert sorted(b["size"] for b in browsed) == [10, 20, 99]
        sub = client.subscribe("BQ", "/size > 5", options="max_backlog=10")
        got = take(sub, 3)
        assert sorted(m.fields()["size"] for m in got) == [10, 20, 99]
        assert all(m.message_type == "bflat" for m in got)
        assert client.ack("BQ", [m.bookmark for m in got]) == 3
        sub.close()


def test_a_topic_created_on_first_use_takes_the_message_type(
    engine: EngineProcesses, publisher: Client
) -> None:
    with engine.client(message_type="bson") as client:
        sub = client.subscribe("fresh-bson", "/level > 1")
        info = client.topics["bson:fresh-bson"]
        assert (info.auto, info.message_type) == (True, "bson")
        assert info.log_topic == f"{engine.prefix}.log.bson.fresh-bson"
        for n in range(4):
            client.publish("fresh-bson", {"n": n, "level": n}, sow_key=f"k{n}")
        got = take(sub, 2)
        assert sorted(m.fields()["n"] for m in got) == [2, 3]
        sub.close()
    # a protobuf topic needs its Schema from a configuration: not created on first use
    with pytest.raises(UnknownTopicError, match="fresh-pb"):
        publisher.publish("fresh-pb", {"n": 1}, message_type="protobuf")
