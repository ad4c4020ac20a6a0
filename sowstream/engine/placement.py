"""Placing subscriptions on partitions (with their SOW part or a bookmark replay) and
sending what conflation buffered.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sowstream.config.models import TopicConfig
from sowstream.engine.aggregates import live_groups
from sowstream.engine.apply import Applier, plain_key
from sowstream.engine.outbox import Outbox
from sowstream.engine.ownership import Ownership
from sowstream.engine.partition import Outcome, PartitionMoved, PartitionState
from sowstream.engine.ports import LogReader, Sender, wall_clock_ms
from sowstream.engine.queries import TIMEOUT, Queries, refusal, send_partials, wants_raw
from sowstream.engine.registry import RegistryProgress
from sowstream.engine.replies import ReplyWriter
from sowstream.engine.table import PartitionTable
from sowstream.errors import InvalidCommandError, InvalidMessageError, SowstreamError
from sowstream.filters import FilterError, compile_filter
from sowstream.sow.bookmarks import Bookmark
from sowstream.sow.fold import apply_record
from sowstream.sow.history import as_of_bound, covers
from sowstream.sow.ops import RawRecord
from sowstream.sow.planner import FullScan
from sowstream.sow.query import QueryOptions, validate_query
from sowstream.sow.record import SowRecord
from sowstream.subscriptions.matcher import TopicSubscriptions
from sowstream.subscriptions.model import (
    OOF,
    OOF_DELETED,
    OOF_EXPIRED,
    OOF_MATCH,
    WITH_SOW,
    Change,
    SubscriptionSpec,
)
from sowstream.subscriptions.options import parse_options
from sowstream.wire import headers as h
from sowstream.wire.protocol import REGISTRY_OFFSET, Command

log = logging.getLogger("sowstream.engine")


class Placement:
    """The placement stage: subscriptions start on a partition under its lock."""

    def __init__(
        self,
        table: PartitionTable,
        sender: Sender,
        log_reader: LogReader | None,
        subs: TopicSubscriptions,
        outbox: Outbox,
        applier: Applier,
        ownership: Ownership,
        queries: Queries,
        registry: RegistryProgress | None = None,
    ) -> None:
        """``log_reader`` replays the log for a bookmark; ``applier`` stores what a conflation
        flush cleared, in order with the batches; ``queries`` reads History and shapes the
        records of a SOW part as a query's; ``registry``: how far the worker has read the
        subscription registry (None: placements do not wait for it)."""
        self.topic: TopicConfig = table.topic
        self.compiled = table.compiled
        self._table = table
        self._sender = sender
        self._log_reader = log_reader
        self._subs = subs
        self._outbox = outbox
        self._applier = applier
        self._ownership = ownership
        self._queries = queries
        self._registry = registry

    async def flush_conflated(self, now_ms: int | None = None) -> None:
        """Send the messages of conflation intervals that have ended.

        Partition by partition under its lock, so the flush sits between two batches: the removal
        of the sent records' journal entries is stored after every batch that wrote them and
        before any that starts a new interval.
        """
        if not self._subs:
            return
        keys = self._subs.due(now_ms if now_ms is not None else wall_clock_ms())
        for partition in sorted(self._subs.partitions_of(keys)):
            ps = self._table.get(partition)
            if ps is None:
                self._subs.drop_partition(partition)  # its next owner finishes these intervals
                continue
            async with ps.lock:
                await self._flush_partition(keys, partition, ps)

    async def _flush_partition(self, keys: list[str], partition: int, ps: PartitionState) -> None:
        """Send ``keys``' buffered changes of ``partition`` (caller holds ps.lock)."""
        sent = await self._outbox.deliver(self._subs.flush_due(keys, partition))
        self._clear_journal(partition, ps, sent)

    def _drop_buffered(self, key: str, partition: int, ps: PartitionState) -> None:
        """Drop ``key``'s buffered changes of ``partition`` before a bookmark replay, which
        sends them all from what the subscriber holds (caller holds ps.lock)."""
        self._subs.discard_partition(key, partition)
        self._clear_journal(partition, ps, [])

    def _clear_journal(
        self, partition: int, ps: PartitionState, sent: list[asyncio.Future[Any]]
    ) -> None:
        """Remove the journal entries of what left the buffers, once Kafka has ``sent``."""
        cleared = self._subs.take_cleared(partition)
        if cleared and self._table.holds(partition, ps):
            self._applier.enqueue(partition, ps, Outcome(journal=cleared), sent)

    async def _registration_read(self, cmd: Command) -> None:
        """Wait until this worker has read the registration the command follows (its option
        ``registry_offset``): a removal of the same key read after the placement would end it
        (:class:`~sowstream.engine.registry.RegistryProgress`)."""
        text = cmd.option(REGISTRY_OFFSET)
        if self._registry is None or not text or not text.isdigit():
            return
        if not await self._registry.wait_past(int(text)):
            log.warning(
                "topic %r: placing %s before the registry is read to offset %s (still behind)",
                self.topic.name,
                cmd.sub_id,
                text,
            )

    def _history_covers(self, bookmark: Bookmark) -> bool:
        """Whether History holds the SOW as it was at ``bookmark``."""
        assert bookmark.at_ms is not None
        history = self._table.history
        return (
            history is not None
            and bookmark.at_ms >= 0
            and covers(history, bookmark.at_ms, wall_clock_ms())
        )

    async def _replay_start(
        self, partition: int, bookmark: Bookmark, state_ms: int | None = None
    ) -> int:
        """The first log offset a replay after ``bookmark`` reads. A state read from History
        reflects ``state_ms`` (the bookmark rounded down to the Granularity): the replay starts
        right after it, or the changes in between would be lost."""
        assert self._log_reader is not None and bookmark.at_ms is not None
        since = bookmark.at_ms if state_ms is None else state_ms
        by_time = await self._log_reader.offset_for_time(partition, since + 1) if since >= 0 else 0
        if state_ms is not None and state_ms < bookmark.at_ms:
            return by_time
        return bookmark.start_offset(partition, by_time)

    async def _log_base(self, partition: int, start: int) -> dict[str, SowRecord]:
        """The partition's SOW just before ``start``, folded from the log's first record.

        Without History this is the only exact base for a replay: from an empty one, a
        ``delta_publish`` would replay as just its fields and the removal of a record the
        subscriber holds would send nothing. The log is kept whole (``retention.ms`` -1); one
        whose beginning was deleted by retention gives an empty base, with a warning."""
        assert self._log_reader is not None
        state: dict[str, SowRecord] = {}
        if start <= 0:
            return state
        first = await self._log_reader.start_offset(partition)
        if first > 0:
            log.warning(
                "topic %r partition %d: the log's offsets 0..%d were deleted by retention; a "
                "replay after a bookmark starts from an empty state",
                self.topic.name,
                partition,
                first - 1,
            )
            return state
        async for batch in self._log_reader.batches(partition, start - 1, 0):
            for rec in batch:
                if rec.offset < start:
                    for _ in apply_record(self.compiled, state, rec):
                        pass
        return state

    def _replay_base(
        self, ps: PartitionState, bookmark: Bookmark, folded: dict[str, SowRecord] | None
    ) -> tuple[dict[str, SowRecord], int | None]:
        """The state a replay starts from and the time it reflects: ``folded`` (the log folded up
        to the bookmark, :meth:`_log_base`) and None, or with ``folded`` None History's (as of
        the bookmark rounded down to the Granularity)."""
        assert bookmark.at_ms is not None
        if folded is not None:
            return folded, None
        history = self._table.history
        assert history is not None
        return self._queries.as_of(ps, bookmark), as_of_bound(history, bookmark.at_ms)

    async def _replay(
        self,
        partition: int,
        state: dict[str, SowRecord],
        bookmark: Bookmark,
        until: int,
        state_ms: int | None = None,
        start: int | None = None,
    ) -> tuple[int, list[Change]]:
        """Fold the log after ``bookmark`` up to ``until`` from ``state``: (first offset, changes).

        The changes are what live traffic had at the time, so the subscription rules turn them
        into the messages a subscriber placed at the bookmark received (oof included).
        ``start``: the first offset, when the caller looked it up already.
        """
        assert self._log_reader is not None
        if start is None:
            start = await self._replay_start(partition, bookmark, state_ms)
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
                expiry = rec.headers.get(h.COMMAND) == h.SOW_EXPIRE
                changes.extend(
                    Change(
                        step.sow_key,
                        step.before,
                        step.after,
                        partition,
                        rec.offset,
                        rec.timestamp,
                        OOF_EXPIRED if expiry else OOF_DELETED,
                        seq=step.seq,
                    )
                    for step in apply_record(self.compiled, state, rec)
                )
        return start, changes

    def _replay_plain_key(self, rec: RawRecord) -> str | None:
        try:
            return plain_key(self.compiled, rec, rec.headers.get(h.COMMAND) or h.PUBLISH)
        except InvalidMessageError:
            return None

    async def subscribe(self, cmd: Command, partition: int) -> None:
        """Place (or replace) a subscription on one partition, with its SOW part if asked.

        Under the partition lock the subscription starts (or switches filter) and the snapshot is
        read, so on this partition every change is either in the snapshot or after its watermark,
        which ``part_end`` reports for the client to cut live messages at.
        """
        table = self._table
        writer = ReplyWriter.for_command(self._sender, cmd, self.topic.name, partition)
        try:
            spec = spec_from_command(cmd)
            view = self._subs.view(spec)
            opts = validate_query(batch_size=cmd.batch_size or 1)
            replace = spec.options.replace
            previous = cmd.previous_filter
            old = compile_filter(previous) if replace and previous and previous.strip() else None
            aggregated = spec.options.aggregated
            if aggregated and cmd.option("bookmark"):
                raise InvalidCommandError(
                    "an aggregated subscription takes no bookmark: it starts from the current "
                    "groups"
                )
            bookmark = None if replace else self._queries.bookmark(cmd)
            if bookmark is not None and self._log_reader is None:
                raise InvalidCommandError("a bookmark replay needs the transaction log")
            if aggregated and not self.topic.sow:
                raise InvalidCommandError(
                    f"topic {self.topic.name!r} keeps no SOW: an aggregated subscription needs "
                    "one to aggregate"
                )
        except (FilterError, InvalidCommandError) as exc:
            await writer.failure(refusal(exc), str(exc))
            return
        await self._registration_read(cmd)
        ps = await self._ownership.ready(partition)
        folded: dict[str, SowRecord] | None = None
        replay_from: int | None = None  # the replay's first offset, once looked up
        if bookmark is not None and not aggregated and not self._history_covers(bookmark):
            # The log up to the bookmark never changes: folded before taking the lock, so a
            # long log does not hold the partition's batches back.
            replay_from = await self._replay_start(partition, bookmark)
            folded = await self._log_base(partition, replay_from) if self.topic.sow else {}
        try:
            await table.wait_applied(partition, ps, cmd.after_offset)
        except PartitionMoved:
            return
        except SowstreamError as exc:
            await writer.failure(TIMEOUT, str(exc))
            return
        matched: list[tuple[SowRecord, dict[str, Any] | None]] = []
        leaving: list[SowRecord] = []
        # The SOW part as raw batches when the client reads them, except with select (each
        # record is projected, so written anew) and for a replace (records entering and
        # leaving the scope are told apart per record).
        raw: list[bytes] | None = None
        want_raw = wants_raw(cmd) and spec.options.select is None and not replace
        partials: dict[str, Any] | None = None
        async with ps.lock:
            if not table.holds(partition, ps):
                return
            await table.settle(ps)
            self._subs.upsert(spec, held=table.partitions)
            if bookmark is not None and not aggregated:
                self._drop_buffered(spec.key, partition, ps)
            else:
                await self._flush_partition([spec.key], partition, ps)
            self._subs.pin(spec, partition)
            watermark = ps.watermark
            if aggregated:
                # The partition's groups now; every later change updates them (the matcher).
                groups = await live_groups(table, partition, ps, self._subs, spec.key)
                partials = groups.partials() if groups is not None else {}
            elif bookmark is not None:
                # The SOW part as it was at the bookmark (from History, or the log folded up
                # to it), then the log from there: the subscriber sees what one placed at that
                # moment saw, up to now.
                past, past_ms = self._replay_base(ps, bookmark, folded)
                if spec.command in WITH_SOW:
                    scope = QueryOptions(view.filter, (), None, 0, opts.batch_size)
                    then = [r for r in past.values() if view.covers(r.sow_key)]
                    if want_raw:
                        raw, _ = await table.matching_raw(
                            ps, FullScan(), scope, view.entitled, then, unswept=True
                        )
                    else:
                        matched = await table.matching(
                            ps, FullScan(), scope, view.entitled, then, unswept=True
                        )
                start, replayed = await self._replay(
                    partition, past, bookmark, watermark, past_ms, replay_from
                )
                messages = self._subs.replay(spec.key, replayed)
                log.info(
                    "topic %s partition %d: subscription %s replayed from offset %d to %d "
                    "(%d changes, %d messages)",
                    self.topic.name,
                    partition,
                    spec.key,
                    start,
                    watermark,
                    len(replayed),
                    len(messages),
                )
                await self._outbox.deliver(messages, wait=True)
                watermark = start - 1  # the client keeps messages after this: the replay on
            elif replace or spec.command in WITH_SOW:
                scope = QueryOptions(view.filter, (), None, 0, opts.batch_size)
                everything = QueryOptions(None, (), None, 0, opts.batch_size)
                if not replace:
                    keys = sorted(spec.sow_keys) if spec.sow_keys is not None else None
                    how = await table.query_plan(partition, ps, view.filter, keys, view.scope)
                    if want_raw:
                        raw, _ = await table.matching_raw(
                            ps, how, scope, view.entitled, scope=view.scope, unswept=True
                        )
                    else:
                        matched = await table.matching(
                            ps, how, scope, view.entitled, scope=view.scope, unswept=True
                        )
                else:
                    # Entering scope: the new SOW part; leaving scope: out of focus.
                    for rec, body in await table.matching(
                        ps, FullScan(), everything, view.entitled, scope=view.scope, unswept=True
                    ):
                        assert body is None
                        parsed = table.parse(rec.data)
                        was = old is None or old.matches(parsed)
                        now = view.filter is None or view.filter.matches(parsed)
                        if now and not was:
                            matched.append((rec, parsed))
                        elif was and not now:
                            leaving.append(rec)
        if partials is not None:
            # Every placement of an aggregated subscription answers with the partition's groups
            # (a plain subscribe too: the client needs them to combine partitions' updates).
            await send_partials(writer, partials)
            await writer.end(len(partials), log_offset=watermark)
            return
        if raw is not None:
            await writer.raw_records(raw, opts.batch_size, self._queries.raw_flags)
        else:
            # select shapes the SOW part as it shapes live messages (a window shapes its own).
            records = self._queries.reply_records(matched, spec.options.select)
            await writer.records(records, opts.batch_size)
        if leaving and spec.options.oof:
            # Part of the replace's answer (not live traffic): the client shows them after the
            # records that entered.
            leavers = self._queries.reply_records((r, None) for r in leaving)
            await writer.with_(reason=OOF_MATCH).records(leavers, opts.batch_size, command=OOF)
        await writer.end(len(raw) if raw is not None else len(matched), log_offset=watermark)

    def unsubscribe(self, key: str) -> SubscriptionSpec | None:
        """Forget a subscription (its registry tombstone arrived)."""
        return self._subs.remove(key)


def spec_from_command(cmd: Command) -> SubscriptionSpec:
    """The subscription a control-topic command asks for (InvalidCommandError if malformed)."""
    if not cmd.sub_id:
        raise InvalidCommandError(f"{cmd.command} needs a subscription id (SubId)")
    return SubscriptionSpec(
        sub_id=cmd.sub_id,
        reply_to=cmd.reply_to,
        topic=cmd.topic,
        command=cmd.command,
        filter=cmd.filter,
        options=parse_options(cmd.sub_options),
        identity=cmd.identity,
        order_by=cmd.order_by,
        sow_keys=frozenset(cmd.sow_keys) if cmd.sow_keys is not None else None,
        message_type=cmd.message_type or "json",
        topic_regex=cmd.topic_regex,
    )
