"""Subscriptions end to end: two real workers, four partitions, a real Kafka broker.

The spec's examples are used verbatim where the chapters give them: the delta chapter's order 3
update and record 99 conflation, the out-of-focus chapter's buyer moving from NY to LN, and the
pagination example (ids 1, 2, 5, … with top_n 2, skip_n 1, then id 4 arrives).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition

from sowstream.client import Client, Message, Subscription
from sowstream.errors import (
    CommandFailedError,
    InvalidCommandError,
    SubscriptionDroppedError,
    UnknownTopicError,
)
from sowstream.filters import FilterError
from sowstream.messagetypes.changes import merge_delta
from sowstream.wire import headers as h
from tests.support.engine import REPO, EngineProcesses, running_engine
from tests.support.messages import take

pytestmark = pytest.mark.integration

TOPICS: list[dict[str, Any]] = [
    {"Name": "orders", "Key": ["/order"], "Partitions": 4},
    {"Name": "buyer", "Key": ["/buyer/id"], "Partitions": 4},
    {"Name": "records", "Key": ["/id"], "Partitions": 4},
    {"Name": "quotes", "Key": ["/id"], "Expiration": "enabled", "Partitions": 4},
    {"Name": "pages", "Key": ["/id"], "Partitions": 4},
    {"Name": "secure", "Key": ["/id"], "Partitions": 4},
    {"Name": "load", "Key": ["/id"], "Partitions": 4},
    {"Name": "flood", "Key": ["/id"], "Partitions": 4},
    {"Name": "/ett/order", "Key": ["/id"], "Partitions": 2},  # an AMPS-style name
]
PLAIN = [{"Name": "ticks", "Partitions": 4}]
NAMES = [t["Name"] for t in TOPICS]
ENTITLEMENTS = {"alice": {"secure": "/owner = 'alice'"}, "*": {"secure": "/public = true"}}
SLOW = {"conflate_after": 3000, "drop_after": 20000, "check_interval": "500ms"}


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    with running_engine(
        kafka_bootstrap,
        tmp_path_factory.mktemp("subs"),
        TOPICS,
        engine_extra={"slow_consumer": SLOW},
        entitlements=ENTITLEMENTS,
        plain_topics=PLAIN,
    ) as procs:
        yield procs


def quiet(sub: Subscription, wait: float = 1.5) -> list[Message]:
    """Whatever arrives until ``wait`` seconds pass without a message."""
    out: list[Message] = []
    while (msg := sub.next(timeout=wait)) is not None:
        out.append(msg)
    return out


def records(msgs: list[Message], command: str = "sow") -> list[Any]:
    return [m.json() for m in msgs if m.command == command]


def reset(client: Client, topic: str) -> None:
    client.sow_delete(topic, filter="1=1")


def settle(client: Client, topic: str) -> None:
    """Wait until the engine applied ``client``'s publishes (a query reads its own writes)."""
    list(client.sow(topic, top_n=0))


# -- the subscribe family ----------------------------------------------------------------------


def test_sow_and_subscribe_snapshot_then_live(client: Client, publisher: Client) -> None:
    reset(publisher, "records")
    for i in range(10):
        publisher.publish("records", {"id": i, "kind": "a" if i % 2 else "b"})
    publisher.flush()
    settle(publisher, "records")
    sub = client.sow_and_subscribe("records", "/kind = 'a'", batch_size=3)
    group = take(sub, 7)
    assert group[0].command == "group_begin" and group[-1].command == "group_end"
    assert sorted(r["id"] for r in records(group)) == [1, 3, 5, 7, 9]
    assert group[-1].count == 5
    publisher.publish("records", {"id": 11, "kind": "a"})
    publisher.publish("records", {"id": 12, "kind": "b"})  # not in the filter
    publisher.publish("records", {"id": 3, "kind": "a", "note": "updated"})
    live = take(sub, 2)
    assert [m.command for m in live] == ["publish", "publish"]
    assert {m.json()["id"] for m in live} == {11, 3}
    assert all(m.sub_id == sub.sub_id and m.topic == "records" and m.sow_key for m in live)
    assert quiet(sub, 1.0) == []
    sub.close()


def test_subscribe_gets_only_what_is_published_after_it(client: Client, publisher: Client) -> None:
    reset(publisher, "records")
    publisher.publish("records", {"id": 1, "v": 1})
    settle(publisher, "records")
    sub = client.subscribe("records")
    publisher.publish("records", {"id": 1, "v": 2})
    publisher.publish("records", {"id": 2, "v": 1})
    assert sorted((m.json()["id"], m.json()["v"]) for m in take(sub, 2)) == [(1, 2), (2, 1)]
    sub.close()
    publisher.publish("records", {"id": 3, "v": 1})
    publisher.flush()
    assert quiet(sub, 1.0) == []


def test_callback_form_and_several_subscriptions_of_one_client(
    client: Client, publisher: Client
) -> None:
    reset(publisher, "records")
    got_a: list[Message] = []
    got_b: list[Message] = []
    done = threading.Event()

    def on_b(msg: Message) -> None:
        got_b.append(msg)
        if msg.command == "publish":
            done.set()

    sub_a = client.subscribe("records", "/kind = 'a'", on_message=got_a.append)
    settle(publisher, "records")
    sub_b = client.sow_and_delta_subscribe("records", "/kind = 'b'", on_message=on_b)
    publisher.publish("records", {"id": 1, "kind": "a"})
    publisher.publish("records", {"id": 2, "kind": "b"})
    assert done.wait(20)
    deadline = time.monotonic() + 20
    while not got_a and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [m.json() for m in got_a] == [{"id": 1, "kind": "a"}]
    assert [m.command for m in got_b] == ["group_begin", "group_end", "publish"]
    assert got_b[-1].json() == {"id": 2, "kind": "b"}
    client.unsubscribe(sub_a)
    client.unsubscribe(sub_b.sub_id)


def test_replies_are_readable_by_a_plain_kafka_consumer(
    engine: EngineProcesses, client: Client, publisher: Client
) -> None:
    reset(publisher, "records")
    sub = client.subscribe("records", options="oof")
    key = publisher.publish("records", {"id": 5, "x": 1})
    take(sub, 1)
    consumer = Consumer({"bootstrap.servers": engine.bootstrap, "group.id": "plain-reader"})
    consumer.assign([TopicPartition(client.reply_topic, 0, 0)])
    found = None
    deadline = time.monotonic() + 20
    while found is None and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None or msg.error():
            continue
        headers = h.header_map(msg.headers())
        if headers.get(h.COMMAND) == "publish":
            found = (headers, msg.value())
    consumer.close()
    assert found is not None
    headers, value = found
    assert orjson.loads(value) == {"id": 5, "x": 1}
    assert headers[h.SUB_ID] == sub.sub_id
    assert headers[h.TOPIC] == "records"
    assert headers[h.SOW_KEY] == key
    assert int(headers[h.OFFSET]) >= 0 and int(headers[h.PARTITION]) in range(4)
    sub.close()


def test_sow_and_subscribe_under_load_misses_nothing_and_repeats_nothing(
    client: Client, publisher: Client
) -> None:
    """Publishes keep arriving while the subscription is placed: every key's versions, from the
    snapshot on, arrive complete and in order."""
    reset(publisher, "load")
    keys, rounds = 40, 60
    stop = threading.Event()
    published: dict[int, int] = {}

    def publish() -> None:
        for version in range(1, rounds + 1):
            for k in range(keys):
                publisher.publish("load", {"id": k, "v": version})
                published[k] = version
            publisher.flush()
            time.sleep(0.01)
            if stop.is_set():
                return

    thread = threading.Thread(target=publish)
    thread.start()
    time.sleep(0.3)  # the load is on
    settle(publisher, "load")
    sub = client.sow_and_subscribe("load")
    thread.join()
    msgs = quiet(sub, 3.0)
    sub.close()
    seen: dict[int, list[int]] = {}
    for m in msgs:
        if m.command in ("sow", "publish"):
            body = m.json()
            seen.setdefault(body["id"], []).append(body["v"])
    assert msgs[0].command == "group_begin"
    assert sorted(seen) == list(range(keys))
    for k, versions in seen.items():
        start = versions[0]
        # contiguous from the snapshot's version to the last one published: nothing missed,
        # nothing twice, in order
        assert versions == list(range(start, rounds + 1)), (k, versions)


def test_topic_without_sow_empty_group_then_live_full_messages(
    client: Client, publisher: Client
) -> None:
    sub = client.sow_and_delta_subscribe("ticks", "/px > 1")
    assert [m.command for m in take(sub, 2)] == ["group_begin", "group_end"]
    publisher.publish("ticks", {"sym": "A", "px": 2})
    publisher.delta_publish("ticks", {"sym": "A", "qty": 5, "px": 3})  # nothing to merge into
    publisher.publish("ticks", {"sym": "A", "px": 1})  # filtered out
    got = take(sub, 2)
    assert [m.json() for m in got] == [{"sym": "A", "px": 2}, {"sym": "A", "qty": 5, "px": 3}]
    assert not any(m.delta for m in got)
    with pytest.raises(InvalidCommandError, match="no SOW"):
        client.sow("ticks")
    sub.close()


def test_plain_topic_keeps_one_publishers_order(client: Client, publisher: Client) -> None:
    """Unkeyed messages would spread over the 4 partitions and overtake each other."""
    sub = client.subscribe("ticks", "/sym = 'ORD'")
    for n in range(60):
        publisher.publish("ticks", {"sym": "ORD", "n": n})
    publisher.flush()
    got = take(sub, 60)
    assert [m.json()["n"] for m in got] == list(range(60))
    sub.close()


def test_order_by_sorts_the_sow_part_and_no_sowkey_and_select_shape_it(
    client: Client, publisher: Client
) -> None:
    """OrderBy orders a (non-paginated) sow_and_subscribe's SOW part; no_sowkey and select
    apply to it as to live messages (issue 12)."""
    reset(publisher, "records")
    for i in (3, 1, 2):
        publisher.publish("records", {"id": i, "v": i * 10, "extra": "x"})
    settle(publisher, "records")
    sub = client.sow_and_subscribe(
        "records", order_by="/id DESC", options="no_sowkey,select=[/id,/v]"
    )
    part = take(sub, 5)
    assert [m.command for m in part] == ["group_begin", "sow", "sow", "sow", "group_end"]
    assert records(part) == [{"id": 3, "v": 30}, {"id": 2, "v": 20}, {"id": 1, "v": 10}]
    assert all(m.sow_key == "" for m in part)
    sub.close()


def test_sow_keys_limit_the_sow_part_and_the_live_messages(
    client: Client, publisher: Client
) -> None:
    """SowKeys on sow_and_delta_subscribe and subscribe: only those records, in the SOW part
    and live (issue 12)."""
    reset(publisher, "records")
    for i in range(1, 7):
        publisher.publish("records", {"id": i, "v": 0})
    settle(publisher, "records")
    key_of = {m.json()["id"]: m.sow_key for m in client.sow("records") if m.command == "sow"}
    chosen = [key_of[2], key_of[4]]
    sub = client.sow_and_delta_subscribe("records", sow_keys=chosen, options="oof")
    live_only = client.subscribe("records", sow_keys=[key_of[3]])
    part = take(sub, 4)
    assert sorted(r["id"] for r in records(part)) == [2, 4]
    publisher.publish("records", {"id": 2, "v": 1})
    publisher.publish("records", {"id": 3, "v": 1})  # not among the delta subscription's keys
    publisher.sow_delete("records", sow_keys=[key_of[4]])
    publisher.publish("records", {"id": 5, "v": 1})
    got = quiet(sub)
    assert [(m.command, m.sow_key) for m in got] == [("publish", key_of[2]), ("oof", key_of[4])]
    assert got[0].json() == {"id": 2, "v": 1}
    assert [(m.sow_key, m.json()["v"]) for m in quiet(live_only)] == [(key_of[3], 1)]
    sub.close()
    live_only.close()


def test_sow_and_subscribe_on_a_pattern_matching_no_topic_is_an_error(client: Client) -> None:
    with pytest.raises(UnknownTopicError):
        client.sow_and_subscribe("nope.*")


# -- delta subscriptions -------------------------------------------------------------------------


def test_delta_order_3_example(client: Client, publisher: Client) -> None:
    reset(publisher, "orders")
    publisher.publish(
        "orders",
        {"order": 3, "customer": "Patrick", "status": "active", "qty": 1000, "ticker": "MSFT"},
    )
    publisher.publish(
        "orders", {"order": 4, "customer": "Jan", "status": "active", "qty": 5, "ticker": "IBM"}
    )
    settle(publisher, "orders")
    sub = client.sow_and_delta_subscribe("orders")
    assert len(records(take(sub, 4))) == 2
    key = publisher.publish(
        "orders",
        orjson.loads(
            b"""{
    "order":3,
    "customer":"Patrick",
    "status":"pending",
    "qty":1000,
    "ticker":"MSFT"
}"""
        ),
    )
    (msg,) = take(sub, 1)
    assert msg.command == "publish" and msg.delta
    assert msg.json() == {"order": 3, "status": "pending"}
    assert msg.sow_key == key
    # a new record arrives whole
    publisher.publish("orders", {"order": 5, "customer": "Ann", "status": "new"})
    (new,) = take(sub, 1)
    assert new.json() == {"order": 5, "customer": "Ann", "status": "new"} and not new.delta
    sub.close()


def test_delta_options_no_sowkey_no_empties_select_and_nesting(
    client: Client, publisher: Client
) -> None:
    reset(publisher, "orders")
    publisher.publish("orders", {"order": 1, "a": 1, "b": 1, "n": {"x": 1, "y": [1, 2]}})
    settle(publisher, "orders")
    plain = client.sow_and_delta_subscribe("orders", options="no_sowkey")
    settle(publisher, "orders")
    picky = client.sow_and_delta_subscribe("orders", options="no_empties,select=[/order,/a]")
    take(plain, 3)
    take(picky, 3)
    publisher.publish("orders", {"order": 1, "a": 1, "b": 2, "n": {"x": 1, "y": [1, 2]}})
    publisher.publish("orders", {"order": 1, "a": 1, "b": 2, "n": {"x": 2, "y": [1, 3]}})
    publisher.publish("orders", {"order": 1, "a": 1, "b": 2, "n": {"x": 2, "y": [1, 3]}})
    publisher.publish("orders", {"order": 1, "a": 9, "b": 2, "n": {"x": 2, "y": [1, 3]}})
    got = take(plain, 4)
    assert [m.json() for m in got] == [
        {"order": 1, "b": 2},
        {"order": 1, "n": {"x": 2, "y": [1, 3]}},  # nested field by field, arrays whole
        {"order": 1},  # nothing changed: an empty delta without no_empties
        {"order": 1, "a": 9},
    ]
    assert all(m.sow_key == "" for m in got)
    # no_empties with a select list: only changes to /a produce a message
    (only,) = take(picky, 1)
    assert only.json() == {"order": 1, "a": 9} and only.sow_key
    assert quiet(picky, 1.0) == []
    plain.close()
    picky.close()


# -- out of focus ------------------------------------------------------------------------------


def test_oof_buyer_moves_from_ny_to_ln(client: Client, publisher: Client) -> None:
    reset(publisher, "buyer")
    publisher.publish("buyer", {"buyer": {"id": 7, "loc": "NY"}})
    settle(publisher, "buyer")
    sub = client.sow_and_subscribe("buyer", '/buyer/loc="NY"', options="oof")
    assert records(take(sub, 3)) == [{"buyer": {"id": 7, "loc": "NY"}}]
    key = publisher.publish("buyer", {"buyer": {"id": 7, "loc": "LN"}})
    (oof,) = take(sub, 1)
    assert oof.command == "oof" and oof.reason == "match"
    assert oof.topic == "buyer" and oof.sow_key == key
    assert oof.json() == {"buyer": {"id": 7, "loc": "LN"}}  # the updated state
    sub.close()


def test_oof_reasons_deleted_expired_and_delta_publish_match(
    client: Client, publisher: Client
) -> None:
    reset(publisher, "quotes")
    publisher.publish("quotes", {"id": 1, "px": 10, "state": "open"}, expiration=0)
    publisher.publish("quotes", {"id": 2, "px": 20, "state": "open"}, expiration=0)
    publisher.publish("quotes", {"id": 3, "px": 30, "state": "open"}, expiration=0)
    settle(publisher, "quotes")
    sub = client.sow_and_subscribe("quotes", "/state = 'open'", options="oof")
    assert len(records(take(sub, 5))) == 3
    publisher.sow_delete("quotes", filter="/id = 1")
    (deleted,) = take(sub, 1)
    assert (deleted.command, deleted.reason) == ("oof", "deleted")
    assert deleted.json() == {"id": 1, "px": 10, "state": "open"}  # the previous state
    publisher.publish("quotes", {"id": 2, "px": 21, "state": "open"}, expiration=1)
    assert take(sub, 1)[0].command == "publish"
    (expired,) = take(sub, 1, timeout=30)
    assert (expired.command, expired.reason) == ("oof", "expired")
    assert expired.json() == {"id": 2, "px": 21, "state": "open"}
    publisher.delta_publish("quotes", {"id": 3, "state": "filled"})
    (match,) = take(sub, 1)
    assert (match.command, match.reason) == ("oof", "match")
    assert match.json() == {"id": 3, "px": 30, "state": "filled"}  # the merged record
    sub.close()


def test_delta_with_oof_returns_whole_when_back_in_focus(client: Client, publisher: Client) -> None:
    reset(publisher, "records")
    publisher.publish("records", {"id": 1, "state": "open", "qty": 1, "px": 5})
    settle(publisher, "records")
    sub = client.sow_and_delta_subscribe("records", "/state = 'open'", options="oof")
    take(sub, 3)
    publisher.publish("records", {"id": 1, "state": "open", "qty": 2, "px": 5})
    publisher.publish("records", {"id": 1, "state": "done", "qty": 2, "px": 5})
    publisher.publish("records", {"id": 1, "state": "open", "qty": 2, "px": 5})
    delta, oof, back = take(sub, 3)
    assert delta.delta and delta.json() == {"id": 1, "qty": 2}
    assert oof.command == "oof" and oof.reason == "match"
    assert back.command == "publish" and not back.delta
    assert back.json() == {"id": 1, "state": "open", "qty": 2, "px": 5}
    sub.close()


# -- conflation --------------------------------------------------------------------------------


def test_conflated_delta_record_99_example(client: Client, publisher: Client) -> None:
    reset(publisher, "records")
    publisher.publish("records", {"id": 99, "status": "open", "notes": "none", "xref": 82})
    settle(publisher, "records")
    sub = client.sow_and_delta_subscribe("records", options="conflation=2s")
    group = take(sub, 3)  # the SOW part is not conflated
    assert records(group) == [{"id": 99, "status": "open", "notes": "none", "xref": 82}]
    for body in (
        b'{ "id": 99, "status":"questioned", "notes":"none", "xref":82}',
        b'{ "id": 99, "status":"questioned", "notes":"jcarlo hold", "xref":82 }',
        b'{ "id": 99, "status":"cleared", "notes":"none", "xref":82 }',
        b'{ "id": 99, "status":"open", "notes":"none", "xref":82 }',
    ):
        publisher.publish("records", body)
    publisher.flush()
    (msg,) = take(sub, 1, timeout=10)
    assert msg.json() == {"id": 99, "status": "open", "notes": "none"}
    assert quiet(sub, 2.5) == []
    sub.close()


def test_conflation_keeps_the_latest_state_per_key_and_oof_rules(
    client: Client, publisher: Client
) -> None:
    reset(publisher, "records")
    publisher.publish("records", {"id": 1, "state": "open", "v": 0})
    publisher.publish("records", {"id": 2, "state": "open", "v": 0})
    settle(publisher, "records")
    sub = client.sow_and_subscribe("records", "/state = 'open'", options="oof,conflation=2s")
    take(sub, 4)
    publisher.publish("records", {"id": 1, "state": "open", "v": 1})
    publisher.publish("records", {"id": 1, "state": "open", "v": 2})
    publisher.publish("records", {"id": 1, "state": "open", "v": 3})
    # id 2: update, then out of focus, in one interval: oof with what the subscriber last saw
    publisher.publish("records", {"id": 2, "state": "open", "v": 1})
    publisher.publish("records", {"id": 2, "state": "done", "v": 2})
    publisher.flush()
    got = {m.json()["id"]: m for m in take(sub, 2, timeout=10)}
    assert got[1].command == "publish" and got[1].json() == {"id": 1, "state": "open", "v": 3}
    assert got[2].command == "oof" and got[2].json() == {"id": 2, "state": "open", "v": 0}
    # out and back in within one interval: just the latest state
    publisher.publish("records", {"id": 1, "state": "done", "v": 4})
    publisher.publish("records", {"id": 1, "state": "open", "v": 5})
    publisher.flush()
    (back,) = take(sub, 1, timeout=10)
    assert back.command == "publish" and back.json() == {"id": 1, "state": "open", "v": 5}
    sub.close()


# -- pagination ----------------------------------------------------------------------------------


def test_paginated_window_follows_the_chapter_example(client: Client, publisher: Client) -> None:
    reset(publisher, "pages")
    for i in (1, 2, 5, 6, 8):
        publisher.publish("pages", {"id": i})
    settle(publisher, "pages")
    sub = client.sow_and_subscribe("pages", top_n=2, skip_n=1, order_by="/id", options="oof")
    group = take(sub, 4)
    assert [r["id"] for r in records(group)] == [2, 5]
    publisher.publish("pages", {"id": 4})
    got = take(sub, 2)
    assert [(m.command, m.json()["id"]) for m in got] == [("publish", 4), ("oof", 5)]
    assert got[1].reason == "match"
    # a record before the window leaves: everything shifts by one
    publisher.sow_delete("pages", filter="/id = 1")
    got = take(sub, 2)
    assert sorted((m.command, m.json()["id"]) for m in got) == [("oof", 2), ("publish", 5)]
    # outside the window: nothing
    publisher.publish("pages", {"id": 8, "note": "x"})
    assert quiet(sub, 1.0) == []
    sub.close()


def test_two_windows_on_one_filter_each_keep_their_page(client: Client, publisher: Client) -> None:
    reset(publisher, "pages")
    for i in range(1, 7):
        publisher.publish("pages", {"id": i})
    settle(publisher, "pages")
    first = client.sow_and_subscribe("pages", top_n=2, order_by="/id")
    settle(publisher, "pages")
    second = client.sow_and_subscribe("pages", top_n=2, skip_n=2, order_by="/id")
    assert [r["id"] for r in records(take(first, 4))] == [1, 2]
    assert [r["id"] for r in records(take(second, 4))] == [3, 4]
    publisher.publish("pages", {"id": 2, "note": "moved"})
    assert [(m.command, m.json()) for m in take(first, 1)] == [
        ("publish", {"id": 2, "note": "moved"})
    ]
    assert quiet(second, 1.0) == []
    first.close()
    second.close()


# -- replace -------------------------------------------------------------------------------------


def test_replace_changes_the_filter_atomically(client: Client, publisher: Client) -> None:
    reset(publisher, "records")
    for i in range(6):
        publisher.publish("records", {"id": i, "n": i})
    settle(publisher, "records")
    sub = client.sow_and_subscribe("records", "/n < 3", options="oof", sub_id="watch")
    assert sorted(r["id"] for r in records(take(sub, 5))) == [0, 1, 2]
    again = client.sow_and_subscribe("records", "/n >= 2", options="oof,replace", sub_id="watch")
    assert again is sub
    msgs = take(sub, 7)  # group of 3 newly in scope, then oof for 0 and 1
    assert msgs[0].command == "group_begin"
    assert sorted(r["id"] for r in records(msgs)) == [3, 4, 5]
    assert sorted(r["id"] for r in records(msgs, "oof")) == [0, 1]
    publisher.publish("records", {"id": 0, "n": 10})  # now in scope
    publisher.publish("records", {"id": 1, "n": 1})  # still out
    (live,) = take(sub, 1)
    assert live.json() == {"id": 0, "n": 10}
    assert quiet(sub, 1.0) == []
    sub.close()


def test_replace_of_a_paginated_subscription_moves_the_window(
    client: Client, publisher: Client
) -> None:
    reset(publisher, "pages")
    for i in range(1, 9):
        publisher.publish("pages", {"id": i, "even": i % 2 == 0})
    settle(publisher, "pages")
    sub = client.sow_and_subscribe(
        "pages", top_n=2, skip_n=1, order_by="/id", options="oof", sub_id="paged"
    )
    assert [r["id"] for r in records(take(sub, 4))] == [2, 3]
    client.sow_and_subscribe(
        "pages",
        "/even = true",
        top_n=2,
        skip_n=1,
        order_by="/id",
        options="oof,replace",
        sub_id="paged",
    )
    msgs = take(sub, 6)  # evens 2,4,6,8 skip 1: 4 and 6 enter, 2 and 3 leave
    assert [m.command for m in msgs] == ["group_begin", "sow", "sow", "group_end", "oof", "oof"]
    assert [m.json()["id"] for m in msgs if m.command == "sow"] == [4, 6]
    assert sorted(m.json()["id"] for m in msgs if m.command == "oof") == [2, 3]
    publisher.publish("pages", {"id": 5, "even": True})  # now even: enters at rank 2
    got = take(sub, 2)
    assert [(m.command, m.json()["id"]) for m in got] == [("publish", 5), ("oof", 6)]
    sub.close()


def test_replace_errors(client: Client, publisher: Client) -> None:
    with pytest.raises(InvalidCommandError, match="existing"):
        client.sow_and_subscribe("records", options="replace", sub_id="missing")
    settle(publisher, "pages")
    sub = client.sow_and_subscribe("pages", top_n=2, skip_n=1, order_by="/id", sub_id="pg")
    with pytest.raises(InvalidCommandError, match="OrderBy"):
        client.sow_and_subscribe(
            "pages", "/id > 1", top_n=2, skip_n=1, options="replace", sub_id="pg"
        )
    with pytest.raises(InvalidCommandError, match="in use"):
        client.sow_and_subscribe("pages", sub_id="pg")
    sub.close()


# -- entitlements --------------------------------------------------------------------------------


def test_entitlements_filter_queries_and_subscriptions(
    engine: EngineProcesses, publisher: Client
) -> None:
    reset(publisher, "secure")
    publisher.publish("secure", {"id": 1, "owner": "alice", "public": False})
    publisher.publish("secure", {"id": 2, "owner": "bob", "public": True})
    publisher.publish("secure", {"id": 3, "owner": "bob", "public": False})
    publisher.flush()
    with engine.client(identity="alice") as alice, engine.client(identity="eve") as eve:
        assert [r["id"] for r in alice.sow_records("secure")] == [1]
        assert [r["id"] for r in eve.sow_records("secure")] == [2]
        sub_a = alice.sow_and_subscribe("secure", options="oof")
        sub_e = eve.sow_and_delta_subscribe("secure", options="oof")
        assert [r["id"] for r in records(take(sub_a, 3))] == [1]
        assert [r["id"] for r in records(take(sub_e, 3))] == [2]
        publisher.publish("secure", {"id": 4, "owner": "carol", "public": False})  # nobody's
        publisher.publish("secure", {"id": 1, "owner": "bob", "public": False})  # alice loses it
        publisher.publish("secure", {"id": 2, "owner": "bob", "public": False})  # eve loses it
        (a,) = take(sub_a, 1)
        (e,) = take(sub_e, 1)
        assert (a.command, a.reason, a.json()["owner"]) == ("oof", "entitlement", "alice")
        assert (e.command, e.reason, e.json()["public"]) == ("oof", "entitlement", True)
        assert quiet(sub_a, 1.0) == [] and quiet(sub_e, 0.5) == []
        sub_a.close()
        sub_e.close()


# -- bad input and slow consumers ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("bogus", "unknown subscription option 'bogus'"),
        ("conflation=50ms", "100ms"),
        ("select=[a]", "'a'"),
        ("oof=1", "oof"),
    ],
)
def test_bad_options_are_clear_errors(client: Client, options: str, message: str) -> None:
    with pytest.raises(InvalidCommandError, match=message):
        client.sow_and_subscribe("records", options=options)


def test_bad_filter_is_an_error_with_a_position(client: Client) -> None:
    with pytest.raises(FilterError):
        client.subscribe("records", "/a = = 1")


def test_engine_rejects_bad_subscription_commands_from_foreign_clients(
    engine: EngineProcesses, client: Client
) -> None:
    """A client that skips validation gets a failure naming the problem; the engine goes on."""
    info = client.topic_info("records")
    sub = Subscription("x", [], parse_opts(""), key_fields={})
    client._connection.add_subscription(sub)
    with pytest.raises(CommandFailedError, match="unknown subscription option"):
        list(
            client._subscribing.place(
                sub, [info], "subscribe", None, raw_options("nonsense"), None, 1, None, None
            )
        )
    client._connection.drop_subscription(sub)
    assert client.sow_records("records", top_n=0) == []


def test_a_slow_subscriber_is_conflated_then_dropped_without_stalling_others(
    engine: EngineProcesses, publisher: Client
) -> None:
    reset(publisher, "flood")
    with engine.client() as slow, engine.client() as fast:
        stalled = slow.subscribe("flood")
        total = 40_000
        keeping_up = fast.subscribe("flood", f"/id = {total - 1}")
        # distinct records: conflation cannot shrink this backlog, so the policy must drop
        for i in range(total):
            publisher.publish("flood", {"id": i, "n": i})
        publisher.flush()
        # the reader keeps up and sees its record's last update promptly
        last = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            msg = keeping_up.next(timeout=5)
            if msg is None:
                break
            last = msg.json()["n"]
        assert last == total - 1
        # the stalled one, once it reads again, finds its subscription was dropped
        with pytest.raises(SubscriptionDroppedError, match="slow_consumer"):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                stalled.next(timeout=5)
        keeping_up.close()


def parse_opts(text: str) -> Any:
    from sowstream.subscriptions.options import parse_options

    return parse_options(text)


class raw_options:
    def __init__(self, text: str) -> None:
        self.text = text
        self.replace = False
        self.top_n = None

    def to_text(self) -> str:
        return self.text


def apply_view(msgs: list[Message]) -> dict[str, Any]:
    """A subscriber's picture after ``msgs``: deltas merged, oofs removed."""
    view: dict[str, Any] = {}
    for m in msgs:
        if m.command in ("sow", "publish"):
            body = m.json()
            view[m.sow_key] = merge_delta(view[m.sow_key], body) if m.delta else body
        elif m.command == "oof":
            view.pop(m.sow_key, None)
    return view


Check = Callable[[], bool]


# -- the command line ----------------------------------------------------------------------------


def _cli(engine: EngineProcesses, *args: str) -> subprocess.CompletedProcess[str]:
    return engine.cli(*args)


def test_cli_subscribe_prints_json_lines(engine: EngineProcesses, publisher: Client) -> None:
    reset(publisher, "orders")
    publisher.publish("orders", {"order": 1, "status": "new"})
    settle(publisher, "orders")
    cli = subprocess.Popen(
        [
            *(sys.executable, "-m", "sowstream", "subscribe", "orders"),
            *("--sow", "--delta", "--oof", "--json", "--filter", "/status <> 'gone'"),
            *("--count", "3", "--idle", "30"),
            *("--bootstrap", engine.bootstrap, "--prefix", engine.prefix),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        # Its first line is the SOW part's record: the subscription is placed.
        assert cli.stdout is not None
        first = cli.stdout.readline()
        publisher.publish("orders", {"order": 1, "status": "open"})
        publisher.publish("orders", {"order": 1, "status": "gone"})
        rest, stderr = cli.communicate(timeout=120)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 0, stderr
    lines = [orjson.loads(line) for line in [first, *rest.splitlines()]]
    assert [(m["command"], m["data"]) for m in lines] == [
        ("sow", {"order": 1, "status": "new"}),
        ("publish", {"order": 1, "status": "open"}),
        ("oof", {"order": 1, "status": "gone"}),
    ]
    assert lines[1]["delta"] and lines[2]["reason"] == "match"


def test_cli_subscribe_table_shows_the_merged_records_as_columns(
    engine: EngineProcesses, publisher: Client
) -> None:
    """Without --json the subscriber's picture: deltas merged into their record, oofs removed,
    a field per column (nested ones as /a/b paths)."""
    reset(publisher, "buyer")
    publisher.publish("buyer", {"buyer": {"id": 1, "name": "Ann"}, "qty": 5, "status": "new"})
    publisher.publish("buyer", {"buyer": {"id": 2, "name": "Bob"}, "qty": 1, "status": "new"})
    settle(publisher, "buyer")
    result: dict[str, subprocess.CompletedProcess[str]] = {}

    def run() -> None:
        result["cli"] = _cli(
            engine,
            *("subscribe", "buyer", "--sow", "--delta", "--oof"),
            *("--filter", "/status <> 'gone'", "--count", "4", "--idle", "30"),
        )

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(6)  # the CLI connects and places the subscription
    publisher.delta_publish("buyer", {"buyer": {"id": 1}, "qty": 7})
    publisher.delta_publish("buyer", {"buyer": {"id": 2}, "status": "gone"})
    thread.join(120)
    done = result["cli"]
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr  # no librdkafka line either
    lines = done.stdout.splitlines()
    assert "buyer: 1 record(s)" in done.stdout
    header = next(line for line in lines if line.startswith("┃"))
    assert [c.strip() for c in header.strip("┃").split("┃")] == [
        "SowKey",
        "/buyer/id",
        "/buyer/name",
        "/qty",
        "/status",
    ]
    rows = [
        [c.strip() for c in line.strip("│").split("│")][1:] for line in lines if line[:1] == "│"
    ]
    assert rows == [["1", "Ann", "7", "new"]]


def test_cli_subscribe_errors_are_one_line(engine: EngineProcesses) -> None:
    bad = _cli(engine, "subscribe", "orders", "--options", "conflation=10ms", "--idle", "1")
    assert bad.returncode == 1 and "100ms" in bad.stderr and "Traceback" not in bad.stderr


def test_an_amps_style_topic_name_works_end_to_end(
    engine: EngineProcesses, client: Client, publisher: Client
) -> None:
    """``/ett/order`` is not a legal Kafka name: its log is ``<prefix>.log.__-ett_-order``."""
    assert publisher.topic_info("/ett/order").log_topic == f"{engine.prefix}.log.__-ett_-order"
    sub = client.sow_and_subscribe("/ett/order")
    assert [m.command for m in take(sub, 2)] == ["group_begin", "group_end"]
    publisher.publish("/ett/order", {"id": 1, "qty": 5})
    live = take(sub, 1)[0]
    assert live.topic == "/ett/order" and live.json() == {"id": 1, "qty": 5}
    assert publisher.sow_records("/ett/order") == [{"id": 1, "qty": 5}]
    sub.close()
