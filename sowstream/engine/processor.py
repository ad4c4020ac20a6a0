"""One SOW topic's engine: applies log batches to partition state, answers queries, places
subscriptions, expires records.

Everything runs on the worker's event loop. A partition's lock is held while its state is read or
written, so a query sees the state between two log batches: a consistent snapshot of that
partition. :class:`TopicProcessor` is assembled from one stage per concern, each in its module:

* :mod:`~sowstream.engine.partition`: partition state, store reads, index planning, replies;
* :mod:`~sowstream.engine.apply`: log batches folded, stored in order, announced;
* :mod:`~sowstream.engine.ownership`: a partition loaded, rebuilt or checked on assignment;
* :mod:`~sowstream.engine.queries`: ``sow`` answers;
* :mod:`~sowstream.engine.placement`: subscriptions placed, replays, conflation flushes;
* :mod:`~sowstream.engine.maintenance`: expiry and History pruning.
"""

from __future__ import annotations

from sowstream.engine.maintenance import Maintenance
from sowstream.engine.partition import LogReader, PartitionState, Sender, live_headers
from sowstream.engine.placement import Placement, failure_headers, spec_from_command
from sowstream.engine.queries import aggregation_of
from sowstream.sow.ops import RawRecord

__all__ = [
    "LogReader",
    "PartitionState",
    "RawRecord",
    "Sender",
    "TopicProcessor",
    "aggregation_of",
    "failure_headers",
    "live_headers",
    "spec_from_command",
]


class TopicProcessor(Placement, Maintenance):
    """The engine for one SOW topic on one worker."""
