"""Regular expression (Pattern) topics: configuration, record keys, decoding, planning, matching,
and the real processor answering per topic name on an in-memory store (no Kafka)."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace
from typing import Any

import orjson
import pytest

from sowstream.client.client import TopicInfo
from sowstream.client.subscription import Subscription, _Live
from sowstream.config import load_config_text
from sowstream.config.errors import ConfigError
from sowstream.config.queues import queue_sources
from sowstream.engine.meta import topic_info
from sowstream.engine.processor import TopicProcessor
from sowstream.errors import InvalidCommandError, InvalidMessageError
from sowstream.filters import compile_filter
from sowstream.pipeline.rebuild import PipelineError, require_supported
from sowstream.sow.compiled import compile_topic
from sowstream.sow.keys import generated_sow_key
from sowstream.sow.ops import RawRecord, decode_log_record, deleted_by_filter
from sowstream.sow.patterns import (
    NameScope,
    literal_name,
    name_regex,
    record_key,
    split_key,
)
from sowstream.sow.planner import FullScan, KeyLookup, plan
from sowstream.sow.record import SowRecord
from sowstream.subscriptions.matcher import TopicSubscriptions
from sowstream.subscriptions.model import Change, SubscriptionSpec
from sowstream.subscriptions.options import SubscriptionOptions
from sowstream.wire import headers as h
from sowstream.wire.protocol import Command
from sowstream.wire.topics import TopicNames
from tests.support.sender import RecordingSender

YAML = """
sow:
  - Name: orders
    Pattern: 'orders\\..*'
    Key: /id
    HashIndex: [[/g]]
    Durability: transient
    Partitions: 1
  - Name: orders.gb
    Key: /id
"""
CONFIG = load_config_text(YAML)
ORDERS = CONFIG.topics[0]
COMPILED = compile_topic(ORDERS)


def key(name: str, i: int) -> str:
    return generated_sow_key(name, name, ["/id"], {"id": i})


# -- record keys and scopes -------------------------------------------------------------------


def test_record_keys_hold_the_name_and_split_back() -> None:
    stored = record_key("orders.us", "abc")
    assert split_key(stored) == ("orders.us", "abc")
    assert split_key("plain") == ("", "plain")
    assert record_key("a", "x") != record_key("b", "x")


@pytest.mark.parametrize(
    ("regex", "literal"),
    [
        ("orders\\.us", "orders.us"),
        (name_regex("/ett/order-1"), "/ett/order-1"),
        ("orders_us", "orders_us"),
        ("orders\\..*", None),
        ("orders.us", None),
        ("\\d+", None),
        ("a|b", None),
        ("trailing\\", None),
    ],
)
def test_literal_names_are_told_from_regular_expressions(regex: str, literal: str | None) -> None:
    assert literal_name(regex) == literal


def test_a_scope_admits_its_names_and_sow_keys() -> None:
    one = NameScope(name_regex("orders.us"))
    assert one.literal == "orders.us"
    assert one.prefix == b"orders.us\x1f"
    assert one.admits(record_key("orders.us", "k")) and not one.admits(record_key("ordersXus", "k"))
    assert one.admits_stored(record_key("orders.us", "k").encode())
    many = NameScope("orders\\..*", frozenset({"k"}))
    assert many.prefix == b""
    assert many.admits(record_key("orders.eu", "k"))
    assert not many.admits(record_key("orders.eu", "other"))
    assert not many.admits(record_key("trades.eu", "k"))
    assert NameScope().admits(record_key("anything", "k"))
    with pytest.raises(re.error):
        NameScope("orders(")


# -- configuration ----------------------------------------------------------------------------


def test_a_pattern_topic_is_loaded_from_yaml_and_amps_xml() -> None:
    assert ORDERS.pattern == "orders\\..*"
    xml = load_config_text(
        "<SOW><Topic><Name>orders</Name><Pattern>orders\\..*</Pattern><Key>/id</Key>"
        "<MessageType>json</MessageType><FileName>./sow/%n.sow</FileName></Topic></SOW>"
    )
    assert xml.topics[0].pattern == "orders\\..*"


@pytest.mark.parametrize("element", ["History: {Window: 1d}", "Preprocessing: x", "Enrichment: x"])
def test_yaml_pattern_refuses_history_preprocessing_enrichment(element: str) -> None:
    tag = element.split(":")[0]
    with pytest.raises(ConfigError) as caught:
        load_config_text(f"sow:\n  - Name: o\n    Pattern: 'o.*'\n    {element}\n", "cfg.yaml")
    assert caught.value.element == f"sow[0].{tag}"
    assert caught.value.problem == (
        f"{tag} cannot be used with Pattern: topic 'o' is a regular expression topic"
    )


@pytest.mark.parametrize(
    "element",
    [
        "<History><Window>1d</Window></History>",
        "<Preprocessing><Field>1 AS /x</Field></Preprocessing>",
        "<Enrichment><Field>1 AS /x</Field></Enrichment>",
    ],
)
def test_xml_pattern_refuses_history_preprocessing_enrichment(element: str) -> None:
    tag = element[1 : element.index(">")]
    text = f"<SOW><Topic><Name>o</Name><Pattern>o.*</Pattern>{element}</Topic></SOW>"
    with pytest.raises(ConfigError) as caught:
        load_config_text(text, "amps.xml", skip_unsupported=True)  # an error, not unsupported
    assert caught.value.element == f"SOW/Topic[o]/{tag}"
    assert f"{tag} cannot be used with Pattern" in caught.value.problem


def test_an_invalid_pattern_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text("sow:\n  - Name: o\n    Pattern: 'o(.*'\n", "cfg.yaml")
    assert caught.value.element == "sow[0].Pattern"
    assert "Pattern 'o(.*' is not a valid regular expression" in caught.value.problem
    assert "position 1" in caught.value.problem
    with pytest.raises(ConfigError) as xml:
        load_config_text("<SOW><Topic><Name>o</Name><Pattern>[o</Pattern></Topic></SOW>")
    assert xml.value.element == "SOW/Topic[o]/Pattern"
    assert "'[o' is not a valid regular expression" in xml.value.problem


def test_pattern_is_for_sow_topics_and_queues_read_pattern_topics() -> None:
    with pytest.raises(ConfigError) as plain:
        load_config_text("topics:\n  - Name: o\n    Pattern: 'o.*'\n")
    assert plain.value.element == "topics[0].Pattern"
    assert "only applies to SOW topics" in plain.value.problem
    # A queue over a Pattern topic (issue 27): by its Name or Pattern, all of its records; by
    # one name its Pattern owns, that name's records (and publishes to the queue go there).
    config = load_config_text(
        "sow:\n  - Name: o\n    Pattern: 'o\\..*'\n    Key: /id\n"
        "queues:\n  - Name: q\n    UnderlyingTopic: o\n"
        "  - Name: all\n    UnderlyingTopic: 'o\\..*'\n    DefaultPublishTarget: o.in\n"
        "  - Name: us\n    UnderlyingTopic: o.us\n"
    )
    topics = config.topics
    assert [(t.name, only) for t, only in queue_sources(config.queue("q"), topics)] == [("o", None)]
    assert [(t.name, only) for t, only in queue_sources(config.queue("all"), topics)] == [
        ("o", None)
    ]
    assert [(t.name, only) for t, only in queue_sources(config.queue("us"), topics)] == [
        ("o", "o.us")
    ]
    with pytest.raises(ConfigError) as outside:
        load_config_text(
            "sow:\n  - Name: o\n    Pattern: 'o\\..*'\n    Key: /id\n"
            "topics:\n  - Name: o_x\n"
            "queues:\n  - Name: q\n    UnderlyingTopic: 'o_.*'\n    DefaultPublishTarget: o.in\n"
        )
    assert outside.value.element == "queues[0].DefaultPublishTarget"
    assert "'o.in' is not matched by UnderlyingTopic" in outside.value.problem
    with pytest.raises(ConfigError) as unread:
        load_config_text(
            "sow:\n  - Name: o\n    Pattern: 'o\\..*'\n    Key: /id\n"
            "queues:\n  - Name: q\n    UnderlyingTopic: 'o\\.(us|eu)'\n"
            "    DefaultPublishTarget: o.us\n"
        )
    assert unread.value.element == "queues[0].DefaultPublishTarget"
    assert "belongs to the regular expression topic 'o'" in unread.value.problem


def test_an_exact_declaration_wins_over_a_pattern_and_overlaps_are_refused() -> None:
    assert CONFIG.pattern_topic_for("orders.us") is ORDERS
    assert CONFIG.pattern_topic_for("orders.gb") is None  # declared with that very name
    assert CONFIG.pattern_topic_for("trades.us") is None
    assert CONFIG.pattern_topic_for("orders.us", "nvfix") is None
    both = load_config_text(
        "sow:\n  - Name: a\n    Pattern: 'x.*'\n    Key: /id\n"
        "  - Name: b\n    Pattern: '.*y'\n    Key: /id\n"
    )
    assert both.pattern_topic_for("x1").name == "a"  # type: ignore[union-attr]
    with pytest.raises(InvalidCommandError, match="matches the Pattern of several topics"):
        both.pattern_topic_for("xy")


def test_the_meta_record_carries_the_pattern_and_no_fixed_key_domain() -> None:
    info = topic_info(ORDERS, TopicNames())
    assert info["pattern"] == "orders\\..*"
    assert info["key_domain"] == ""  # each name is its own domain
    domained = load_config_text(
        "sow:\n  - Name: o\n    Pattern: 'o.*'\n    Key: /id\n    KeyDomain: shared\n"
    ).topics[0]
    assert topic_info(domained, TopicNames())["key_domain"] == "shared"


def test_the_spark_pipeline_refuses_pattern_topics() -> None:
    with pytest.raises(PipelineError, match="does not rebuild Pattern topics"):
        require_supported(ORDERS)


# -- decoding the log --------------------------------------------------------------------------


def raw(name: str | None, body: dict[str, Any] | None, offset: int, **extra: str) -> RawRecord:
    headers = {**({h.TOPIC: name} if name else {}), **extra}
    value = orjson.dumps(body) if body is not None else None
    k = key(name, body["id"]).encode() if name and body else None
    return RawRecord(0, offset, 1000 + offset, k, value, headers)


def decode_raw(rec: RawRecord) -> Any:
    return decode_log_record(COMPILED, rec.key, rec.value, rec.headers, rec.offset, rec.timestamp)


def test_each_name_keys_its_records_in_its_own_domain() -> None:
    us = decode_raw(raw("orders.us", {"id": 1}, 0))
    eu = decode_raw(raw("orders.eu", {"id": 1}, 1))
    assert us.name == "orders.us" and us.kafka_key == key("orders.us", 1)
    assert us.sow_key == record_key("orders.us", key("orders.us", 1))
    assert eu.sow_key == record_key("orders.eu", key("orders.eu", 1))
    assert not us.rekey and not eu.rekey
    shared = compile_topic(CONFIG.topics[0].model_copy(update={"key_domain": "d"}))
    op = decode_log_record(shared, None, b'{"id": 1}', {h.TOPIC: "orders.us"}, 0, 0)
    assert op.kafka_key == generated_sow_key("orders.us", "d", ["/id"], {"id": 1}) and op.rekey


@pytest.mark.parametrize(
    ("headers", "reason", "text"),
    [
        ({}, "missing_topic", "needs the topic name it is published under in header sow.topic"),
        ({h.TOPIC: "trades.us"}, "bad_topic", "'trades.us' in header sow.topic does not match"),
    ],
)
def test_a_record_without_a_matching_name_is_rejected(
    headers: dict[str, str], reason: str, text: str
) -> None:
    with pytest.raises(InvalidMessageError) as caught:
        decode_log_record(COMPILED, None, b'{"id": 1}', headers, 0, 0)
    assert caught.value.reason == reason
    assert text in str(caught.value)


def test_a_delete_by_filter_takes_its_own_name_only() -> None:
    op = decode_raw(raw("orders.us", None, 5, **{h.COMMAND: h.SOW_DELETE, h.FILTER: "1=1"}))
    assert op.name == "orders.us" and op.sow_key is None
    us = SowRecord(record_key("orders.us", "k"), b'{"id": 1}', 1, 1)
    eu = SowRecord(record_key("orders.eu", "k"), b'{"id": 1}', 1, 1)
    assert deleted_by_filter(COMPILED, us, op) and not deleted_by_filter(COMPILED, eu, op)


# -- planning ----------------------------------------------------------------------------------


def test_key_lookups_need_one_name() -> None:
    flt = compile_filter("/id = 1")
    one = plan(ORDERS, flt, scope=NameScope(name_regex("orders.us")))
    assert one == KeyLookup((record_key("orders.us", key("orders.us", 1)),))
    assert not isinstance(plan(ORDERS, flt, scope=NameScope("orders\\..*")), KeyLookup)
    keyed = plan(ORDERS, None, ["k"], scope=NameScope(name_regex("orders.eu")))
    assert keyed == KeyLookup((record_key("orders.eu", "k"),))
    assert plan(ORDERS, None, ["k"], scope=NameScope("orders\\..*")) == FullScan()


# -- subscriptions -----------------------------------------------------------------------------


def test_subscribers_get_their_names_with_real_topic_and_sow_key() -> None:
    subs = TopicSubscriptions(COMPILED)
    us = SubscriptionSpec("us", "r", "orders", "subscribe", topic_regex=name_regex("orders.us"))
    every = SubscriptionSpec("all", "r", "orders", "subscribe", topic_regex="orders\\..*")
    subs.upsert(us)
    subs.upsert(every)
    out = []
    for n, name in enumerate(["orders.us", "orders.eu"]):
        after = SowRecord(record_key(name, "k"), b'{"id": 1}', n, 0)
        out += subs.dispatch([Change(after.sow_key, None, after, 0, n, 0)], 0)
    got = sorted((d.spec.sub_id, d.topic, d.sow_key) for d in out)
    assert got == [("all", "orders.eu", "k"), ("all", "orders.us", "k"), ("us", "orders.us", "k")]
    with pytest.raises(InvalidCommandError, match="not a valid regular expression"):
        subs.upsert(SubscriptionSpec("bad", "r", "orders", "subscribe", topic_regex="("))


def test_the_topic_regex_travels_in_the_registry_record() -> None:
    spec = SubscriptionSpec("s", "r", "orders", "subscribe", topic_regex="orders\\..*")
    assert SubscriptionSpec.from_wire(spec.to_wire()) == spec


# -- the processor, per name -------------------------------------------------------------------


def command(filter: str | None = None, regex: str | None = None, **extra: Any) -> Command:
    return Command(
        command="sow",
        command_id="c",
        query_id="",
        reply_to="r",
        topic="orders",
        filter=filter,
        topic_regex=regex,
        **extra,
    )


async def ask(sender: RecordingSender, proc: TopicProcessor, cmd: Command) -> list[Any]:
    """(topic, SowKey, /id) of every record one partition answers ``cmd`` with."""
    sender.take()
    await proc.query(cmd, 0)
    replies = sender.replies()
    assert all(r.status == "success" for r in replies), replies
    return sorted(
        (rec.topic, rec.sow_key, orjson.loads(rec.data)["id"])
        for reply in replies
        if reply.command == "sow"
        for rec in reply.records
    )


def test_the_processor_keeps_and_answers_each_name_apart() -> None:
    records = [
        raw("orders.us", {"id": 1, "g": 1, "px": 10}, 0),
        raw("orders.eu", {"id": 1, "g": 1, "px": 20}, 1),
        raw("orders.eu", {"id": 2, "g": 2, "px": 30}, 2),
        raw(None, {"id": 3, "g": 1, "px": 40}, 3),  # no name: dead letter
        raw("orders.us", None, 4, **{h.COMMAND: h.SOW_DELETE, h.FILTER: "/g = 1"}),
        raw("orders.us", {"id": 5, "g": 1, "px": 50}, 5),
    ]

    async def go() -> dict[str, list[tuple[str, str, int]]]:
        sender = RecordingSender()
        proc = TopicProcessor(COMPILED, TopicNames("p"), sender)
        await proc.ready(0)
        await proc.process(records[:4])
        await proc.drain()
        answers: dict[str, list[tuple[str, str, int]]] = {}
        queries = {
            "us": command(regex=name_regex("orders.us")),
            "all": command(regex="orders\\..*"),
            "us by key": command("/id = 1", name_regex("orders.us")),
            "eu by hash index": command("/g = 1", name_regex("orders.eu")),
            "all by range (memo)": command("/px >= 20", "orders\\..*"),
            "eu by SowKeys": command(
                regex=name_regex("orders.eu"), sow_keys=(key("orders.eu", 2), key("orders.us", 1))
            ),
        }
        for label, cmd in list(queries.items()):
            answers[label] = await ask(sender, proc, cmd)
        await proc.process(records[4:])
        await proc.drain()
        queries = {}
        queries["us after delete"] = command(regex=name_regex("orders.us"))
        queries["all after delete"] = command(regex="orders\\..*")
        for label, cmd in queries.items():
            answers[label] = await ask(sender, proc, cmd)
        dead = [s for s in sender.records if s.topic == "p.deadletter"]
        assert len(dead) == 1
        return answers

    answers = asyncio.run(go())
    us1 = ("orders.us", key("orders.us", 1), 1)
    eu1 = ("orders.eu", key("orders.eu", 1), 1)
    eu2 = ("orders.eu", key("orders.eu", 2), 2)
    assert answers["us"] == [us1]
    assert answers["all"] == sorted([us1, eu1, eu2])
    assert answers["us by key"] == [us1]
    assert answers["eu by hash index"] == [eu1]
    assert answers["all by range (memo)"] == sorted([eu1, eu2])
    assert answers["eu by SowKeys"] == [eu2]
    # The delete by filter on orders.us took its record and left orders.eu's.
    us5 = ("orders.us", key("orders.us", 5), 5)
    assert answers["us after delete"] == [us5]
    assert answers["all after delete"] == sorted([eu1, eu2, us5])


# -- the client's view of a Pattern topic ------------------------------------------------------


def client_info(**changes: Any) -> TopicInfo:
    info = TopicInfo("orders", ("/id",), "", 4, "p.log.orders", "p.ctl.orders")
    return replace(info, pattern="orders\\..*", **changes)


def test_a_name_addresses_its_pattern_topic_and_the_name_all_of_it() -> None:
    us = client_info().addressed_as("orders.us")
    assert us.topic_regex == "orders\\.us" and us.published_name == "orders.us"
    whole = client_info().addressed_as("orders")  # its Name, which the Pattern does not match
    assert whole.topic_regex is None and whole.published_name is None
    assert client_info(topic_regex="orders\\..*").published_name is None
    plain = TopicInfo("ticks", (), "ticks", 4, "p.log.ticks", "p.ctl.ticks")
    assert plain.addressed_as("ticks") is plain


def test_a_subscription_orders_a_pattern_topic_per_topic_not_per_name() -> None:
    spec = SubscriptionSpec("s", "r", "orders", "subscribe", topic_regex="orders\\..*")
    sub = Subscription(
        "s", [spec], SubscriptionOptions(), key_fields={}, patterns={"orders": "orders\\..*"}
    )
    sub.set_cut("orders", 0, 10)  # the placement's part_end names the Pattern topic
    sub.release()

    def live(name: str, offset: int) -> _Live:
        return _Live("publish", name, 0, offset, "k", b"{}", 0, "", False)

    for name, offset in [("orders.us", 9), ("orders.eu", 11), ("orders.us", 12), ("orders.eu", 12)]:
        sub.on_live(live(name, offset))
    got = []
    while (msg := sub.next(timeout=0)) is not None:
        got.append((msg.topic, msg.bookmark.split("|")[-1]))
    assert got == [("orders.eu", "11"), ("orders.us", "12")]
