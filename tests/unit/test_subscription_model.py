"""A subscriber's picture equals the SOW it subscribed to, whatever the batching and replays.

Runs the real ``TopicProcessor`` (in-memory store, no Kafka) with one subscription, captures the
live messages it sends, and feeds them through the real client-side ``Subscription`` (which drops
replayed messages by sequence and merges deltas). After random operations cut into random batches
and a crash replay, the subscriber's records must equal the model SOW restricted to the filter.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from sowstream.client.subscription import Subscription, _Live
from sowstream.engine.processor import TopicProcessor
from sowstream.filters import compile_filter
from sowstream.messagetypes.changes import merge_delta
from sowstream.sow.compiled import compile_topic
from sowstream.subscriptions.model import SubscriptionSpec
from sowstream.subscriptions.options import parse_options
from sowstream.wire import headers as h
from sowstream.wire.topics import TopicNames
from tests.support.sender import RecordingSender
from tests.unit.test_processor_model import TOPIC, model, ops, to_records


def without_nulls(value: Any) -> Any:
    """A delta says "field removed" with null; the subscriber's record simply lacks it."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    return value


def subscriber_view(sub: Subscription) -> dict[str, Any]:
    view: dict[str, Any] = {}
    while (msg := sub.next(timeout=0)) is not None:
        if msg.command == "oof":
            view.pop(msg.sow_key, None)
        elif msg.delta:
            assert msg.sow_key in view, "a delta for a record the subscriber does not have"
            view[msg.sow_key] = merge_delta(view[msg.sow_key], msg.json())
        else:
            view[msg.sow_key] = msg.json()
    return {k: without_nulls(v) for k, v in view.items()}


FILTERS = [None, "/v > 3", "/g = 1", "/x/v >= 5"]


def app_messages(
    records: list[Any], cuts: list[int], replay_from: int | None, spec: SubscriptionSpec
) -> Subscription:
    """What the application receives: the engine's messages through the client's Subscription."""
    sender = RecordingSender()

    async def go() -> None:
        proc = TopicProcessor(compile_topic(TOPIC), TopicNames("p"), sender)
        ps = await proc.ready(0)
        proc.subs.upsert(spec)
        bounds = sorted({0, len(records), *[c % (len(records) + 1) for c in cuts]})
        for lo, hi in itertools.pairwise(bounds):
            await proc.process(records[lo:hi])
        if replay_from is not None and records:
            await proc.drain()
            ps.watermark = ps.folded = -1  # a crash: the batch comes again, messages are sent again
            await proc.process(records[replay_from % len(records) :])
        await proc.drain()

    asyncio.run(go())
    sub = Subscription("s", [spec], spec.options, key_fields={"t": ("/id",)})
    sub.release()
    for value, hdrs in sender.live():
        sub.on_live(
            _Live(
                hdrs[h.COMMAND],
                hdrs[h.TOPIC],
                int(hdrs[h.PARTITION]),
                int(hdrs[h.OFFSET]),
                hdrs[h.SOW_KEY],
                value,
                int(hdrs[h.TIMESTAMP]),
                hdrs.get(h.REASON, ""),
                hdrs.get(h.DELTA) == "1",
                int(hdrs.get(h.SEQ, "0")),
            )
        )
    return sub


def drain(sub: Subscription) -> list[tuple[str, str, bytes, bool]]:
    out = []
    while (msg := sub.next(timeout=0)) is not None:
        out.append((msg.command, msg.sow_key, msg.data, msg.delta))
    return out


@settings(max_examples=300, deadline=None)
@given(
    ops,
    st.lists(st.integers(0, 60), max_size=5),
    st.none() | st.integers(0, 60),
    st.sampled_from(FILTERS),
    st.booleans(),
)
def test_subscriber_view_equals_filtered_sow(
    sequence: list[tuple[str, int, int, int]],
    cuts: list[int],
    replay_from: int | None,
    flt: str | None,
    delta: bool,
) -> None:
    records = to_records(sequence)
    spec = SubscriptionSpec(
        sub_id="s",
        reply_to="r",
        topic="t",
        command="delta_subscribe" if delta else "subscribe",
        filter=flt,
        options=parse_options("oof"),
    )
    sub = app_messages(records, cuts, replay_from, spec)
    compiled = compile_filter(flt) if flt else None
    expected = {
        key.decode(): body
        for key, body in model(sequence).items()
        if compiled is None or compiled.matches(body)
    }
    assert subscriber_view(sub) == expected


@settings(max_examples=200, deadline=None)
@given(
    ops,
    st.lists(st.integers(0, 60), max_size=5),
    st.integers(0, 60),
    st.sampled_from(FILTERS),
    st.booleans(),
)
def test_a_crash_replay_changes_nothing_the_application_sees(
    sequence: list[tuple[str, int, int, int]],
    cuts: list[int],
    replay_from: int,
    flt: str | None,
    delta: bool,
) -> None:
    """At-least-once from the engine, exactly once and in order after the client's dedup."""
    records = to_records(sequence)
    command = "delta_subscribe" if delta else "subscribe"
    spec = SubscriptionSpec("s", "r", "t", command, flt, parse_options("oof"))
    calm = drain(app_messages(records, cuts, None, spec))
    crashed = drain(app_messages(records, cuts, replay_from, spec))
    assert crashed == calm


def test_messages_for_one_record_follow_log_order() -> None:
    sequence = [("publish", 1, 0, v) for v in range(10)]
    spec = SubscriptionSpec("s", "r", "t", "subscribe", None, parse_options(""))
    sender = RecordingSender()

    async def go() -> None:
        proc = TopicProcessor(compile_topic(TOPIC), TopicNames("p"), sender)
        await proc.ready(0)
        proc.subs.upsert(spec)
        recs = to_records(sequence)
        await proc.process(recs[:3])
        await proc.process(recs[3:])

    asyncio.run(go())
    assert [orjson.loads(v)["v"] for v, _ in sender.live()] == list(range(10))
    assert [int(hd[h.OFFSET]) for _, hd in sender.live()] == list(range(10))
