"""One SOW topic's engine: applies log batches to partition state, answers queries, places
subscriptions, expires records.

Everything runs on the worker's event loop. A partition's lock is held while its state is read or
written, so a query sees the state between two log batches: a consistent snapshot of that
partition. :class:`TopicProcessor` only assembles the parts, each in its module:

* :mod:`~sowstream.engine.table`: the held partitions' state (owned there), store reads, index
  planning, batch writes;
* :mod:`~sowstream.engine.outbox`: subscription messages and views' change events sent;
* :mod:`~sowstream.engine.apply`: log batches folded, stored in order, announced;
* :mod:`~sowstream.engine.ownership`: a partition loaded, rebuilt or checked on assignment;
* :mod:`~sowstream.engine.queries`: ``sow`` answers;
* :mod:`~sowstream.engine.placement`: subscriptions placed, replays, conflation flushes;
* :mod:`~sowstream.engine.maintenance`: expiry and History pruning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sowstream.config.models import TopicConfig
from sowstream.engine.apply import Applier
from sowstream.engine.maintenance import Maintenance
from sowstream.engine.native import NativeMode, default_mode, native_fold
from sowstream.engine.outbox import Outbox
from sowstream.engine.ownership import Ownership
from sowstream.engine.partition import PartitionState
from sowstream.engine.placement import Placement
from sowstream.engine.ports import LogReader, Sender, StateTable
from sowstream.engine.queries import Queries
from sowstream.engine.queues import QueueRuntime
from sowstream.engine.registry import RegistryProgress
from sowstream.engine.store import (
    MemoryPartition,
    PartitionStore,
    PrefixedPartition,
    RocksPartition,
)
from sowstream.engine.table import PartitionTable
from sowstream.sow.compiled import CompiledTopic
from sowstream.sow.ops import RawRecord
from sowstream.subscriptions.matcher import EntitlementLookup, TopicSubscriptions
from sowstream.views.conflated import ConflatedFeed
from sowstream.views.routing import ViewFeed
from sowstream.wire.avro import encode
from sowstream.wire.topics import TopicNames
from sowstream.wire.versions import VERSION_HEADER

# LogReader, Sender, RawRecord and PartitionState are imported from here by the worker's modules
# (until they import them from where they are defined).
__all__ = ["LogReader", "PartitionState", "RawRecord", "Sender", "TopicProcessor"]


class TopicProcessor:
    """The engine for one SOW topic on one worker: its partition table and the stages that
    receive it, with the methods the worker calls."""

    def __init__(
        self,
        compiled: CompiledTopic[TopicConfig],
        names: TopicNames,
        sender: Sender,
        *,
        table: StateTable | None = None,
        log_reader: LogReader | None = None,
        entitlement: EntitlementLookup | None = None,
        new_store: Callable[[int], PartitionStore] | None = None,
        native: NativeMode | None = None,
        key_prefix: bytes | None = None,
        registry: RegistryProgress | None = None,
    ) -> None:
        """``compiled``: the topic with its message type and stages (its unit compiles them
        once); ``table``: the RocksDB table that keeps the partitions (None: in memory);
        ``new_store`` replaces how a partition's store is made (tests keep stores across
        processors, as RocksDB outlives a worker); ``native``: whether the compiled fold applies
        the log (engine.native; None: $SOWSTREAM_NATIVE, else on); ``key_prefix``: the topic's
        keys in ``table``, which it shares with other topics (those created on first use)."""
        topic = compiled.definition
        self.topic = topic
        self.compiled = compiled
        self.names = names
        # Queues whose underlying topics include this one, and views and conflated topics reading
        # it (set up by the engine): each applied publish or change goes to them.
        self.queues: list[QueueRuntime] = []
        self.views: list[ViewFeed | ConflatedFeed] = []
        self._sender = sender
        if new_store is None:
            new_store = _store_maker(topic, table, key_prefix)
        self.table = PartitionTable(compiled, sender, new_store, backed=table is not None)
        self.subs = TopicSubscriptions(
            compiled, entitlement, current=self.table.current_record if topic.sow else None
        )
        self.outbox = Outbox(compiled, sender, self.views)
        mode = native or default_mode()
        self.applier = Applier(
            self.table,
            names,
            sender,
            self.subs,
            self.outbox,
            self.queues,
            native_fold(compiled, mode),
            shadow=mode == "shadow",
        )
        self.ownership = Ownership(
            self.table, sender, log_reader, self.subs, self.queues, self.applier
        )
        self.queries = Queries(self.table, sender, self.subs, self.ownership)
        self.placement = Placement(
            self.table,
            sender,
            log_reader,
            self.subs,
            self.outbox,
            self.applier,
            self.ownership,
            self.queries,
            registry,
        )
        self.log_topic = self.applier.log_topic
        self.maintenance = Maintenance(self.table, sender, self.log_topic)
        # What the worker calls, by stage.
        self.state = self.table.get
        self.process = self.applier.process
        self.drain = self.applier.drain
        self.store_changes = self.applier.store_changes
        self.ready = self.ownership.ready
        self.caught_up = self.ownership.caught_up
        self.drop = self.ownership.drop
        self.verify_log = self.ownership.verify_log
        self.partition_status = self.ownership.partition_status
        self.query = self.queries.query
        self.subscribe = self.placement.subscribe
        self.unsubscribe = self.placement.unsubscribe
        self.flush_conflated = self.placement.flush_conflated
        self.send_failure = self.outbox.send_failure
        self.expire_due = self.maintenance.expire_due
        self.prune_history = self.maintenance.prune_history

    @property
    def view_name(self) -> str | None:
        """Set when this topic is a view or conflated topic: only its maintainer writes the log."""
        return self.applier.view_name

    @view_name.setter
    def view_name(self, name: str | None) -> None:
        self.applier.view_name = name

    @property
    def partitions(self) -> list[int]:
        """Partitions this worker currently holds state for."""
        return self.table.partitions

    async def reply(self, reply_to: str, body: dict[str, Any]) -> None:
        """Send one Reply built by the worker's command handling (dropped if the client is gone).

        The stages answer through :class:`~sowstream.engine.replies.ReplyWriter`; this stays
        for the worker's callers until they do too.
        """
        await self._sender.send_reply(reply_to, encode("Reply", body), VERSION_HEADER)


def _store_maker(
    topic: TopicConfig, table: StateTable | None, key_prefix: bytes | None = None
) -> Callable[[int], PartitionStore]:
    """How a partition's store is made: in the table's RocksDB (under ``key_prefix`` in a
    shared one), or in memory for a transient topic (and without a table)."""
    if topic.durability == "transient" or table is None:
        return lambda partition: MemoryPartition()
    if key_prefix is not None:
        return lambda partition: PrefixedPartition(RocksPartition(table, partition), key_prefix)
    return lambda partition: RocksPartition(table, partition)
