"""A log partition held in a list, for unit tests of the stages that read the log
(the worker reads Kafka; the integration tests cover that reader)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from sowstream.sow.ops import RawRecord


class ListLog:
    """:class:`~sowstream.engine.ports.LogReader` over records kept in memory; ``first``
    plays retention: offsets below it are gone."""

    def __init__(self, records: list[RawRecord] | None = None) -> None:
        self.records: list[RawRecord] = list(records or [])
        self.first = 0

    def _of(self, partition: int) -> list[RawRecord]:
        return [r for r in self.records if r.partition == partition and r.offset >= self.first]

    async def end_offset(self, partition: int) -> int:
        return max((r.offset for r in self._of(partition)), default=-1)

    async def start_offset(self, partition: int) -> int:
        held = self._of(partition)
        if not held:
            return await self.end_offset(partition) + 1
        return min(r.offset for r in held)

    async def offset_for_time(self, partition: int, at_ms: int) -> int:
        later = [r.offset for r in self._of(partition) if r.timestamp >= at_ms]
        return min(later, default=await self.end_offset(partition) + 1)

    async def batches(
        self, partition: int, until: int, start: int = 0
    ) -> AsyncIterator[list[RawRecord]]:
        batch = [r for r in self._of(partition) if start <= r.offset <= until]
        if batch:
            yield batch
