"""Placing subscriptions on partitions (with their SOW part or a bookmark replay) and
sending what conflation buffered.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from sowstream.engine.partition import Outcome, PartitionMoved, PartitionState, wall_clock_ms
from sowstream.engine.queries import Queries
from sowstream.errors import InvalidCommandError, InvalidMessageError, SowstreamError
from sowstream.filters import FilterError, compile_filter
from sowstream.sow.bookmarks import Bookmark
from sowstream.sow.fold import apply_record
from sowstream.sow.history import as_of_bound, covers
from sowstream.sow.ops import RawRecord
from sowstream.sow.planner import FullScan
from sowstream.sow.query import QueryOptions, validate_query
from sowstream.sow.record import SowRecord
from sowstream.subscriptions.model import (
    FAILURE,
    OOF,
    OOF_DELETED,
    OOF_MATCH,
    WITH_SOW,
    Change,
    SubscriptionSpec,
)
from sowstream.subscriptions.options import parse_options
from sowstream.wire import headers as h

log = logging.getLogger("sowstream.engine")


class Placement(Queries):
    """The placement stage: subscriptions start on a partition under its lock."""

    async def flush_conflated(self, now_ms: int | None = None) -> None:
        """Send the messages of conflation intervals that have ended.

        Partition by partition under its lock, so the flush sits between two batches: the removal
        of the sent records' journal entries is stored after every batch that wrote them and
        before any that starts a new interval.
        """
        if not self.subs:
            return
        keys = self.subs.due(now_ms if now_ms is not None else wall_clock_ms())
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
            self._enqueue(partition, ps, Outcome(journal=cleared), sent)

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
            or not covers(self._history, bookmark.at_ms, wall_clock_ms())
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
        except PartitionMoved:
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
                        ps,
                        FullScan(),
                        scope,
                        view.entitled,
                        [r for r in past.values() if view.covers(r.sow_key)],
                    )
                start, replayed = await self._replay(partition, past, bookmark, watermark, past_ms)
                await self.deliver(self.subs.replay(spec.key, replayed), wait=True)
                watermark = start - 1  # the client keeps messages after this: the replay on
            elif replace or spec.command in WITH_SOW:
                scope = QueryOptions(view.filter, (), None, 0, opts.batch_size)
                everything = QueryOptions(None, (), None, 0, opts.batch_size)
                if not replace:
                    keys = sorted(spec.sow_keys) if spec.sow_keys is not None else None
                    how = await self._query_plan(partition, ps, view.filter, keys, view.scope)
                    matched = await self._matching(ps, how, scope, view.entitled, scope=view.scope)
                else:
                    # Entering scope: the new SOW part; leaving scope: out of focus.
                    for rec, body in await self._matching(
                        ps, FullScan(), everything, view.entitled, scope=view.scope
                    ):
                        assert body is None
                        parsed = self._parse(rec.data)
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
        sow_keys=frozenset(cmd["sow_keys"]) if cmd.get("sow_keys") is not None else None,
        message_type=cmd.get("message_type") or "json",
        topic_regex=cmd.get("topic_regex"),
    )


def failure_headers(spec: SubscriptionSpec, reason: str) -> list[tuple[str, bytes]]:
    """Headers of the message that tells a client the engine ended its subscription."""
    return [
        (h.COMMAND, FAILURE.encode()),
        (h.SUB_ID, spec.sub_id.encode()),
        (h.TOPIC, spec.topic.encode()),
        (h.REASON, reason.encode()),
    ]
