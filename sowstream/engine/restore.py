"""Refill partition stores from their changelogs in bulk, before faust's own table recovery.

faust restores a table one changelog record at a time through its consumer, its event objects and
its recovery loop: about 7k records/s here, so a worker that lost the RocksDB of a large SOW was
down for minutes (docs/benchmarks.md). Before faust reads the changelog partitions it was just
assigned, :class:`BatchedRecovery` copies every changelog partition that is far behind (store
missing or old) with a confluent-kafka consumer into RocksDB ``WriteBatch``es, and hands faust
the offset it reached, so faust's recovery only reads what is left (usually nothing).

The copy is exactly what faust's recovery would write: the changelog records in offset order,
puts and tombstones, into the same partition database, and faust's own changelog offset key
(``FAUST_OFFSET_KEY``). Each batch carries that offset in the same atomic write, so a worker
killed mid-restore holds a prefix of the changelog that knows its own end, and faust (or the next
copy) goes on from there. faust keeps the assignment, the seek, the standby logic and the
offsets; the copy stops when a new rebalance starts.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from faust.stores.rocksdb import Store as RocksStore
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.types import TP
from faust.types.transports import ConsumerT
from rocksdict import WriteBatch

from sowstream.errors import StateStoreError
from sowstream.sow.layout import FAUST_OFFSET_KEY

log = logging.getLogger("sowstream.engine")

# Below this many records behind, faust's own recovery is as quick as starting a consumer.
BATCHED_MIN_RECORDS = 1_000
CONSUME_MAX = 10_000  # records taken from the consumer (and written as one batch) at a time
POLL_SECONDS = 0.5


class RestoreStalledError(StateStoreError):
    """The changelog stopped delivering records before the copy reached its end."""


@dataclass
class PartitionCopy:
    """One changelog partition to copy: into ``db``, offsets ``start``..``end`` (inclusive).

    ``last`` is the last offset stored so far (with faust's offset key), ``records`` how many
    records were written.
    """

    partition: int
    db: Any
    start: int
    end: int
    last: int = field(init=False)
    records: int = 0

    def __post_init__(self) -> None:
        self.last = self.start - 1


def copy_changelog(
    config: Mapping[str, str],
    topic: str,
    copies: Mapping[int, PartitionCopy],
    stop: threading.Event,
    stall_seconds: float,
) -> None:
    """Copy each partition of changelog ``topic`` in ``copies`` into its database (blocking).

    Returns when every partition reached its ``end`` or ``stop`` is set; raises
    RestoreStalledError when no record arrives for ``stall_seconds`` before that, and
    StateStoreError when RocksDB refuses a write. Whatever was written stays: each batch is a
    prefix of the changelog with its offset.
    """
    consumer = Consumer(
        {
            # Never commits: positions come from faust's offsets in the stores.
            "group.id": f"sowstream-restore-{topic}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            # faust reads changelogs uncommitted unless it runs exactly-once, which we do not.
            "isolation.level": "read_uncommitted",
            # A start offset gone from the log must fail the copy, never skip records.
            "auto.offset.reset": "error",
            "max.partition.fetch.bytes": 8 * 1024 * 1024,
            "log_level": 4,
            **config,
        }
    )
    todo = {p for p, c in copies.items() if c.end >= c.start}
    try:
        consumer.assign([TopicPartition(topic, p, copies[p].start) for p in sorted(todo)])
        heard = time.monotonic()
        while todo and not stop.is_set():
            # consume(n, timeout) waits for n records or the whole timeout: the last records of
            # a changelog would wait it out. Wait for one, then take what is already fetched.
            first = consumer.poll(POLL_SECONDS)
            if first is None:
                if time.monotonic() - heard > stall_seconds:
                    behind = {p: copies[p].end - copies[p].last for p in sorted(todo)}
                    raise RestoreStalledError(
                        f"changelog {topic}: no record for {stall_seconds:.0f} s with "
                        f"partitions {behind} (partition: records) still to copy"
                    )
                continue
            heard = time.monotonic()
            _store_chunk(topic, [first, *consumer.consume(CONSUME_MAX - 1, 0)], copies, todo)
    finally:
        consumer.close()


def _store_chunk(
    topic: str, msgs: list[Any], copies: Mapping[int, PartitionCopy], todo: set[int]
) -> None:
    """Write one consumed chunk: one WriteBatch per partition, ending with faust's offset."""
    batches: dict[int, tuple[WriteBatch, int, int]] = {}  # partition: (batch, last, records)
    for msg in msgs:
        p = msg.partition()
        if p not in todo:
            continue
        copy = copies[p]
        err = msg.error()
        if err is not None:
            if err.code() != KafkaError._PARTITION_EOF:
                raise KafkaException(err)
            # At the end of the log: any offsets up to ``end`` not delivered are not records
            # (transaction markers), and faust must not wait for them.
            if msg.offset() > copy.end:
                batch, _, n = batches.get(p) or (WriteBatch(raw_mode=True), copy.last, 0)
                batches[p] = (batch, copy.end, n)
                todo.discard(p)
            continue
        offset = msg.offset()
        if offset > copy.end:
            todo.discard(p)
            continue
        batch, _, n = batches.get(p) or (WriteBatch(raw_mode=True), copy.last, 0)
        value = msg.value()  # keys are never None: a compacted topic refuses such records
        if value is None:
            batch.delete(msg.key())
        else:
            batch.put(msg.key(), value)
        batches[p] = (batch, offset, n + 1)
        if offset >= copy.end:
            todo.discard(p)
    for p, (batch, last, n) in batches.items():
        copy = copies[p]
        if last <= copy.last:
            continue
        batch.put(FAUST_OFFSET_KEY, str(last).encode())
        try:
            copy.db.write(batch)
        except Exception as exc:  # rocksdict raises bare Exception
            raise StateStoreError(
                f"changelog {topic} partition {p}: RocksDB write failed: {exc}"
            ) from exc
        copy.last = last
        copy.records += n


class BatchedRecovery(Recovery):
    """faust's Recovery, which first copies far-behind active changelog partitions in bulk."""

    def __init__(
        self, app: Any, tables: Any, *, client_config: Mapping[str, str], **kwargs: Any
    ) -> None:
        super().__init__(app, tables, **kwargs)
        self._client_config = dict(client_config)
        # A copy cut short by a rebalance finishes its current batch in its thread; the next
        # copy waits for it, so two never write one database.
        self._copying: asyncio.Future[None] | None = None
        self.copies: dict[str, dict[int, PartitionCopy]] = {}  # the copy running now, by topic

    async def _wait(self, coro: Any, timeout: Any = None) -> None:
        # faust bounds each recovery step by the request timeout and takes a step that runs out
        # of it for a stopped service (its recovery would end for good). The copy's length grows
        # with the store; it watches for stalls itself (copy_changelog) and a rebalance still
        # interrupts it.
        if getattr(coro, "cr_code", None) is _BUILD_OFFSETS:
            timeout = None
        await super()._wait(coro, timeout=timeout)

    async def _build_offsets(
        self, consumer: ConsumerT, tps: set[TP], destination: Any, title: str
    ) -> None:
        if title == "active" and self._copying is not None and not self._copying.done():
            await asyncio.shield(self._copying)
            for tp in tps:  # what the interrupted copy stored meanwhile
                table = self.tp_to_table.get(tp)
                persisted = table.persisted_offset(tp) if table is not None else None
                if persisted is not None and (
                    destination[tp] is None or destination[tp] < persisted
                ):
                    destination[tp] = persisted
        await super()._build_offsets(consumer, tps, destination, title)
        if title == "active":
            await self._copy_behind(tps, destination)

    async def _copy_behind(self, tps: set[TP], destination: Any) -> None:
        """Copy every active partition far behind its changelog's end; tell faust the offsets."""
        plans: dict[str, dict[int, PartitionCopy]] = {}
        for tp in sorted(tps):
            store = getattr(self.tp_to_table.get(tp), "data", None)
            if not isinstance(store, RocksStore) or not store.use_rocksdict:
                continue
            end = self.active_highwaters.get(tp)
            have = destination[tp] if destination[tp] is not None else -1
            if end is None or end - have < BATCHED_MIN_RECORDS:
                continue
            try:
                db = store._db_for_partition(tp.partition)
            except Exception as exc:  # rocksdict raises bare Exception (e.g. lock held)
                log.warning("batched restore skips %s: %s; faust restores it", tp, exc)
                continue
            plans.setdefault(tp.topic, {})[tp.partition] = PartitionCopy(
                tp.partition, db, have + 1, end
            )
        if not plans:
            return
        stop = threading.Event()
        loop = asyncio.get_running_loop()
        stall = float(self.app.conf.broker_request_timeout)
        started = time.perf_counter()
        work = asyncio.gather(
            *(
                loop.run_in_executor(
                    None, copy_changelog, self._client_config, topic, copies, stop, stall
                )
                for topic, copies in plans.items()
            ),
            return_exceptions=True,
        )
        self._copying = cast("asyncio.Future[None]", work)
        self.copies = plans
        try:
            outcomes = await asyncio.shield(work)
        except asyncio.CancelledError:
            stop.set()  # a new rebalance: faust starts over, from what was stored
            raise
        finally:
            self.copies = {}
        elapsed = time.perf_counter() - started
        records = 0
        for (topic, copies), outcome in zip(plans.items(), outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning(
                    "batched restore of %s stopped (%s); faust restores the rest", topic, outcome
                )
            for p, c in copies.items():
                records += c.records
                if c.last >= c.start:
                    destination[TP(topic, p)] = c.last
        log.info(
            "restored %d changelog records of %d partitions in %.2f s (%s)",
            records,
            sum(len(c) for c in plans.values()),
            elapsed,
            ", ".join(sorted(plans)),
        )


_BUILD_OFFSETS = BatchedRecovery._build_offsets.__code__


def restore_progress(app: Any) -> list[dict[str, Any]]:
    """The changelog partitions this worker is restoring now: the last offset restored (by
    faust or by a batched copy) and the changelog's end (``sowstream status``)."""
    if not app.in_recovery:
        return []
    recovery = app.tables.recovery
    copies: dict[str, dict[int, PartitionCopy]] = getattr(recovery, "copies", {})
    rows = []
    for tp, end in sorted(recovery.active_highwaters.items()):
        done = recovery.active_offsets.get(tp)
        copy = copies.get(tp.topic, {}).get(tp.partition)
        if copy is not None and (done is None or copy.last > done):
            done = copy.last
        rows.append(
            {
                "changelog": tp.topic,
                "partition": tp.partition,
                "offset": -1 if done is None else int(done),
                "end": int(end),
            }
        )
    return rows


def batched_table_manager(client_config: Mapping[str, str]) -> type[TableManager]:
    """A faust TableManager whose recovery is :class:`BatchedRecovery` (``client_config``:
    the confluent-kafka settings of the copy: bootstrap servers and security)."""
    settings = dict(client_config)

    class BatchedTableManager(TableManager):
        @property
        def recovery(self) -> Recovery:
            if self._recovery is None:
                self._recovery = BatchedRecovery(
                    self.app, self, client_config=settings, beacon=self.beacon, loop=self.loop
                )
            return self._recovery

    return BatchedTableManager
