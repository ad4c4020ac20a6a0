"""One SOW topic's engine: applies log batches to partition state, answers queries, expires records.

Everything here runs on the worker's event loop. A partition's lock is held while its state is
read or written, so a query sees the state between two log batches: a consistent snapshot of that
partition. Apply work is synchronous inside the lock; the batch's changelog records are queued
inside it too (their order must match the RocksDB writes), replies and acks go out after it.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from sowstream.config.models import TopicConfig
from sowstream.engine import metrics
from sowstream.engine.store import (
    WATERMARK_KEY,
    MemoryPartition,
    PartitionStore,
    RocksPartition,
    is_record_key,
)
from sowstream.errors import (
    InvalidCommandError,
    InvalidMessageError,
    SowstreamError,
    StateStoreError,
)
from sowstream.filters import Filter, FilterError, compile_filter
from sowstream.queues.store import queue_prefix
from sowstream.sow.aggregate import Aggregation, parse_aggregation
from sowstream.sow.bookmarks import Bookmark, parse_bookmark
from sowstream.sow.expiration import processes_expiration
from sowstream.sow.fold import apply_record
from sowstream.sow.history import (
    HISTORY_PREFIX,
    Version,
    as_of_bound,
    check_window,
    covers,
    expired_versions,
    states_as_of,
    version_changes,
)
from sowstream.sow.keys import generated_sow_key
from sowstream.sow.layout import index_entries
from sowstream.sow.ops import (
    LogOp,
    RawRecord,
    apply_keyed,
    decode_log_record,
    deleted_by_filter,
    parse_body,
)
from sowstream.sow.planner import FullScan, IndexLookup, KeyLookup, Plan, plan
from sowstream.sow.query import QueryOptions, result_order, validate_query
from sowstream.sow.record import SowRecord
from sowstream.subscriptions.delta import project
from sowstream.subscriptions.journal import JOURNAL_PREFIX
from sowstream.subscriptions.matcher import EntitlementLookup, TopicSubscriptions
from sowstream.subscriptions.model import (
    FAILURE,
    OOF,
    OOF_DELETED,
    OOF_EXPIRED,
    OOF_MATCH,
    WITH_SOW,
    Change,
    Delivery,
    SubscriptionSpec,
    dumps,
)
from sowstream.subscriptions.options import parse_options
from sowstream.wire import headers as h
from sowstream.wire.avro import encode
from sowstream.wire.topics import TopicNames

if TYPE_CHECKING:
    from sowstream.engine.queues import QueueRuntime

log = logging.getLogger("sowstream.engine")

# Kafka's default max message size is 1 MB; stay well under it when packing a reply batch.
MAX_REPLY_BYTES = 900_000
SCAN_YIELD_EVERY = 5_000
APPLIED_WAIT_SECONDS = 30.0
DELIVERY_WAIT_SECONDS = 10.0
HISTORY_PRUNE_SECONDS = 60.0
# Batches of a partition whose subscription messages may be in flight at once (see process()).
MAX_IN_FLIGHT = 4


class LogReader(Protocol):
    """Reads a log partition directly, for rebuilding state that is not in a changelog."""

    async def end_offset(self, partition: int) -> int:
        """Offset of the last record in the partition (-1 when empty)."""

    def batches(self, partition: int, until: int, start: int = 0) -> AsyncIterator[list[RawRecord]]:
        """The partition's records from ``start`` (default: the beginning) up to ``until``."""

    async def offset_for_time(self, partition: int, at_ms: int) -> int:
        """The first offset whose log time is at or after ``at_ms`` (the end if none is)."""


class Sender:
    """How the processor talks to Kafka; the worker supplies one backed by faust's producer."""

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[Any] | None:
        """Queue one record for production; returns its delivery future when there is one."""
        raise NotImplementedError

    async def send_reply(
        self, topic: str, value: bytes, headers: list[tuple[str, bytes]] | None = None
    ) -> asyncio.Future[Any] | None:
        """Queue a reply for a client; a client that has gone away must not hold the engine up.

        Returns the delivery future, or None when the reply was dropped (client gone).
        """
        raise NotImplementedError

    def prepare(self, topic: str) -> None:
        """Replies to ``topic`` are coming: fetch what sending needs now, without waiting."""


@dataclass
class _Outcome:
    """What applying a batch produced: store changes to replicate, then messages to send."""

    changes: dict[bytes, bytes | None] = field(default_factory=dict)
    overlay: dict[bytes, SowRecord | None] = field(default_factory=dict)
    before: dict[bytes, SowRecord | None] = field(default_factory=dict)
    last: int = -1
    events: list[Change] = field(default_factory=list)
    rekeys: list[tuple[str, RawRecord]] = field(default_factory=list)
    dead: list[tuple[RawRecord, InvalidMessageError]] = field(default_factory=list)
    acks: list[tuple[RawRecord, int, str, str, str]] = field(default_factory=list)
    versions: list[Version] = field(default_factory=list)
    journal: dict[bytes, bytes | None] = field(default_factory=dict)  # conflation journal, queues
    # Applied publishes for queues: (offset, timestamp, data, body, expiration ms or None).
    enqueued: list[tuple[int, int, bytes, dict[str, Any], int | None]] = field(default_factory=list)


@dataclass
class _InFlight:
    """A folded batch whose subscription messages are sent but not yet acknowledged by Kafka."""

    outcome: _Outcome
    sent: list[asyncio.Future[Any]]


@dataclass
class PartitionState:
    """State of one assigned partition: its store, applied offset and expiry schedule.

    ``watermark`` is the last log offset stored; ``folded`` the last one folded, which runs ahead
    while batches wait in ``in_flight`` for their messages' acknowledgements.
    """

    store: PartitionStore
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    watermark: int = -1
    folded: int = -1
    applied: asyncio.Condition = field(default_factory=asyncio.Condition)
    expiry: list[tuple[int, bytes]] = field(default_factory=list)
    ready: bool = False
    in_flight: deque[_InFlight] = field(default_factory=deque)
    committer: asyncio.Task[None] | None = None
    failure: Exception | None = None  # why storing a batch failed; the partition is unusable

    async def wake(self) -> None:
        """Wake everyone waiting on this partition's progress (they re-check what they need)."""
        async with self.applied:
            self.applied.notify_all()


class TopicProcessor:
    """The engine for one SOW topic on one worker."""

    def __init__(
        self,
        topic: TopicConfig,
        names: TopicNames,
        sender: Sender,
        *,
        table: Any | None = None,
        log_reader: LogReader | None = None,
        entitlement: EntitlementLookup | None = None,
    ) -> None:
        self.topic = topic
        self.subs = TopicSubscriptions(
            topic, entitlement, current=self._current_record if topic.sow else None
        )
        # Queues whose underlying topics include this one (set up by the engine).
        self.queues: list[QueueRuntime] = []
        self.names = names
        self.log_topic = names.log(topic.name)
        self._sender = sender
        self._table = table
        self._log_reader = log_reader
        self._parts: dict[int, PartitionState] = {}
        self._expires = processes_expiration(topic.expiration)
        self._index_fields = [tuple(f) for f in topic.hash_indexes]
        self._history = topic.history if topic.sow else None
        self._pruned_at = 0.0

    # -- partition lifecycle -------------------------------------------------------------------

    def _new_store(self, partition: int) -> PartitionStore:
        if self.topic.durability == "transient" or self._table is None:
            return MemoryPartition()
        return RocksPartition(self._table, partition)

    async def ready(self, partition: int) -> PartitionState:
        """The partition's state, loading it on first use after an assignment."""
        ps = self._parts.get(partition)
        if ps is None:
            ps = self._parts[partition] = PartitionState(self._new_store(partition))
        if not ps.ready:
            async with ps.lock:
                if not ps.ready:
                    await self._load(partition, ps)
                    ps.folded = ps.watermark
                    ps.ready = True
        return ps

    async def _load(self, partition: int, ps: PartitionState) -> None:
        await self._load_state(partition, ps)
        for queue in self.queues:
            entries = ps.store.scan(prefix=queue_prefix(queue.name))
            queue.load(self.topic.name, partition, entries, ps.watermark)

    async def _load_state(self, partition: int, ps: PartitionState) -> None:
        if not self.topic.sow:
            raw = ps.store.get(WATERMARK_KEY) if self._table is not None else None
            if raw is not None:
                ps.watermark = int(raw)  # a plain topic feeding queues goes on where it was
            elif self._log_reader is not None and (
                self._table is None or self.topic.recovery_point == "now"
            ):
                # Nothing is stored, so nothing to rebuild: serve what is published from now on.
                ps.watermark = await self._log_reader.end_offset(partition)
            return
        raw = ps.store.get(WATERMARK_KEY)
        transient = self.topic.durability == "transient"
        if raw is not None and not transient:
            ps.watermark = int(raw)
            self.subs.restore(partition, ps.store.scan(prefix=JOURNAL_PREFIX), _now_ms())
        elif self._log_reader is not None:
            await self._recover(partition, ps, transient)
        if self._expires:
            for key, value in ps.store.scan():
                if is_record_key(key):
                    rec = SowRecord.from_bytes(value)
                    if rec.expiration is not None:
                        heapq.heappush(ps.expiry, (rec.expiration, key))

    async def _recover(self, partition: int, ps: PartitionState, transient: bool) -> None:
        """Start a partition that has no state: fold the log from the RecoveryPoint.

        Transient topics always come here; a persistent topic only when its state is new, where
        ``epoch`` is left to the normal consumer (it starts at the beginning) and ``now`` skips
        what the log already holds.
        """
        assert self._log_reader is not None
        end = await self._log_reader.end_offset(partition)
        if self.topic.recovery_point == "now":
            ps.watermark = end
        elif transient:
            async for batch in self._log_reader.batches(partition, end):
                self._apply(ps, batch, replay=True)
            ps.watermark = max(ps.watermark, end)
        else:
            return
        if not transient:
            mark = {WATERMARK_KEY: str(ps.watermark).encode()}
            ps.store.write(mark)
            await ps.store.replicate(mark, self._sender.send)
        log.info(
            "topic %s partition %d recovered from the log (RecoveryPoint %s) up to offset %d",
            self.topic.name,
            partition,
            self.topic.recovery_point,
            ps.watermark,
        )

    async def drop(self, partitions: Iterable[int]) -> None:
        """Forget partitions taken away by a rebalance (their state stays in Kafka/RocksDB)."""
        for p in partitions:
            self.subs.drop_partition(p)
            for queue in self.queues:
                queue.drop(self.topic.name, p)
            ps = self._parts.pop(p, None)
            if ps is not None:
                await ps.wake()  # queries waiting on it give up

    def state(self, partition: int) -> PartitionState | None:
        """The partition's current state, None when it is not held."""
        return self._parts.get(partition)

    @property
    def partitions(self) -> list[int]:
        """Partitions this worker currently holds state for."""
        return sorted(self._parts)

    # -- applying the log ----------------------------------------------------------------------

    async def process(self, records: Sequence[RawRecord]) -> None:
        """Fold a batch of log records (any mix of partitions, each in log order) and send its
        subscription messages; the state is stored once Kafka has acknowledged them.

        Only partitions loaded by :meth:`ready` take records: a partition dropped by a rebalance
        must be read again from its stored watermark, never continued from where this batch is.

        Subscribers' messages must reach Kafka before the state that produced them is stored
        (a crash in between replays the batch, so delivery is at-least-once), but waiting for
        each batch's acknowledgements before folding the next would put a broker round trip,
        the RocksDB write and the changelog sends in front of every later record. So batches
        are pipelined: the next batch folds on top of the ones still in flight and a committer
        task stores them in order as their acknowledgements come in.
        """
        by_partition: dict[int, list[RawRecord]] = {}
        for rec in records:
            by_partition.setdefault(rec.partition, []).append(rec)
        for partition, recs in by_partition.items():
            ps = self._parts.get(partition)
            if ps is None or not ps.ready:
                continue  # not held (any more): whoever loads it next reads from its watermark
            async with ps.lock:
                if self._parts.get(partition) is not ps:
                    continue  # revoked while waiting: the new owner reads these records again
                await self._settle(ps, keep=MAX_IN_FLIGHT - 1)
                outcome = self._fold(ps, recs, replay=False)
                sent: list[asyncio.Future[Any]] = []
                if outcome.events:
                    sent = await self.deliver(self.subs.dispatch(outcome.events, _now_ms()))
                    outcome.journal = self.subs.take_journal(partition)
                for queue in self.queues if outcome.enqueued else ():
                    outcome.journal.update(
                        queue.append(self.topic.name, partition, outcome.enqueued)
                    )
                ps.folded = max(ps.folded, outcome.last)
                self._enqueue(partition, ps, outcome, sent)

    def _enqueue(
        self,
        partition: int,
        ps: PartitionState,
        outcome: _Outcome,
        sent: list[asyncio.Future[Any]],
    ) -> None:
        """Queue ``outcome`` to be stored, in order, once Kafka has ``sent`` (under ps.lock)."""
        ps.in_flight.append(_InFlight(outcome, sent))
        if ps.committer is None:
            ps.committer = asyncio.create_task(self._commit_in_order(partition, ps))

    async def _commit_in_order(self, partition: int, ps: PartitionState) -> None:
        """Store the partition's in-flight batches, oldest first, once their messages are in."""
        try:
            while ps.in_flight:
                head = ps.in_flight[0]
                if head.sent:
                    await self._acknowledged(head.sent)
                if self._parts.get(partition) is not ps:
                    # Revoked: nothing of these batches is stored, so the new owner replays them.
                    ps.in_flight.clear()
                else:
                    self._commit(ps, head.outcome)
                    await ps.store.replicate(head.outcome.changes, self._sender.send)
                    # Leaves the overlay only now: until its changelog sends are queued no later
                    # batch may commit (the changelog keeps write order); readers looking
                    # through the overlay meanwhile find the same records as in the store.
                    ps.in_flight.popleft()
                    await self._perform(head.outcome)
                await ps.wake()
        except Exception as exc:
            log.error(
                "topic %s partition %d: storing a batch failed",
                self.topic.name,
                partition,
                exc_info=exc,
            )
            # Forget the partition: it is loaded again from what the store holds, and the batches
            # that were in flight are read from the log again.
            ps.failure = exc
            ps.in_flight.clear()
            if self._parts.get(partition) is ps:
                del self._parts[partition]
            await ps.wake()
        finally:
            # No await between the loop's last check and here: a batch appended after it finds
            # no committer and starts one.
            if ps.committer is asyncio.current_task():
                ps.committer = None

    async def _settle(self, ps: PartitionState, keep: int = 0) -> None:
        """Wait until at most ``keep`` batches are in flight (by default: all stored).

        Readers of the store (queries, placements, expiry) call it under the partition lock, so
        what they read is complete and nothing new is folded meanwhile.
        """
        async with ps.applied:
            while True:
                if ps.failure is not None:
                    raise StateStoreError(
                        f"topic {self.topic.name!r}: storing a batch failed: {ps.failure}"
                    ) from ps.failure
                if len(ps.in_flight) <= keep:
                    return
                await ps.applied.wait()

    async def drain(self) -> None:
        """Wait until every batch folded so far is stored (before reading the stores directly)."""
        for ps in list(self._parts.values()):
            async with ps.lock:
                await self._settle(ps)

    def _load_record(
        self, ps: PartitionState, overlay: dict[bytes, SowRecord | None], key: bytes
    ) -> SowRecord | None:
        if key in overlay:
            return overlay[key]
        for flight in reversed(ps.in_flight):
            if key in flight.outcome.overlay:
                return flight.outcome.overlay[key]
        raw = ps.store.get(key)
        return SowRecord.from_bytes(raw) if raw is not None else None

    def _apply(self, ps: PartitionState, recs: Sequence[RawRecord], *, replay: bool) -> _Outcome:
        """Fold ``recs`` into the partition and write the result as one batch."""
        outcome = self._fold(ps, recs, replay=replay)
        self._commit(ps, outcome)
        return outcome

    def _commit(self, ps: PartitionState, outcome: _Outcome) -> None:
        if not self.topic.sow:
            if self._table is not None and (outcome.last > ps.watermark or outcome.journal):
                # A plain topic stores only what its queues hold, and its position.
                changes = dict(outcome.journal)
                if outcome.last > ps.watermark:
                    changes[WATERMARK_KEY] = str(outcome.last).encode()
                ps.store.write(changes)
                outcome.changes = changes
            ps.watermark = max(ps.watermark, outcome.last)
            return
        if outcome.last > ps.watermark or outcome.journal:
            outcome.changes = self._write(
                ps,
                outcome.overlay,
                outcome.before,
                outcome.last if outcome.last > ps.watermark else None,
                outcome.versions,
                outcome.journal,
            )

    def _fold(self, ps: PartitionState, recs: Sequence[RawRecord], *, replay: bool) -> _Outcome:
        """Compute what ``recs`` do to the partition, without writing it yet.

        Every key an op touches is written again even when unchanged: after a crash the replayed
        ops re-send their records, so a changelog that missed the last batch catches up. With
        subscriptions present, each op's effect on its record is kept as a :class:`Change`.
        """
        if not self.topic.sow:
            return self._fold_plain(ps, recs, replay=replay)
        outcome = _Outcome()
        overlay = outcome.overlay
        before = outcome.before
        events = outcome.events if (self.subs and not replay) else None
        versions = outcome.versions if self._history is not None else None
        last = ps.folded
        applied = 0
        for rec in recs:
            if rec.offset <= ps.folded:
                continue
            last = max(last, rec.offset)
            try:
                op = decode_log_record(
                    self.topic, rec.key, rec.value, rec.headers, rec.offset, rec.timestamp
                )
            except InvalidMessageError as exc:
                if not replay:
                    outcome.dead.append((rec, exc))
                    outcome.acks.append((rec, 0, "failure", exc.reason, str(exc)))
                continue
            if op.rekey:
                if not replay and op.sow_key is not None:
                    outcome.rekeys.append((op.sow_key, rec))
                continue
            if op.sow_key is None:
                count = self._delete_by_filter(ps, overlay, before, op, events, rec, versions)
            else:
                key = op.sow_key.encode()
                stored = self._load_record(ps, overlay, key)
                if key not in before:
                    before[key] = stored
                new = apply_keyed(self.topic, stored, op)
                overlay[key] = new
                if self.queues and new is not None and op.command != h.SOW_DELETE:
                    outcome.enqueued.append(self._queued(rec, new.data, new.parsed()))
                if versions is not None and new is not stored:
                    versions.append(Version(op.sow_key, stored, new, op.offset, op.timestamp))
                count = 1 if (op.command != h.SOW_DELETE or stored is not None) else 0
                if events is not None:
                    self._note(events, op.sow_key, stored, new, rec)
            applied += 1
            if not replay and op.reply_to:
                outcome.acks.append((rec, count, "success", "", ""))
        outcome.last = last
        metrics.UPDATES.labels(self.topic.name).inc(applied)
        if outcome.dead:
            metrics.REJECTED.labels(self.topic.name).inc(len(outcome.dead))
        return outcome

    def _fold_plain(
        self, ps: PartitionState, recs: Sequence[RawRecord], *, replay: bool
    ) -> _Outcome:
        """A topic without a SOW: every publish goes to subscribers whole, nothing is stored.

        With no stored state a delta_publish cannot be merged, so it is passed on as published
        (as AMPS does); a sow_delete has nothing to delete.
        """
        outcome = _Outcome()
        events = outcome.events if (self.subs and not replay) else None
        last = ps.folded
        for rec in recs:
            if rec.offset <= ps.folded:
                continue
            last = max(last, rec.offset)
            command = rec.headers.get(h.COMMAND) or h.PUBLISH
            try:
                sow_key = self._plain_key(rec, command)
            except InvalidMessageError as exc:
                if not replay:
                    outcome.dead.append((rec, exc))
                    outcome.acks.append((rec, 0, "failure", exc.reason, str(exc)))
                continue
            if self.queues and command != h.SOW_DELETE and rec.value is not None:
                body = parse_body(self.topic.name, rec.value)
                outcome.enqueued.append(self._queued(rec, rec.value, body))
            if sow_key is not None and events is not None:
                assert rec.value is not None
                after = SowRecord(sow_key, rec.value, rec.offset, rec.timestamp)
                events.append(
                    Change(sow_key, None, after, rec.partition, rec.offset, rec.timestamp)
                )
            if not replay and rec.headers.get(h.REPLY_TO):
                outcome.acks.append((rec, int(sow_key is not None), "success", "", ""))
        outcome.last = last
        return outcome

    @staticmethod
    def _queued(
        rec: RawRecord, data: bytes, body: dict[str, Any]
    ) -> tuple[int, int, bytes, dict[str, Any], int | None]:
        """An applied publish as a queue takes it (a delta_publish as the merged record)."""
        raw = rec.headers.get(h.EXPIRATION)
        expiration = int(float(raw) * 1000) if raw else None
        return rec.offset, rec.timestamp, data, body, expiration

    async def store_changes(self, partition: int, changes: Mapping[bytes, bytes | None]) -> None:
        """Write ``changes`` (queue entries) into ``partition``'s store after the batches before
        them, and return once they are stored. Nothing happens for a partition not held."""
        ps = self._parts.get(partition)
        if ps is None or not ps.ready or not changes:
            return
        async with ps.lock:
            if self._parts.get(partition) is not ps:
                return
            self._enqueue(partition, ps, _Outcome(journal=dict(changes)), [])
            await self._settle(ps)

    def _plain_key(self, rec: RawRecord, command: str) -> str | None:
        """The message's key on a plain topic (None for a delete, which does nothing here)."""
        if command not in h.LOG_COMMANDS:
            raise InvalidMessageError(
                f"topic {self.topic.name!r}: unknown command {command!r} in header {h.COMMAND}",
                topic=self.topic.name,
                reason="unknown_command",
            )
        if command == h.SOW_DELETE:
            return None
        body = parse_body(self.topic.name, rec.value)
        if self.topic.keys:
            return generated_sow_key(
                self.topic.name, self.topic.effective_key_domain, self.topic.keys, body
            )
        return rec.key.decode("utf-8", "replace") if rec.key else f"{rec.partition}-{rec.offset}"

    @staticmethod
    def _note(
        events: list[Change],
        sow_key: str,
        stored: SowRecord | None,
        new: SowRecord | None,
        rec: RawRecord,
        seq: int = 0,
    ) -> None:
        """Record an op's effect for subscribers."""
        if new is stored:
            # Already applied before a crash: re-announce the stored result of exactly this op
            # (its message may not have gone out); subscribers drop it if they have it.
            if stored is not None and stored.log_offset == rec.offset:
                events.append(
                    Change(
                        sow_key, None, stored, rec.partition, rec.offset, rec.timestamp, resent=True
                    )
                )
            return
        events.append(
            Change(
                sow_key, stored, new, rec.partition, rec.offset, rec.timestamp, OOF_DELETED, seq=seq
            )
        )

    def _delete_by_filter(
        self,
        ps: PartitionState,
        overlay: dict[bytes, SowRecord | None],
        before: dict[bytes, SowRecord | None],
        op: LogOp,
        events: list[Change] | None = None,
        rec: RawRecord | None = None,
        versions: list[Version] | None = None,
    ) -> int:
        count = 0
        candidates = dict.fromkeys(self._candidate_keys(ps, plan(self.topic, op.filter)))
        for flight in ps.in_flight:
            candidates.update(dict.fromkeys(flight.outcome.overlay))
        candidates.update(dict.fromkeys(overlay))
        # Sorted: each removed record's message sequence must come out the same on a replay.
        for key in sorted(candidates) if events is not None else candidates:
            stored = self._load_record(ps, overlay, key)
            if stored is None or not deleted_by_filter(stored, op):
                continue
            if key not in before:
                before[key] = stored
            overlay[key] = None
            count += 1
            if versions is not None:
                versions.append(Version(stored.sow_key, stored, None, op.offset, op.timestamp))
            if events is not None and rec is not None:
                self._note(events, stored.sow_key, stored, None, rec, seq=count)
        return count

    def _write(
        self,
        ps: PartitionState,
        overlay: dict[bytes, SowRecord | None],
        before: dict[bytes, SowRecord | None],
        watermark: int | None = None,
        versions: Sequence[Version] = (),
        journal: Mapping[bytes, bytes | None] | None = None,
    ) -> dict[bytes, bytes | None]:
        """Write the batch's final records (and index entries) as one store batch.

        A log batch passes its highest offset: it is written last, so a changelog prefix that
        holds the watermark holds the whole batch. Expiry deletes change no watermark.
        """
        changes: dict[bytes, bytes | None] = {}
        for key, new in overlay.items():
            if self._index_fields:
                self._index_changes(changes, key, before.get(key), new)
            changes[key] = new.to_bytes() if new is not None else None
            if new is not None and new.expiration is not None and self._expires:
                heapq.heappush(ps.expiry, (new.expiration, key))
        if versions and self._history is not None:
            for key, value in version_changes(self._history, versions).items():
                # A version is only ever written by its own log operation, so one that exists
                # came from the first application; an operation replayed after a crash may see
                # a different state before it (its record was deleted since) and must not
                # rewrite history.
                if value is not None and ps.store.get(key) is not None:
                    continue
                changes[key] = value
        if journal:
            changes.update(journal)
        if watermark is not None:
            changes[WATERMARK_KEY] = str(watermark).encode()
        ps.store.write(changes)
        if watermark is not None:
            ps.watermark = watermark
        return changes

    def _index_entries(self, key: bytes, record: SowRecord | None) -> set[bytes]:
        return index_entries(self._index_fields, key, record.parsed() if record else None)

    def _index_changes(
        self,
        changes: dict[bytes, bytes | None],
        key: bytes,
        old: SowRecord | None,
        new: SowRecord | None,
    ) -> None:
        old_entries = self._index_entries(key, old)
        new_entries = self._index_entries(key, new)
        for entry in old_entries - new_entries:
            changes[entry] = None
        for entry in new_entries - old_entries:
            changes[entry] = b""

    async def _perform(self, outcome: _Outcome) -> None:
        for sow_key, rec in outcome.rekeys:
            hdrs = {**rec.headers, h.ORIGIN: f"{rec.partition}:{rec.offset}"}
            await self._sender.send(
                self.log_topic,
                rec.value,
                key=sow_key.encode(),
                headers=h.to_kafka_headers(dict(hdrs)),
            )
        for rec, exc in outcome.dead:
            log.warning(
                "rejected record %s[%d]@%d: %s", self.log_topic, rec.partition, rec.offset, exc
            )
            letter = {
                "topic": self.topic.name,
                "source_topic": self.log_topic,
                "source_partition": rec.partition,
                "source_offset": rec.offset,
                "timestamp": rec.timestamp,
                "key": rec.key,
                "value": rec.value,
                "headers": rec.headers,
                "reason": exc.reason,
                "error": str(exc),
            }
            await self._sender.send(
                self.names.dead_letter, encode("DeadLetter", letter), key=self.topic.name.encode()
            )
        for rec, count, status, reason, message in outcome.acks:
            reply_to = rec.headers.get(h.REPLY_TO)
            if not reply_to:
                continue
            await self.reply(
                reply_to,
                {
                    "command": "ack",
                    "command_id": rec.headers.get(h.COMMAND_ID, ""),
                    "topic": self.topic.name,
                    "partition": rec.partition,
                    "log_offset": rec.offset,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "count": count,
                },
            )

    async def reply(self, reply_to: str, body: dict[str, Any]) -> None:
        """Send one Reply message to a client's reply topic (dropped if the client is gone)."""
        await self._sender.send_reply(reply_to, encode("Reply", body))

    async def deliver(
        self, deliveries: Sequence[Delivery], *, wait: bool = False
    ) -> list[asyncio.Future[Any]]:
        """Send subscription messages; with ``wait``, until Kafka has them all.

        Returns the delivery futures of the messages sent.
        """
        futures: list[asyncio.Future[Any]] = []
        if not deliveries:
            return futures
        for d in deliveries:
            fut = await self._sender.send_reply(d.spec.reply_to, d.data, live_headers(d))
            if fut is not None:
                futures.append(fut)
        metrics.DELIVERED.labels(self.topic.name).inc(len(deliveries))
        if wait:
            await self._acknowledged(futures)
        return futures

    async def _acknowledged(self, futures: list[asyncio.Future[Any]]) -> None:
        """Wait until Kafka has acknowledged ``futures``, for a bounded time."""
        if futures:
            # Bounded: a reply topic deleted under us must not hold the partition for the
            # producer's whole delivery timeout (its client is gone anyway).
            _, late = await asyncio.wait(futures, timeout=DELIVERY_WAIT_SECONDS)
            if late:
                log.warning(
                    "topic %s: %d subscription messages not acknowledged by Kafka within %.0fs",
                    self.topic.name,
                    len(late),
                    DELIVERY_WAIT_SECONDS,
                )

    async def flush_conflated(self, now_ms: int | None = None) -> None:
        """Send the messages of conflation intervals that have ended.

        Partition by partition under its lock, so the flush sits between two batches: the removal
        of the sent records' journal entries is stored after every batch that wrote them and
        before any that starts a new interval.
        """
        if not self.subs:
            return
        keys = self.subs.due(now_ms if now_ms is not None else _now_ms())
        for partition in sorted(self.subs.partitions_of(keys)):
            ps = self._parts.get(partition)
            if ps is None:
                self.subs.drop_partition(partition)  # its next owner finishes these intervals
                continue
            async with ps.lock:
                await self._flush_partition(keys, partition, ps)

    async def _flush_partition(self, keys: list[str], partition: int, ps: PartitionState) -> None:
        """Send ``keys``' buffered changes of ``partition`` (caller holds ps.lock)."""
        sent = await self.deliver(self.subs.flush_due(keys, partition))
        cleared = self.subs.take_cleared(partition)
        if cleared and self._parts.get(partition) is ps:
            self._enqueue(partition, ps, _Outcome(journal=cleared), sent)

    def _current_record(self, partition: int, sow_key: str) -> SowRecord | None:
        """The record ``partition`` holds under ``sow_key`` now, batches in flight included."""
        ps = self._parts.get(partition)
        return self._load_record(ps, {}, sow_key.encode()) if ps is not None else None

    # -- expiration ----------------------------------------------------------------------------

    async def expire_due(self, now_ms: int | None = None) -> int:
        """Delete every record whose expiration has passed; returns how many were deleted."""
        if not self._expires:
            return 0
        now = now_ms if now_ms is not None else _now_ms()
        total = 0
        for p, ps in list(self._parts.items()):
            if not ps.ready or not ps.expiry or ps.expiry[0][0] > now:
                continue
            async with ps.lock:
                await self._settle(ps)
                overlay: dict[bytes, SowRecord | None] = {}
                before: dict[bytes, SowRecord | None] = {}
                while ps.expiry and ps.expiry[0][0] <= now:
                    due, key = heapq.heappop(ps.expiry)
                    stored = self._load_record(ps, overlay, key)
                    # Entries go stale when an update moves the expiration; only the current one
                    # counts.
                    if stored is None or stored.expiration != due:
                        continue
                    before[key] = stored
                    overlay[key] = None
                if overlay and self.subs:
                    # Not a log operation: placed after everything the partition has applied,
                    # ordered by expiry time (so the same on a replay).
                    gone = sorted((r.expiration or 0, r.sow_key, r) for r in before.values() if r)
                    expired = [
                        Change(
                            r.sow_key,
                            r,
                            None,
                            p,
                            ps.watermark,
                            now,
                            OOF_EXPIRED,
                            seq=due * 1000 + i + 1,
                        )
                        for i, (due, _, r) in enumerate(gone)
                    ]
                    await self.deliver(self.subs.dispatch(expired, now), wait=True)
                if overlay:
                    journal = self.subs.take_journal(p)
                    changes = self._write(ps, overlay, before, journal=journal)
                    await ps.store.replicate(changes, self._sender.send)
                    total += len(overlay)
        if total:
            metrics.EXPIRED.labels(self.topic.name).inc(total)
        return total

    # -- history -------------------------------------------------------------------------------

    async def prune_history(self, now_ms: int | None = None) -> int:
        """Drop versions that left the History Window (at most once a minute)."""
        if self._history is None or self._history.window_ms is None:
            return 0
        if time.monotonic() - self._pruned_at < HISTORY_PRUNE_SECONDS:
            return 0
        self._pruned_at = time.monotonic()
        cutoff = (now_ms if now_ms is not None else _now_ms()) - self._history.window_ms
        total = 0
        for ps in list(self._parts.values()):
            if not ps.ready:
                continue
            async with ps.lock:
                await self._settle(ps)
                drop = expired_versions(ps.store.scan(prefix=HISTORY_PREFIX), cutoff)
                if drop:
                    changes: dict[bytes, bytes | None] = dict.fromkeys(drop)
                    ps.store.write(changes)
                    await ps.store.replicate(changes, self._sender.send)
                    total += len(drop)
        return total

    def _as_of(self, ps: PartitionState, bookmark: Bookmark) -> dict[str, SowRecord]:
        """Every record of the partition as it was at the bookmark (History required)."""
        assert self._history is not None and bookmark.at_ms is not None
        if bookmark.at_ms < 0:
            return {}
        bound = as_of_bound(self._history, bookmark.at_ms)
        return {r.sow_key: r for r in states_as_of(ps.store.scan(prefix=HISTORY_PREFIX), bound)}

    def _bookmark(self, cmd: dict[str, Any]) -> Bookmark | None:
        """The command's bookmark option, checked against the topic (InvalidCommandError)."""
        text = (cmd.get("options") or {}).get("bookmark")
        if not text:
            return None
        bookmark = parse_bookmark(text)
        if bookmark.at_ms is None:
            return None  # NOW: nothing to replay
        if cmd["command"] != "sow" and cmd["command"] not in WITH_SOW:
            return bookmark  # a replay from the log needs no History
        if self._history is None and cmd["command"] != "sow":
            # As AMPS does: without History, sow_and_subscribe answers with the current state
            # and the subscription starts now.
            return None
        if bookmark.at_ms >= 0 or self._history is None:
            check_window(self.topic.name, self._history, max(bookmark.at_ms, 0), _now_ms())
        return bookmark

    def _replay_base(
        self, ps: PartitionState, bookmark: Bookmark
    ) -> tuple[dict[str, SowRecord], int | None]:
        """The state a replay starts from and the time it reflects: History's when it covers the
        bookmark (as of the bookmark rounded down to the Granularity), else empty and None (the
        replay starts at the bookmark and each record's first message comes whole)."""
        assert bookmark.at_ms is not None
        if (
            self._history is None
            or bookmark.at_ms < 0
            or not covers(self._history, bookmark.at_ms, _now_ms())
        ):
            return {}, None
        return self._as_of(ps, bookmark), as_of_bound(self._history, bookmark.at_ms)

    async def _replay(
        self,
        partition: int,
        state: dict[str, SowRecord],
        bookmark: Bookmark,
        until: int,
        state_ms: int | None = None,
    ) -> tuple[int, list[Change]]:
        """Fold the log after ``bookmark`` up to ``until`` from ``state``: (first offset, changes).

        The changes are what live traffic had at the time, so the subscription rules turn them
        into the messages a subscriber placed at the bookmark received (oof included). A state
        read from History reflects ``state_ms`` (the bookmark rounded down to the Granularity):
        the replay starts right after it, or the changes in between would be lost.
        """
        assert self._log_reader is not None and bookmark.at_ms is not None
        since = bookmark.at_ms if state_ms is None else state_ms
        by_time = await self._log_reader.offset_for_time(partition, since + 1) if since >= 0 else 0
        rounded = state_ms is not None and state_ms < bookmark.at_ms
        start = by_time if rounded else bookmark.start_offset(partition, by_time)
        changes: list[Change] = []
        async for batch in self._log_reader.batches(partition, until, start):
            for rec in batch:
                if rec.offset < start:
                    continue
                if not self.topic.sow:
                    key = self._replay_plain_key(rec)
                    if key is not None and rec.value is not None:
                        after = SowRecord(key, rec.value, rec.offset, rec.timestamp)
                        changes.append(
                            Change(key, None, after, partition, rec.offset, rec.timestamp)
                        )
                    continue
                changes.extend(
                    Change(
                        step.sow_key,
                        step.before,
                        step.after,
                        partition,
                        rec.offset,
                        rec.timestamp,
                        OOF_DELETED,
                        seq=step.seq,
                    )
                    for step in apply_record(self.topic, state, rec)
                )
        return start, changes

    def _replay_plain_key(self, rec: RawRecord) -> str | None:
        try:
            return self._plain_key(rec, rec.headers.get(h.COMMAND) or h.PUBLISH)
        except InvalidMessageError:
            return None

    # -- queries -------------------------------------------------------------------------------

    def _candidate_keys(self, ps: PartitionState, how: Plan) -> Iterator[bytes]:
        if isinstance(how, KeyLookup):
            yield from (k.encode() for k in how.sow_keys)
        elif isinstance(how, IndexLookup):
            for prefix in how.prefixes:
                for entry, _ in ps.store.scan(prefix=prefix):
                    yield entry[len(prefix) :]
        else:
            for key, _ in ps.store.scan():
                if is_record_key(key):
                    yield key

    async def _matching(
        self,
        ps: PartitionState,
        how: Plan,
        opts: QueryOptions,
        visible: Filter | None = None,
        records: Iterable[SowRecord] | None = None,
    ) -> list[tuple[SowRecord, dict[str, Any] | None]]:
        """Records of the partition that match (and ``visible`` allows), read under its lock.

        ``records`` replaces the stored state (a historical query passes the state as of then).
        """
        out: list[tuple[SowRecord, dict[str, Any] | None]] = []
        flt = opts.filter
        need_parsed = flt is not None or visible is not None or bool(opts.order_by)
        # An expired record may still wait for the next expiry sweep; never show it.
        now = _now_ms() if self._expires else None
        seen = 0
        for rec in records if records is not None else self._stored(ps, how):
            seen += 1
            if seen % SCAN_YIELD_EVERY == 0:
                await asyncio.sleep(0)
            if now is not None and rec.expiration is not None and rec.expiration <= now:
                continue
            parsed = orjson.loads(rec.data) if need_parsed else None
            if flt is not None and not flt.matches(parsed):  # type: ignore[arg-type]
                continue
            if visible is not None and not visible.matches(parsed):  # type: ignore[arg-type]
                continue
            out.append((rec, parsed))
        return out

    def _stored(self, ps: PartitionState, how: Plan) -> Iterator[SowRecord]:
        if isinstance(how, FullScan):
            for key, raw in ps.store.scan():
                if is_record_key(key):
                    yield SowRecord.from_bytes(raw)
            return
        for key in self._candidate_keys(ps, how):
            value = ps.store.get(key)
            if value is not None:
                yield SowRecord.from_bytes(value)

    async def query(self, cmd: dict[str, Any], partition: int) -> None:
        """Answer one partition's share of a ``sow`` command on the client's reply topic."""
        reply_to = cmd["reply_to"]
        base = {
            "answer_id": uuid.uuid4().hex[:12],
            "command_id": cmd["command_id"],
            "query_id": cmd.get("query_id") or "",
            "topic": self.topic.name,
            "partition": partition,
        }
        try:
            if not self.topic.sow:
                raise InvalidCommandError(
                    f"topic {self.topic.name!r} has no SOW: it can be subscribed to, not queried"
                )
            opts = validate_query(
                filter=cmd.get("filter"),
                order_by=cmd.get("order_by"),
                top_n=cmd.get("top_n"),
                skip_n=cmd.get("skip_n"),
                batch_size=cmd.get("batch_size") or 1,
            )
            bookmark = self._bookmark(cmd)
            aggregation = aggregation_of(cmd)
        except (FilterError, InvalidCommandError) as exc:
            reason = "bad_filter" if isinstance(exc, FilterError) else "bad_option"
            await self.reply(
                reply_to,
                {
                    **base,
                    "command": "part_end",
                    "status": "failure",
                    "reason": reason,
                    "message": str(exc),
                },
            )
            return
        ps = await self.ready(partition)
        try:
            await self._wait_applied(partition, ps, cmd.get("after_offset", -1))
        except _PartitionMoved:
            return  # the partition's new owner reads this command again and answers it
        except SowstreamError as exc:
            await self.reply(
                reply_to,
                {
                    **base,
                    "command": "part_end",
                    "status": "failure",
                    "reason": "timeout",
                    "message": str(exc),
                },
            )
            return
        how = plan(self.topic, opts.filter, cmd.get("sow_keys"))
        started = time.perf_counter()
        visible = self.subs.visible(cmd.get("identity") or "")
        if opts.top_n == 0 and aggregation is None:
            # Nothing can be shown: answer at once (clients probe readiness this way, and a
            # full scan of a large partition for nothing would pile up behind their retries).
            await self.reply(reply_to, {**base, "command": "part_end", "count": 0})
            return
        async with ps.lock:
            await self._settle(ps)
            past = self._as_of(ps, bookmark) if bookmark is not None else None
            if past is not None and cmd.get("sow_keys"):
                past = {k: past[k] for k in cmd["sow_keys"] if k in past}
            records = past.values() if past is not None else None
            matched = await self._matching(ps, how, opts, visible, records)
        if self._parts.get(partition) is not ps:
            return  # revoked while reading: the new owner answers
        if aggregation is not None:
            # The client merges every partition's partial aggregates, then orders and trims.
            partials = aggregation.partial(
                body if body is not None else r.parsed() for r, body in matched
            )
            await self._send_partials(reply_to, base, partials)
            await self.reply(reply_to, {**base, "command": "part_end", "count": len(matched)})
            metrics.QUERY_SECONDS.labels(self.topic.name).observe(time.perf_counter() - started)
            return
        if opts.ordered:
            order = result_order(opts.order_by)
            matched.sort(key=lambda pair: order((pair[0].sow_key, pair[1] or {})))
            if opts.keep is not None:
                matched = matched[: opts.keep]
        await self._send_batches(reply_to, base, matched, opts.batch_size)
        await self.reply(reply_to, {**base, "command": "part_end", "count": len(matched)})
        metrics.QUERY_SECONDS.labels(self.topic.name).observe(time.perf_counter() - started)

    async def _fail(
        self, reply_to: str, base: dict[str, Any], exc: Exception, reason: str | None = None
    ) -> None:
        if reason is None:
            reason = "bad_filter" if isinstance(exc, FilterError) else "bad_option"
        await self.reply(
            reply_to,
            {
                **base,
                "command": "part_end",
                "status": "failure",
                "reason": reason,
                "message": str(exc),
            },
        )

    async def subscribe(self, cmd: dict[str, Any], partition: int) -> None:
        """Place (or replace) a subscription on one partition, with its SOW part if asked.

        Under the partition lock the subscription starts (or switches filter) and the snapshot is
        read, so on this partition every change is either in the snapshot or after its watermark,
        which ``part_end`` reports for the client to cut live messages at.
        """
        reply_to = cmd["reply_to"]
        base = {
            "answer_id": uuid.uuid4().hex[:12],
            "command_id": cmd["command_id"],
            "query_id": cmd.get("query_id") or "",
            "topic": self.topic.name,
            "partition": partition,
        }
        try:
            spec = spec_from_command(cmd)
            view = self.subs.view(spec)
            opts = validate_query(batch_size=cmd.get("batch_size") or 1)
            replace = spec.options.replace
            previous = cmd.get("previous_filter")
            old = compile_filter(previous) if replace and previous and previous.strip() else None
            bookmark = None if replace else self._bookmark(cmd)
            if bookmark is not None and self._log_reader is None:
                raise InvalidCommandError("a bookmark replay needs the transaction log")
        except (FilterError, InvalidCommandError) as exc:
            await self._fail(reply_to, base, exc)
            return
        ps = await self.ready(partition)
        try:
            await self._wait_applied(partition, ps, cmd.get("after_offset", -1))
        except _PartitionMoved:
            return
        except SowstreamError as exc:
            await self._fail(reply_to, base, exc, "timeout")
            return
        matched: list[tuple[SowRecord, dict[str, Any] | None]] = []
        leaving: list[SowRecord] = []
        async with ps.lock:
            if self._parts.get(partition) is not ps:
                return
            await self._settle(ps)
            self.subs.upsert(spec, held=self.partitions)
            await self._flush_partition([spec.key], partition, ps)
            self.subs.pin(spec, partition)
            watermark = ps.watermark
            if bookmark is not None:
                # History: the SOW part as it was at the bookmark, then the log from there, so
                # the subscriber sees what one placed at that moment saw, up to now.
                past, past_ms = self._replay_base(ps, bookmark)
                if spec.command in WITH_SOW:
                    scope = QueryOptions(view.filter, (), None, 0, opts.batch_size)
                    matched = await self._matching(
                        ps, FullScan(), scope, view.entitled, list(past.values())
                    )
                start, replayed = await self._replay(partition, past, bookmark, watermark, past_ms)
                await self.deliver(self.subs.replay(spec.key, replayed), wait=True)
                watermark = start - 1  # the client keeps messages after this: the replay on
            elif replace or spec.command in WITH_SOW:
                scope = QueryOptions(view.filter, (), None, 0, opts.batch_size)
                everything = QueryOptions(None, (), None, 0, opts.batch_size)
                if not replace:
                    matched = await self._matching(
                        ps, plan(self.topic, view.filter), scope, view.entitled
                    )
                else:
                    # Entering scope: the new SOW part; leaving scope: out of focus.
                    for rec, body in await self._matching(
                        ps, FullScan(), everything, view.entitled
                    ):
                        assert body is None
                        parsed = rec.parsed()
                        was = old is None or old.matches(parsed)
                        now = view.filter is None or view.filter.matches(parsed)
                        if now and not was:
                            matched.append((rec, parsed))
                        elif was and not now:
                            leaving.append(rec)
        # select shapes the SOW part as it shapes live messages (a window shapes its own).
        await self._send_batches(
            reply_to, base, matched, opts.batch_size, select=spec.options.select
        )
        if leaving and spec.options.oof:
            # Part of the replace's answer (not live traffic): the client shows them after the
            # records that entered.
            await self._send_batches(
                reply_to,
                {**base, "reason": OOF_MATCH},
                [(r, None) for r in leaving],
                opts.batch_size,
                command=OOF,
            )
        await self.reply(
            reply_to,
            {**base, "command": "part_end", "count": len(matched), "log_offset": watermark},
        )

    async def send_failure(self, spec: SubscriptionSpec, reason: str, text: str) -> None:
        """Tell a subscriber the engine ended its subscription, and why."""
        await self._sender.send_reply(spec.reply_to, text.encode(), failure_headers(spec, reason))

    def unsubscribe(self, key: str) -> SubscriptionSpec | None:
        """Forget a subscription (its registry tombstone arrived)."""
        return self.subs.remove(key)

    async def _send_batches(
        self,
        reply_to: str,
        base: dict[str, Any],
        matched: list[tuple[SowRecord, dict[str, Any] | None]],
        batch_size: int,
        command: str = "sow",
        select: tuple[str, ...] | None = None,
    ) -> None:
        batch: list[dict[str, Any]] = []
        size = 0
        for rank, (rec, body) in enumerate(matched):
            data = rec.data if select is None else dumps(project(body or rec.parsed(), select))
            item = {
                "sow_key": rec.sow_key,
                "data": data,
                "timestamp": rec.log_timestamp,
                "log_offset": rec.log_offset,
                "sort_rank": rank,
            }
            if batch and (len(batch) >= batch_size or size + len(data) > MAX_REPLY_BYTES):
                await self.reply(reply_to, {**base, "command": command, "records": batch})
                batch, size = [], 0
            batch.append(item)
            size += len(data) + len(rec.sow_key) + 32
        if batch:
            await self.reply(reply_to, {**base, "command": command, "records": batch})

    async def _send_partials(
        self, reply_to: str, base: dict[str, Any], partials: dict[str, Any]
    ) -> None:
        """Partial aggregates as ``partial`` replies, split by group to stay under Kafka's limit.

        Each group is serialised once, as a ``"key":state`` member of the reply's JSON object.
        """
        members: list[bytes] = []
        size = 0
        for group, state in partials.items():
            member = orjson.dumps(group) + b":" + orjson.dumps(state)
            if members and size + len(member) > MAX_REPLY_BYTES:
                await self._reply_partial(reply_to, base, members)
                members, size = [], 0
            members.append(member)
            size += len(member) + 1
        if members:
            await self._reply_partial(reply_to, base, members)

    async def _reply_partial(
        self, reply_to: str, base: dict[str, Any], members: list[bytes]
    ) -> None:
        data = b"{" + b",".join(members) + b"}"
        record = {"sow_key": "", "data": data, "timestamp": 0, "log_offset": -1}
        await self.reply(reply_to, {**base, "command": "partial", "records": [record]})

    async def _wait_applied(self, partition: int, ps: PartitionState, offset: int) -> None:
        if offset < 0 or ps.watermark >= offset:
            return
        deadline = time.monotonic() + APPLIED_WAIT_SECONDS
        async with ps.applied:
            while ps.watermark < offset:
                if self._parts.get(partition) is not ps:
                    raise _PartitionMoved
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SowstreamError(
                        f"topic {self.topic.name!r}: the log was not applied up to offset "
                        f"{offset} within {APPLIED_WAIT_SECONDS:.0f}s"
                    )
                try:
                    await asyncio.wait_for(ps.applied.wait(), remaining)
                except TimeoutError:
                    continue


def aggregation_of(cmd: dict[str, Any]) -> Aggregation | None:
    """The aggregation a ``sow`` command asks for with grouping/projection (or None)."""
    options = cmd.get("options") or {}
    grouping, projection = options.get("grouping"), options.get("projection")
    if grouping is None and projection is None:
        return None
    return parse_aggregation(grouping, projection)


def spec_from_command(cmd: dict[str, Any]) -> SubscriptionSpec:
    """The subscription a control-topic command asks for (InvalidCommandError if malformed)."""
    if not cmd.get("sub_id"):
        raise InvalidCommandError(f"{cmd['command']} needs a subscription id (SubId)")
    return SubscriptionSpec(
        sub_id=cmd["sub_id"],
        reply_to=cmd["reply_to"],
        topic=cmd["topic"],
        command=cmd["command"],
        filter=cmd.get("filter"),
        options=parse_options(cmd.get("sub_options") or ""),
        identity=cmd.get("identity") or "",
        order_by=cmd.get("order_by"),
    )


class _PartitionMoved(Exception):
    """The partition was revoked while a command waited for it."""


def live_headers(d: Delivery) -> list[tuple[str, bytes]]:
    """Kafka headers of a live subscription message (documented in docs/protocol.md)."""
    pairs = [
        (h.COMMAND, d.command.encode()),
        (h.SUB_ID, d.spec.sub_id.encode()),
        (h.TOPIC, d.spec.topic.encode()),
        (h.PARTITION, str(d.partition).encode()),
        (h.OFFSET, str(d.offset).encode()),
        (h.TIMESTAMP, str(d.timestamp).encode()),
    ]
    if not d.spec.options.no_sowkey:
        pairs.append((h.SOW_KEY, d.sow_key.encode()))
    if d.reason:
        pairs.append((h.REASON, d.reason.encode()))
    if d.is_delta:
        pairs.append((h.DELTA, b"1"))
    if d.seq:
        pairs.append((h.SEQ, str(d.seq).encode()))
    return pairs


def failure_headers(spec: SubscriptionSpec, reason: str) -> list[tuple[str, bytes]]:
    """Headers of the message that tells a client the engine ended its subscription."""
    return [
        (h.COMMAND, FAILURE.encode()),
        (h.SUB_ID, spec.sub_id.encode()),
        (h.TOPIC, spec.topic.encode()),
        (h.REASON, reason.encode()),
    ]


def _now_ms() -> int:
    return int(time.time() * 1000)
