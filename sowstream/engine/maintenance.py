"""Time-driven upkeep of a topic's partitions: record expiry and History pruning."""

from __future__ import annotations

import heapq
import logging
import time

from sowstream.config.models import TopicConfig
from sowstream.engine import metrics
from sowstream.engine.aggregates import ensure_live_groups
from sowstream.engine.derived import delivered
from sowstream.engine.outbox import Outbox
from sowstream.engine.partition import HISTORY_PRUNE_SECONDS
from sowstream.engine.ports import Sender, wall_clock_ms
from sowstream.engine.table import PartitionTable
from sowstream.sow.history import HISTORY_PREFIX, expired_versions
from sowstream.sow.record import SowRecord
from sowstream.subscriptions.matcher import TopicSubscriptions
from sowstream.subscriptions.model import OOF_EXPIRED, Change

log = logging.getLogger("sowstream.engine")


class Maintenance:
    """The maintenance stage, run by the worker's timers."""

    def __init__(
        self, table: PartitionTable, sender: Sender, subs: TopicSubscriptions, outbox: Outbox
    ) -> None:
        self.topic: TopicConfig = table.topic
        self._table = table
        self._sender = sender
        self._subs = subs
        self._outbox = outbox
        self._pruned_at = 0.0  # when History was last pruned (time.monotonic)

    async def expire_due(self, now_ms: int | None = None) -> int:
        """Delete every record whose expiration has passed; returns how many were deleted."""
        table = self._table
        if not table.expires:
            return 0
        now = now_ms if now_ms is not None else wall_clock_ms()
        total = 0
        for p, ps in table.states():
            if not ps.ready or not ps.expiry or ps.expiry[0][0] > now:
                continue
            async with ps.lock:
                await table.settle(ps)
                await ensure_live_groups(table, p, ps, self._subs)
                overlay: dict[bytes, SowRecord | None] = {}
                before: dict[bytes, SowRecord | None] = {}
                while ps.expiry and ps.expiry[0][0] <= now:
                    due, key = heapq.heappop(ps.expiry)
                    stored = table.load_record(ps, overlay, key)
                    # Entries go stale when an update moves the expiration; only the current one
                    # counts.
                    if stored is None or stored.expiration != due:
                        continue
                    before[key] = stored
                    overlay[key] = None
                if overlay and (self._subs or self._outbox.views):
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
                    await self._outbox.deliver(self._subs.dispatch(expired, now), wait=True)
                    try:
                        await delivered(await self._outbox.feed_views(expired), "change events")
                    except RuntimeError as exc:
                        # Stored, the expiry would never reach the views: retried next pass.
                        log.error(
                            "topic %s partition %d: expiry postponed: %s", self.topic.name, p, exc
                        )
                        for due, key in ((r.expiration or 0, k) for k, r in before.items() if r):
                            heapq.heappush(ps.expiry, (due, key))
                        continue
                if overlay:
                    journal = self._subs.take_journal(p)
                    changes = table.write(ps, overlay, before, journal=journal)
                    await ps.store.replicate(changes, self._sender)
                    total += len(overlay)
        if total:
            metrics.EXPIRED.labels(self.topic.name).inc(total)
        return total

    async def prune_history(self, now_ms: int | None = None) -> int:
        """Drop versions that left the History Window (at most once a minute)."""
        history = self._table.history
        if history is None or history.window_ms is None:
            return 0
        if time.monotonic() - self._pruned_at < HISTORY_PRUNE_SECONDS:
            return 0
        self._pruned_at = time.monotonic()
        cutoff = (now_ms if now_ms is not None else wall_clock_ms()) - history.window_ms
        total = 0
        for _, ps in self._table.states():
            if not ps.ready:
                continue
            async with ps.lock:
                await self._table.settle(ps)
                drop = expired_versions(ps.store.scan(prefix=HISTORY_PREFIX), cutoff)
                if drop:
                    changes: dict[bytes, bytes | None] = dict.fromkeys(drop)
                    ps.store.write(changes)
                    await ps.store.replicate(changes, self._sender)
                    total += len(drop)
        return total
