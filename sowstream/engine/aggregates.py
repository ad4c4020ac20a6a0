"""The groups of an aggregated subscription on one partition, read from the partition's state.

A placement reads them with its snapshot, and a worker that loads a partition reads them for
every aggregated subscription already registered, so the partition's later changes update them
(``sowstream.subscriptions.matcher``) wherever the partition moves.
"""

from __future__ import annotations

from sowstream.engine.partition import PartitionState
from sowstream.engine.table import PartitionTable
from sowstream.sow.aggregate.live import LiveGroups
from sowstream.sow.planner import FullScan
from sowstream.sow.query import QueryOptions
from sowstream.subscriptions.matcher import TopicSubscriptions

__all__ = ["ensure_live_groups", "live_groups", "load_live_groups"]


async def live_groups(
    table: PartitionTable, partition: int, ps: PartitionState, subs: TopicSubscriptions, key: str
) -> LiveGroups | None:
    """Subscription ``key``'s groups over the partition's matching records now, kept in
    ``subs`` (caller holds the partition lock, nothing in flight); None if not aggregated."""
    spec = subs.get(key)
    aggregation = subs.aggregation_of(key)
    if spec is None or aggregation is None:
        return None
    view = subs.view(spec)
    scope = QueryOptions(view.filter, (), None, 0, 1)
    matched = await table.matching(ps, FullScan(), scope, view.entitled, scope=view.scope)
    groups = LiveGroups(aggregation)
    groups.load(
        body if body is not None else table.parse(rec.data)
        for rec, body in matched
        if view.covers(rec.sow_key)  # SowKeys the subscription is limited to
    )
    subs.set_live(key, partition, groups)
    return groups


async def ensure_live_groups(
    table: PartitionTable, partition: int, ps: PartitionState, subs: TopicSubscriptions
) -> None:
    """Before changes of ``partition`` are dispatched (caller holds its lock): read the groups
    of aggregated subscriptions registered after the partition was loaded (a worker may load
    a partition before it has read the registry), from the state with nothing in flight."""
    missing = subs.missing_groups(partition)
    if not missing:
        return
    await table.settle(ps)
    for key in missing:
        await live_groups(table, partition, ps, subs, key)


async def load_live_groups(
    table: PartitionTable, partition: int, ps: PartitionState, subs: TopicSubscriptions
) -> None:
    """Read the groups of every registered aggregated subscription (a partition just loaded)."""
    for key, _, _ in subs.aggregated():
        await live_groups(table, partition, ps, subs, key)
