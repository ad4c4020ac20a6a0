"""A topic processor's partitions: their state, how it is read, and what every stage shares.

The stages of the processor (apply, ownership, queries, placement, maintenance) are layers of
one class, each in its own module; this base holds the per-partition state, the store reads and
index planning they all use, and the way replies and messages leave the worker.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sowstream.config.models import TopicConfig
from sowstream.engine import memo, metrics
from sowstream.engine.store import (
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
from sowstream.filters import Filter
from sowstream.sow.expiration import processes_expiration
from sowstream.sow.history import Version
from sowstream.sow.keys import same_values
from sowstream.sow.layout import index_entries
from sowstream.sow.memo import memo_entries
from sowstream.sow.ops import RawRecord, parse_body, resolve_sow_key
from sowstream.sow.patterns import NameScope
from sowstream.sow.planner import (
    FullScan,
    IndexLookup,
    KeyLookup,
    MemoLookup,
    Plan,
    UnionLookup,
    describe,
    memo_paths,
    plan,
    plan_name,
)
from sowstream.sow.query import QueryOptions
from sowstream.sow.record import SowRecord
from sowstream.subscriptions.matcher import EntitlementLookup, TopicSubscriptions
from sowstream.subscriptions.model import Change, Delivery
from sowstream.wire import headers as h
from sowstream.wire.avro import encode
from sowstream.wire.topics import TopicNames

if TYPE_CHECKING:
    from sowstream.engine.queues import QueueRuntime
    from sowstream.views.conflated import ConflatedFeed
    from sowstream.views.routing import ViewFeed

log = logging.getLogger("sowstream.engine")

# Kafka's default max message size is 1 MB; stay well under it when packing a reply batch.
MAX_REPLY_BYTES = 900_000
SCAN_YIELD_EVERY = 5_000
REPLICATE_YIELD_EVERY = 256  # records sent before the event loop gets a turn
APPLIED_WAIT_SECONDS = 30.0
DELIVERY_WAIT_SECONDS = 10.0
HISTORY_PRUNE_SECONDS = 60.0
# Batches of a partition whose subscription messages may be in flight at once (see process()).
MAX_IN_FLIGHT = 4
# Entries counted at most per memo lookup when choosing the most selective conjunct of an AND.
ESTIMATE_CAP = 10_000


class LogReader(Protocol):
    """Reads a log partition directly, for rebuilding state that is not in a changelog."""

    async def end_offset(self, partition: int) -> int:
        """Offset of the last record in the partition (-1 when empty)."""

    def batches(self, partition: int, until: int, start: int = 0) -> AsyncIterator[list[RawRecord]]:
        """The partition's records from ``start`` (default: the beginning) up to ``until``."""

    async def offset_for_time(self, partition: int, at_ms: int) -> int:
        """The first offset whose log time is at or after ``at_ms`` (the end if none is)."""

    async def start_offset(self, partition: int) -> int:
        """Offset of the first record the partition still holds (its end when empty)."""


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

    async def send_many(
        self, topic: str, partition: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> list[tuple[asyncio.Future[Any], int]]:
        """Queue ``(key, value)`` records for one partition, in order, in as few Kafka batches
        as they fit; returns each batch's delivery future (whose result's ``offset`` is the
        batch's first) with its number of records. By default one send per record."""
        out: list[tuple[asyncio.Future[Any], int]] = []
        for i, (key, value) in enumerate(records, 1):
            fut = await self.send(topic, value, key=key, partition=partition)
            if fut is not None:
                out.append((fut, 1))
            if i % REPLICATE_YIELD_EVERY == 0:
                await asyncio.sleep(0)  # many records must not hold the event loop
        return out


@dataclass
class Outcome:
    """What applying a batch produced: store changes to replicate, then messages to send."""

    changes: dict[bytes, bytes | None] = field(default_factory=dict)
    overlay: dict[bytes, SowRecord | None] = field(default_factory=dict)
    before: dict[bytes, SowRecord | None] = field(default_factory=dict)
    # The parsed body of an overlay record where the fold had it (a publish stored as sent),
    # so writing the batch's index entries does not parse it again.
    bodies: dict[bytes, dict[str, Any]] = field(default_factory=dict)
    last: int = -1
    last_record: RawRecord | None = None  # the record at ``last``: its fingerprint is stored
    events: list[Change] = field(default_factory=list)
    rekeys: list[tuple[str, RawRecord]] = field(default_factory=list)
    dead: list[tuple[RawRecord, InvalidMessageError]] = field(default_factory=list)
    acks: list[tuple[RawRecord, int, str, str, str]] = field(default_factory=list)
    versions: list[Version] = field(default_factory=list)
    journal: dict[bytes, bytes | None] = field(default_factory=dict)  # conflation journal, queues
    # Applied publishes for queues: (offset, timestamp, data, body, expiration ms or None).
    enqueued: list[tuple[int, int, bytes, dict[str, Any], int | None]] = field(default_factory=list)
    stored: bool = False  # set once the batch is stored and its changelog records are in Kafka


@dataclass
class InFlight:
    """A folded batch whose messages are sent but not yet acknowledged by Kafka.

    ``sent``: subscribers' messages, waited for a bounded time (a client may be gone);
    ``required``: the change events of views and conflated topics, which must all be in Kafka
    before the batch is stored, or a view would miss the change for good.
    """

    outcome: Outcome
    sent: list[asyncio.Future[Any]]
    required: list[asyncio.Future[Any]] = field(default_factory=list)


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
    in_flight: deque[InFlight] = field(default_factory=deque)
    committer: asyncio.Task[None] | None = None
    failure: Exception | None = None  # why storing a batch failed; the partition is unusable
    memo: set[str] = field(default_factory=set)  # fields whose memo index is complete and kept

    async def wake(self) -> None:
        """Wake everyone waiting on this partition's progress (they re-check what they need)."""
        async with self.applied:
            self.applied.notify_all()


class PartitionMoved(Exception):
    """The partition was revoked while a command waited for it."""


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class ProcessorBase:
    """The state and shared reads of one topic's processor; see :class:`TopicProcessor`."""

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
        self.codec = topic.codec
        self._parse = self.codec.parse  # bound once: the scan and match loops call it per record
        self.subs = TopicSubscriptions(
            topic, entitlement, current=self._current_record if topic.sow else None
        )
        # Queues whose underlying topics include this one (set up by the engine).
        self.queues: list[QueueRuntime] = []
        # Views and conflated topics reading this topic (set up by the engine): each applied
        # change goes to them.
        self.views: list[ViewFeed | ConflatedFeed] = []
        # Set when this topic is a view or conflated topic: only its maintainer writes the log.
        self.view_name: str | None = None
        self.names = names
        self.log_topic = names.log(topic.name, topic.message_type)
        self._sender = sender
        self._table = table
        self._log_reader = log_reader
        self._parts: dict[int, PartitionState] = {}
        self._expires = processes_expiration(topic.expiration)
        self._index_fields = [tuple(f) for f in topic.hash_indexes]
        self._index_paths = tuple(dict.fromkeys(p for f in self._index_fields for p in f))
        self._history = topic.history if topic.sow else None
        self._pruned_at = 0.0

    def scope(
        self, topic_regex: str | None, sow_keys: Iterable[str] | None = None
    ) -> NameScope | None:
        """Which records a command reads, on a Pattern topic (None elsewhere: every record, the
        SowKeys being looked up directly). InvalidCommandError for a regex that does not compile.
        """
        if self.topic.pattern is None:
            return None
        try:
            return NameScope(topic_regex, frozenset(sow_keys) if sow_keys is not None else None)
        except re.error as exc:
            raise InvalidCommandError(
                f"topic pattern {topic_regex!r} is not a valid regular expression: {exc}"
            ) from None

    def _new_store(self, partition: int) -> PartitionStore:
        if self.topic.durability == "transient" or self._table is None:
            return MemoryPartition()
        return RocksPartition(self._table, partition)

    async def drop(self, partitions: Iterable[int]) -> None:
        """Forget partitions taken away by a rebalance (their state stays in Kafka/RocksDB)."""
        for p in partitions:
            self._forget(p)
            ps = self._parts.pop(p, None)
            if ps is not None:
                await ps.wake()  # queries waiting on it give up

    def _forget(self, partition: int) -> None:
        """Drop what the subscriptions and queues hold of ``partition``."""
        self.subs.drop_partition(partition)
        for queue in self.queues:
            queue.drop(self.topic.name, partition)

    def state(self, partition: int) -> PartitionState | None:
        """The partition's current state, None when it is not held."""
        return self._parts.get(partition)

    @property
    def partitions(self) -> list[int]:
        """Partitions this worker currently holds state for."""
        return sorted(self._parts)

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
        body = parse_body(self.topic, rec.value, delta=command == h.DELTA_PUBLISH)
        if not self.topic.user_supplied_keys:
            return resolve_sow_key(self.topic, body, None)
        return rec.key.decode("utf-8", "replace") if rec.key else f"{rec.partition}-{rec.offset}"

    def _index_entries(
        self, key: bytes, body: dict[str, Any] | None, memo_fields: Iterable[str] = ()
    ) -> set[bytes]:
        """Hash-index and memo-index entries of a record's body (None: no record)."""
        entries = index_entries(self._index_fields, key, body)
        if memo_fields:
            entries |= memo_entries(memo_fields, key, body)
        return entries

    def _index_changes(
        self,
        changes: dict[bytes, bytes | None],
        key: bytes,
        old: SowRecord | None,
        new: SowRecord | None,
        memo_fields: Iterable[str] = (),
        new_body: dict[str, Any] | None = None,
    ) -> None:
        """Add the index entries to delete and to write when ``old`` becomes ``new`` (each
        record parsed once for both kinds of index; ``new_body`` is ``new`` already parsed)."""
        old_body = self._parse(old.data) if old is not None else None
        if new is None:
            new_body = None
        elif new_body is None:
            new_body = self._parse(new.data)
        if (
            old_body is not None
            and new_body is not None
            and same_values(self._index_paths, old_body, new_body)
            and same_values(memo_fields, old_body, new_body)
        ):
            return  # the usual update: no indexed value changed, so neither did an entry
        old_entries = self._index_entries(key, old_body, memo_fields)
        new_entries = self._index_entries(key, new_body, memo_fields)
        for entry in old_entries - new_entries:
            changes[entry] = None
        for entry in new_entries - old_entries:
            changes[entry] = b""

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

    async def feed_views(self, changes: Sequence[Change]) -> list[asyncio.Future[Any]]:
        """Send the change events of ``changes`` to the input topics of the views reading this
        topic; returns their delivery futures (the batch is stored once Kafka has them).

        Events go out per input partition in Kafka batches (``send_many``), in the order the
        changes were applied: a send per event cost several times more event-loop time.
        A change re-announced after a crash (``resent``) sends nothing: its events were
        acknowledged before its result was stored, which is how it came to be stored.
        """
        pending: dict[tuple[str, int], list[tuple[bytes, bytes | None]]] = {}
        codec = self.codec
        for change in changes:
            if change.resent:
                continue
            before = change.before_body(codec)
            after = change.after_body(codec)
            source = (self.topic.ident, change.partition, change.offset, change.seq)
            for feed in self.views:
                for event in feed.events(change.sow_key, before, after, source):
                    pending.setdefault((feed.input_topic, event.partition), []).append(
                        (event.key, event.value)
                    )
        futures: list[asyncio.Future[Any]] = []
        for (topic, partition), events in pending.items():
            futures.extend(fut for fut, _ in await self._sender.send_many(topic, partition, events))
            metrics.VIEW_EVENTS.labels(self.topic.name).inc(len(events))
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

    def _current_record(self, partition: int, sow_key: str) -> SowRecord | None:
        """The record ``partition`` holds under ``sow_key`` now, batches in flight included."""
        ps = self._parts.get(partition)
        return self._load_record(ps, {}, sow_key.encode()) if ps is not None else None

    def _holds(self, partition: int, ps: PartitionState) -> Callable[[], bool]:
        """Whether ``ps`` is still this worker's state of ``partition`` (not revoked)."""
        return lambda: self._parts.get(partition) is ps

    async def _build_memo(self, partition: int, ps: PartitionState, path: str) -> None:
        """Build the memo index on ``path`` (under the partition lock, nothing in flight)."""
        started = time.perf_counter()
        try:
            built = await memo.build(
                ps.store, path, self._sender, self._holds(partition, ps), self.topic.codec
            )
        except SowstreamError as exc:
            # The store refused the writes (disk full, ...): queries scan instead, and the index
            # (still marked as building) is built again by the next query that needs it.
            log.error(
                "topic %s partition %d: building the memo index on %s failed, scanning instead: %s",
                self.topic.name,
                partition,
                path,
                exc,
            )
            return
        if built:
            ps.memo.add(path)
            metrics.MEMO_BUILDS.labels(self.topic.name).inc()
            log.info(
                "topic %s partition %d: memo index on %s built in %.3fs",
                self.topic.name,
                partition,
                path,
                time.perf_counter() - started,
            )

    async def _query_plan(
        self,
        partition: int,
        ps: PartitionState,
        flt: Filter | None,
        sow_keys: Sequence[str] | None = None,
        scope: NameScope | None = None,
    ) -> Plan:
        """Plan a query under the partition lock, building the memo indexes it needs first.

        A range, BEGINS WITH, ENDS WITH or LIKE on a field without a memo index builds one
        here, on the query that first needs it; afterwards every write keeps it current.
        """

        def estimate(lookup: MemoLookup) -> int:
            return memo.count(ps.store, lookup, ESTIMATE_CAP)

        how = plan(
            self.topic,
            flt,
            sow_keys,
            memo_ready=ps.memo,
            memo_auto=True,
            estimate=estimate,
            scope=scope,
        )
        for path in sorted(memo_paths(how) - ps.memo):
            await self._build_memo(partition, ps, path)
        if not memo_paths(how) <= ps.memo:
            how = FullScan()  # a build gave up (the partition moved): the scan is always right
        metrics.QUERY_PLANS.labels(self.topic.name, plan_name(how)).inc()
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "topic %s partition %d: filter %r answered by %s",
                self.topic.name,
                partition,
                flt.text if flt is not None else None,
                describe(how),
            )
        return how

    def _candidate_keys(
        self, ps: PartitionState, how: Plan, scope: NameScope | None = None
    ) -> Iterator[bytes]:
        """Store keys of the records ``how`` reads; on a Pattern topic only those in ``scope``."""
        keys = self._lookup_keys(ps, how, scope.prefix if scope is not None else b"")
        if scope is None:
            yield from keys
        else:
            yield from (key for key in keys if scope.admits_stored(key))

    def _lookup_keys(self, ps: PartitionState, how: Plan, prefix: bytes) -> Iterator[bytes]:
        if isinstance(how, KeyLookup):
            yield from (k.encode() for k in how.sow_keys)
        elif isinstance(how, IndexLookup):
            for prefix in how.prefixes:
                for entry, _ in ps.store.scan(prefix=prefix):
                    yield entry[len(prefix) :]
        elif isinstance(how, MemoLookup):
            # Key order, repeats dropped: the records come out as a scan would give them.
            yield from sorted(set(memo.candidates(ps.store, how)))
        elif isinstance(how, UnionLookup):
            keys: set[bytes] = set()
            for part in how.parts:
                keys.update(self._lookup_keys(ps, part, prefix))
            yield from sorted(keys)
        else:
            # One name of a Pattern topic: its records lie together, under the name's prefix.
            for key, _ in ps.store.scan(prefix=prefix) if prefix else ps.store.scan():
                if is_record_key(key):
                    yield key

    async def _matching(
        self,
        ps: PartitionState,
        how: Plan,
        opts: QueryOptions,
        visible: Filter | None = None,
        records: Iterable[SowRecord] | None = None,
        scope: NameScope | None = None,
    ) -> list[tuple[SowRecord, dict[str, Any] | None]]:
        """Records of the partition that match (and ``visible`` allows), read under its lock.

        ``records`` replaces the stored state (a historical query passes the state as of then);
        on a Pattern topic only the records in ``scope`` are read.
        """
        if records is not None and scope is not None:
            records = [r for r in records if scope.admits(r.sow_key)]
        out: list[tuple[SowRecord, dict[str, Any] | None]] = []
        flt = opts.filter
        need_parsed = flt is not None or visible is not None or bool(opts.order_by)
        # An expired record may still wait for the next expiry sweep; never show it.
        now = wall_clock_ms() if self._expires else None
        seen = 0
        for rec in records if records is not None else self._stored(ps, how, scope):
            seen += 1
            if seen % SCAN_YIELD_EVERY == 0:
                await asyncio.sleep(0)
            if now is not None and rec.expiration is not None and rec.expiration <= now:
                continue
            parsed = self._parse(rec.data) if need_parsed else None
            if flt is not None and not flt.matches(parsed):  # type: ignore[arg-type]
                continue
            if visible is not None and not visible.matches(parsed):  # type: ignore[arg-type]
                continue
            out.append((rec, parsed))
        return out

    def _stored(
        self, ps: PartitionState, how: Plan, scope: NameScope | None = None
    ) -> Iterator[SowRecord]:
        if isinstance(how, FullScan):
            prefix = scope.prefix if scope is not None else b""
            for key, raw in ps.store.scan(prefix=prefix) if prefix else ps.store.scan():
                if is_record_key(key) and (scope is None or scope.admits_stored(key)):
                    yield SowRecord.from_bytes(raw)
            return
        for key in self._candidate_keys(ps, how, scope):
            value = ps.store.get(key)
            if value is not None:
                yield SowRecord.from_bytes(value)

    async def _wait_applied(self, partition: int, ps: PartitionState, offset: int) -> None:
        if offset < 0 or ps.watermark >= offset:
            return
        deadline = time.monotonic() + APPLIED_WAIT_SECONDS
        async with ps.applied:
            while ps.watermark < offset:
                if self._parts.get(partition) is not ps:
                    raise PartitionMoved
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


def live_headers(d: Delivery) -> list[tuple[str, bytes]]:
    """Kafka headers of a live subscription message (documented in docs/protocol.md)."""
    pairs = [
        (h.COMMAND, d.command.encode()),
        (h.SUB_ID, d.spec.sub_id.encode()),
        (h.TOPIC, (d.topic or d.spec.topic).encode()),
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
