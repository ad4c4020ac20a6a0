"""Message queues: the per-worker delivery state of one queue (``machine``), free of I/O."""

from sowstream.queues.machine import (
    AckOutcome,
    AckResult,
    Bookmark,
    Lease,
    QueueMachine,
    QueueMessage,
    QueueStats,
    Removed,
)

__all__ = [
    "AckOutcome",
    "AckResult",
    "Bookmark",
    "Lease",
    "QueueMachine",
    "QueueMessage",
    "QueueStats",
    "Removed",
]
