"""The partitions of one topic that this worker holds, and what every stage does with them.

A :class:`PartitionTable` owns the :class:`~sowstream.engine.partition.PartitionState` of each
held partition (store, lock, watermarks, in-flight batches, memo indexes, expiry schedule) and
the operations on them that more than one stage needs: waiting until a partition is settled or
applied far enough, reading records through the in-flight overlays, planning and running the
reads of a query, and writing a batch of records with its index entries. The stages (apply,
ownership, queries, placement, maintenance) receive the table; none keeps partition state of its
own.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from itertools import chain, islice
from operator import itemgetter
from typing import Any

from sowstream.config.models import TopicConfig
from sowstream.engine import memo, metrics
from sowstream.engine.partition import (
    APPLIED_WAIT_SECONDS,
    ESTIMATE_CAP,
    SCAN_YIELD_EVERY,
    PartitionMoved,
    PartitionState,
)
from sowstream.engine.ports import Sender, wall_clock_ms
from sowstream.engine.store import (
    FAUST_OFFSET_KEY,
    RECORDS_START,
    WATERMARK_KEY,
    PartitionStore,
    is_record_key,
)
from sowstream.errors import InvalidCommandError, SowstreamError, StateStoreError
from sowstream.filters import Filter
from sowstream.sow.compiled import CompiledTopic
from sowstream.sow.expiration import processes_expiration
from sowstream.sow.history import Version, version_changes
from sowstream.sow.keys import same_values
from sowstream.sow.layout import index_entries
from sowstream.sow.memo import memo_entries
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
from sowstream.sow.record import (
    EXPIRING,
    PLAIN,
    SowRecord,
    normalised,
    stored_body,
    stored_expiration,
)

log = logging.getLogger("sowstream.engine")
STORED_FORMS = (PLAIN, EXPIRING)  # the markers of format 1 (sow.record), which Rust reads

_FIRST = itemgetter(0)  # a stored value's first byte: its format marker
_FORMAT_1 = bytes((PLAIN, EXPIRING))  # the markers of format 1 (anything else is Avro)


class PartitionTable:
    """The held partitions of one topic: their states, reads, index planning and batch writes."""

    def __init__(
        self,
        compiled: CompiledTopic[TopicConfig],
        sender: Sender,
        new_store: Callable[[int], PartitionStore],
        *,
        backed: bool = False,
    ) -> None:
        """``new_store`` makes a partition's store when it is first held; ``backed``: a faust
        table keeps this topic's stores (a plain topic then stores its queues and position)."""
        topic = compiled.definition
        self.topic = topic
        self.compiled = compiled  # its message type and stages, for the stages that read bodies
        self.backed = backed
        self.parse = compiled.codec.parse  # bound once: the scan and match loops call it per record
        self.expires = processes_expiration(topic.expiration)
        self.history = topic.history if topic.sow else None
        self.index_fields = [tuple(f) for f in topic.hash_indexes]
        self.index_paths = tuple(dict.fromkeys(p for f in self.index_fields for p in f))
        self._sender = sender  # memo index builds go to the changelog through it
        self._new_store = new_store
        self._parts: dict[int, PartitionState] = {}

    # -- which partitions are held --------------------------------------------------------------

    def get(self, partition: int) -> PartitionState | None:
        """The partition's current state, None when it is not held."""
        return self._parts.get(partition)

    def open(self, partition: int) -> PartitionState:
        """The partition's state, made (with a new store, not loaded yet) when not held."""
        ps = self._parts.get(partition)
        if ps is None:
            ps = self._parts[partition] = PartitionState(self._new_store(partition))
        return ps

    def remove(self, partition: int, ps: PartitionState | None = None) -> PartitionState | None:
        """Stop holding ``partition`` (only if its state is still ``ps``, when given); returns
        the state removed."""
        if ps is not None and self._parts.get(partition) is not ps:
            return None
        return self._parts.pop(partition, None)

    def holds(self, partition: int, ps: PartitionState) -> bool:
        """Whether ``ps`` is still this worker's state of ``partition`` (not revoked)."""
        return self._parts.get(partition) is ps

    def holder(self, partition: int, ps: PartitionState) -> Callable[[], bool]:
        """:meth:`holds` for later: long jobs (memo builds) check it between steps."""
        return lambda: self._parts.get(partition) is ps

    def states(self) -> list[tuple[int, PartitionState]]:
        """The held partitions with their states, as of now (a copy: callers await)."""
        return list(self._parts.items())

    @property
    def partitions(self) -> list[int]:
        """Partitions this worker currently holds state for."""
        return sorted(self._parts)

    # -- waiting ---------------------------------------------------------------------------------

    async def settle(self, ps: PartitionState, keep: int = 0) -> None:
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

    async def wait_applied(self, partition: int, ps: PartitionState, offset: int) -> None:
        """Wait until ``ps`` has stored the log up to ``offset`` (PartitionMoved when it is
        revoked meanwhile, SowstreamError after APPLIED_WAIT_SECONDS)."""
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

    # -- reading records -------------------------------------------------------------------------

    def load_record(
        self, ps: PartitionState, overlay: dict[bytes, SowRecord | None], key: bytes
    ) -> SowRecord | None:
        """The record under ``key``: from ``overlay`` (the batch being folded), else the newest
        batch in flight that has it, else the store."""
        if key in overlay:
            return overlay[key]
        for flight in reversed(ps.in_flight):
            if key in flight.outcome.overlay:
                return flight.outcome.overlay[key]
        raw = ps.store.get(key)
        return SowRecord.from_bytes(raw) if raw is not None else None

    def load_many(
        self, ps: PartitionState, overlay: dict[bytes, SowRecord | None], keys: list[bytes]
    ) -> list[SowRecord | bytes | None]:
        """The records under ``keys`` as :meth:`load_record` finds them, those read from the
        store (in one multi-get) in their stored form, unless it is an old (Avro) one."""
        out: list[SowRecord | bytes | None] = []
        missing: list[int] = []
        flights = [flight.outcome.overlay for flight in reversed(ps.in_flight)]
        for key in keys:
            if key in overlay:
                out.append(overlay[key])
                continue
            for held in flights:
                if key in held:
                    out.append(held[key])
                    break
            else:
                missing.append(len(out))
                out.append(None)
        if missing:
            raws = ps.store.get_many([keys[i] for i in missing])
            for i, raw in zip(missing, raws, strict=True):
                if raw is not None and raw[0] not in STORED_FORMS:
                    out[i] = SowRecord.from_bytes(raw)
                else:
                    out[i] = raw
        return out

    def current_record(self, partition: int, sow_key: str) -> SowRecord | None:
        """The record ``partition`` holds under ``sow_key`` now, batches in flight included."""
        ps = self._parts.get(partition)
        return self.load_record(ps, {}, sow_key.encode()) if ps is not None else None

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

    async def build_memo(self, partition: int, ps: PartitionState, path: str) -> None:
        """Build the memo index on ``path`` (under the partition lock, nothing in flight)."""
        started = time.perf_counter()
        try:
            built = await memo.build(
                ps.store, path, self._sender, self.holder(partition, ps), self.compiled.codec
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

    async def drop_memo(self, partition: int, ps: PartitionState, path: str) -> None:
        """Drop the memo index on ``path`` from the store (under the partition lock)."""
        await memo.drop(ps.store, path, self._sender, self.holder(partition, ps))

    async def query_plan(
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
            await self.build_memo(partition, ps, path)
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

    def candidate_keys(
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

    async def matching(
        self,
        ps: PartitionState,
        how: Plan,
        opts: QueryOptions,
        visible: Filter | None = None,
        records: Iterable[SowRecord] | None = None,
        scope: NameScope | None = None,
        *,
        unswept: bool = False,
    ) -> list[tuple[SowRecord, dict[str, Any] | None]]:
        """Records of the partition that match (and ``visible`` allows), read under its lock.

        ``records`` replaces the stored state (a historical query passes the state as of then);
        on a Pattern topic only the records in ``scope`` are read.
        """
        if records is not None and scope is not None:
            records = [r for r in records if scope.admits(r.sow_key)]
        out: list[tuple[SowRecord, dict[str, Any] | None]] = []
        flt = opts.filter
        parse = self.parse
        need_parsed = flt is not None or visible is not None or bool(opts.order_by)
        # An expired record may still wait for its removal to come through the log: a query
        # never shows it, a subscription's SOW part (``unswept``) does, since the removal's oof
        # follows in the subscription's stream.
        now = wall_clock_ms() if self.expires and not unswept else None
        seen = 0
        for rec in records if records is not None else self._stored(ps, how, scope):
            seen += 1
            if seen % SCAN_YIELD_EVERY == 0:
                await asyncio.sleep(0)
            if now is not None and rec.expiration is not None and rec.expiration <= now:
                continue
            parsed = parse(rec.data) if need_parsed else None
            if flt is not None and not flt.matches(parsed):  # type: ignore[arg-type]
                continue
            if visible is not None and not visible.matches(parsed):  # type: ignore[arg-type]
                continue
            out.append((rec, parsed))
        return out

    async def matching_raw(
        self,
        ps: PartitionState,
        how: Plan,
        opts: QueryOptions,
        visible: Filter | None = None,
        records: Iterable[SowRecord] | None = None,
        scope: NameScope | None = None,
        *,
        unswept: bool = False,
    ) -> tuple[list[bytes], list[dict[str, Any]] | None]:
        """:meth:`matching` as stored values (format 1), for raw scans: the values that match,
        and their parsed bodies when a filter, an entitlement or OrderBy needed them (None
        otherwise). A body is parsed only for those; nothing else of a record is decoded.
        """
        if records is not None:
            admitted = (r for r in records if scope is None or scope.admits(r.sow_key))
            source: Iterator[bytes] = (r.to_bytes() for r in admitted)
        else:
            source = self._stored_raw(ps, how, scope)
        flt = opts.filter
        need_parsed = flt is not None or visible is not None or bool(opts.order_by)
        # An expired record may still wait for its removal to come through the log: a query
        # never shows it, a subscription's SOW part (``unswept``) does, since the removal's oof
        # follows in the subscription's stream.
        now = wall_clock_ms() if self.expires and not unswept else None
        values: list[bytes] = []
        bodies: list[dict[str, Any]] | None = [] if need_parsed else None
        parse = self.parse
        # In chunks, checked in bulk: a full scan of plain records costs no Python per record.
        while chunk := list(islice(source, SCAN_YIELD_EVERY)):
            markers = bytes(map(_FIRST, chunk))
            if markers.translate(None, _FORMAT_1):
                chunk = [normalised(v) for v in chunk]  # a store written before format 1
                markers = bytes(map(_FIRST, chunk))
            if now is not None and EXPIRING in markers:
                chunk = [v for v in chunk if (e := stored_expiration(v)) is None or e > now]
            if bodies is None:
                values.extend(chunk)
            else:
                for value in chunk:
                    parsed = parse(stored_body(value))
                    if flt is not None and not flt.matches(parsed):
                        continue
                    if visible is not None and not visible.matches(parsed):
                        continue
                    values.append(value)
                    bodies.append(parsed)
            await asyncio.sleep(0)
        return values, bodies

    def _stored_raw(
        self, ps: PartitionState, how: Plan, scope: NameScope | None = None
    ) -> Iterator[bytes]:
        """:meth:`_stored` as the values in the store (a full scan's values come straight from
        the store's iterators: no Python runs per record here)."""
        if not isinstance(how, FullScan):
            return self._looked_up(ps, how, scope)
        if scope is None:
            # Every record key lies past the reserved and index keys, except faust's offset.
            store = ps.store
            return chain(
                store.values(RECORDS_START, FAUST_OFFSET_KEY),
                store.values(FAUST_OFFSET_KEY + b"\x00", None),
            )
        pairs = ps.store.scan(prefix=scope.prefix) if scope.prefix else ps.store.scan()
        return (raw for key, raw in pairs if is_record_key(key) and scope.admits_stored(key))

    def _looked_up(self, ps: PartitionState, how: Plan, scope: NameScope | None) -> Iterator[bytes]:
        """The stored values of the records a lookup plan names."""
        for key in self.candidate_keys(ps, how, scope):
            value = ps.store.get(key)
            if value is not None:
                yield value

    def _stored(
        self, ps: PartitionState, how: Plan, scope: NameScope | None = None
    ) -> Iterator[SowRecord]:
        """The records ``how`` reads, decoded (:meth:`_stored_raw` as records)."""
        return map(SowRecord.from_bytes, self._stored_raw(ps, how, scope))

    # -- writing records -------------------------------------------------------------------------

    def index_entries(
        self, key: bytes, body: dict[str, Any] | None, memo_fields: Iterable[str] = ()
    ) -> set[bytes]:
        """Hash-index and memo-index entries of a record's body (None: no record)."""
        entries = index_entries(self.index_fields, key, body)
        if memo_fields:
            entries |= memo_entries(memo_fields, key, body)
        return entries

    def index_changes(
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
        old_body = self.parse(old.data) if old is not None else None
        if new is None:
            new_body = None
        elif new_body is None:
            new_body = self.parse(new.data)
        if (
            old_body is not None
            and new_body is not None
            and same_values(self.index_paths, old_body, new_body)
            and same_values(memo_fields, old_body, new_body)
        ):
            return  # the usual update: no indexed value changed, so neither did an entry
        old_entries = self.index_entries(key, old_body, memo_fields)
        new_entries = self.index_entries(key, new_body, memo_fields)
        for entry in old_entries - new_entries:
            changes[entry] = None
        for entry in new_entries - old_entries:
            changes[entry] = b""

    def batch_changes(
        self,
        ps: PartitionState,
        overlay: dict[bytes, SowRecord | None],
        before: dict[bytes, SowRecord | None],
        watermark: int | None = None,
        versions: Sequence[Version] = (),
        journal: Mapping[bytes, bytes | None] | None = None,
        position: Mapping[bytes, bytes | None] | None = None,
        bodies: Mapping[bytes, dict[str, Any]] | None = None,
        encoded: Mapping[bytes, bytes | None] | None = None,
        index_same: AbstractSet[bytes] = frozenset(),
    ) -> dict[bytes, bytes | None]:
        """A batch's final records (and index entries) as one store batch, for the changelog
        and then :meth:`write`; ``encoded`` holds the stored form of every overlay record when
        the compiled fold made them, and ``index_same`` the keys whose indexed values it found
        unchanged (no entry changes).

        A log batch passes its highest offset: it is written last, so a changelog prefix that
        holds the watermark holds the whole batch. Expiry deletes change no watermark.
        """
        changes: dict[bytes, bytes | None] = {}
        indexed = bool(self.index_fields or ps.memo)
        for key, new in overlay.items():
            if indexed and key not in index_same:
                body = bodies.get(key) if bodies else None
                self.index_changes(changes, key, before.get(key), new, ps.memo, body)
            if encoded is not None:
                changes[key] = encoded[key]
            else:
                changes[key] = new.to_bytes() if new is not None else None
        if versions and self.history is not None:
            for key, value in version_changes(self.history, versions).items():
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
            # The watermark goes last; its record's fingerprint with it (see sow.logcheck).
            changes.update(position or {WATERMARK_KEY: str(watermark).encode()})
        return changes

    def write(
        self,
        ps: PartitionState,
        changes: Mapping[bytes, bytes | None],
        overlay: Mapping[bytes, SowRecord | None],
        watermark: int | None,
    ) -> None:
        """Write a batch's ``changes`` (made by :meth:`batch_changes`) into the store and take
        up its records' expirations and its watermark."""
        ps.store.write(changes)
        if self.expires:
            for key, new in overlay.items():
                if new is not None and new.expiration is not None:
                    heapq.heappush(ps.expiry, (new.expiration, key))
        if watermark is not None:
            ps.watermark = watermark
