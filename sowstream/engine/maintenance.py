"""Time-driven upkeep of a topic's partitions: record expiry and History pruning."""

from __future__ import annotations

import heapq
import logging
import time
from typing import Any

from sowstream.config.models import TopicConfig
from sowstream.engine.derived import delivered
from sowstream.engine.partition import HISTORY_PRUNE_SECONDS
from sowstream.engine.ports import Sender, wall_clock_ms
from sowstream.engine.store import commit
from sowstream.engine.table import PartitionTable
from sowstream.sow.history import HISTORY_PREFIX, expired_versions
from sowstream.sow.patterns import split_key
from sowstream.sow.record import SowRecord
from sowstream.wire import headers as h

log = logging.getLogger("sowstream.engine")

EXPIRE = h.SOW_EXPIRE.encode()
# How long a written removal has to come back through the log before it is written again.
RECHECK_MS = 30_000


class Maintenance:
    """The maintenance stage, run by the worker's timers."""

    def __init__(self, table: PartitionTable, sender: Sender, log_topic: str) -> None:
        self.topic: TopicConfig = table.topic
        self._table = table
        self._sender = sender
        self._log_topic = log_topic
        self._pruned_at = 0.0  # when History was last pruned (time.monotonic)

    async def expire_due(self, now_ms: int | None = None) -> int:
        """Ask for the removal of every record whose expiration has passed; returns how many
        removals were written to the log.

        An expiry is written to the topic's log as a ``sow_expire`` record and applied when the
        pump reads it back, like any other operation: its messages then have a log position of
        their own, so a new owner that meets it again after a crash sends the same position
        (which subscribers drop as a repeat) instead of a second ``oof`` at a later one."""
        table = self._table
        if not table.expires:
            return 0
        now = now_ms if now_ms is not None else wall_clock_ms()
        total = 0
        for p, ps in table.states():
            if not ps.ready or not ps.expiry or ps.expiry[0][0] > now:
                continue
            # No lock: the records are read through the batches in flight, and a removal that
            # a later update overtakes is a no-op when applied (it names the expiration).
            due_now: dict[bytes, SowRecord] = {}
            while ps.expiry and ps.expiry[0][0] <= now:
                when, key = heapq.heappop(ps.expiry)
                stored = table.load_record(ps, {}, key)
                # Entries go stale when an update moves the expiration later (the new one has
                # an entry of its own) or the record goes.
                if stored is not None and (stored.expiration or now + 1) <= when:
                    due_now[key] = stored
            if not due_now:
                continue
            sent = [await self._request(p, stored) for stored in due_now.values()]
            failed: RuntimeError | None = None
            try:
                await delivered([f for f in sent if f is not None], "expiry removals")
                total += len(due_now)
            except RuntimeError as exc:
                failed = exc
                log.error("topic %s partition %d: expiry postponed: %s", self.topic.name, p, exc)
            for key, stored in due_now.items():
                # A failed request is tried again next pass. A written one is looked at again
                # later: by then the pump has applied it and the record is gone, unless the
                # request was lost with a worker (repeating it is harmless: a no-op if applied).
                when = (stored.expiration or now) if failed is not None else now + RECHECK_MS
                heapq.heappush(ps.expiry, (when, key))
        return total

    async def _request(self, partition: int, stored: SowRecord) -> Any:
        """Write the removal of ``stored`` to its log partition, keyed as its publishes are."""
        name, sow_key = split_key(stored.sow_key) if self.topic.pattern else ("", stored.sow_key)
        headers = [(h.COMMAND, EXPIRE), (h.DUE, str(stored.expiration).encode())]
        if name:
            headers.append((h.TOPIC, name.encode()))
        return await self._sender.send(
            self._log_topic, None, key=sow_key.encode(), partition=partition, headers=headers
        )

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
                    await commit(ps.store, changes, self._sender)
                    total += len(drop)
        return total
