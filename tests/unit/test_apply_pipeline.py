"""Pipelined apply: a batch's state is stored only once Kafka acknowledged its subscription
messages, while later batches fold on top of it and send theirs without waiting.

Runs the real ``TopicProcessor`` on an in-memory store with a sender whose acknowledgements the
test releases by hand.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from sowstream.config.queues import QueueConfig
from sowstream.engine.partition import PartitionState
from sowstream.engine.processor import TopicProcessor
from sowstream.engine.queues import QueueRuntime
from sowstream.engine.store import WATERMARK_KEY, is_record_key
from sowstream.errors import StateStoreError
from sowstream.queues import Bookmark
from sowstream.queues.ledger import PartitionLedger, ledger_key
from sowstream.queues.store import entry_key
from sowstream.sow.compiled import compile_topic
from sowstream.sow.ops import RawRecord
from sowstream.sow.record import SowRecord
from sowstream.subscriptions.model import SubscriptionSpec
from sowstream.subscriptions.options import parse_options
from sowstream.wire import headers as h
from sowstream.wire.topics import TopicNames
from tests.support.log import ListLog
from tests.support.sender import RecordingSender
from tests.unit.test_processor_model import TOPIC, key_of, to_records


def stored(proc: TopicProcessor) -> dict[int, int]:
    """Record id → stored value ``v``, read straight from partition 0's store."""
    out = {}
    ps = proc.state(0)
    assert ps is not None
    for key, raw in ps.store.scan():
        if is_record_key(key):
            body = orjson.loads(SowRecord.from_bytes(raw).data)
            out[body["id"]] = body.get("v", body.get("x", {}).get("v"))
    return out


async def settle_loop() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def subscribed() -> tuple[RecordingSender, TopicProcessor, PartitionState]:
    """A processor with one subscription and partition 0 loaded; Kafka acknowledges its sends
    when the test says."""
    sender = RecordingSender(held=True)
    proc = TopicProcessor(compile_topic(TOPIC), TopicNames("p"), sender)
    proc.subs.upsert(SubscriptionSpec("s", "r", "t", "subscribe", None, parse_options("")))
    return sender, proc, await proc.ready(0)


def test_later_batches_send_while_earlier_ones_wait_for_acks() -> None:
    async def go() -> None:
        sender, proc, ps = await subscribed()
        recs = to_records([("publish", 1, 0, 5), ("delta", 1, 0, 7), ("publish", 2, 0, 1)])
        await proc.process(recs[:1])
        await proc.process(recs[1:])
        await settle_loop()
        # Both batches' messages are out although none is acknowledged yet ...
        assert len(sender.live()) == 3
        # ... the delta was merged onto the publish that is not stored yet ...
        assert orjson.loads(sender.live()[1][0]) == {"id": 1, "g": 0, "v": 5, "x": {"v": 7}}
        # ... and nothing is stored before Kafka has the messages.
        assert stored(proc) == {} and ps.watermark == -1 and ps.folded == 2
        sender.acknowledge(1)
        await settle_loop()
        assert stored(proc) == {1: 5} and ps.watermark == 0
        sender.acknowledge()
        await proc.drain()
        assert stored(proc) == {1: 5, 2: 1} and ps.watermark == 2
        assert ps.store.get(WATERMARK_KEY) == b"2"

    asyncio.run(go())


def test_a_queue_write_waits_for_its_own_batch_without_holding_later_ones_back() -> None:
    """A queue's store write (acknowledgements) goes in order behind the batches in flight and
    returns once it is stored; meanwhile the next log batch still folds and sends (the write
    once held the partition's lock until every batch in flight was stored)."""

    async def go() -> None:
        sender, proc, ps = await subscribed()
        recs = to_records([("publish", 1, 0, 5), ("publish", 2, 0, 6)])
        await proc.process(recs[:1])
        write = asyncio.create_task(proc.store_changes(0, {b"\x00q-test": b"1"}))
        await settle_loop()
        await asyncio.wait_for(proc.process(recs[1:]), 1)  # not held back by the write
        assert len(sender.live()) == 2 and not write.done()
        sender.acknowledge()
        assert await asyncio.wait_for(write, 5) is True
        assert ps.store.get(b"\x00q-test") == b"1"
        await proc.drain()
        assert stored(proc) == {1: 5, 2: 6}

    asyncio.run(go())


def test_a_query_waits_for_the_batches_in_flight() -> None:
    async def go() -> None:
        sender, proc, _ = await subscribed()
        await proc.process(to_records([("publish", 1, 0, 5), ("publish", 2, 0, 6)]))
        drained = asyncio.ensure_future(proc.drain())
        await settle_loop()
        assert not drained.done()
        sender.acknowledge()
        await asyncio.wait_for(drained, 5)
        assert stored(proc) == {1: 5, 2: 6}

    asyncio.run(go())


def test_a_revoked_partition_stores_nothing_of_its_batches_in_flight() -> None:
    async def go() -> None:
        sender, proc, ps = await subscribed()
        await proc.process(to_records([("publish", 1, 0, 5)]))
        await proc.drop([0])
        sender.acknowledge()
        await settle_loop()
        # The new owner replays from the stored watermark, so the batch is not lost.
        assert not ps.in_flight and ps.watermark == -1
        assert list(ps.store.scan()) == []

    asyncio.run(go())


def test_batches_in_flight_are_bounded() -> None:
    async def go() -> None:
        sender, proc, ps = await subscribed()
        recs = to_records([("publish", i % 3, 0, i) for i in range(8)])
        for rec in recs[:4]:
            await proc.process([rec])
        fifth = asyncio.ensure_future(proc.process(recs[4:5]))
        await settle_loop()
        assert not fifth.done() and len(ps.in_flight) == 4
        sender.acknowledge(1)
        await asyncio.wait_for(fifth, 5)
        assert len(ps.in_flight) == 4 and ps.watermark == 0
        sender.acknowledge()
        await proc.drain()

    asyncio.run(go())


def test_a_failed_store_write_drops_the_partition_for_a_reload() -> None:
    async def go() -> None:
        sender, proc, ps = await subscribed()

        def broken(changes: Any) -> None:
            raise StateStoreError("disk full")

        ps.store.write = broken  # type: ignore[method-assign]
        await proc.process(to_records([("publish", 1, 0, 5)]))
        sender.acknowledge()
        await settle_loop()
        # Readers waiting on it learn why; the pump finds the partition gone and loads it again.
        assert proc.state(0) is None and isinstance(ps.failure, StateStoreError)
        with pytest.raises(StateStoreError, match="disk full"):
            await proc.table.settle(ps)
        fresh = await proc.ready(0)
        assert fresh is not ps and fresh.failure is None and not fresh.in_flight

    asyncio.run(go())


def test_a_failed_store_write_resets_the_queues_of_the_partition() -> None:
    """A queue fed by the topic forgets the partition along with it: the reload reads the log
    from the queue's low-water offset, and the publishes whose batch was not stored become
    queue messages again (kept only in the queue's memory, a later owner of the partition
    would never have them)."""

    async def go() -> None:
        sender = RecordingSender(held=True)
        names = TopicNames("p")
        recs = to_records([("publish", 1, 0, 5), ("publish", 2, 0, 6)])
        log = ListLog()  # the records are appended as they are published
        proc = TopicProcessor(compile_topic(TOPIC), names, sender, log_reader=log)
        config = QueueConfig(name="WQ", underlying_topic=TOPIC.name)
        queue = QueueRuntime(config, names, sender, proc.store_changes)
        proc.queues.append(queue)
        ps = await proc.ready(0)
        log.records.append(recs[0])
        await proc.process(recs[:1])
        await proc.drain()
        ledger = PartitionLedger.from_bytes(ps.store.get(ledger_key("WQ")) or b"")
        assert ledger.low == 0 and not ledger.skips(0)  # message 0 is read from the log
        assert ps.store.get(entry_key("WQ", 0)) is None  # no stored copy of it

        def broken(changes: Any) -> None:
            raise StateStoreError("disk full")

        ps.store.write = broken  # type: ignore[method-assign]
        log.records.append(recs[1])
        await proc.process(recs[1:])
        await settle_loop()
        assert proc.state(0) is None and isinstance(ps.failure, StateStoreError)
        assert not queue.machine.holds(TOPIC.name, 0)
        assert queue.machine.message(Bookmark(TOPIC.name, 0, 1)) is None

        # The pump loads the partition again and reads its log from the stored watermark on.
        fresh = await proc.ready(0)
        await proc.process([r for r in recs if r.offset > fresh.folded])
        await proc.drain()
        browsed = [m.bookmark.offset for m in queue.machine.browse()]
        assert browsed == [0, 1]

    asyncio.run(go())


def test_a_batch_is_in_the_local_store_only_once_its_changelog_records_are_in_kafka() -> None:
    """A worker killed between its local write and the changelog's acknowledgement restarted
    with a batch only its own store held: a later owner restoring the changelog missed it while
    the watermark of the batches after it said it was applied (a chaos run's SOW lost an update).
    The local store now follows the changelog."""

    async def go() -> None:
        sender, proc, ps = await subscribed()
        changelog: list[dict[bytes, bytes | None]] = []
        in_kafka = asyncio.Event()

        async def replicate(changes: Any, _sender: Any) -> None:
            changelog.append(dict(changes))
            await in_kafka.wait()

        ps.store.replicate = replicate  # type: ignore[method-assign]
        await proc.process(to_records([("publish", 1, 0, 5)]))
        sender.acknowledge()
        await settle_loop()
        assert len(changelog) == 1  # sent to the changelog ...
        assert stored(proc) == {} and ps.store.get(WATERMARK_KEY) is None  # ... not stored yet
        in_kafka.set()
        await proc.table.settle(ps)
        assert stored(proc) == {1: 5}
        assert ps.store.get(WATERMARK_KEY) == changelog[0][WATERMARK_KEY]

    asyncio.run(go())


def test_a_batch_its_changelog_refused_is_not_stored_and_is_applied_again() -> None:
    async def go() -> None:
        sender, proc, ps = await subscribed()

        async def refused(changes: Any, _sender: Any) -> None:
            raise StateStoreError("changelog 'p-sow-t-changelog' partition 0: delivery failed")

        ps.store.replicate = refused  # type: ignore[method-assign]
        await proc.process(to_records([("publish", 1, 0, 5)]))
        sender.acknowledge()
        await settle_loop()
        assert not [k for k, _ in ps.store.scan() if is_record_key(k)]
        assert ps.store.get(WATERMARK_KEY) is None
        assert proc.state(0) is None  # loaded again: the log is applied from before the batch

    asyncio.run(go())


def test_what_a_batch_owes_is_sent_before_it_is_stored() -> None:
    """Publishers' acks, the keyed copy of an unkeyed publish and a dead letter went out only
    after the batch was stored: a worker killed in between lost them for good, since the next
    owner starts after the stored watermark (a chaos run's sow_delete waited out its timeout).
    They now go with the batch's messages; the batch is stored once Kafka has them."""

    async def go() -> None:
        sender, proc, ps = await subscribed()
        asked = {h.REPLY_TO: "p.reply.pub", h.COMMAND_ID: "c1"}
        recs = [
            RawRecord(0, 0, 1, key_of(1), orjson.dumps({"id": 1, "g": 0, "v": 5}), asked),
            RawRecord(0, 1, 1, None, orjson.dumps({"id": 2, "g": 0, "v": 6}), {}),
            RawRecord(0, 2, 1, key_of(3), b"{not json", {}),
        ]
        await proc.process(recs)
        await settle_loop()
        assert [(r.status, r.log_offset) for r in sender.replies()] == [("success", 0)]
        copies = [r for r in sender.records if r.topic == proc.applier.log_topic]
        assert [(r.key, r.headers.get(h.ORIGIN)) for r in copies] == [(key_of(2), "0:1")]
        assert [r.topic for r in sender.records if "dead" in r.topic] == [
            TopicNames("p").dead_letter
        ]
        assert ps.store.get(WATERMARK_KEY) is None  # ... while nothing is stored yet
        sender.acknowledge()
        await proc.drain()
        assert ps.store.get(WATERMARK_KEY) == b"2"

    asyncio.run(go())


def test_a_batch_whose_keyed_copy_kafka_refused_is_not_stored_and_is_applied_again() -> None:
    async def go() -> None:
        sender = RecordingSender(refuse=lambda topic: topic == "p.log.t")
        proc = TopicProcessor(compile_topic(TOPIC), TopicNames("p"), sender)
        ps = await proc.ready(0)
        assert proc.applier.log_topic == "p.log.t"
        await proc.process([RawRecord(0, 0, 1, None, orjson.dumps({"id": 2, "v": 6}), {})])
        await settle_loop()
        await settle_loop()
        assert ps.store.get(WATERMARK_KEY) is None
        assert proc.state(0) is None  # loaded again: the unkeyed publish is re-keyed again

    asyncio.run(go())
