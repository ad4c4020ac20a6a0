"""The SOW engine end to end: two real workers, four partitions, a real Kafka broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from sowstream.client import Client, Command
from sowstream.errors import (
    CommandFailedError,
    InvalidCommandError,
    InvalidMessageError,
    UnknownTopicError,
)
from sowstream.filters import FilterError
from sowstream.wire import headers as h
from sowstream.wire.avro import decode
from sowstream.wire.kafka import producer_config
from tests.support.engine import EngineProcesses, running_engine

pytestmark = pytest.mark.integration

TOPICS: list[dict[str, Any]] = [
    {"Name": "orders", "Key": ["/orderId"], "HashIndex": [["/customer"]], "Partitions": 4},
    {"Name": "ORDERS", "Key": ["/invoice", "/customerId"], "Partitions": 4},
    {"Name": "work", "Key": ["/id"], "Partitions": 4},
    {"Name": "quotes", "Key": ["/id"], "Expiration": "2s", "Partitions": 4},
    {"Name": "alerts", "Key": ["/id"], "Expiration": "enabled", "Partitions": 4},
    {"Name": "archive", "Key": ["/id"], "Expiration": "disabled", "Partitions": 4},
    {"Name": "blobs", "Partitions": 4},
    {"Name": "shipping", "Key": ["/customerId"], "KeyDomain": "customers", "Partitions": 4},
    {"Name": "credit", "Key": ["/customerId"], "KeyDomain": "customers", "Partitions": 4},
]
NAMES = [t["Name"] for t in TOPICS]


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    with running_engine(kafka_bootstrap, tmp_path_factory.mktemp("engine"), TOPICS) as procs:
        yield procs


def bodies(client: Client, topic: str, flt: str | None = None, **opts: Any) -> list[Any]:
    return client.sow_records(topic, flt, **opts)


def clear(client: Client, topic: str) -> None:
    client.sow_delete(topic, filter="1=1")


# -- publish and query ------------------------------------------------------------------------


def test_orders_update_replaces_the_whole_record(client: Client) -> None:
    """Chapter 7's ORDERS example: two inserts, then order 2's price goes from 120 to 95."""
    clear(client, "orders")
    client.publish("orders", {"orderId": 1, "symbol": "MSFT", "price": 100, "customer": "a"})
    client.publish(
        "orders", {"orderId": 2, "symbol": "IBM", "price": 120, "customer": "b", "note": "first"}
    )
    client.publish("orders", {"orderId": 2, "symbol": "IBM", "price": 95, "customer": "b"})
    records = bodies(client, "orders", order_by="/orderId")
    assert records == [
        {"orderId": 1, "symbol": "MSFT", "price": 100, "customer": "a"},
        {"orderId": 2, "symbol": "IBM", "price": 95, "customer": "b"},
    ]


def test_query_messages_form_one_group_with_query_id_and_keys(client: Client) -> None:
    clear(client, "orders")
    keys = {client.publish("orders", {"orderId": i, "customer": "c"}) for i in range(20)}
    msgs = list(client.sow("orders", "/customer = 'c'", query_id="q-42", batch_size=3))
    assert [m.command for m in (msgs[0], msgs[-1])] == ["group_begin", "group_end"]
    records = msgs[1:-1]
    assert all(m.command == "sow" for m in records)
    assert all(m.query_id == "q-42" for m in msgs)
    assert {m.sow_key for m in records} == keys
    assert all(m.topic == "orders" and m.timestamp > 0 for m in records)
    assert all(1 <= m.batch_size <= 3 for m in records)
    assert msgs[-1].count == 20


def test_filters_order_by_top_n_skip_n(client: Client) -> None:
    clear(client, "orders")
    for i in range(1, 11):
        client.publish(
            "orders",
            {
                "orderId": i,
                "qty": i * 10,
                "customer": "even" if i % 2 == 0 else "odd",
                "px": str(100 + i),
            },
        )
    assert [
        r["orderId"]
        for r in bodies(client, "orders", "/qty >= 50 AND /customer = 'odd'", order_by="/qty DESC")
    ] == [9, 7, 5]
    # numeric strings compare as numbers
    assert sorted(r["orderId"] for r in bodies(client, "orders", "/px > 108")) == [9, 10]
    page = bodies(client, "orders", order_by="/qty DESC", top_n=3, skip_n=2)
    assert [r["orderId"] for r in page] == [8, 7, 6]
    assert len(bodies(client, "orders", top_n=4)) == 4
    assert bodies(
        client, "orders", "/orderId IN (3, 4) OR /qty BETWEEN 95 AND 100", order_by="/orderId"
    ) == [
        {"orderId": 3, "qty": 30, "customer": "odd", "px": "103"},
        {"orderId": 4, "qty": 40, "customer": "even", "px": "104"},
        {"orderId": 10, "qty": 100, "customer": "even", "px": "110"},
    ]


def test_sow_keys_hash_index_and_key_lookup(client: Client) -> None:
    clear(client, "orders")
    keys = [client.publish("orders", {"orderId": i, "customer": f"c{i % 3}"}) for i in range(30)]
    by_keys = bodies(client, "orders", sow_keys=keys[:2], order_by="/orderId")
    assert [r["orderId"] for r in by_keys] == [0, 1]
    # the HashIndex on /customer answers exact matches and IN
    assert len(bodies(client, "orders", "/customer = 'c1'")) == 10
    assert len(bodies(client, "orders", "/customer IN ('c1', 'c2')")) == 20
    # an update moves the record to another index entry
    client.publish("orders", {"orderId": 1, "customer": "c0"})
    assert len(bodies(client, "orders", "/customer = 'c1'")) == 9
    assert len(bodies(client, "orders", "/customer = 'c0'")) == 11
    # equality on the Key field is a direct lookup
    assert bodies(client, "orders", "/orderId = 7") == [{"orderId": 7, "customer": "c1"}]
    assert bodies(client, "orders", "/orderId IN (7, 8, 999)", order_by="/orderId") == [
        {"orderId": 7, "customer": "c1"},
        {"orderId": 8, "customer": "c2"},
    ]


def test_composite_keys(client: Client) -> None:
    clear(client, "ORDERS")
    client.publish("ORDERS", {"invoice": 1, "customerId": "A", "v": 1})
    client.publish("ORDERS", {"invoice": 1, "customerId": "B", "v": 2})
    client.publish("ORDERS", {"invoice": 1, "customerId": "A", "v": 3})
    assert bodies(client, "ORDERS", order_by="/customerId") == [
        {"invoice": 1, "customerId": "A", "v": 3},
        {"invoice": 1, "customerId": "B", "v": 2},
    ]


def test_regex_topic_query_spans_topics(client: Client) -> None:
    clear(client, "orders")
    clear(client, "ORDERS")
    client.publish("orders", {"orderId": 1})
    client.publish("ORDERS", {"invoice": 1, "customerId": "x"})
    msgs = [m for m in client.sow("(?i)orders") if m.command == "sow"]
    assert sorted(m.topic for m in msgs) == ["ORDERS", "orders"]


def test_key_domain_gives_the_same_sow_key_across_topics(client: Client) -> None:
    a = client.publish("shipping", {"customerId": 77, "address": "x"})
    b = client.publish("credit", {"customerId": 77, "rating": "AA"})
    c = client.publish("orders", {"orderId": 77})
    assert a == b != c
    assert [m.sow_key for m in client.sow("credit", "/customerId = 77") if m.command == "sow"] == [
        a
    ]


def test_user_supplied_sow_keys(client: Client) -> None:
    clear(client, "blobs")
    client.publish("blobs", {"v": 1}, sow_key="QUJD")
    client.publish("blobs", {"v": 2}, sow_key="QUJD")
    client.publish("blobs", {"v": 3}, sow_key="REVG")
    msgs = [m for m in client.sow("blobs", order_by="/v") if m.command == "sow"]
    assert [(m.sow_key, m.json()) for m in msgs] == [("QUJD", {"v": 2}), ("REVG", {"v": 3})]
    with pytest.raises(InvalidMessageError, match="Base64"):
        client.publish("blobs", {"v": 4}, sow_key="not base64!")
    with pytest.raises(InvalidMessageError, match="must supply a SowKey"):
        client.publish("blobs", {"v": 5})


# -- delta publish ----------------------------------------------------------------------------


def test_delta_publish_by_two_workers(engine: EngineProcesses, client: Client) -> None:
    """The delta chapter's order 735: inventory and credit workers each add their field."""
    client.publish(
        "work", {"id": 735, "customer": "Patrick", "item": 90123, "qty": 1000, "state": "new"}
    )
    with engine.client() as inventory, engine.client() as credit:
        ready = "/state = 'new' AND /inventory IS NULL AND /credit IS NULL"
        assert [r["id"] for r in bodies(inventory, "work", ready)] == [735]
        inventory.delta_publish("work", {"id": 735, "inventory": "available"}, ack=True)
        credit.delta_publish("work", {"id": 735, "credit": "approved"}, ack=True)
    done = "/state = 'new' AND /inventory IS NOT NULL AND /credit IS NOT NULL"
    assert bodies(client, "work", done) == [
        {
            "id": 735,
            "customer": "Patrick",
            "item": 90123,
            "qty": 1000,
            "state": "new",
            "inventory": "available",
            "credit": "approved",
        }
    ]


def test_delta_publish_merge_rules(client: Client) -> None:
    client.publish(
        "work",
        {
            "id": 42,
            "contents": {"packages": [{"box": "chocolates"}, {"bowl": "noodles"}], "owner": "me"},
            "flowers": "roses",
        },
    )
    client.delta_publish("work", {"id": 42, "contents": {"packages": [{"basket": "eggs"}]}})
    client.delta_publish("work", {"id": 42})  # absent fields stay as they are
    assert bodies(client, "work", "/id = 42") == [
        {
            "id": 42,
            "contents": {"packages": [{"basket": "eggs"}], "owner": "me"},
            "flowers": "roses",
        }
    ]
    client.delta_publish("work", {"id": 43, "fresh": True})  # no record yet: insert
    assert bodies(client, "work", "/id = 43") == [{"id": 43, "fresh": True}]


# -- sow_delete --------------------------------------------------------------------------------


def test_sow_delete_forms_return_counts(client: Client) -> None:
    clear(client, "orders")
    keys = [
        client.publish("orders", {"orderId": i, "customer": "d" if i < 5 else "e"})
        for i in range(12)
    ]
    assert client.sow_delete("orders", filter="/customer = 'd' AND /orderId < 3") == 3
    assert client.sow_delete("orders", sow_keys=[keys[3], keys[4], keys[0]]) == 2
    assert client.sow_delete("orders", data={"orderId": 5, "customer": "ignored"}) == 1
    assert client.sow_delete("orders", data={"orderId": 5}) == 0
    assert len(bodies(client, "orders")) == 6
    assert client.sow_delete("orders", filter="1=1") == 6
    assert bodies(client, "orders") == []
    ack = list(client.execute(Command("sow_delete", "orders", filter="1=1")))
    assert [(m.command, m.count) for m in ack] == [("ack", 0)]


# -- expiration --------------------------------------------------------------------------------


def _wait_until(predicate: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.25)
    raise AssertionError("condition not reached in time")


def test_topic_expiration_and_reset_on_update(client: Client) -> None:
    client.publish("quotes", {"id": "short", "px": 1})
    client.publish("quotes", {"id": "kept", "px": 1})
    client.publish("quotes", {"id": "never", "px": 1}, expiration=0)
    client.publish("quotes", {"id": "long", "px": 1}, expiration=60)
    # keep "kept" alive by updating it more often than the 2s topic expiration
    for _ in range(6):
        time.sleep(0.6)
        client.publish("quotes", {"id": "kept", "px": 2})
    ids = sorted(r["id"] for r in bodies(client, "quotes"))
    assert ids == ["kept", "long", "never"]
    _wait_until(lambda: sorted(r["id"] for r in bodies(client, "quotes")) == ["long", "never"])


def test_expiration_enabled_only_expires_messages_that_ask(client: Client) -> None:
    client.publish("alerts", {"id": 1}, expiration=1)
    client.publish("alerts", {"id": 2})
    _wait_until(lambda: [r["id"] for r in bodies(client, "alerts")] == [2])


def test_expiration_disabled_keeps_everything(client: Client) -> None:
    client.publish("archive", {"id": 1}, expiration=1)
    time.sleep(3)
    assert bodies(client, "archive", "/id = 1") == [{"id": 1}]


# -- bad input ---------------------------------------------------------------------------------


def _plain_producer(engine: EngineProcesses) -> Producer:
    return Producer(producer_config(engine.bootstrap))


def _dead_letters(
    engine: EngineProcesses, count: int, timeout: float = 20.0
) -> list[dict[str, Any]]:
    consumer = Consumer(
        {
            "bootstrap.servers": engine.bootstrap,
            "group.id": uuid.uuid4().hex,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(f"{engine.prefix}.deadletter", 0, 0)])
    letters: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(letters) < count and time.monotonic() < deadline:
            for msg in consumer.consume(100, 0.5):
                if not msg.error():
                    letters.append(decode("DeadLetter", msg.value()))
    finally:
        consumer.close()
    return letters


def test_plain_kafka_producer_bad_records_go_to_dead_letters(
    engine: EngineProcesses, client: Client
) -> None:
    clear(client, "work")
    producer = _plain_producer(engine)
    log = f"{engine.prefix}.log.work"
    producer.produce(log, value=b'{"id": 1, "v": ')  # malformed JSON
    producer.produce(log, value=b'{"v": 1}')  # no /id
    producer.produce(log, value=b"[1, 2]")  # not an object
    producer.produce(log, value=b'{"id": 2}', headers=[(h.COMMAND, b"frobnicate")])
    producer.produce(log, value=b'{"id": 3}', headers=[(h.EXPIRATION, b"soon")])
    producer.produce(log, value=b"", headers=[(h.COMMAND, b"sow_delete"), (h.FILTER, b"/id = ")])
    producer.produce(log, value=b'{"id": 4, "ok": true}')  # valid, unkeyed: the engine re-keys
    producer.flush(10)
    letters = _dead_letters(engine, 6)
    reasons = sorted(letter["reason"] for letter in letters)
    assert reasons == sorted(
        [
            "malformed_json",
            "missing_key_field",
            "malformed_json",
            "unknown_command",
            "bad_expiration",
            "bad_filter",
        ]
    )
    malformed = next(x for x in letters if x["value"] == b'{"id": 1, "v": ')
    assert "work" in malformed["error"] and malformed["source_topic"] == log
    missing = next(x for x in letters if x["reason"] == "missing_key_field")
    assert "/id" in missing["error"]
    _wait_until(lambda: bodies(client, "work", "/id = 4") == [{"id": 4, "ok": True}])
    # the engine kept running and valid data is untouched
    client.publish("work", {"id": 5}, ack=True)
    assert sorted(r["id"] for r in bodies(client, "work")) == [4, 5]


def test_unkeyed_plain_publish_is_rekeyed_onto_the_owning_partition(
    engine: EngineProcesses, client: Client
) -> None:
    clear(client, "work")
    producer = _plain_producer(engine)
    log = f"{engine.prefix}.log.work"
    for i in range(40):
        producer.produce(log, value=orjson.dumps({"id": 1000 + i, "v": 1}), partition=i % 4)
    producer.produce(log, value=orjson.dumps({"id": 1000, "v": 2}), key=b"my-own-key")
    producer.flush(10)
    _wait_until(lambda: len(bodies(client, "work")) == 40)
    _wait_until(lambda: bodies(client, "work", "/id = 1000") == [{"id": 1000, "v": 2}])
    # the keyed copies sit on the partition murmur2 picks for the SowKey, like the client's own
    key = client.publish("work", {"id": 1000, "v": 3}, ack=True)
    consumer = Consumer(
        {
            "bootstrap.servers": engine.bootstrap,
            "group.id": uuid.uuid4().hex,
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    consumer.assign([TopicPartition(log, p, 0) for p in range(4)])
    partitions = set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for msg in consumer.consume(500, 0.5):
            if not msg.error() and msg.key() == key.encode():
                partitions.add(msg.partition())
        if len(partitions) and time.monotonic() > deadline - 8:
            break
    consumer.close()
    assert len(partitions) == 1


def test_client_side_errors_name_the_problem(client: Client) -> None:
    with pytest.raises(InvalidMessageError, match="malformed JSON"):
        client.publish("orders", '{"orderId": ')
    with pytest.raises(InvalidMessageError, match="/orderId"):
        client.publish("orders", {"id": 1})
    with pytest.raises(CommandFailedError, match="topic 'no pe' cannot be created"):
        client.publish("no pe", {"a": 1})  # an undeclared topic is created, if its name is valid
    with pytest.raises(InvalidCommandError, match="'nope' has no SOW"):
        list(client.sow("nope"))
    with pytest.raises(UnknownTopicError):
        list(client.sow("nope.*"))
    with pytest.raises(FilterError) as bad:
        list(client.sow("orders", "/a = = 1"))
    assert bad.value.position == 5
    with pytest.raises(InvalidCommandError, match="BatchSize"):
        list(client.sow("orders", batch_size=10_001))
    with pytest.raises(InvalidCommandError, match="skip_n requires top_n"):
        list(client.sow("orders", skip_n=3))
    with pytest.raises(FilterError):
        client.sow_delete("orders", filter="/a IN (")
    with pytest.raises(InvalidCommandError):
        client.sow_delete("orders")


def test_engine_rejects_bad_commands_from_foreign_clients(
    engine: EngineProcesses, client: Client
) -> None:
    """A non-Python client skipping validation still gets a clear failure, engine unharmed."""
    producer = _plain_producer(engine)
    info = client.topic_info("orders")
    from sowstream.wire.avro import encode

    def send(**fields: Any) -> str:
        command_id = uuid.uuid4().hex
        cmd = {
            "command": "sow",
            "command_id": command_id,
            "query_id": "",
            "reply_to": client.reply_topic,
            "topic": "orders",
            "filter": None,
            "sow_keys": None,
            "order_by": None,
            "top_n": None,
            "skip_n": None,
            "batch_size": 1,
            "after_offset": -1,
            "options": {},
            **fields,
        }
        producer.produce(info.control_topic, value=encode("Command", cmd), partition=0)
        producer.flush(10)
        return command_id

    for fields, reason in [
        ({"filter": "/x LIKE '('"}, "bad_filter"),
        ({"batch_size": 20_000}, "bad_option"),
        ({"skip_n": 2}, "bad_option"),
        ({"command": "subscribe_all"}, "unknown_command"),
    ]:
        command_id = send(**fields)
        with pytest.raises(CommandFailedError) as failed:
            client._connection.await_acks(command_id, 1)
        assert failed.value.reason == reason
    assert isinstance(bodies(client, "orders"), list)


def test_publish_ack_reports_engine_rejection(engine: EngineProcesses, client: Client) -> None:
    with pytest.raises(CommandFailedError) as failed:
        client.publish("quotes", {"id": 9}, expiration="whenever", ack=True)
    assert failed.value.reason == "bad_expiration"


def test_reply_topic_is_removed_on_close(engine: EngineProcesses) -> None:
    from confluent_kafka.admin import AdminClient

    c = engine.client()
    topic = c.reply_topic
    admin = AdminClient({"bootstrap.servers": engine.bootstrap})
    assert topic in admin.list_topics(timeout=10).topics
    c.close()
    _wait_until(lambda: topic not in admin.list_topics(timeout=10).topics)


def test_worker_rejects_invalid_config(tmp_path: Path, kafka_bootstrap: str) -> None:
    import subprocess
    import sys

    bad = tmp_path / "bad.yaml"
    bad.write_text("sow:\n  - Name: t\n    Key: [/a]\n    Expiration: 5 parsecs\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sowstream",
            "worker",
            "--config",
            str(bad),
            "--bootstrap",
            kafka_bootstrap,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "bad.yaml" in proc.stderr and "Expiration" in proc.stderr


# -- the command line ----------------------------------------------------------------------------


def _cli(engine: EngineProcesses, *args: str, stdin: str | None = None) -> Any:
    import subprocess
    import sys

    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sowstream",
            *args,
            "--bootstrap",
            engine.bootstrap,
            "--prefix",
            engine.prefix,
        ],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_publish_query_delete(engine: EngineProcesses, client: Client) -> None:
    clear(client, "work")
    done = _cli(engine, "publish", "work", '{"id": 1, "qty": 5}')
    assert done.returncode == 0, done.stderr
    lines = '{"id": 2, "qty": 7}\n{"id": 3, "qty": 9}\n'
    assert _cli(engine, "publish", "work", "-", stdin=lines).returncode == 0
    assert _cli(engine, "delta-publish", "work", '{"id": 1, "note": "x"}').returncode == 0
    out = _cli(engine, "sow", "work", "--filter", "/qty > 5", "--order-by", "/id DESC", "--json")
    assert out.returncode == 0, out.stderr
    rows = [orjson.loads(line) for line in out.stdout.splitlines()]
    assert [r["data"] for r in rows] == [{"id": 3, "qty": 9}, {"id": 2, "qty": 7}]
    assert all(r["topic"] == "work" and r["sow_key"] for r in rows)
    table = _cli(engine, "sow", "work", "--top-n", "1", "--order-by", "/id")
    assert table.returncode == 0 and "1 record" in table.stdout
    assert table_rows(table.stdout)[:2] == [["SowKey", "/id", "/qty", "/note"], ["1", "5", "x"]]
    deleted = _cli(engine, "delete", "work", "--filter", "/qty >= 7")
    assert deleted.returncode == 0 and "deleted 2 record(s)" in deleted.stdout
    assert [r["id"] for r in bodies(client, "work")] == [1]


def table_rows(text: str) -> list[list[str]]:
    """A rich table's header and rows as cells, the SowKey cell left out of the rows."""
    rows = []
    for line in text.splitlines():
        bar = "┃" if "┃" in line else "│"
        if line.startswith(bar):
            cells = [c.strip() for c in line.strip(bar).split(bar)]
            rows.append(cells if bar == "┃" else cells[1:])
    return rows


def test_cli_tables_show_fields_as_columns_and_no_kafka_log_lines(
    engine: EngineProcesses, client: Client
) -> None:
    """What a new user tries first: publish, delta-publish, sow. Nested fields are /a/b columns,
    records lacking a field leave its cell empty, and librdkafka prints nothing."""
    clear(client, "work")
    steps = [
        ("publish", "work", '{"id": 1, "qty": 5, "addr": {"city": "Oslo", "zip": "0150"}}'),
        ("delta-publish", "work", '{"id": 1, "qty": 7}'),
        ("publish", "work", '{"id": 2, "tags": ["a", "b"]}'),
    ]
    for step in steps:
        done = _cli(engine, *step, "--ack")
        assert done.returncode == 0, done.stderr
        assert done.stderr.count("\n") == 1 and "%" not in done.stderr, done.stderr
    table = _cli(engine, "sow", "work", "--order-by", "/id")
    assert table.returncode == 0 and "%" not in table.stderr, table.stderr
    assert "work: 2 record(s)" in table.stdout
    assert table_rows(table.stdout) == [
        ["SowKey", "/id", "/qty", "/addr/city", "/addr/zip", "/tags"],
        ["1", "7", "Oslo", "0150", ""],
        ["2", "", "", "", '["a","b"]'],
    ]
    as_json = _cli(engine, "sow", "work", "--order-by", "/id", "--json")
    assert [orjson.loads(line)["data"] for line in as_json.stdout.splitlines()] == [
        {"id": 1, "qty": 7, "addr": {"city": "Oslo", "zip": "0150"}},
        {"id": 2, "tags": ["a", "b"]},
    ]


def test_cli_errors_are_one_clear_line(engine: EngineProcesses) -> None:
    bad_filter = _cli(engine, "sow", "work", "--filter", "/qty >")
    assert bad_filter.returncode == 1
    assert "error:" in bad_filter.stderr and "position" in bad_filter.stderr
    assert "Traceback" not in bad_filter.stderr
    unknown = _cli(engine, "publish", "no pe", "{}")
    assert unknown.returncode == 1 and "topic 'no pe' cannot be created" in unknown.stderr
    malformed = _cli(engine, "publish", "work", "{not json")
    assert malformed.returncode == 1 and "malformed JSON" in malformed.stderr
    skip = _cli(engine, "sow", "work", "--skip-n", "2")
    assert skip.returncode == 1 and "skip_n requires top_n" in skip.stderr


def test_a_partition_answered_twice_is_counted_once(
    engine: EngineProcesses, client: Client
) -> None:
    """After a rebalance a command may be read again by the partition's new owner."""
    clear(client, "orders")
    for i in range(40):
        client.publish("orders", {"orderId": i})
    info = client.topic_info("orders")
    for ordered in (True, False):
        pending = client.sow("orders", order_by="/orderId" if ordered else None, batch_size=3)
        consumer = Consumer(
            {
                "bootstrap.servers": engine.bootstrap,
                "group.id": uuid.uuid4().hex,
                "enable.auto.commit": False,
            }
        )
        producer = _plain_producer(engine)
        for p in range(info.partitions):
            tp = TopicPartition(info.control_topic, p)
            _, high = consumer.get_watermark_offsets(tp, timeout=10)
            consumer.assign([TopicPartition(info.control_topic, p, high - 1)])
            msg = consumer.poll(10)
            assert msg is not None and not msg.error()
            producer.produce(info.control_topic, value=msg.value(), partition=p)
        producer.flush(10)
        consumer.close()
        ids = [m.json()["orderId"] for m in pending if m.command == "sow"]
        assert sorted(ids) == list(range(40))
        if ordered:
            assert ids == list(range(40))
    # a delete by filter whose log records are read twice is counted once
    assert client.sow_delete("orders", filter="/orderId < 10") == 10
