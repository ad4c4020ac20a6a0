"""The batched changelog restore (sowstream.engine.restore, and the recovery step around it in
sowstream.engine.runtime_restore) on a real broker and real RocksDB.

The copy itself: records, tombstones and faust's offset land as faust would write them, from any
start offset, and every way it can stop leaves a store that knows how far it got. Then the
recovery step around it: which partitions it copies and what it tells faust. The whole engine,
restored both ways from the same changelog, is compared in test_restore_engine.py.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import faust
import pytest
from confluent_kafka import KafkaException, Producer
from faust.types import TP
from rocksdict import Options, Rdict

from sowstream.engine.restore import (
    BATCHED_MIN_RECORDS,
    PartitionCopy,
    RestoreStalledError,
    copy_changelog,
)
from sowstream.engine.runtime_restore import BatchedRecovery
from sowstream.errors import StateStoreError
from sowstream.sow.layout import FAUST_OFFSET_KEY
from sowstream.wire.kafka import TopicSpec, ensure_topics

pytestmark = pytest.mark.integration

Entries = list[tuple[bytes, bytes | None]]


def produce(bootstrap: str, topic: str, partition: int, entries: Entries) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    failed: list[Any] = []
    for key, value in entries:
        producer.produce(
            topic, value, key=key, partition=partition, on_delivery=lambda e, _: failed.append(e)
        )
    assert producer.flush(30) == 0
    assert not [e for e in failed if e is not None]


def fold(entries: Entries) -> dict[bytes, bytes]:
    """What faust's record-at-a-time restore makes of ``entries``."""
    state: dict[bytes, bytes] = {}
    for key, value in entries:
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


def content(db: Rdict) -> dict[bytes, bytes]:
    return {k: v for k, v in db.items() if k != FAUST_OFFSET_KEY}


def entries_for(n: int, salt: str) -> Entries:
    """Puts, overwrites and tombstones over a few keys, as a store's changelog holds them."""
    out: Entries = []
    for i in range(n):
        key = f"k{i % 37:03d}".encode()
        out.append((key, None) if i % 11 == 0 else (key, f"{salt}{i}".encode()))
    return out


@pytest.fixture
def changelog(kafka_bootstrap: str) -> str:
    topic = f"restore-{uuid.uuid4().hex[:8]}-changelog"
    ensure_topics(kafka_bootstrap, [TopicSpec(topic, 2, {"cleanup.policy": "compact"})])
    return topic


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Rdict]:
    store = Rdict(str(tmp_path / "p.db"), Options(raw_mode=True))
    yield store
    store.close()


def test_copy_writes_records_tombstones_and_faust_offset(
    kafka_bootstrap: str, changelog: str, db: Rdict, tmp_path: Path
) -> None:
    zero = entries_for(500, "a")
    one = entries_for(30, "b")
    produce(kafka_bootstrap, changelog, 0, zero)
    produce(kafka_bootstrap, changelog, 1, one)
    other = Rdict(str(tmp_path / "p1.db"), Options(raw_mode=True))
    copies = {
        0: PartitionCopy(0, db, 0, len(zero) - 1),
        1: PartitionCopy(1, other, 0, len(one) - 1),
    }
    copy_changelog({"bootstrap.servers": kafka_bootstrap}, changelog, copies, threading.Event(), 30)
    assert content(db) == fold(zero)
    assert db[FAUST_OFFSET_KEY] == str(len(zero) - 1).encode()
    assert (copies[0].last, copies[0].records) == (len(zero) - 1, len(zero))
    assert content(other) == fold(one)
    assert other[FAUST_OFFSET_KEY] == str(len(one) - 1).encode()
    other.close()


def test_copy_from_a_stored_offset_continues_a_partial_store(
    kafka_bootstrap: str, changelog: str, db: Rdict
) -> None:
    entries = entries_for(400, "c")
    produce(kafka_bootstrap, changelog, 0, entries)
    config = {"bootstrap.servers": kafka_bootstrap}
    # a store that holds the first 150 records (a worker stopped there) ...
    copy_changelog(config, changelog, {0: PartitionCopy(0, db, 0, 149)}, threading.Event(), 30)
    assert content(db) == fold(entries[:150])
    assert db[FAUST_OFFSET_KEY] == b"149"
    # ... goes on from the record after its offset, and ends as a copy of the whole changelog
    copy_changelog(config, changelog, {0: PartitionCopy(0, db, 150, 399)}, threading.Event(), 30)
    assert content(db) == fold(entries)
    assert db[FAUST_OFFSET_KEY] == b"399"


def test_copy_that_stops_receiving_records_fails_and_keeps_its_progress(
    kafka_bootstrap: str, changelog: str, db: Rdict
) -> None:
    entries = entries_for(100, "d")
    produce(kafka_bootstrap, changelog, 0, entries)
    # faust's highwater said 150 records, the changelog holds 100: the copy cannot finish
    copy = PartitionCopy(0, db, 0, 149)
    with pytest.raises(RestoreStalledError, match=rf"changelog {changelog}: no record for 1 s"):
        copy_changelog(
            {"bootstrap.servers": kafka_bootstrap}, changelog, {0: copy}, threading.Event(), 1
        )
    assert content(db) == fold(entries)
    assert db[FAUST_OFFSET_KEY] == b"99"  # faust goes on from there
    assert copy.last == 99


def test_copy_from_an_offset_the_log_does_not_have_fails_instead_of_skipping(
    kafka_bootstrap: str, changelog: str, db: Rdict
) -> None:
    produce(kafka_bootstrap, changelog, 0, entries_for(20, "e"))
    copy = PartitionCopy(0, db, 500, 600)
    with pytest.raises(KafkaException):
        copy_changelog(
            {"bootstrap.servers": kafka_bootstrap}, changelog, {0: copy}, threading.Event(), 30
        )
    assert content(db) == {} and FAUST_OFFSET_KEY not in db


def test_copy_into_a_database_that_refuses_writes_names_the_partition(
    kafka_bootstrap: str, changelog: str, tmp_path: Path
) -> None:
    produce(kafka_bootstrap, changelog, 1, entries_for(20, "f"))
    closed = Rdict(str(tmp_path / "closed.db"), Options(raw_mode=True))
    closed.close()
    with pytest.raises(StateStoreError, match=rf"changelog {changelog} partition 1: RocksDB"):
        copy_changelog(
            {"bootstrap.servers": kafka_bootstrap},
            changelog,
            {1: PartitionCopy(1, closed, 0, 19)},
            threading.Event(),
            30,
        )


def test_a_stopped_copy_returns_at_once(kafka_bootstrap: str, changelog: str, db: Rdict) -> None:
    produce(kafka_bootstrap, changelog, 0, entries_for(50, "g"))
    stop = threading.Event()
    stop.set()
    copy = PartitionCopy(0, db, 0, 49)
    copy_changelog({"bootstrap.servers": kafka_bootstrap}, changelog, {0: copy}, stop, 30)
    assert copy.last == -1 and FAUST_OFFSET_KEY not in db


class Recovering:
    """A real faust app with one RocksDB table over ``changelog`` and our Recovery for it."""

    def __init__(self, bootstrap: str, changelog: str, datadir: Path) -> None:
        self.app = faust.App(
            f"restore-{uuid.uuid4().hex[:6]}",
            broker=f"kafka://{bootstrap}",
            store="rocksdb://",
            datadir=str(datadir),
        )
        self.table = self.app.Table("t", partitions=2, key_type=bytes, value_type=bytes)
        self.recovery = BatchedRecovery(
            self.app, self.app.tables, client_config={"bootstrap.servers": bootstrap}
        )
        self.tps = {TP(changelog, 0), TP(changelog, 1)}
        for tp in self.tps:
            self.recovery.tp_to_table[tp] = self.table

    def db(self, partition: int) -> Any:
        return self.table.data._db_for_partition(partition)

    def copy(self, highwaters: dict[int, int], offsets: dict[int, int]) -> dict[TP, int]:
        """Run the copy step for these highwaters and starting offsets (faust's -1 logic)."""
        destination = {tp: offsets[tp.partition] for tp in self.tps}
        for tp in self.tps:
            self.recovery.active_highwaters[tp] = highwaters[tp.partition]
        asyncio.run(self.recovery._copy_behind(self.tps, destination))
        return {tp: destination[tp] for tp in self.tps}


def test_recovery_copies_far_behind_partitions_and_leaves_short_tails_to_faust(
    kafka_bootstrap: str, changelog: str, tmp_path: Path
) -> None:
    far = entries_for(BATCHED_MIN_RECORDS + 200, "h")
    near = entries_for(BATCHED_MIN_RECORDS - 1, "i")
    produce(kafka_bootstrap, changelog, 0, far)
    produce(kafka_bootstrap, changelog, 1, near)
    rec = Recovering(kafka_bootstrap, changelog, tmp_path)
    got = rec.copy({0: len(far) - 1, 1: len(near) - 1}, {0: -1, 1: -1})
    assert got == {TP(changelog, 0): len(far) - 1, TP(changelog, 1): -1}
    assert {k: v for k, v in rec.db(0).items() if k != FAUST_OFFSET_KEY} == fold(far)
    assert rec.table.data.persisted_offset(TP(changelog, 0)) == len(far) - 1
    assert rec.table.data.persisted_offset(TP(changelog, 1)) is None  # faust reads these
    # behind by a lot again from a persisted offset: only the tail is copied
    more = entries_for(BATCHED_MIN_RECORDS + 5, "j")
    produce(kafka_bootstrap, changelog, 0, more)
    end = len(far) + len(more) - 1
    got = rec.copy({0: end, 1: len(near) - 1}, {0: len(far) - 1, 1: -1})
    assert got[TP(changelog, 0)] == end
    assert {k: v for k, v in rec.db(0).items() if k != FAUST_OFFSET_KEY} == fold(far + more)


def test_recovery_hands_a_failed_copy_to_faust_from_where_it_stopped(
    kafka_bootstrap: str, changelog: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entries = entries_for(BATCHED_MIN_RECORDS + 10, "k")
    produce(kafka_bootstrap, changelog, 0, entries)
    rec = Recovering(kafka_bootstrap, changelog, tmp_path)
    rec.app.conf.broker_request_timeout = 1.0  # the stall limit of the copy
    # faust's highwater is ahead of what the changelog delivers: the copy stalls at its end
    with caplog.at_level(logging.INFO, logger="sowstream.engine"):
        got = rec.copy({0: len(entries) + 100, 1: -1}, {0: -1, 1: -1})
    assert got[TP(changelog, 0)] == len(entries) - 1  # faust goes on from here
    assert rec.table.data.persisted_offset(TP(changelog, 0)) == len(entries) - 1
    assert f"batched restore of {changelog} stopped" in caplog.text
    assert "faust restores the rest" in caplog.text


def test_recovery_leaves_a_partition_whose_database_will_not_open_to_faust(
    kafka_bootstrap: str, changelog: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entries = entries_for(BATCHED_MIN_RECORDS + 10, "m")
    produce(kafka_bootstrap, changelog, 0, entries)
    rec = Recovering(kafka_bootstrap, changelog, tmp_path)
    path = rec.table.data.partition_path(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = Rdict(str(path), Options(raw_mode=True))  # RocksDB's lock: faust cannot open it
    try:
        with caplog.at_level(logging.INFO, logger="sowstream.engine"):
            got = rec.copy({0: len(entries) - 1, 1: -1}, {0: -1, 1: -1})
    finally:
        holder.close()
    assert got[TP(changelog, 0)] == -1  # faust restores it (and reports the lock itself)
    assert f"batched restore skips TP(topic='{changelog}', partition=0)" in caplog.text
