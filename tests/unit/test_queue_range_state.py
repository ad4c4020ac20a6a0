"""A queue's state over a log partition is a ledger of ranges and its bodies are read from the
log: a worker taking a partition over (here, a second processor on the same store and log) holds
exactly the messages the first one had not finished with. Also: copies of merged records, the
older layout (a copy per message and ack markers), and what the log's retention may delete."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

import orjson
import pytest

from sowstream.config.loader import load_config_text
from sowstream.config.queues import QueueConfig
from sowstream.engine import metrics
from sowstream.engine.processor import TopicProcessor
from sowstream.engine.queues import AckAnswer, QueueRuntime
from sowstream.engine.store import WATERMARK_KEY, MemoryPartition
from sowstream.errors import InvalidCommandError
from sowstream.queues import Bookmark
from sowstream.queues.ledger import PartitionLedger, ack_chunk_prefix, ledger_key
from sowstream.queues.retention import LogRetention
from sowstream.queues.store import StoredMessage, ack_marker, entry_key, start_key
from sowstream.sow.compiled import compile_topic
from sowstream.sow.keys import generated_sow_key
from sowstream.sow.ops import RawRecord
from sowstream.wire import headers as h
from sowstream.wire.protocol import Command
from sowstream.wire.topics import TopicNames
from tests.support.log import ListLog
from tests.support.sender import RecordingSender

TOPIC = load_config_text("sow:\n  - Name: t\n    Key: /id\n    Durability: persistent\n").topics[0]
NAMES = TopicNames("p")


def publish(offset: int, i: int, command: str = h.PUBLISH, **body: object) -> RawRecord:
    """A publish of record ``i`` (-1: one without its key field, which the topic refuses)."""
    if i < 0:
        return RawRecord(0, offset, 1_000 + offset, None, orjson.dumps(body), {h.COMMAND: command})
    key = generated_sow_key("t", "t", ["/id"], {"id": i}).encode()
    value = orjson.dumps({"id": i, **body})
    return RawRecord(0, offset, 1_000 + offset, key, value, {h.COMMAND: command})


def ack(offsets: Iterable[int], client: str = "alice", action: str = "") -> Command:
    marks = ",".join(Bookmark("t", 0, o).text() for o in offsets)
    return Command(
        command="queue_ack",
        command_id="c",
        query_id="",
        reply_to=client,
        topic="WQ",
        options={"bookmarks": marks, "action": action},
    )


class Worker:
    """One owner of partition 0: a processor and its queue over a store and a log that
    outlive it (as RocksDB and Kafka outlive a worker)."""

    def __init__(self, store: MemoryPartition, log: ListLog, config: QueueConfig) -> None:
        sender = RecordingSender()
        self.proc = TopicProcessor(
            compile_topic(TOPIC), NAMES, sender, log_reader=log, new_store=lambda _p: store
        )
        self.queue = QueueRuntime(
            config, NAMES, sender, lambda _t, p, changes: self.proc.store_changes(p, changes)
        )
        self.proc.queues.append(self.queue)
        self.log = log

    async def start(self) -> Worker:
        await self.proc.ready(0)
        return self

    async def publish(self, *records: RawRecord) -> None:
        self.log.records.extend(records)
        await self.proc.process(list(records))
        await self.proc.drain()

    async def ack(self, command: Command) -> AckAnswer:
        (answer,) = await self.queue.acknowledge_all([(command, 0)], "t")
        assert isinstance(answer, AckAnswer)
        return answer

    def held(self) -> list[int]:
        return sorted(m.bookmark.offset for m in self.queue.machine.browse())

    def data(self, offset: int) -> bytes:
        message = self.queue.machine.message(Bookmark("t", 0, offset))
        assert message is not None
        return message.data


def queue_config(**settings: object) -> QueueConfig:
    return QueueConfig(name="WQ", underlying_topic="t", **settings)  # type: ignore[arg-type]


def test_a_new_owner_reads_the_bodies_from_the_log_and_skips_what_was_finished() -> None:
    async def go() -> None:
        store, log = MemoryPartition(), ListLog()
        first = await Worker(store, log, queue_config()).start()
        await first.publish(*(publish(o, o, n=o) for o in range(6)))
        assert (await first.ack(ack([1, 3]))).done == 2
        assert (await first.ack(ack([4], action="expire"))).results == {"expired": 1}
        assert first.held() == [0, 2, 5]
        # Nothing per message is stored: the ledger and one ack chunk.
        assert not list(store.scan(prefix=entry_key("WQ", 0)[:-8]))
        assert len(list(store.scan(prefix=ack_chunk_prefix("WQ")))) == 1
        ledger = PartitionLedger.from_bytes(store.get(ledger_key("WQ")) or b"")
        assert ledger.low == 0 and [ledger.skips(o) for o in range(6)] == [
            False, True, False, True, True, False,
        ]  # fmt: skip

        second = await Worker(store, log, queue_config()).start()
        assert second.held() == [0, 2, 5]
        assert second.data(2) == orjson.dumps({"id": 2, "n": 2})
        repeat = await second.ack(ack([1]))  # the first answer was lost: a retry
        assert repeat.results == {"acked": 1} and repeat.done == 1
        other = await second.ack(ack([3], client="bob"))  # sublet leasing: anyone's ack counts
        assert other.results == {"acked": 1}
        await second.ack(ack([0, 2]))
        # Finished up to 5: the low-water offset moves past them, the log is read from there.
        assert PartitionLedger.from_bytes(store.get(ledger_key("WQ")) or b"").low == 5
        third = await Worker(store, log, queue_config()).start()
        assert third.held() == [5]

    asyncio.run(go())


def test_under_strict_leasing_only_the_same_clients_repeat_counts() -> None:
    async def go() -> None:
        store, log = MemoryPartition(), ListLog()
        first = await Worker(store, log, queue_config(leasing="strict")).start()
        await first.publish(publish(0, 0))
        await first.ack(ack([0], client="alice"))
        second = await Worker(store, log, queue_config(leasing="strict")).start()
        assert (await second.ack(ack([0], client="bob"))).done == 0
        assert (await second.ack(ack([0], client="alice"))).results == {"acked": 1}

    asyncio.run(go())


def test_a_merged_record_is_stored_as_a_copy_and_deleted_with_its_message() -> None:
    """A delta_publish is queued merged, which the log does not hold: a copy is stored."""

    async def go() -> None:
        store, log = MemoryPartition(), ListLog()
        first = await Worker(store, log, queue_config()).start()
        await first.publish(publish(0, 1, a=1), publish(1, 1, h.DELTA_PUBLISH, b=2))
        merged = first.data(1)
        assert orjson.loads(merged) == {"id": 1, "a": 1, "b": 2}
        copy = store.get(entry_key("WQ", 1))
        assert copy is not None and StoredMessage.from_bytes(copy).data == merged
        assert store.get(entry_key("WQ", 0)) is None  # the plain publish: read from the log

        second = await Worker(store, log, queue_config()).start()
        assert second.held() == [0, 1] and second.data(1) == merged
        await second.ack(ack([1]))
        assert store.get(entry_key("WQ", 1)) is None
        third = await Worker(store, log, queue_config()).start()
        assert third.held() == [0]

    asyncio.run(go())


def test_what_the_queue_never_took_is_not_offered_by_a_reload() -> None:
    """A publish the topic refused (no key: a dead letter) and one acknowledged before it
    arrived passed the reload's own reading of the log; the ledger says to skip them."""

    async def go() -> None:
        store, log = MemoryPartition(), ListLog()
        first = await Worker(store, log, queue_config()).start()
        await first.publish(publish(0, 0))
        assert (await first.ack(ack([2]))).results == {"deferred": 1}
        await first.publish(publish(1, -1, n=1), publish(2, 2), publish(3, 3))
        assert first.held() == [0, 3]
        second = await Worker(store, log, queue_config()).start()
        assert second.held() == [0, 3]

    asyncio.run(go())


def test_a_store_of_the_older_layout_is_read_and_carried_on() -> None:
    """The older layout: a copy of every message not yet removed, an ack marker for each recent
    acknowledgement, the queue's start offset, no ledger."""

    async def go() -> None:
        store, log = MemoryPartition(), ListLog()
        log.records.extend(publish(o, o) for o in range(4))
        now = int(time.time() * 1000)
        store.write(
            {
                WATERMARK_KEY: b"3",
                start_key("WQ"): b"0",
                entry_key("WQ", 0): StoredMessage(b'{"id":0,"old":1}', 1_000, None).to_bytes(),
                entry_key("WQ", 1): ack_marker("alice", now),
                entry_key("WQ", 2): StoredMessage(b'{"id":2}', 1_002, None).to_bytes(),
                # 3 was acknowledged long ago: its marker is gone, and so is the message.
            }
        )
        worker = await Worker(store, log, queue_config()).start()
        assert worker.held() == [0, 2]
        assert worker.data(0) == b'{"id":0,"old":1}'  # the stored copy, not the log's record
        assert (await worker.ack(ack([1]))).results == {"acked": 1}  # the marker's memory
        assert PartitionLedger.from_bytes(store.get(ledger_key("WQ")) or b"").low == 4
        await worker.publish(publish(4, 4))
        await worker.ack(ack([0]))
        assert store.get(entry_key("WQ", 0)) is None
        await worker.queue.sweep_acks(now + 10**9, force=True)
        assert store.get(entry_key("WQ", 1)) is None  # the old marker ages out like a chunk

        again = await Worker(store, log, queue_config()).start()
        assert again.held() == [2, 4]

    asyncio.run(go())


def test_a_log_that_lost_unfinished_records_is_reported_naming_the_queue(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def go() -> None:
        store, log = MemoryPartition(), ListLog()
        first = await Worker(store, log, queue_config()).start()
        await first.publish(*(publish(o, o) for o in range(5)))
        await first.ack(ack([0]))
        log.first = 3  # retention deleted offsets 0 to 2
        lost = metrics.QUEUE_LOST.labels("WQ")._value.get()
        with caplog.at_level(logging.ERROR, "sowstream.engine.queues"):
            second = await Worker(store, log, queue_config()).start()
        assert second.held() == [3, 4]  # what the log still holds is not lost with it
        assert "queue WQ: t partition 0: the log no longer holds offsets 1 to 2" in caplog.text
        assert metrics.QUEUE_LOST.labels("WQ")._value.get() == lost + 2

    asyncio.run(go())


def test_a_damaged_ledger_reads_the_log_again_from_the_queues_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """At-least-once: the acknowledged messages come again, none is lost."""

    async def go() -> None:
        store, log = MemoryPartition(), ListLog()
        first = await Worker(store, log, queue_config()).start()
        await first.publish(*(publish(o, o) for o in range(3)))
        await first.ack(ack([0, 1]))
        store.write({ledger_key("WQ"): b'{"v": 1, "low": "x"}'})
        with caplog.at_level(logging.ERROR):
            second = await Worker(store, log, queue_config()).start()
        assert second.held() == [0, 1, 2]
        assert "queue WQ: t partition 0: queue ledger: low-water offset 'x'" in caplog.text

    asyncio.run(go())


def test_a_message_close_to_its_logs_retention_raises_the_alarm(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def go() -> None:
        store, log = MemoryPartition(), ListLog()
        worker = await Worker(store, log, queue_config()).start()
        await worker.publish(publish(0, 0))  # logged at 1,000 ms
        queue = worker.queue
        queue.retention["t"] = LogRetention("p.log.t", 10_000)
        gauge = metrics.QUEUE_RETENTION_ALARM.labels("WQ")
        assert not queue.check_retention(8_999) and gauge._value.get() == 0
        with caplog.at_level(logging.ERROR):
            assert queue.check_retention(9_000) and gauge._value.get() == 1
        assert "queue WQ: a message of t partition 0 is 8 s old, and the log p.log.t" in (
            caplog.text
        )
        await worker.ack(ack([0]))
        assert not queue.check_retention(10**9) and gauge._value.get() == 0

    asyncio.run(go())


def test_a_malformed_acknowledgement_stores_nothing() -> None:
    async def go() -> None:
        store, log = MemoryPartition(), ListLog()
        worker = await Worker(store, log, queue_config()).start()
        await worker.publish(publish(0, 0))
        before = store.get(ledger_key("WQ"))
        bad = ack([0])
        bad.options["bookmarks"] = "t|zero|0"
        (answer,) = await worker.queue.acknowledge_all([(bad, 0)], "t")
        assert isinstance(answer, InvalidCommandError) and "t|zero|0" in str(answer)
        assert store.get(ledger_key("WQ")) == before and worker.held() == [0]

    asyncio.run(go())


def test_a_damaged_ack_chunk_is_reported_and_deleted(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        store, log = MemoryPartition(), ListLog()
        first = await Worker(store, log, queue_config()).start()
        await first.publish(publish(0, 0), publish(1, 1))
        await first.ack(ack([0]))
        ((key, _),) = store.scan(prefix=ack_chunk_prefix("WQ"))
        store.write({key: b"{broken"})
        with caplog.at_level(logging.ERROR):
            second = await Worker(store, log, queue_config()).start()
        assert "queue WQ: t partition 0: queue ack chunk is not JSON" in caplog.text
        assert store.get(key) is None and second.held() == [1]

    asyncio.run(go())
