"""Taking a partition on: loading or rebuilding its state, checking its log, reporting it."""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterable
from typing import Any

import orjson

from sowstream.config.models import TopicConfig
from sowstream.config.queues import QueueConfig
from sowstream.engine import memo, metrics
from sowstream.engine.aggregates import load_live_groups
from sowstream.engine.apply import Applier, queued
from sowstream.engine.partition import AppliedPublish, PartitionMoved, PartitionState
from sowstream.engine.ports import LogReader, Sender, wall_clock_ms
from sowstream.engine.queues import QueueRuntime
from sowstream.engine.store import (
    APPLIED_RECORD_KEY,
    RECORDS_START,
    WARNINGS_KEY,
    WATERMARK_KEY,
    commit,
    is_record_key,
)
from sowstream.engine.table import PartitionTable
from sowstream.errors import InvalidMessageError
from sowstream.queues.ledger import LedgerError, PartitionLedger, ack_chunk_prefix, ledger_key
from sowstream.queues.store import epoch_key, queue_prefix, start_key
from sowstream.sow.logcheck import add_warning, fingerprint, rebased, recreation, warning
from sowstream.sow.ops import RawRecord, parse_body
from sowstream.sow.record import SowRecord
from sowstream.subscriptions.journal import JOURNAL_PREFIX
from sowstream.subscriptions.matcher import TopicSubscriptions
from sowstream.subscriptions.model import LOG_RESET
from sowstream.wire import headers as h

log = logging.getLogger("sowstream.engine")


class Ownership:
    """The ownership stage: a partition's state made ready when the worker is assigned it, and
    forgotten when it is revoked."""

    def __init__(
        self,
        table: PartitionTable,
        sender: Sender,
        log_reader: LogReader | None,
        subs: TopicSubscriptions,
        queues: list[QueueRuntime],
        applier: Applier,
    ) -> None:
        """``log_reader`` rebuilds and checks partitions from the log (None: tests without
        Kafka); ``applier`` folds the log into a transient topic's partition as it loads."""
        self.topic: TopicConfig = table.topic
        self.compiled = table.compiled
        self._table = table
        self._sender = sender
        self._log_reader = log_reader
        self._subs = subs
        self._queues = queues
        self._applier = applier
        # A topic created on first use is younger than every queue reading it: its whole log
        # is after any queue's RecoveryPoint.
        self.created_on_first_use = False

    async def ready(self, partition: int) -> PartitionState:
        """The partition's state, loading it on first use after an assignment."""
        table = self._table
        ps = table.open(partition)
        if not ps.ready:
            async with ps.lock:
                if not ps.ready:
                    await self._load(partition, ps)
                    ps.folded = ps.watermark
                    if not table.holds(partition, ps):
                        # Revoked while loading: what the load handed the queues and the
                        # subscriptions is not this worker's (unless a newer load of the
                        # partition has started since: that one owns them now).
                        if table.get(partition) is None:
                            self._forget(partition)
                        return ps
                    ps.ready = True
        return ps

    async def drop(self, partitions: Iterable[int]) -> None:
        """Forget partitions taken away by a rebalance (their state stays in Kafka/RocksDB)."""
        for p in partitions:
            self._forget(p)
            ps = self._table.remove(p)
            if ps is not None:
                await ps.wake()  # queries waiting on it give up

    def _forget(self, partition: int) -> None:
        """Drop what the subscriptions and queues hold of ``partition``."""
        self._subs.drop_partition(partition)
        for queue in self._queues:
            queue.drop(self.topic.name, partition)

    async def caught_up(self, partition: int, offset: int) -> PartitionState:
        """The partition's state, loaded and, when its log already holds ``offset``, applied up
        to it. Raises PartitionMoved when the partition is revoked meanwhile, SowstreamError
        when the log is not applied that far in time.

        For queue acknowledgements: a worker taking a partition over reads its control topic
        and its log side by side, so an ack of a message can arrive before the message is
        loaded or read again from the log; applied then it would look like an ack sent ahead of
        its message (deferred), and swallow the message when it arrives."""
        ps = await self.ready(partition)
        if not self._table.holds(partition, ps):
            raise PartitionMoved
        # Fast path: a message delivered from this state was folded into it already.
        if (
            offset > ps.folded
            and self._log_reader is not None
            and offset <= await self._log_reader.end_offset(partition)
        ):
            await self._table.wait_applied(partition, ps, offset)
        return ps

    async def _load(self, partition: int, ps: PartitionState) -> None:
        if self.topic.sow:
            # Before the state: a transient topic's rebuild from the log keeps them current.
            await self._load_memo(partition, ps)
        await self._load_state(partition, ps)
        if self.topic.sow and self._subs:
            await load_live_groups(self._table, partition, ps, self._subs)
        for queue in self._queues:
            await self._load_queue(partition, ps, queue)

    async def _load_queue(self, partition: int, ps: PartitionState, queue: QueueRuntime) -> None:
        """Hand ``queue`` the partition: its ledger, the log's publishes from the ledger's
        low-water offset to the watermark, its stored copies and ack chunks. A queue that meets
        the partition for the first time resolves its RecoveryPoint to a log offset and stores
        it; its ledger starts there. A store of the older layout (a stored copy of every message,
        no ledger) holds every message up to the watermark: its ledger starts after it."""
        name = queue.name
        copies = ps.store.scan(prefix=queue_prefix(name))
        chunks = ps.store.scan(prefix=ack_chunk_prefix(name))
        key = start_key(name)
        raw_start, raw_ledger = ps.store.get(key), ps.store.get(ledger_key(name))
        epoch = ps.store.get(epoch_key(name))  # the last owner's: ours comes after it
        after = int(epoch) if epoch else 0
        changes: dict[bytes, bytes | None] = {}
        ledger: PartitionLedger | None = None
        if raw_ledger is not None:
            try:
                ledger = PartitionLedger.from_bytes(raw_ledger)
            except LedgerError as exc:
                # Read the log again from the queue's start: acknowledged messages come again
                # (at-least-once), none is lost.
                log.error(
                    "queue %s: %s partition %d: %s; reading the log from offset %s again",
                    name,
                    self.topic.name,
                    partition,
                    exc,
                    int(raw_start or 0),
                )
                ledger = PartitionLedger(int(raw_start or 0))
        elif raw_start is None and self._log_reader is not None:
            start = await self._queue_start(partition, queue.config)
            changes[key] = str(start).encode()
            ledger = PartitionLedger(start)
            log.info(
                "queue %s: takes %s partition %d from offset %d on (RecoveryPoint %s)",
                name,
                self.topic.name,
                partition,
                start,
                queue.config.recovery_point,
            )
        records: list[AppliedPublish] = []
        if ledger is not None and self._log_reader is not None and ledger.low <= ps.watermark:
            first = await self._log_reader.start_offset(partition)
            if first > ledger.low:
                queue.log_lost(self.topic.name, partition, ledger.low, first)
            async for batch in self._log_reader.batches(partition, ps.watermark, ledger.low):
                for rec in batch:
                    if rec.offset <= ps.watermark and not ledger.skips(rec.offset):
                        item = self._as_published(rec)
                        if item is not None:
                            records.append(item)
        changes.update(
            queue.load(
                self.topic.name,
                partition,
                copies,
                # A RecoveryPoint past the watermark: nothing before it enters the queue.
                ps.watermark if ledger is None else max(ps.watermark, ledger.low - 1),
                ledger=ledger,
                records=records,
                chunks=chunks,
                after=after,
            )
        )
        await commit(ps.store, changes, self._sender)

    async def _queue_start(self, partition: int, config: QueueConfig) -> int:
        """The first log offset a queue's RecoveryPoint lets in (epoch: the log's first)."""
        assert self._log_reader is not None
        if self.created_on_first_use:
            return await self._log_reader.start_offset(partition)
        if config.recovery_point == "now":
            return await self._log_reader.end_offset(partition) + 1
        at_ms = config.recovery_point_ms
        if at_ms is None:
            return await self._log_reader.start_offset(partition)
        return await self._log_reader.offset_for_time(partition, at_ms)

    def _as_published(self, rec: RawRecord) -> AppliedPublish | None:
        """A logged publish as a queue takes it when the queue starts behind the partition: the
        message as published (the log does not keep merged or enriched records); None for
        deletes and records that do not decode (they were dead-lettered when applied)."""
        command = rec.headers.get(h.COMMAND) or h.PUBLISH
        if rec.value is None or command not in h.PUBLISHES:
            return None
        try:
            body = parse_body(self.compiled, rec.value, delta=command == h.DELTA_PUBLISH)
            return queued(rec, rec.value, body, self.topic.name)
        except InvalidMessageError:
            return None

    async def _load_state(self, partition: int, ps: PartitionState) -> None:
        if not self.topic.sow:
            raw = ps.store.get(WATERMARK_KEY) if self._table.backed else None
            if raw is not None:
                ps.watermark = int(raw)  # a plain topic feeding queues goes on where it was
                await self._check_log(partition, ps)
            elif self._log_reader is not None and (
                not self._table.backed or self.topic.recovery_point == "now"
            ):
                # Nothing is stored, so nothing to rebuild: serve what is published from now on.
                ps.watermark = await self._log_reader.end_offset(partition)
            return
        raw = ps.store.get(WATERMARK_KEY)
        transient = self.topic.durability == "transient"
        if raw is not None and not transient:
            ps.watermark = int(raw)
            await self._check_log(partition, ps)
            self._subs.restore(partition, ps.store.scan(prefix=JOURNAL_PREFIX), wall_clock_ms())
        elif self._log_reader is not None:
            await self._recover(partition, ps, transient)
        if self._table.expires:
            for key, value in ps.store.scan():
                if is_record_key(key):
                    rec = SowRecord.from_bytes(value)
                    if rec.expiration is not None:
                        heapq.heappush(ps.expiry, (rec.expiration, key))

    async def _recover(self, partition: int, ps: PartitionState, transient: bool) -> None:
        """Start a partition that has no state: fold the log from the RecoveryPoint.

        Transient topics always come here; a persistent topic only when its state is new (or
        lost), where ``epoch`` is left to the normal consumer (it starts at the beginning), and
        ``now`` or a timestamp store the position just before the first record to apply, so
        records older than the point never enter the SOW.
        """
        assert self._log_reader is not None
        end = await self._log_reader.end_offset(partition)
        start = await self._recovery_start(partition, end)
        if transient:
            if start <= end:
                async for batch in self._log_reader.batches(partition, end, start):
                    self._applier.apply(ps, [r for r in batch if r.offset >= start], replay=True)
            ps.watermark = max(ps.watermark, end)
        elif start == 0:
            return
        else:
            ps.watermark = start - 1
            mark = {APPLIED_RECORD_KEY: None, WATERMARK_KEY: str(ps.watermark).encode()}
            await commit(ps.store, mark, self._sender)
        log.info(
            "topic %s partition %d recovered from the log (RecoveryPoint %s, from offset %d) "
            "up to offset %d",
            self.topic.name,
            partition,
            self.topic.recovery_point,
            start,
            ps.watermark,
        )

    async def _recovery_start(self, partition: int, end: int) -> int:
        """The first log offset the RecoveryPoint lets into the SOW (``end + 1``: none yet)."""
        assert self._log_reader is not None
        if self.topic.recovery_point == "now":
            return end + 1
        at_ms = self.topic.recovery_point_ms
        if at_ms is None:
            return 0
        return await self._log_reader.offset_for_time(partition, at_ms)

    async def verify_log(self, partition: int) -> bool:
        """Check the partition's log is still the one it applied (the pump saw signs it is not:
        its topic vanished or its offsets went back); True when it was found recreated.

        Raises what the log reader raises while the log topic does not exist again yet.
        """
        ps = self._table.get(partition)
        if ps is None or not ps.ready:
            return False
        async with ps.lock:
            if not self._table.holds(partition, ps):
                return False
            await self._table.settle(ps)
            return await self._check_log(partition, ps)

    async def _check_log(self, partition: int, ps: PartitionState) -> bool:
        """Compare the stored watermark with the log (under ps.lock, nothing in flight); if the
        log was deleted and made again, keep the SOW and apply the new log from its start."""
        if self._log_reader is None or ps.watermark < 0:
            return False
        end = await self._log_reader.end_offset(partition)
        stored = ps.store.get(APPLIED_RECORD_KEY)
        found = None
        if stored is not None and end >= ps.watermark:
            start = await self._log_reader.start_offset(partition)
            if start <= ps.watermark:
                async for batch in self._log_reader.batches(partition, ps.watermark, ps.watermark):
                    rec = next((r for r in batch if r.offset == ps.watermark), None)
                    if rec is not None:
                        found = fingerprint(rec.offset, rec.timestamp, rec.key)
                        break
        reason = recreation(ps.watermark, end, stored, found)
        if reason is None:
            return False
        await self._rebase(partition, ps, reason, end)
        return True

    async def _rebase(self, partition: int, ps: PartitionState, reason: str, end: int) -> None:
        """Follow AMPS for a SOW newer than its log: take no action on the SOW, say so (log,
        metric, ``sowstream status``), and apply the new log from its first record on."""
        assert self._log_reader is not None
        start = await self._log_reader.start_offset(partition)
        entry = warning(
            self.topic.name, partition, ps.watermark, start, end, reason, wall_clock_ms()
        )
        log.warning("%s", entry["message"])
        metrics.LOGS_RECREATED.labels(self.topic.name, str(partition)).inc()
        changes: dict[bytes, bytes | None] = {}
        if self.topic.sow:
            for key, value in ps.store.scan():
                if is_record_key(key):
                    changes[key] = rebased(SowRecord.from_bytes(value)).to_bytes()
        changes[WARNINGS_KEY] = orjson.dumps(add_warning(self.warnings(ps), entry))
        changes[APPLIED_RECORD_KEY] = None
        changes[WATERMARK_KEY] = str(start - 1).encode()
        await commit(ps.store, changes, self._sender)
        ps.watermark = ps.folded = start - 1
        # Subscribers drop messages at or below the last offset they saw: tell them the
        # partition's offsets start over, or the new log's first messages would look like repeats.
        reset = str(ps.watermark).encode()
        for spec in self._subs.specs():
            await self._sender.send_reply(
                spec.reply_to,
                b"",
                [
                    (h.COMMAND, LOG_RESET.encode()),
                    (h.SUB_ID, spec.sub_id.encode()),
                    (h.TOPIC, spec.topic.encode()),
                    (h.PARTITION, str(partition).encode()),
                    (h.OFFSET, reset),
                ],
            )

    @staticmethod
    def warnings(ps: PartitionState) -> list[dict[str, Any]]:
        """The partition's stored status warnings, oldest first."""
        raw = ps.store.get(WARNINGS_KEY)
        return list(orjson.loads(raw)) if raw else []

    async def partition_status(self, partition: int) -> dict[str, Any]:
        """What ``sowstream status`` shows for one partition (loading it if needed)."""
        ps = await self.ready(partition)
        return {
            "topic": self.topic.name,
            "partition": partition,
            "sow": self.topic.sow,
            "watermark": ps.watermark,
            "records": self.record_count(ps),
            "warnings": self.warnings(ps),
        }

    @staticmethod
    def record_count(ps: PartitionState) -> int:
        """The SOW records in the partition's store, counted by a key scan (on demand only)."""
        return sum(1 for key in ps.store.keys(RECORDS_START, None) if is_record_key(key))

    async def _load_memo(self, partition: int, ps: PartitionState) -> None:
        """Take over the memo indexes the store holds; rebuild partial ones, build configured
        ones that are missing (``Index``), so they are ready before the first query."""
        found = memo.load(ps.store)
        ps.memo = set(found.ready)
        for path in sorted(found.partial):
            if path in self.topic.indexes:
                await self._table.build_memo(partition, ps, path)
            else:
                # Built on demand and never finished (a crash, a lost assignment): drop it, the
                # next query that needs it builds it again.
                await self._table.drop_memo(partition, ps, path)
        for path in self.topic.indexes:
            if path not in ps.memo:
                await self._table.build_memo(partition, ps, path)
