"""Answering ``sow`` queries: a consistent snapshot per partition, sent in batches."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import orjson

from sowstream.engine import metrics
from sowstream.engine.ownership import Ownership
from sowstream.engine.partition import (
    MAX_REPLY_BYTES,
    PartitionMoved,
    PartitionState,
    wall_clock_ms,
)
from sowstream.errors import InvalidCommandError, SowstreamError
from sowstream.filters import FilterError
from sowstream.sow.aggregate import Aggregation, parse_aggregation
from sowstream.sow.bookmarks import Bookmark, parse_bookmark
from sowstream.sow.history import HISTORY_PREFIX, as_of_bound, check_window, states_as_of
from sowstream.sow.patterns import split_key
from sowstream.sow.planner import FullScan, Plan
from sowstream.sow.query import result_order, validate_query
from sowstream.sow.record import SowRecord
from sowstream.subscriptions.delta import project
from sowstream.subscriptions.model import WITH_SOW

log = logging.getLogger("sowstream.engine")


class Queries(Ownership):
    """The query stage: ``sow`` (plain, by SowKeys, historical, aggregated) per partition."""

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
            check_window(self.topic.name, self._history, max(bookmark.at_ms, 0), wall_clock_ms())
        return bookmark

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
            scope = self.scope(cmd.get("topic_regex"), cmd.get("sow_keys"))
            if not self.codec.has_fields and (
                opts.filter is not None or opts.order_by or aggregation is not None
            ):
                raise InvalidCommandError(
                    f"{self.topic.message_type} topic {self.topic.name!r}: its messages are not "
                    "parsed, so a sow takes no content filter, OrderBy or aggregate (query by "
                    "SowKeys instead)"
                )
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
        except PartitionMoved:
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
            how: Plan = FullScan()
            if records is None:
                how = await self._query_plan(partition, ps, opts.filter, cmd.get("sow_keys"), scope)
            matched = await self._matching(ps, how, opts, visible, records, scope)
        if self._parts.get(partition) is not ps:
            return  # revoked while reading: the new owner answers
        if aggregation is not None:
            # The client merges every partition's partial aggregates, then orders and trims.
            partials = aggregation.partial(
                body if body is not None else self._parse(r.data) for r, body in matched
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
        pattern = self.topic.pattern is not None
        for rank, (rec, body) in enumerate(matched):
            if select is not None:
                data = self.codec.serialise(project(body or self._parse(rec.data), select))
            else:
                data = rec.data
            # A Pattern topic's record says which topic name it was published under.
            name, sow_key = split_key(rec.sow_key) if pattern else ("", rec.sow_key)
            item = {
                "sow_key": sow_key,
                "data": data,
                "timestamp": rec.log_timestamp,
                "log_offset": rec.log_offset,
                "sort_rank": rank,
                "topic": name,
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


def aggregation_of(cmd: dict[str, Any]) -> Aggregation | None:
    """The aggregation a ``sow`` command asks for with grouping/projection (or None)."""
    options = cmd.get("options") or {}
    grouping, projection = options.get("grouping"), options.get("projection")
    if grouping is None and projection is None:
        return None
    return parse_aggregation(grouping, projection)
