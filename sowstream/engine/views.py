"""Maintained views on a worker: a view's input topic in, the view's own log out.

Each view has an input topic (``<prefix>.view-in.<view>``) that the processors of its
underlying topics fill with change events (``sowstream.views.routing``), an input pump that
reads it in batches (``engine.inputs``), and a table (RocksDB, replicated to its changelog)
that keeps, per input partition, the :class:`~sowstream.views.maintainer.ViewMaintainer`
state: one entry per group and per joined row, the position of the last event taken from each
source partition, and the input offset applied (the *watermark*, written last in each batch).

A batch of events is applied in input order; the view records it creates, changes or deletes
are produced to the view's log (publishes keyed by the record's SowKey, ``sow_delete`` for a
group that emptied, each marked with the ``sow.view`` header; in Kafka batches per log
partition), and only once Kafka has acknowledged them is the state stored: each group and
joined row the batch touched once, in its last state (the record cache of Kafka Streams; every
change still goes out to the log, as ``Conflation: none`` promises subscribers). The view's own
topic processor then applies its log like any SOW topic, so readers get ``sow``,
subscriptions, deltas, ``oof`` and views over the view.

At-least-once, made exact: a crash can lose state writes, never acknowledged outputs. The input
is read again from the stored watermark (any offset missing from what the pump hands over, at a
batch's start or inside it, is fetched from the topic directly), so no event is lost; events at
or below the watermark are skipped, and events an underlying worker produced twice (it replayed
its log) are skipped by their source position.
Outputs repeated after a crash are the same records again, in the same order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from sowstream.config.views import ViewConfig
from sowstream.engine import metrics
from sowstream.engine.atomic import purgeable, unwrap, wrap_batch
from sowstream.engine.derived import runner_store, without_gaps, write_records
from sowstream.engine.ports import LogReader, Sender, StateTable
from sowstream.engine.store import MemoryPartition, PartitionStore, commit
from sowstream.messagetypes import MessageType
from sowstream.sow.aggregate import StateError
from sowstream.sow.ops import RawRecord
from sowstream.views.inline import UnderlyingChange, conflate, last_per_record
from sowstream.views.maintainer import ViewChange, ViewMaintainer
from sowstream.views.routing import decode_event, source_mark
from sowstream.wire import headers as h

log = logging.getLogger("sowstream.engine.views")

WATERMARK = b"wm"
MARK_PREFIX = b"src/"
_NO_MARK = (-1, -1, -1)


@dataclass
class ViewPartition:
    """One input partition's maintainer and positions, as loaded from its store."""

    store: PartitionStore
    maintainer: ViewMaintainer
    watermark: int = -1
    marks: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    caught_up: bool = False  # read the input from the watermark to its end once, when loaded
    purge: set[bytes] = field(default_factory=set)  # committed deletions, removed next batch


class ViewRunner:
    """Keeps one view on this worker, for the input partitions faust assigned it."""

    def __init__(
        self,
        view: ViewConfig,
        sender: Sender,
        table: StateTable | None,
        input_reader: LogReader,
        *,
        input_topic: str,
        log_topic: str,
        codec: MessageType,
        log_partitions: int | None = None,
    ) -> None:
        """``log_partitions``: the view log's partition count, so a batch's view records go out
        per partition in Kafka batches (None: one send per record, partitioned by the
        producer)."""
        self.view = view
        self._log_partitions = log_partitions
        self.input_topic = input_topic
        self.log_topic = log_topic
        self._sender = sender
        self._table = table
        self._reader = input_reader
        self._codec = codec
        self._parts: dict[int, ViewPartition] = {}
        self._held: set[int] = set()  # input partitions faust assigned this worker
        self._memory: dict[int, MemoryPartition] = {}
        self._view_header = (h.VIEW, view.name.encode())

    # -- partitions -------------------------------------------------------------------------------

    def _new_store(self, partition: int) -> PartitionStore:
        return runner_store(self._table, self._memory, partition)

    def ready(self, partition: int) -> ViewPartition | None:
        """The partition's state, loaded from its store on first use after an assignment;
        None for a partition not assigned here (events of it may still arrive after a
        revocation, and applying them would race the new owner)."""
        vp = self._parts.get(partition)
        if vp is None:
            if partition not in self._held:
                return None
            store = self._new_store(partition)
            maintainer = ViewMaintainer(self.view)
            stored = list(store.scan(start=b""))
            committed = next((int(v) for k, v in stored if k == WATERMARK), -1)
            # A batch cut short by a crash (its watermark missing) is rolled back: see atomic.
            entries: list[tuple[bytes, bytes]] = []
            purge: set[bytes] = set()
            for key, raw in stored:
                value = raw if key == WATERMARK else unwrap(raw, committed)
                if value is not None:
                    entries.append((key, value))
                elif purgeable(raw, committed):
                    purge.add(key)
            maintainer.load_entries(entries)
            vp = ViewPartition(store, maintainer, watermark=committed, purge=purge)
            for key, value in entries:
                if key.startswith(MARK_PREFIX):
                    offset, seq, part = orjson.loads(value)
                    vp.marks[key[len(MARK_PREFIX) :].decode()] = (offset, seq, part)
            self._parts[partition] = vp
            log.info(
                "view %s partition %d: %d groups loaded, input applied up to offset %d",
                self.view.name,
                partition,
                len(maintainer.groups),
                vp.watermark,
            )
        return vp

    async def warm(self, partitions: Iterable[int]) -> None:
        """Load newly assigned partitions and apply what their input holds past the stored
        watermark: faust starts the agent at the group's committed offset, which a crash can
        leave ahead of the state, and no later event may come to reveal the gap."""
        for partition in partitions:
            vp = self._parts.get(partition)
            if vp is not None and vp.caught_up:
                continue
            try:
                vp = self.ready(partition)
                if vp is None:
                    continue
                end = await self._reader.end_offset(partition)
                if end > vp.watermark:
                    start = vp.watermark
                    recs: list[RawRecord] = []
                    async for batch in self._reader.batches(partition, end, vp.watermark + 1):
                        recs.extend(batch)
                    await self._apply_partition(partition, recs)
                    log.info(
                        "view %s partition %d: caught up from offset %d to %d (%d events read)",
                        self.view.name,
                        partition,
                        start,
                        end,
                        len(recs),
                    )
                vp.caught_up = True
            except Exception:
                log.exception("view %s partition %d: catching up failed", self.view.name, partition)
                self._parts.pop(partition, None)

    def position(self, partition: int) -> int | None:
        """The input offset to read next for ``partition`` (after its watermark); None while it
        is not loaded and caught up."""
        vp = self._parts.get(partition)
        if vp is None or not vp.caught_up:
            return None
        return vp.watermark + 1

    def assign(self, partitions: Iterable[int]) -> None:
        """Partitions faust assigned this worker: only these are loaded and applied."""
        self._held.update(partitions)

    def assigned(self) -> list[int]:
        """The input partitions faust assigned this worker."""
        return sorted(self._held)

    def loading(self) -> list[int]:
        """Input partitions assigned here that are not loaded and caught up yet (``/ready``)."""
        return sorted(
            p for p in self._held if (vp := self._parts.get(p)) is None or not vp.caught_up
        )

    async def drop(self, partitions: Iterable[int]) -> None:
        """Forget partitions taken away by a rebalance (their state stays in the store).

        Returns once a batch being applied to them is finished, outputs and state included:
        the rebalance waits for this, so the next owner starts from the stored state and its
        outputs cannot be overtaken by ours.
        """
        for p in list(partitions):
            self._held.discard(p)
            vp = self._parts.pop(p, None)
            if vp is not None:
                async with vp.lock:
                    pass

    def records(self) -> dict[str, dict[str, Any]]:
        """The view records of the partitions held here (for tests and status)."""
        out: dict[str, dict[str, Any]] = {}
        for vp in self._parts.values():
            out.update(vp.maintainer.records())
        return out

    # -- applying events --------------------------------------------------------------------------

    async def handle(self, records: Sequence[RawRecord]) -> None:
        """Apply a batch of input records (any mix of partitions, each in offset order)."""
        by_partition: dict[int, list[RawRecord]] = {}
        for rec in records:
            by_partition.setdefault(rec.partition, []).append(rec)
        # Partitions hold disjoint groups (events are routed by group or join key), so their
        # batches go concurrently: each waits for Kafka twice, and the waits overlap.
        if len(by_partition) == 1:
            ((partition, recs),) = by_partition.items()
            await self._apply_safely(partition, recs)
        else:
            await asyncio.gather(*(self._apply_safely(p, rs) for p, rs in by_partition.items()))

    async def _apply_safely(self, partition: int, recs: list[RawRecord]) -> None:
        try:
            await self._apply_partition(partition, recs)
        except Exception:
            # Nothing is lost: the partition is loaded again from its store, and the next
            # event makes it read what it missed from the input topic.
            log.exception("view %s partition %d: applying events failed", self.view.name, partition)
            self._parts.pop(partition, None)

    async def _apply_partition(self, partition: int, recs: list[RawRecord]) -> None:
        vp = self.ready(partition)
        if vp is None:
            log.info(
                "view %s partition %d: %d events left to its owner (not assigned here)",
                self.view.name,
                partition,
                len(recs),
            )
            return
        async with vp.lock:
            if self._parts.get(partition) is not vp:
                return
            recs = await without_gaps(
                self._reader, partition, vp.watermark, recs, f"view {self.view.name}"
            )
            if not recs:
                return
            committed = vp.watermark
            changes = self._fold(vp, recs)
            entries_marks = {
                MARK_PREFIX + stream.encode(): orjson.dumps(list(mark))
                for stream, mark in vp.marks.items()
            }
            await write_records(
                self._sender,
                self.log_topic,
                self._view_header,
                self._codec,
                ((c.sow_key, c.record) for c in changes),
                partitions=self._log_partitions,
            )
            entries = vp.maintainer.take_entries()
            entries.update(entries_marks)
            records: dict[bytes, bytes | None] = dict(
                wrap_batch(entries, vp.watermark, committed, vp.store.get)
            )
            records.update((key, None) for key in vp.purge - entries.keys())
            records[WATERMARK] = str(vp.watermark).encode()  # last: it commits the batch
            await commit(vp.store, records, self._sender)
            vp.purge = {key for key, value in entries.items() if value is None}
            metrics.VIEW_CHANGES.labels(self.view.name).inc(len(changes))

    def _fold(self, vp: ViewPartition, recs: Sequence[RawRecord]) -> list[ViewChange]:
        """Apply events to the maintainer; returns the view changes in order (with
        ``Conflation: inline``, one change per view record touched by the batch)."""
        events = self._events(vp, recs)
        incoming = len(events)
        if self.view.conflation == "inline":
            events = conflate(events)
        metrics.VIEW_UPDATES.labels(self.view.name, "incoming").inc(incoming)
        metrics.VIEW_UPDATES.labels(self.view.name, "processed").inc(len(events))
        out: list[ViewChange] = []
        maintainer = vp.maintainer
        for event in events:
            try:
                out.extend(
                    maintainer.apply(
                        event.topic, event.sow_key, event.before, event.after, seq=event.seq
                    )
                )
            except (StateError, ValueError) as exc:
                log.error(
                    "view %s: change of %s %s at %s@%d not applied: %s",
                    self.view.name,
                    event.topic,
                    event.sow_key,
                    self.input_topic,
                    event.seq,
                    exc,
                )
        if self.view.conflation == "inline":
            out = last_per_record(out)
        return out

    def _events(self, vp: ViewPartition, recs: Sequence[RawRecord]) -> list[UnderlyingChange]:
        """The batch's events not applied before (advancing the watermark and source marks)."""
        out: list[UnderlyingChange] = []
        for rec in recs:
            vp.watermark = max(vp.watermark, rec.offset)
            if rec.value is None:
                continue
            try:
                topic, sow_key, before, after, position = decode_event(rec.value)
                stream, place = source_mark(position)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning(
                    "view %s: ignored malformed change event %s[%d]@%d: %s",
                    self.view.name,
                    self.input_topic,
                    rec.partition,
                    rec.offset,
                    exc,
                )
                continue
            if place <= vp.marks.get(stream, _NO_MARK):
                continue  # produced again by a worker that replayed its log
            vp.marks[stream] = place
            out.append(UnderlyingChange(topic, sow_key, before, after, rec.offset))
        return out
