"""Answering ``sow`` queries: a consistent snapshot per partition, sent in batches."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from sowstream.config.models import TopicConfig
from sowstream.engine import metrics
from sowstream.engine.ownership import Ownership
from sowstream.engine.partition import PartitionMoved, PartitionState
from sowstream.engine.ports import Sender, wall_clock_ms
from sowstream.engine.replies import MAX_REPLY_BYTES, ReplyWriter
from sowstream.engine.table import PartitionTable
from sowstream.errors import InvalidCommandError, SowstreamError
from sowstream.filters import FilterError
from sowstream.sow.aggregate import Aggregation, parse_aggregation
from sowstream.sow.bookmarks import Bookmark, parse_bookmark
from sowstream.sow.history import HISTORY_PREFIX, as_of_bound, check_window, states_as_of
from sowstream.sow.patterns import split_key
from sowstream.sow.planner import FullScan, Plan
from sowstream.sow.query import QueryOptions, result_order, validate_query
from sowstream.sow.record import SowRecord, stored_key
from sowstream.subscriptions.delta import project
from sowstream.subscriptions.matcher import TopicSubscriptions
from sowstream.subscriptions.model import BAD_FILTER, BAD_OPTION, WITH_SOW
from sowstream.wire import rawscan
from sowstream.wire.protocol import PARTIAL, SOW, Command, ReplyRecord

log = logging.getLogger("sowstream.engine")

# The reason a command is refused for, by the error that refused it.
TIMEOUT = "timeout"


class Queries:
    """The query stage: ``sow`` (plain, by SowKeys, historical, aggregated) per partition."""

    def __init__(
        self,
        table: PartitionTable,
        sender: Sender,
        subs: TopicSubscriptions,
        ownership: Ownership,
    ) -> None:
        """``ownership`` loads a partition a query arrives for before it is read."""
        self.topic: TopicConfig = table.topic
        self.codec = table.compiled.codec
        self._table = table
        self._sender = sender
        self._subs = subs
        self._ownership = ownership

    def as_of(self, ps: PartitionState, bookmark: Bookmark) -> dict[str, SowRecord]:
        """Every record of the partition as it was at the bookmark (History required)."""
        history = self._table.history
        assert history is not None and bookmark.at_ms is not None
        if bookmark.at_ms < 0:
            return {}
        bound = as_of_bound(history, bookmark.at_ms)
        return {r.sow_key: r for r in states_as_of(ps.store.scan(prefix=HISTORY_PREFIX), bound)}

    def bookmark(self, cmd: Command) -> Bookmark | None:
        """The command's bookmark option, checked against the topic (InvalidCommandError)."""
        text = cmd.option("bookmark")
        if not text:
            return None
        bookmark = parse_bookmark(text)
        if bookmark.at_ms is None:
            return None  # NOW: nothing to replay
        if cmd.command != SOW and cmd.command not in WITH_SOW:
            return bookmark  # a replay from the log needs no History
        history = self._table.history
        if history is None and cmd.command != SOW:
            # As AMPS does: without History, sow_and_subscribe answers with the current state
            # and the subscription starts now.
            return None
        if bookmark.at_ms >= 0 or history is None:
            check_window(self.topic.name, history, max(bookmark.at_ms, 0), wall_clock_ms())
        return bookmark

    async def query(self, cmd: Command, partition: int) -> None:
        """Answer one partition's share of a ``sow`` command on the client's reply topic."""
        table = self._table
        writer = ReplyWriter.for_command(self._sender, cmd, self.topic.name, partition)
        try:
            if not self.topic.sow:
                raise InvalidCommandError(
                    f"topic {self.topic.name!r} has no SOW: it can be subscribed to, not queried"
                )
            opts = validate_query(
                filter=cmd.filter,
                order_by=cmd.order_by,
                top_n=cmd.top_n,
                skip_n=cmd.skip_n,
                batch_size=cmd.batch_size or 1,
            )
            bookmark = self.bookmark(cmd)
            aggregation = aggregation_of(cmd)
            scope = table.scope(cmd.topic_regex, cmd.sow_keys)
            if not self.codec.has_fields and (
                opts.filter is not None or opts.order_by or aggregation is not None
            ):
                raise InvalidCommandError(
                    f"{self.topic.message_type} topic {self.topic.name!r}: its messages are not "
                    "parsed, so a sow takes no content filter, OrderBy or aggregate (query by "
                    "SowKeys instead)"
                )
        except (FilterError, InvalidCommandError) as exc:
            await writer.failure(refusal(exc), str(exc))
            return
        ps = await self._ownership.ready(partition)
        try:
            await table.wait_applied(partition, ps, cmd.after_offset)
        except PartitionMoved:
            return  # the partition's new owner reads this command again and answers it
        except SowstreamError as exc:
            await writer.failure(TIMEOUT, str(exc))
            return
        started = time.perf_counter()
        visible = self._subs.visible(cmd.identity)
        # Raw batches when the client reads them; aggregates have partials of their own.
        raw = wants_raw(cmd) and aggregation is None
        if opts.top_n == 0 and aggregation is None:
            # Nothing can be shown: answer at once (clients probe readiness this way, and a
            # full scan of a large partition for nothing would pile up behind their retries).
            await writer.end(0)
            return
        async with ps.lock:
            await table.settle(ps)
            past = self.as_of(ps, bookmark) if bookmark is not None else None
            if past is not None and cmd.sow_keys:
                past = {k: past[k] for k in cmd.sow_keys if k in past}
            records = past.values() if past is not None else None
            how: Plan = FullScan()
            if records is None:
                how = await table.query_plan(partition, ps, opts.filter, cmd.sow_keys, scope)
            if raw:
                values, bodies = await table.matching_raw(ps, how, opts, visible, records, scope)
            else:
                matched = await table.matching(ps, how, opts, visible, records, scope)
        if not table.holds(partition, ps):
            return  # revoked while reading: the new owner answers
        if raw:
            await self.answer_raw(writer, values, bodies, opts)
            metrics.QUERY_SECONDS.labels(self.topic.name).observe(time.perf_counter() - started)
            return
        if aggregation is not None:
            # The client merges every partition's partial aggregates, then orders and trims.
            parse = table.parse
            partials = aggregation.partial(
                body if body is not None else parse(r.data) for r, body in matched
            )
            await send_partials(writer, partials)
            await writer.end(len(matched))
            metrics.QUERY_SECONDS.labels(self.topic.name).observe(time.perf_counter() - started)
            return
        if opts.ordered:
            order = result_order(opts.order_by)
            matched.sort(key=lambda pair: order((pair[0].sow_key, pair[1] or {})))
            if opts.keep is not None:
                matched = matched[: opts.keep]
        await writer.records(self.reply_records(matched), opts.batch_size)
        await writer.end(len(matched))
        metrics.QUERY_SECONDS.labels(self.topic.name).observe(time.perf_counter() - started)

    async def answer_raw(
        self,
        writer: ReplyWriter,
        values: list[bytes],
        bodies: list[dict[str, Any]] | None,
        opts: QueryOptions,
    ) -> None:
        """Send matched stored values as raw batches, ranked as :meth:`query` ranks records,
        then the ``part_end``."""
        if opts.ordered:
            order = result_order(opts.order_by)
            keys = [
                order((stored_key(v), bodies[i] if bodies is not None else {}))
                for i, v in enumerate(values)
            ]
            ranked = sorted(range(len(values)), key=keys.__getitem__)
            values = [values[i] for i in ranked[: opts.keep]]
        await writer.raw_records(values, opts.batch_size, self.raw_flags)
        await writer.end(len(values))

    @property
    def raw_flags(self) -> int:
        """The raw batch flags of this topic's answers (a Pattern topic's keys hold names)."""
        return rawscan.PATTERN_KEYS if self.topic.pattern is not None else 0

    def reply_records(
        self,
        matched: Iterable[tuple[SowRecord, dict[str, Any] | None]],
        select: tuple[str, ...] | None = None,
    ) -> Iterator[ReplyRecord]:
        """``matched`` as reply records ranked in order; with ``select``, only those fields."""
        pattern = self.topic.pattern is not None
        codec = self.codec
        for rank, (rec, body) in enumerate(matched):
            if select is not None:
                data = codec.serialise(project(body or codec.parse(rec.data), select))
            else:
                data = rec.data
            # A Pattern topic's record says which topic name it was published under.
            name, sow_key = split_key(rec.sow_key) if pattern else ("", rec.sow_key)
            yield ReplyRecord(sow_key, data, rec.log_timestamp, rec.log_offset, rank, name)


def wants_raw(cmd: Command) -> bool:
    """Whether ``cmd``'s client reads raw batches (it asks with the ``raw`` option)."""
    return cmd.option(rawscan.RAW_OPTION) == rawscan.RAW_V1


def refusal(exc: Exception) -> str:
    """The reason a command is refused for ``exc`` (a filter or another option)."""
    return BAD_FILTER if isinstance(exc, FilterError) else BAD_OPTION


async def send_partials(writer: ReplyWriter, partials: dict[str, Any]) -> None:
    """Partial aggregates as ``partial`` replies, split by group to stay under Kafka's limit.

    Each group is serialised once, as a ``"key":state`` member of the reply's JSON object.
    """
    members: list[bytes] = []
    size = 0
    for group, state in partials.items():
        member = orjson.dumps(group) + b":" + orjson.dumps(state)
        if members and size + len(member) > MAX_REPLY_BYTES:
            await _send_partial(writer, members)
            members, size = [], 0
        members.append(member)
        size += len(member) + 1
    if members:
        await _send_partial(writer, members)


async def _send_partial(writer: ReplyWriter, members: list[bytes]) -> None:
    data = b"{" + b",".join(members) + b"}"
    await writer.send(writer.base.with_(command=PARTIAL, records=[ReplyRecord("", data, 0, -1)]))


def aggregation_of(cmd: Command) -> Aggregation | None:
    """The aggregation a ``sow`` command asks for with grouping/projection (or None)."""
    grouping, projection = cmd.option("grouping"), cmd.option("projection")
    if grouping is None and projection is None:
        return None
    return parse_aggregation(grouping, projection)
