"""The runtime's table recovery: faust's, copying far-behind changelog partitions in bulk first.

:class:`BatchedRecovery` is faust's ``Recovery`` with one step added: once faust has read where
each active changelog partition's store stands and where the changelog ends, the partitions far
behind are copied by :func:`~sowstream.engine.restore.copy_changelog` (confluent-kafka into
RocksDB batches, see :mod:`~sowstream.engine.restore`) and faust is told the offsets reached.
A runtime module: with :mod:`~sowstream.engine.runtime`, the only ones of the engine that import
faust.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any, cast

from faust.stores.rocksdb import Store as RocksStore
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.types import TP
from faust.types.transports import ConsumerT

from sowstream.engine.restore import BATCHED_MIN_RECORDS, PartitionCopy, copy_changelog

log = logging.getLogger("sowstream.engine")


def seekable(offsets: Mapping[TP, int | None], tps: set[TP]) -> Counter[TP]:
    """Where recovery seeks each changelog partition: faust turns -1 (nothing read) into 0 but
    passes on an offset it could not learn (None, while the broker restarts), and aiokafka's
    seek raised ValueError for it: the recovery crashed and stopped the worker. Unknown reads
    the changelog from its start, as nothing read does."""
    out: Counter[TP] = Counter()
    for tp in tps:
        offset = offsets.get(tp)
        out[tp] = offset if offset is not None and offset >= 0 else -1
    return out


class BatchedRecovery(Recovery):
    """faust's Recovery, which first copies far-behind active changelog partitions in bulk."""

    def __init__(
        self, app: Any, tables: Any, *, client_config: Mapping[str, str], **kwargs: Any
    ) -> None:
        super().__init__(app, tables, **kwargs)
        self._client_config = dict(client_config)
        # A copy cut short by a rebalance finishes its current batch in its thread; the next
        # copy waits for it, so two never write one database.
        self._copying: asyncio.Future[None] | None = None
        self.copies: dict[str, dict[int, PartitionCopy]] = {}  # the copy running now, by topic

    async def _wait(self, coro: Any, timeout: Any = None) -> None:
        # faust bounds each recovery step by the request timeout and takes a step that runs out
        # of it for a stopped service (its recovery would end for good). The copy's length grows
        # with the store; it watches for stalls itself (copy_changelog) and a rebalance still
        # interrupts it.
        if getattr(coro, "cr_code", None) is _BUILD_OFFSETS:
            timeout = None
        await super()._wait(coro, timeout=timeout)

    async def _seek_offsets(
        self, consumer: ConsumerT, tps: set[TP], offsets: Any, title: str
    ) -> None:
        await super()._seek_offsets(consumer, tps, seekable(offsets, tps), title)

    async def _build_offsets(
        self, consumer: ConsumerT, tps: set[TP], destination: Any, title: str
    ) -> None:
        if title == "active" and self._copying is not None and not self._copying.done():
            await asyncio.shield(self._copying)
            for tp in tps:  # what the interrupted copy stored meanwhile
                table = self.tp_to_table.get(tp)
                persisted = table.persisted_offset(tp) if table is not None else None
                if persisted is not None and (
                    destination[tp] is None or destination[tp] < persisted
                ):
                    destination[tp] = persisted
        await super()._build_offsets(consumer, tps, destination, title)
        if title == "active":
            await self._copy_behind(tps, destination)

    async def _copy_behind(self, tps: set[TP], destination: Any) -> None:
        """Copy every active partition far behind its changelog's end; tell faust the offsets."""
        plans: dict[str, dict[int, PartitionCopy]] = {}
        for tp in sorted(tps):
            store = getattr(self.tp_to_table.get(tp), "data", None)
            if not isinstance(store, RocksStore) or not store.use_rocksdict:
                continue
            end = self.active_highwaters.get(tp)
            have = destination[tp] if destination[tp] is not None else -1
            if end is None or end - have < BATCHED_MIN_RECORDS:
                continue
            try:
                db = store._db_for_partition(tp.partition)
            except Exception as exc:  # rocksdict raises bare Exception (e.g. lock held)
                log.warning("batched restore skips %s: %s; faust restores it", tp, exc)
                continue
            plans.setdefault(tp.topic, {})[tp.partition] = PartitionCopy(
                tp.partition, db, have + 1, end
            )
        if not plans:
            return
        stop = threading.Event()
        loop = asyncio.get_running_loop()
        stall = float(self.app.conf.broker_request_timeout)
        started = time.perf_counter()
        work = asyncio.gather(
            *(
                loop.run_in_executor(
                    None, copy_changelog, self._client_config, topic, copies, stop, stall
                )
                for topic, copies in plans.items()
            ),
            return_exceptions=True,
        )
        self._copying = cast("asyncio.Future[None]", work)
        self.copies = plans
        try:
            outcomes = await asyncio.shield(work)
        except asyncio.CancelledError:
            stop.set()  # a new rebalance: faust starts over, from what was stored
            raise
        finally:
            self.copies = {}
        elapsed = time.perf_counter() - started
        records = 0
        for (topic, copies), outcome in zip(plans.items(), outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning(
                    "batched restore of %s stopped (%s); faust restores the rest", topic, outcome
                )
            for p, c in copies.items():
                records += c.records
                if c.last >= c.start:
                    destination[TP(topic, p)] = c.last
        log.info(
            "restored %d changelog records of %d partitions in %.2f s (%s)",
            records,
            sum(len(c) for c in plans.values()),
            elapsed,
            ", ".join(sorted(plans)),
        )


_BUILD_OFFSETS = BatchedRecovery._build_offsets.__code__


def restore_progress(app: Any) -> list[dict[str, Any]]:
    """The changelog partitions this worker is restoring now: the last offset restored (by
    faust or by a batched copy) and the changelog's end (``sowstream status``)."""
    if not app.in_recovery:
        return []
    recovery = app.tables.recovery
    copies: dict[str, dict[int, PartitionCopy]] = getattr(recovery, "copies", {})
    rows = []
    for tp, end in sorted(recovery.active_highwaters.items()):
        done = recovery.active_offsets.get(tp)
        copy = copies.get(tp.topic, {}).get(tp.partition)
        if copy is not None and (done is None or copy.last > done):
            done = copy.last
        rows.append(
            {
                "changelog": tp.topic,
                "partition": tp.partition,
                "offset": -1 if done is None else int(done),
                "end": int(end),
            }
        )
    return rows


def batched_table_manager(client_config: Mapping[str, str]) -> type[TableManager]:
    """A faust TableManager whose recovery is :class:`BatchedRecovery` (``client_config``:
    the confluent-kafka settings of the copy: bootstrap servers and security)."""
    settings = dict(client_config)

    class BatchedTableManager(TableManager):
        @property
        def recovery(self) -> Recovery:
            if self._recovery is None:
                self._recovery = BatchedRecovery(
                    self.app, self, client_config=settings, beacon=self.beacon, loop=self.loop
                )
            return self._recovery

    return BatchedTableManager
