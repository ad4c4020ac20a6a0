"""The input side of views and conflated topics without a broker: where the input pump reads
each partition from, and view records written per log partition in Kafka batches."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import orjson
from confluent_kafka import murmur2

from sowstream.engine.derived import write_records
from sowstream.engine.inputs import InputPump
from sowstream.messagetypes import get
from sowstream.sow.ops import RawRecord
from sowstream.wire import headers as h
from tests.support.router import Held
from tests.support.sender import RecordingSender


class Runner:
    """A runner with the partitions it holds and where each stands (None: not loaded)."""

    def __init__(self, held: list[int], at: dict[int, int | None]) -> None:
        self.held = held
        self.at = at
        self.handled: list[RawRecord] = []

    def assigned(self) -> list[int]:
        return self.held

    def position(self, partition: int) -> int | None:
        return self.at.get(partition)

    async def handle(self, records: Sequence[RawRecord]) -> None:
        self.handled.extend(records)


def test_the_pump_reads_owned_loaded_partitions_from_the_runners_positions() -> None:
    runner = Runner([0, 1, 2], {0: 5, 1: None, 2: 0, 3: 9})
    held = Held({("in", 0), ("in", 1), ("in", 2), ("in", 3), ("other", 0)})
    pump = InputPump(runner, "in", held, {})
    # 1 is not loaded yet (its runner catches up itself first); 3 is the group's but not the
    # runner's (revoked or not yet handed over): neither is read.
    assert pump.positions() == {0: 5, 2: 0}


def test_the_pump_reads_nothing_while_ownership_is_moving() -> None:
    runner = Runner([0], {0: 5})
    pump = InputPump(runner, "in", Held({("in", 0)}, settled=False), {})
    assert pump.positions() == {}


def test_view_records_go_out_per_log_partition_in_key_order_with_their_headers() -> None:
    sender = RecordingSender()
    records = [(f"k{i}", {"i": i}) for i in range(20)] + [("k3", None)]
    header = (h.VIEW, b"V")
    asyncio.run(write_records(sender, "log", header, get("json"), records, partitions=4))
    assert len(sender.records) == len(records)
    for sent in sender.records:
        assert sent.partition == murmur2(sent.key or b"", 4)
        assert sent.headers[h.VIEW] == "V"
    by_key = [(r.key, r.value) for r in sender.records if r.key == b"k3"]
    # Within a partition the order is kept: the delete comes after the publish.
    assert by_key == [(b"k3", orjson.dumps({"i": 3})), (b"k3", None)]
    deleted = [r for r in sender.records if r.value is None]
    assert deleted[0].headers[h.COMMAND] == h.SOW_DELETE
    assert {r.partition for r in sender.records} == {0, 1, 2, 3}
