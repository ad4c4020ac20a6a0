"""Applying log batches: fold under the partition lock, store in log order, then notify.

A batch is folded synchronously inside the lock (so a query sees the state between two
batches), its changelog records are queued inside it too (their order must match the RocksDB
writes), and replies, subscription messages and queue hand-offs go out after it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sowstream.auth import Authenticator
from sowstream.config.models import TopicConfig
from sowstream.engine import metrics
from sowstream.engine.aggregates import ensure_live_groups
from sowstream.engine.derived import delivered
from sowstream.engine.metrics import BatchLife
from sowstream.engine.native import (
    DEAD,
    REKEY,
    UNCHANGED,
    NativeFold,
    digest,
    is_panic,
)
from sowstream.engine.outbox import Outbox
from sowstream.engine.partition import (
    MAX_IN_FLIGHT,
    Ack,
    AppliedPublish,
    InFlight,
    Outcome,
    PartitionState,
    Rejected,
    Rekey,
)
from sowstream.engine.ports import Sender, wall_clock_ms
from sowstream.engine.queues import QueueRuntime
from sowstream.engine.store import APPLIED_RECORD_KEY, WATERMARK_KEY
from sowstream.engine.table import PartitionTable
from sowstream.errors import InvalidMessageError
from sowstream.sow.compiled import CompiledTopic
from sowstream.sow.expiration import parse_expiration_header
from sowstream.sow.history import Version
from sowstream.sow.logcheck import fingerprint
from sowstream.sow.ops import (
    TOO_LARGE,
    LogOp,
    RawRecord,
    apply_keyed,
    authenticated,
    check_publish_entitlement,
    check_refused,
    check_size,
    decode_log_record,
    deleted_by_filter,
    parse_body,
    record_size,
    resolve_sow_key,
)
from sowstream.sow.patterns import name_regex
from sowstream.sow.planner import plan
from sowstream.sow.record import SowRecord
from sowstream.subscriptions.matcher import TopicSubscriptions
from sowstream.subscriptions.model import OOF_DELETED, OOF_EXPIRED, Change, Watched
from sowstream.wire import headers as h
from sowstream.wire.avro import encode
from sowstream.wire.kafka import LARGEST_LOG_RECORD
from sowstream.wire.protocol import ACK, FAILURE, SUCCESS, Reply
from sowstream.wire.topics import TopicNames
from sowstream.wire.versions import VERSION_HEADER

log = logging.getLogger("sowstream.engine")


class Applier:
    """The apply stage: log records in, store changes, replies and subscription messages out."""

    def __init__(
        self,
        table: PartitionTable,
        names: TopicNames,
        sender: Sender,
        subs: TopicSubscriptions,
        outbox: Outbox,
        queues: list[QueueRuntime],
        native: NativeFold | None = None,
        *,
        shadow: bool = False,
    ) -> None:
        """``queues``: the queues fed by this topic (the engine adds to the list as it wires
        them); the views reading it are the ``outbox``'s. ``native``: the topic's compiled
        fold, if it is used; ``shadow``: only compared with the Python fold (engine.native)."""
        self.topic: TopicConfig = table.topic
        self.compiled = table.compiled
        self.names = names
        self.log_topic = names.log(self.topic.name, self.topic.message_type)
        # Set when this topic is a view or conflated topic: only its maintainer writes the log.
        self.view_name: str | None = None
        # Checks publishers' credentials (set by the engine; None: identities are asserted).
        self.authenticator: Authenticator | None = None
        self._table = table
        self._sender = sender
        self._subs = subs
        self._outbox = outbox
        self._queues = queues
        self._native = native
        self._shadow = shadow

    async def process(self, records: Sequence[RawRecord], fetched: float | None = None) -> None:
        """Fold a batch of log records (any mix of partitions, each in log order) and send its
        subscription messages; the state is stored once Kafka has acknowledged them.
        ``fetched``: the ``time.perf_counter()`` the records were fetched at (batch-life metrics).

        Only partitions loaded by :meth:`Ownership.ready` take records: a partition dropped by
        a rebalance must be read again from its stored watermark, never continued from where
        this batch is.

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
        table = self._table
        subs = self._subs
        outbox = self._outbox
        for partition, recs in by_partition.items():
            ps = table.get(partition)
            if ps is None or not ps.ready:
                continue  # not held (any more): whoever loads it next reads from its watermark
            life = BatchLife(fetched)
            async with ps.lock:
                if not table.holds(partition, ps):
                    continue  # revoked while waiting: the new owner reads these records again
                await table.settle(ps, keep=MAX_IN_FLIGHT - 1)
                await ensure_live_groups(table, partition, ps, subs)
                life.mark("locked")
                outcome = self._fold(ps, self._identified(recs), replay=False)
                life.mark("folded")
                sent: list[asyncio.Future[Any]] = []
                required: list[asyncio.Future[Any]] = []
                if outcome.events:
                    sent = await outbox.deliver(subs.dispatch(outcome.events, wall_clock_ms()))
                    outcome.journal = subs.take_journal(partition)
                    if outbox.views:
                        required = await outbox.feed_views(outcome.events)
                # Owed before the batch is stored, as subscription messages are: sent after
                # it, a worker killed in between lost them for good (the next owner starts
                # after the stored watermark), so a publisher waited out its timeout and an
                # unkeyed publish's keyed copy never reached the log.
                required = [*required, *await self._forward(outcome)]
                sent = [*sent, *await self._acknowledge(outcome)]
                if self._queues and (outcome.enqueued or outcome.dead):
                    refused = [rejected.record.offset for rejected in outcome.dead]
                    for queue in self._queues:
                        outcome.journal.update(
                            queue.append(self.topic.name, partition, outcome.enqueued, refused)
                        )
                ps.folded = max(ps.folded, outcome.last)
                life.mark("replies_enqueued")
                self.enqueue(partition, ps, outcome, sent, required, life)

    def enqueue(
        self,
        partition: int,
        ps: PartitionState,
        outcome: Outcome,
        sent: list[asyncio.Future[Any]],
        required: list[asyncio.Future[Any]] | None = None,
        life: BatchLife | None = None,
    ) -> None:
        """Queue ``outcome`` to be stored, in order, once Kafka has ``sent`` and ``required``
        (see InFlight; under ps.lock)."""
        ps.in_flight.append(InFlight(outcome, sent, required or [], life))
        if ps.committer is None:
            ps.committer = asyncio.create_task(self._commit_in_order(partition, ps))

    async def _commit_in_order(self, partition: int, ps: PartitionState) -> None:
        """Store the partition's in-flight batches, oldest first, once their messages are in."""
        table = self._table
        try:
            while ps.in_flight:
                head = ps.in_flight[0]
                if head.sent:
                    await self._outbox.acknowledged(head.sent)
                # Refused: the batch is not stored, the partition is loaded again and its log
                # replayed (below), and the events go out again.
                await delivered(
                    head.required,
                    f"change events, re-keyed copies or dead letters of topic {self.topic.name!r}",
                )
                life = head.life
                if life is not None:
                    life.mark("replies_acked")
                if not table.holds(partition, ps):
                    # Revoked: nothing of these batches is stored, so the new owner replays them.
                    ps.in_flight.clear()
                else:
                    # The changelog first, then the local store: a worker killed in between
                    # restarts with neither (the log is applied again from the watermark
                    # before), never with a batch only its own store holds, which a later
                    # owner restoring the changelog would miss while the watermark it was
                    # followed by says it is applied.
                    write_locally = self._commit(ps, head.outcome)
                    await ps.store.replicate(head.outcome.changes, self._sender)
                    if life is not None:
                        life.mark("changelog_acked")
                    write_locally()
                    if life is not None:
                        life.mark("stored")
                    # Leaves the overlay only now: until Kafka has its changelog records no later
                    # batch may be stored (see RocksPartition.replicate); readers looking
                    # through the overlay meanwhile find the same records as in the store.
                    ps.in_flight.popleft()
                    head.outcome.stored = True
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
            if table.remove(partition, ps) is not None:
                # The queues forget it too: they hold messages of the unstored batches, and
                # would take the log replay after the reload for repeats and never store them.
                for queue in self._queues:
                    queue.drop(self.topic.name, partition)
            await ps.wake()
        finally:
            # No await between the loop's last check and here: a batch appended after it finds
            # no committer and starts one.
            if ps.committer is asyncio.current_task():
                ps.committer = None

    async def drain(self) -> None:
        """Wait until every batch folded so far is stored (before reading the stores directly)."""
        for _, ps in self._table.states():
            async with ps.lock:
                await self._table.settle(ps)

    def apply(self, ps: PartitionState, recs: Sequence[RawRecord], *, replay: bool) -> Outcome:
        """Fold ``recs`` into the partition and write the result as one batch."""
        outcome = self._fold(ps, self._identified(recs), replay=replay)
        self._commit(ps, outcome)()  # outside the pipeline: no changelog to wait for
        return outcome

    def _commit(self, ps: PartitionState, outcome: Outcome) -> Callable[[], None]:
        """Make the batch's store changes (``outcome.changes``); returns the step that writes
        them into the local store (the pipeline takes it once the changelog has them)."""
        table = self._table
        last = outcome.last
        if not self.topic.sow:
            changes: dict[bytes, bytes | None] = {}
            if table.backed and (last > ps.watermark or outcome.journal):
                # A plain topic stores only what its queues hold, and its position.
                changes = dict(outcome.journal)
                if last > ps.watermark:
                    changes.update(_position(outcome))
                outcome.changes = changes

            def plain() -> None:
                if changes:
                    ps.store.write(changes)
                ps.watermark = max(ps.watermark, last)

            return plain
        if not (last > ps.watermark or outcome.journal):
            return _nothing
        watermark = last if last > ps.watermark else None
        outcome.changes = changes = table.batch_changes(
            ps,
            outcome.overlay,
            outcome.before,
            watermark,
            outcome.versions,
            outcome.journal,
            _position(outcome),
            outcome.bodies,
            outcome.encoded,
            outcome.index_same if outcome.index_memo == ps.memo else frozenset(),
        )
        overlay = outcome.overlay
        return lambda: table.write(ps, changes, overlay, watermark)

    @property
    def _checks_publishers(self) -> bool:
        """Whether publishers' credentials are checked here: every publish when credentials are
        required, else those of topics with publish entitlements (the Python fold does that)."""
        auth = self.authenticator
        if auth is None or not auth.enabled:
            return False
        return auth.settings.required or bool(self.topic.publish_filters)

    def _identified(self, recs: Sequence[RawRecord]) -> Sequence[RawRecord]:
        """``recs`` with their credentials checked, where publishers are checked."""
        if not self._checks_publishers:
            return recs
        assert self.authenticator is not None
        return authenticated(self.authenticator, self.log_topic, recs)

    def _fold(self, ps: PartitionState, recs: Sequence[RawRecord], *, replay: bool) -> Outcome:
        """Compute what ``recs`` do to the partition, without writing it yet.

        Every key an op touches is written again even when unchanged: after a crash the replayed
        ops re-send their records, so a changelog that missed the last batch catches up. With
        subscriptions present, each op's effect on its record is kept as a :class:`Change` (the
        compiled fold skips those no subscription can take, by the values it read).

        The compiled fold (engine.native) takes the chunk first; from the first record it
        declines the Python fold goes on. A Rust panic folds the whole chunk again in Python.
        """
        if not self.topic.sow:
            return self._fold_plain(ps, recs, replay=replay)
        native = self._native if not self._checks_publishers else None
        # A view's log holds only its maintainer's records; a chunk with any other (refused as
        # a dead letter) is folded in Python whole: rare, and the compiled fold cut there left
        # the memo index entries different (the differential test found it).
        if (
            native is not None
            and self.view_name is not None
            and not all(self._engine_written(r) for r in recs)
        ):
            native = None
        if native is None:
            outcome = Outcome(last=ps.folded)
            applied = self._fold_python(ps, recs, outcome, replay=replay)
        elif self._shadow:
            outcome = Outcome(last=ps.folded)
            applied = self._fold_python(ps, recs, outcome, replay=replay)
            self._compare(ps, recs, outcome, native, replay=replay)
        else:
            outcome, applied = self._fold_both(ps, recs, native, replay=replay)
        metrics.UPDATES.labels(self.topic.name).inc(applied)
        if outcome.dead:
            metrics.REJECTED.labels(self.topic.name).inc(len(outcome.dead))
        return outcome

    def _fold_both(
        self, ps: PartitionState, recs: Sequence[RawRecord], native: NativeFold, *, replay: bool
    ) -> tuple[Outcome, int]:
        """The compiled fold up to its first decline, the Python fold from there; the outcome
        and how many ops were applied."""
        outcome = Outcome(last=ps.folded)
        # A record too large to take, or one on a view's log the engine did not write, is the
        # Python fold's (a dead letter): the compiled fold stops before it.
        # A record too large to take is the Python fold's (a dead letter): the compiled fold
        # stops before it.
        cut = next((i for i, r in enumerate(recs) if record_size(r) > LARGEST_LOG_RECORD), None)
        try:
            start, applied = self._fold_native(
                ps, recs if cut is None else recs[:cut], outcome, native, replay=replay
            )
        except BaseException as exc:
            # A panic, or anything it refused (a header it cannot read): the Python fold redoes
            # the chunk, and raises itself whatever is really wrong (a store that fails).
            if not (is_panic(exc) or isinstance(exc, Exception)):
                raise
            log.error(
                "topic %s: the compiled fold panicked or failed (%s: %s); folding the chunk in "
                "Python",
                self.topic.name,
                type(exc).__name__,
                exc,
            )
            metrics.NATIVE_PANICS.labels(self.topic.name).inc()
            outcome = Outcome(last=ps.folded)
            start, applied = 0, 0
        if start < len(recs):
            outcome.encoded = None
            outcome.index_same.clear()
            metrics.NATIVE_RECORDS.labels(self.topic.name, "declined").inc(len(recs) - start)
            applied += self._fold_python(ps, recs[start:], outcome, replay=replay)
        return outcome, applied

    def _compare(
        self,
        ps: PartitionState,
        recs: Sequence[RawRecord],
        reference: Outcome,
        native: NativeFold,
        *,
        replay: bool,
    ) -> None:
        """engine.native: shadow: fold ``recs`` the compiled way too and count a difference."""
        taken = self.taken_events()
        try:
            other, _ = self._fold_both(ps, recs, native, replay=replay)
            same = digest(other, taken) == digest(reference, taken)
        except Exception as exc:  # the reference outcome is used whatever happens here
            log.error("topic %s: the shadow compiled fold failed: %s", self.topic.name, exc)
            same = False
        if not same:
            metrics.NATIVE_MISMATCHES.labels(self.topic.name).inc()
            log.warning(
                "topic %s partition %d: the compiled fold differs from the Python fold on the "
                "chunk of offsets %d..%d (the Python fold's result is used)",
                self.topic.name,
                recs[0].partition if recs else -1,
                recs[0].offset if recs else -1,
                recs[-1].offset if recs else -1,
            )

    def taken_events(self) -> Callable[[Change], bool] | None:
        """Which change events the compiled fold makes: those some subscription may take when
        only subscriptions take them (no views); None: every one."""
        return None if self._outbox.views else self._subs.may_take

    def _fold_native(
        self,
        ps: PartitionState,
        recs: Sequence[RawRecord],
        outcome: Outcome,
        native: NativeFold,
        *,
        replay: bool,
    ) -> tuple[int, int]:
        """Fold ``recs`` with the compiled fold into ``outcome``, as :meth:`_fold_python` would;
        returns where it declined (len(recs) if nowhere) and how many ops it applied."""
        table = self._table
        overlay = outcome.overlay
        before = outcome.before
        events = outcome.events if ((self._subs or self._outbox.views) and not replay) else None
        queues = bool(self._queues)
        parse = table.parse
        memo = frozenset(ps.memo)
        index_paths = [*table.index_paths, *sorted(memo)]
        # The paths subscriptions are indexed by: the fold reads each op's values there, and
        # matching parses only the bodies of changes some subscription may take.
        watch_at = self._subs.watched_paths() if events is not None and self._subs else ()
        # Only subscriptions take the events (taken_events): an op none of them can take by
        # the values read gets no event, and its stored record is never decoded.
        passes_by = self._subs.passes_by if watch_at and self.taken_events() else None
        declined_at, ops, writes, olds, watched = native.run(
            recs,
            ps.folded,
            lambda keys: table.load_many(ps, overlay, keys),
            index_paths,
            watch_at,
        )

        def found(key: bytes) -> SowRecord | None:
            """The record the fold found under ``key`` (read from the store's bytes once)."""
            old = olds[key]
            if type(old) is bytes:
                old = olds[key] = SowRecord.from_bytes(old)
            return old  # type: ignore[return-value]

        applied = 0
        for n, op in enumerate(ops):
            kind = op[0]
            rec = recs[op[1]]
            if kind == DEAD:
                if not replay:
                    exc = InvalidMessageError(op[3], topic=self.topic.name, reason=op[2])
                    outcome.dead.append(Rejected(rec, exc))
                    outcome.acks.append(Ack(rec, 0, FAILURE, exc.reason, str(exc)))
                continue
            if kind == REKEY:
                if not replay:
                    outcome.rekeys.append(Rekey(op[2], rec))
                continue
            key = op[2]
            values = watched[n] if watched else None
            new: SowRecord | None
            noted = events is not None
            if kind == UNCHANGED:
                new = stored = overlay[key] if key in overlay else found(key)
                count = 1
            else:
                if passes_by is not None and values is not None:
                    held = overlay[key] if key in overlay else olds[key]
                    states = [values[0]] if held is not None else []
                    if op[4] is not None:
                        states.append(values[1])
                    noted = not passes_by(rec.partition, watch_at, states)
                if noted:
                    stored = overlay[key] if key in overlay else found(key)
                if op[4] is None:
                    new, count = None, op[5]
                else:
                    new, count = SowRecord(op[3], op[4], op[6], op[7], op[8]), 1
            overlay[key] = new
            if queues and new is not None and rec.headers.get(h.COMMAND) != h.SOW_DELETE:
                outcome.enqueued.append(queued(rec, new.data, parse(new.data), self.topic.name))
            if noted and events is not None:
                _note(
                    events,
                    op[3],
                    stored,
                    new,
                    rec,
                    watched_at=watch_at,
                    watched=values,
                )
            applied += 1
            if not replay and rec.headers.get(h.REPLY_TO):
                outcome.acks.append(Ack(rec, count, SUCCESS))
        for rec in recs[:declined_at]:
            if rec.offset > ps.folded:
                outcome.last = max(outcome.last, rec.offset)
                outcome.last_record = rec
        whole = declined_at == len(recs)
        indexed = bool(index_paths)
        for key, _form, same in writes:
            # The batch write reads the records found only to change index entries; the
            # Python fold going on after a decline expects every one of them.
            if not whole or (indexed and not same):
                before[key] = found(key)
            elif indexed:
                outcome.index_same.add(key)
        if whole:
            outcome.encoded = {key: form for key, form, _ in writes}
            outcome.index_memo = memo
        metrics.NATIVE_RECORDS.labels(self.topic.name, "folded").inc(declined_at)
        return declined_at, applied

    def _engine_written(self, rec: RawRecord) -> bool:
        """Whether ``rec`` may be on this topic's log: any record, except on a view or conflated
        topic, whose log only its maintainer (``sow.view``) and the expiry sweep write."""
        view = self.view_name
        if view is None:
            return True
        headers = rec.headers
        return headers.get(h.VIEW) == view or headers.get(h.COMMAND) == h.SOW_EXPIRE

    def _fold_python(
        self, ps: PartitionState, recs: Sequence[RawRecord], outcome: Outcome, *, replay: bool
    ) -> int:
        """The reference fold: ``recs`` into ``outcome`` (which may hold a prefix of the chunk
        folded already); returns how many ops it applied."""
        topic = self.topic
        compiled = self.compiled
        load = self._table.load_record
        parse = self._table.parse
        overlay = outcome.overlay
        before = outcome.before
        bodies = outcome.bodies
        events = outcome.events if ((self._subs or self._outbox.views) and not replay) else None
        versions = outcome.versions if self._table.history is not None else None
        last = outcome.last
        applied = expired = 0
        for rec in recs:
            if rec.offset <= ps.folded:
                continue
            last = max(last, rec.offset)
            outcome.last_record = rec
            try:
                if not self._engine_written(rec):
                    raise InvalidMessageError(
                        f"topic {topic.name!r} is computed by the engine (a view or a "
                        "conflated topic): only the engine writes it; "
                        "publish to its underlying topics instead",
                        topic=topic.name,
                        reason="view",
                    )
                check_size(topic, rec)
                op = decode_log_record(
                    compiled, rec.key, rec.value, rec.headers, rec.offset, rec.timestamp
                )
            except InvalidMessageError as exc:
                if not replay:
                    outcome.dead.append(Rejected(rec, exc))
                    outcome.acks.append(Ack(rec, 0, FAILURE, exc.reason, str(exc)))
                continue
            if op.rekey:
                if not replay and op.kafka_key is not None:
                    outcome.rekeys.append(Rekey(op.kafka_key, rec))
                continue
            if op.sow_key is None:
                count = self._delete_by_filter(ps, overlay, before, op, events, rec, versions)
            else:
                key = op.sow_key.encode()
                stored = load(ps, overlay, key)
                if key not in before:
                    before[key] = stored
                try:
                    new = apply_keyed(compiled, stored, op)
                except InvalidMessageError as exc:
                    if not replay:
                        outcome.dead.append(Rejected(rec, exc))
                        outcome.acks.append(Ack(rec, 0, FAILURE, exc.reason, str(exc)))
                    continue
                overlay[key] = new
                if new is not None and new.data is rec.value and op.command == h.PUBLISH:
                    # Stored as published (no merge, Preprocessing or Enrichment): op.body is
                    # the codec's own parse of new.data.
                    bodies[key] = op.body  # type: ignore[assignment]
                else:
                    bodies.pop(key, None)
                if self._queues and new is not None and op.command in h.PUBLISHES:
                    outcome.enqueued.append(queued(rec, new.data, parse(new.data), topic.name))
                if versions is not None and new is not stored:
                    versions.append(Version(op.sow_key, stored, new, op.offset, op.timestamp))
                count = 1 if (op.command in h.PUBLISHES or new is not stored) else 0
                if op.command == h.SOW_EXPIRE and count and not replay:
                    expired += 1
                if events is not None:
                    reason = OOF_EXPIRED if op.command == h.SOW_EXPIRE else OOF_DELETED
                    _note(events, op.sow_key, stored, new, rec, body=bodies.get(key), reason=reason)
            applied += 1
            if not replay and op.reply_to:
                outcome.acks.append(Ack(rec, count, SUCCESS))
        outcome.last = last
        if expired:
            metrics.EXPIRED.labels(topic.name).inc(expired)
        return applied

    def _fold_plain(
        self, ps: PartitionState, recs: Sequence[RawRecord], *, replay: bool
    ) -> Outcome:
        """A topic without a SOW: every publish goes to subscribers whole, nothing is stored.

        With no stored state a delta_publish cannot be merged, so it is passed on as published
        (as AMPS does); a sow_delete has nothing to delete.
        """
        topic = self.topic
        compiled = self.compiled
        outcome = Outcome()
        events = outcome.events if (self._subs and not replay) else None
        last = ps.folded
        for rec in recs:
            if rec.offset <= ps.folded:
                continue
            last = max(last, rec.offset)
            outcome.last_record = rec
            command = rec.headers.get(h.COMMAND) or h.PUBLISH
            enqueue: AppliedPublish | None = None
            try:
                check_size(topic, rec)
                check_refused(topic, rec.headers)
                sow_key = plain_key(compiled, rec, command)
                if topic.publish_filters and command in h.PUBLISHES:
                    delta = command == h.DELTA_PUBLISH
                    body = parse_body(compiled, rec.value, delta=delta)
                    check_publish_entitlement(topic, rec.headers, body)
                if self._queues and command in h.PUBLISHES and rec.value is not None:
                    # Read here, so a body or expiration a queue cannot take is a dead letter.
                    body = parse_body(compiled, rec.value)
                    enqueue = queued(rec, rec.value, body, topic.name)
            except InvalidMessageError as exc:
                if not replay:
                    outcome.dead.append(Rejected(rec, exc))
                    outcome.acks.append(Ack(rec, 0, FAILURE, exc.reason, str(exc)))
                continue
            if enqueue is not None:
                outcome.enqueued.append(enqueue)
            if sow_key is not None and events is not None:
                assert rec.value is not None
                after = SowRecord(sow_key, rec.value, rec.offset, rec.timestamp)
                events.append(
                    Change(sow_key, None, after, rec.partition, rec.offset, rec.timestamp)
                )
            if not replay and rec.headers.get(h.REPLY_TO):
                outcome.acks.append(Ack(rec, int(sow_key is not None), SUCCESS))
        outcome.last = last
        return outcome

    async def store_changes(
        self,
        partition: int,
        changes: Mapping[bytes, bytes | None] | Callable[[], Mapping[bytes, bytes | None]],
    ) -> bool:
        """Write ``changes`` (queue entries, or a function making them, called when their turn
        comes) into ``partition``'s store after the batches before them; returns once they are
        stored, True, or False when they are not: the partition is not held here, or was
        revoked before they were stored (its next owner has none)."""
        ps = self._table.get(partition)
        if not changes:
            return True
        if ps is None or not ps.ready:
            return False
        async with ps.lock:
            if not self._table.holds(partition, ps):
                return False
            made = changes() if callable(changes) else changes
            if not made:
                return True
            outcome = Outcome(journal=dict(made))
            self.enqueue(partition, ps, outcome, [])
        # Waits for this batch only, without the lock: batches folded after it may be stored
        # meanwhile (they would only have to wait for it), but none is held back by the wait.
        async with ps.applied:
            while not outcome.stored:
                if ps.failure is not None or not self._table.holds(partition, ps):
                    return False
                await ps.applied.wait()
        return True

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
        table = self._table
        count = 0
        # On a Pattern topic a delete by filter takes the records of its own topic name only.
        scope = table.scope(name_regex(op.name)) if op.name is not None else None
        how = plan(self.topic, op.filter, memo_ready=ps.memo, scope=scope)
        candidates = dict.fromkeys(table.candidate_keys(ps, how, scope))
        for flight in ps.in_flight:
            candidates.update(dict.fromkeys(flight.outcome.overlay))
        candidates.update(dict.fromkeys(overlay))
        # Sorted: each removed record's message sequence must come out the same on a replay.
        for key in sorted(candidates) if events is not None else candidates:
            stored = table.load_record(ps, overlay, key)
            if stored is None or not deleted_by_filter(self.compiled, stored, op):
                continue
            if key not in before:
                before[key] = stored
            overlay[key] = None
            count += 1
            if versions is not None:
                versions.append(Version(stored.sow_key, stored, None, op.offset, op.timestamp))
            if events is not None and rec is not None:
                _note(events, stored.sow_key, stored, None, rec, seq=count)
        return count

    async def _forward(self, outcome: Outcome) -> list[asyncio.Future[Any]]:
        """Send what the log owes for a batch, the batch stored only once Kafka has it:
        re-keyed copies of unkeyed records and dead letters. A batch stored and then folded
        again after a crash sends them again (at-least-once, as everything the log drives)."""
        futures: list[asyncio.Future[Any] | None] = []
        for sow_key, rec in outcome.rekeys:
            hdrs = {**rec.headers, h.ORIGIN: f"{rec.partition}:{rec.offset}"}
            futures.append(
                await self._sender.send(
                    self.log_topic,
                    rec.value,
                    key=sow_key.encode(),
                    headers=h.to_kafka_headers(dict(hdrs)),
                )
            )
        for rec, exc in outcome.dead:
            log.warning(
                "rejected record %s[%d]@%d: %s", self.log_topic, rec.partition, rec.offset, exc
            )
            whole = exc.reason != TOO_LARGE
            letter = {
                "topic": self.topic.name,
                "message_type": self.topic.message_type,
                "source_topic": self.log_topic,
                "source_partition": rec.partition,
                "source_offset": rec.offset,
                "timestamp": rec.timestamp,
                "key": rec.key if whole else None,
                "value": rec.value if whole else None,
                "headers": rec.headers if whole else {},
                "reason": exc.reason,
                # A record too large to copy is left where it is, on the log.
                "error": str(exc)
                if whole
                else f"{exc} (key, value and headers are left out "
                f"of this dead letter: the record is {self.log_topic}[{rec.partition}]"
                f"@{rec.offset})",
            }
            futures.append(
                await self._sender.send(
                    self.names.dead_letter,
                    encode("DeadLetter", letter),
                    key=self.topic.ident.encode(),
                    headers=VERSION_HEADER,
                )
            )
        return [f for f in futures if f is not None]

    async def _acknowledge(self, outcome: Outcome) -> list[asyncio.Future[Any]]:
        """Answer the publishers that asked (``sow.reply_to``), before the batch is stored; a
        repeat after a crash is counted once by the client (same partition and offset)."""
        acks: dict[str, list[tuple[bytes, list[tuple[str, bytes]]]]] = {}
        for ack in outcome.acks:
            rec = ack.record
            reply_to = rec.headers.get(h.REPLY_TO)
            if not reply_to:
                continue
            reply = Reply(
                command=ACK,
                command_id=rec.headers.get(h.COMMAND_ID, ""),
                topic=self.topic.name,
                partition=rec.partition,
                log_offset=rec.offset,
                status=ack.status,
                reason=ack.reason,
                message=ack.message,
                count=ack.changed,
            )
            acks.setdefault(reply_to, []).append((reply.encode(), VERSION_HEADER))
        futures: list[asyncio.Future[Any]] = []
        for reply_to, replies in acks.items():  # batched per publisher's reply topic
            futures.extend(await self._sender.send_replies(reply_to, replies))
        return futures


def _nothing() -> None:
    """The store step of a batch that changes nothing."""


def queued(rec: RawRecord, data: bytes, body: dict[str, Any], topic: str) -> AppliedPublish:
    """An applied publish as a queue takes it (a delta_publish as the merged record); an
    expiration header it cannot hold is an InvalidMessageError (checked already on a SOW
    topic, by the fold)."""
    expiration = parse_expiration_header(topic, rec.headers.get(h.EXPIRATION))
    name = rec.headers.get(h.TOPIC) or None  # a Pattern topic's records carry their name
    logged = data is rec.value or data == rec.value
    return AppliedPublish(rec.offset, rec.timestamp, data, body, expiration, name, logged)


def plain_key(compiled: CompiledTopic[TopicConfig], rec: RawRecord, command: str) -> str | None:
    """The message's key on a plain topic (None for a delete, which does nothing here)."""
    topic = compiled.definition
    if command not in h.LOG_COMMANDS:
        raise InvalidMessageError(
            f"topic {topic.name!r}: unknown command {command!r} in header {h.COMMAND}",
            topic=topic.name,
            reason="unknown_command",
        )
    if command not in h.PUBLISHES:
        return None
    body = parse_body(compiled, rec.value, delta=command == h.DELTA_PUBLISH)
    if not topic.user_supplied_keys:
        return resolve_sow_key(topic, body, None)
    return rec.key.decode("utf-8", "replace") if rec.key else f"{rec.partition}-{rec.offset}"


def _note(
    events: list[Change],
    sow_key: str,
    stored: SowRecord | None,
    new: SowRecord | None,
    rec: RawRecord,
    seq: int = 0,
    body: dict[str, Any] | None = None,
    reason: str = OOF_DELETED,
    watched_at: tuple[str, ...] | None = None,
    watched: Watched | None = None,
) -> None:
    """Record an op's effect for subscribers (``body``: ``new`` parsed, if known; ``watched``:
    the values the compiled fold read at the paths ``watched_at``)."""
    if new is stored:
        # Already applied before a crash: re-announce the stored result of exactly this op
        # (its message may not have gone out); subscribers drop it if they have it.
        if stored is not None and stored.log_offset == rec.offset:
            events.append(
                Change(sow_key, None, stored, rec.partition, rec.offset, rec.timestamp, resent=True)
            )
        return
    events.append(
        Change(
            sow_key,
            stored,
            new,
            rec.partition,
            rec.offset,
            rec.timestamp,
            reason,
            seq=seq,
            _after_body=body,
            watched_at=watched_at,
            watched=watched,
        )
    )


def _position(outcome: Outcome) -> dict[bytes, bytes | None]:
    """The store entries that record how far a batch applied the log: the fingerprint of its
    last record, then the watermark (last, see ``PartitionTable.batch_changes``)."""
    rec = outcome.last_record
    mark = str(outcome.last).encode()
    if rec is None or rec.offset != outcome.last:
        return {WATERMARK_KEY: mark}
    return {
        APPLIED_RECORD_KEY: fingerprint(rec.offset, rec.timestamp, rec.key),
        WATERMARK_KEY: mark,
    }
