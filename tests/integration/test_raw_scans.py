"""Raw scans end to end: a client that asks for raw batches sees exactly what a client that asks
for the record form sees, for every kind of query; two real workers, a real Kafka broker."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from sowstream.client import Client, Message, Subscription
from tests.support.engine import EngineProcesses, running_engine
from tests.support.messages import take

pytestmark = pytest.mark.integration

HISTORY = {"Window": "1d", "Granularity": "0s"}
TOPICS: list[dict[str, Any]] = [
    {
        "Name": "orders",
        "Key": ["/id"],
        "HashIndex": [["/desk"]],
        "Expiration": "enabled",
        "Partitions": 4,
    },
    {"Name": "past", "Key": ["/id"], "History": HISTORY, "Partitions": 2},
    {"Name": "secure", "Key": ["/id"], "Partitions": 2},
    {"Name": "md", "Pattern": "md\\..*", "Key": ["/id"], "Partitions": 2},
]
ENTITLEMENTS = {"alice": {"secure": "/owner = 'alice'"}}


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    workdir = tmp_path_factory.mktemp("raw")
    with running_engine(kafka_bootstrap, workdir, TOPICS, entitlements=ENTITLEMENTS) as procs:
        yield procs


@pytest.fixture(scope="module")
def raw(engine: EngineProcesses) -> Iterator[Client]:
    """A client that asks for raw batches (the default); it also publishes."""
    with engine.client() as c:
        yield c


@pytest.fixture(scope="module")
def record(engine: EngineProcesses) -> Iterator[Client]:
    """A client that asks for the record form, as clients before raw batches did."""
    with engine.client(raw_scans=False) as c:
        yield c


Seen = tuple[str, str, str, bytes, int, str, int]


def seen(msgs: list[Message], *, raw_form: bool | None = None) -> list[Seen]:
    """The ``sow`` messages as the application sees them; ``raw_form`` checks which form
    they came in (a message of a raw batch has not written out its bookmark yet: it holds its
    batch, or its bookmark's parts when the compiled splitter read the batch)."""
    sows = [m for m in msgs if m.command == "sow"]
    if raw_form is not None and sows:
        assert all(
            ("_source" in m.__dict__ or "_bookmark_at" in m.__dict__) == raw_form for m in sows
        )
    return [
        (m.topic, m.sow_key, m.query_id, m.data, m.timestamp, m.bookmark, m.batch_size)
        for m in sows
    ]


def both(
    raw: Client, record: Client, topic: str, flt: str | None = None, **opts: Any
) -> list[Seen]:
    """``sow`` through both clients; the answers must agree, message for message."""
    ordered = opts.get("order_by") is not None or opts.get("top_n") is not None
    # (The client sorts an ordered answer by reading its messages: no unread one is left.)
    got = seen(list(raw.sow(topic, flt, query_id="q", **opts)), raw_form=None if ordered else True)
    want = seen(list(record.sow(topic, flt, query_id="q", **opts)), raw_form=False)
    if ordered:
        assert got == want
    else:  # partitions answer in any order
        assert sorted(got) == sorted(want)
    return got


def fill(raw: Client, topic: str, count: int, **extra: Any) -> None:
    raw.sow_delete(topic, filter="1=1")
    for i in range(count):
        body = {
            "id": i,
            "desk": f"d{i % 4}",
            "px": (i * 37) % 101,
            "owner": ["alice", "bob"][i % 2],
        }
        raw.publish(topic, {**body, **extra})
    list(raw.sow(topic, top_n=0))  # applied: every later query sees them all


def test_full_scans_and_filters_agree(raw: Client, record: Client) -> None:
    fill(raw, "orders", 120)
    assert len(both(raw, record, "orders")) == 120
    assert len(both(raw, record, "orders", batch_size=7)) == 120
    assert len(both(raw, record, "orders", "/px > 50")) == sum(
        1 for i in range(120) if (i * 37) % 101 > 50
    )
    assert len(both(raw, record, "orders", "/desk = 'd1'")) == 30  # the hash index
    assert len(both(raw, record, "orders", "/id BETWEEN 10 AND 19 OR /desk = 'd3'")) == 37
    keys = [m.sow_key for m in raw.sow("orders", "/id < 5") if m.command == "sow"]
    assert len(both(raw, record, "orders", sow_keys=keys)) == 5


def test_order_by_top_n_and_skip_n_agree_in_order(raw: Client, record: Client) -> None:
    fill(raw, "orders", 80)
    ranked = both(raw, record, "orders", order_by="/px DESC, /id", top_n=25, batch_size=4)
    assert len(ranked) == 25
    assert len(both(raw, record, "orders", "/px < 60", order_by="/desk", top_n=10, skip_n=5)) == 10
    # top_n alone keeps whichever partitions answer first: only the count is the same
    for client in (raw, record):
        assert len([m for m in client.sow("orders", top_n=7) if m.command == "sow"]) == 7


def test_expired_records_are_left_out_of_both(raw: Client, record: Client) -> None:
    fill(raw, "orders", 20)
    for i in range(20, 30):
        raw.publish("orders", {"id": i, "desk": "gone"}, expiration=1)
    list(raw.sow("orders", top_n=0))
    time.sleep(1.5)  # expired, whether or not the sweep has removed them yet
    got = both(raw, record, "orders")
    assert len(got) == 20 and not any(b'"gone"' in data for _, _, _, data, *_ in got)


def test_entitlements_filter_both_forms_alike(engine: EngineProcesses, raw: Client) -> None:
    fill(raw, "secure", 30)
    with (
        engine.client(identity="alice") as alice,
        engine.client(identity="alice", raw_scans=False) as alice_record,
    ):
        got = both(alice, alice_record, "secure")
        assert len(got) == 15 and all(b'"alice"' in data for _, _, _, data, *_ in got)
        assert len(both(alice, alice_record, "secure", "/px > 20", order_by="/px")) > 0


def test_pattern_topics_carry_each_records_name(raw: Client, record: Client) -> None:
    raw.sow_delete("md.us", filter="1=1")
    raw.sow_delete("md.eu", filter="1=1")
    for i in range(12):
        raw.publish("md.us" if i % 3 else "md.eu", {"id": i % 5, "px": i})
    list(raw.sow("md", top_n=0))
    every = both(raw, record, "md")
    assert {topic for topic, *_ in every} == {"md.us", "md.eu"}
    one = both(raw, record, "md.us")
    assert {topic for topic, *_ in one} == {"md.us"}
    assert len(both(raw, record, "md", order_by="/px DESC")) == len(every)


def test_historical_queries_agree(raw: Client, record: Client) -> None:
    fill(raw, "past", 10)
    then = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() + 1))
    time.sleep(2)
    for i in range(10):
        raw.publish("past", {"id": i, "px": 1000 + i})
    list(raw.sow("past", top_n=0))
    got = both(raw, record, "past", bookmark=then)
    assert len(got) == 10 and not any(b"1000" in data for _, _, _, data, *_ in got)


def sow_part(sub: Subscription) -> list[Message]:
    """A ``sow_and_subscribe``'s SOW part, group_begin to group_end."""
    out = take(sub, 1)
    while out[-1].command != "group_end":
        out += take(sub, 1)
    return out


def both_subscribed(raw: Client, record: Client, topic: str, **opts: Any) -> list[Seen]:
    """The SOW part of ``sow_and_subscribe`` through both clients, which must agree."""
    subs = [c.sow_and_subscribe(topic, query_id="q", **opts) for c in (raw, record)]
    try:
        got, want = (seen(sow_part(s)) for s in subs)
    finally:
        for s in subs:
            s.close()
    if opts.get("order_by") is not None:
        assert got == want
    else:
        assert sorted(got) == sorted(want)
    return got


def test_sow_and_subscribe_parts_agree_with_select_and_pagination(
    raw: Client, record: Client
) -> None:
    fill(raw, "orders", 40)
    assert len(both_subscribed(raw, record, "orders")) == 40
    assert len(both_subscribed(raw, record, "orders", filter="/desk = 'd2'")) == 10
    projected = both_subscribed(raw, record, "orders", options="select=[/id,/px]")
    assert len(projected) == 40 and all(b"desk" not in data for _, _, _, data, *_ in projected)
    page = both_subscribed(raw, record, "orders", top_n=5, skip_n=3, order_by="/id")
    assert [data for _, _, _, data, *_ in page] == [
        m.data for m in raw.sow("orders", order_by="/id", top_n=5, skip_n=3) if m.command == "sow"
    ]
    live = raw.sow_and_subscribe("orders", "/id = 7")
    assert [m.json()["id"] for m in sow_part(live) if m.command == "sow"] == [7]
    raw.publish("orders", {"id": 7, "desk": "d9"})
    (update,) = take(live, 1)
    assert (update.command, update.json()["desk"]) == ("publish", "d9")
    live.close()
