"""Deltas from views and conflated topics name their record in the body (send_keys).

A view's SOW topic and a conflated topic have no Key fields of their own; their deltas carry a
view's Grouping fields (as the view shows them) and a conflated topic's underlying record key
fields. The property test runs the real processor and the real client-side subscription on such
a topic and has the subscriber name each record by those fields only, never by its SowKey: what
it holds must still equal the SOW.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sowstream.client.messages import Message
from sowstream.client.topics import TopicInfo
from sowstream.config import TopicConfig, load_config_text
from sowstream.config.root import SowstreamConfig
from sowstream.engine.meta import topic_info
from sowstream.sow.keys import sow_key_from_values
from sowstream.sow.ops import RawRecord
from sowstream.subscriptions.model import (
    DELTA_SUBSCRIBE,
    SOW_AND_DELTA_SUBSCRIBE,
    WITH_SOW,
)
from sowstream.subscriptions.options import parse_options
from sowstream.wire import headers as h
from sowstream.wire.avro import decode, encode
from sowstream.wire.topics import TopicNames
from tests.support.subscriber import Harness

CONFIG = """
sow:
  - Name: trades
    Key: [/region, /desk, /id]
  - Name: px
    Key: /sym
views:
  - Name: BY_DESK
    UnderlyingTopic: trades
    Projection: ["/region AS /area", "/desk", "SUM(/qty) AS /total", "COUNT(/id) AS /n"]
    Grouping: ["/region", "/desk"]
    Partitions: 2
  - Name: TOTALS
    UnderlyingTopic: trades
    Projection: ["SUM(/qty) AS /total"]
    Grouping: ["/region"]
conflated_topics:
  - Name: px-C
    UnderlyingTopic: px
    Partitions: 2
  - Name: desks-C
    UnderlyingTopic: BY_DESK
  - Name: desks-CC
    UnderlyingTopic: desks-C
"""


def loaded() -> SowstreamConfig:
    return load_config_text(CONFIG)


def derived(name: str) -> TopicConfig:
    config = loaded()
    found = [t for t in (*config.view_topics, *config.conflated_topic_configs) if t.name == name]
    assert len(found) == 1
    return found[0]


@pytest.mark.parametrize(
    ("topic", "keys"),
    [
        ("BY_DESK", ("/area", "/desk")),  # the Grouping fields as the view shows them
        ("TOTALS", ()),  # the view does not show its Grouping field: nothing to send
        ("px-C", ("/sym",)),  # the underlying topic's Key fields
        ("desks-C", ("/area", "/desk")),  # over a view: the view's
        ("desks-CC", ("/area", "/desk")),  # over a conflated topic: what that one sends
    ],
)
def test_delta_keys_of_views_and_conflated_topics(topic: str, keys: tuple[str, ...]) -> None:
    definition = derived(topic)
    assert definition.keys == ()  # still no Key fields: the SowKeys are made elsewhere
    assert definition.delta_keys == keys


def test_a_keyed_topic_sends_its_key_fields() -> None:
    (trades, px) = loaded().topics
    assert (trades.delta_keys, px.delta_keys) == (("/region", "/desk", "/id"), ("/sym",))


# ---- the subscriber names records by the key fields in the body


class Shape:
    """How records of one derived topic look: their key fields and a record for a key."""

    def __init__(self, topic: str) -> None:
        self.topic = derived(topic)
        self.keys = self.topic.delta_keys

    def body(self, k: int, v: int) -> dict[str, Any]:
        if self.topic.name == "px-C":
            return {"sym": f"S{k}", "p": v, "v": 10}
        return {"area": f"R{k % 2}", "desk": f"D{k}", "total": v, "n": v % 3 + 1}

    def named(self, body: dict[str, Any]) -> str:
        """The record's name as the application reads it: its key fields' values."""
        missing = [p for p in self.keys if p[1:] not in body]
        assert not missing, f"{body} lacks the key fields {missing}"
        return orjson.dumps([body[p[1:]] for p in self.keys]).decode()

    def message_key(self, msg: Message) -> str:
        return self.named(msg.json())


RECORDS = 5
op = st.tuples(
    st.sampled_from(["publish", "publish", "delete"]),
    st.integers(0, RECORDS - 1),
    st.integers(0, 3),
)


def run(
    shape: Shape, ops: list[tuple[str, int, int]], command: str, options: str, cut: int
) -> None:
    harness = Harness(shape.topic, command, None, parse_options(options), key_of=shape.message_key)
    sow: dict[str, dict[str, Any]] = {}
    partitions = shape.topic.partitions
    offsets = [0] * partitions

    def record(kind: str, k: int, v: int) -> RawRecord:
        sow_key = sow_key_from_values(shape.topic.name, [str(k)])
        p = k % partitions
        offsets[p] += 1
        if kind == "delete":
            sow.pop(sow_key, None)
            return RawRecord(
                p, offsets[p], 1_000 + offsets[p], sow_key.encode(), None, {h.COMMAND: h.SOW_DELETE}
            )
        body = shape.body(k, v)
        sow[sow_key] = body
        return RawRecord(
            p, offsets[p], 1_000 + offsets[p], sow_key.encode(), orjson.dumps(body), {}
        )

    async def go() -> None:
        await harness.start()
        await harness.apply([record(*o) for o in ops[:cut]])
        seen: set[str] = set()
        harness.register()
        for p in range(partitions):
            await harness.place(p)
        for o in ops[cut:]:
            await harness.apply([record(*o)])
            seen.add(sow_key_from_values(shape.topic.name, [str(o[1])]))
        await harness.flush()
        wanted = {shape.named(body): body for body in harness.expected(sow).values()}
        held = harness.cache.view()
        if command not in WITH_SOW:
            # Without a SOW part the subscriber knows only the records changed since it
            # subscribed; one that was there before and only updated arrives as a delta (held
            # apart as partial), with its key fields.
            names = {shape.named(sow[k]) for k in seen if k in sow} - harness.cache.partial
            if "no_empties" in options:  # a publish changing nothing tells it nothing
                names &= set(held)
            wanted = {n: wanted[n] for n in names}
            for name in harness.cache.partial:
                assert set(held.pop(name)) >= {p[1:] for p in shape.keys}
        if "oof" in options:
            assert held == wanted
        else:  # nobody tells the subscriber a record left: it may keep ones that did
            assert {n: held.get(n) for n in wanted} == wanted

    asyncio.run(go())


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["BY_DESK", "px-C", "desks-C"]),
    st.lists(op, min_size=1, max_size=25),
    st.sampled_from([SOW_AND_DELTA_SUBSCRIBE, DELTA_SUBSCRIBE]),
    st.sampled_from(["oof", "oof,no_empties", "oof,conflation=1s", ""]),
    st.integers(0, 25),
)
def test_a_delta_subscriber_naming_records_by_their_key_fields_holds_the_sow(
    topic: str, ops: list[tuple[str, int, int]], command: str, options: str, cut: int
) -> None:
    run(Shape(topic), ops, command, options, min(cut, len(ops)))


def test_clients_learn_the_delta_keys_from_the_meta_topic() -> None:
    names = TopicNames("p")
    for name, keys in (("BY_DESK", ("/area", "/desk")), ("px-C", ("/sym",))):
        record = decode("TopicInfo", encode("TopicInfo", topic_info(derived(name), names)))
        info = TopicInfo.from_wire(record)
        assert (info.keys, info.delta_keys) == ((), keys)
    trades = TopicInfo.from_wire(
        decode("TopicInfo", encode("TopicInfo", topic_info(loaded().topics[0], names)))
    )
    assert trades.delta_keys == ("/region", "/desk", "/id")
    # A record written before the field existed: the Key fields, as before.
    older = {**record, "keys": ["/sym"], "delta_keys": []}
    assert TopicInfo.from_wire(older).delta_keys == ("/sym",)
