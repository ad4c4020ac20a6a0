"""Whether a queue can trust its log to keep the bodies it has not finished with.

A queue's messages are read from its topics' transaction logs (sowstream.queues.ledger), so the
log must keep every record the queue may still deliver: a compacted log drops superseded
records whatever their age, and a finite ``retention.ms`` drops them by age.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# An alarm is raised once the oldest unfinished message has used this share of the retention.
ALARM_SHARE = 0.8


@dataclass(frozen=True, slots=True)
class LogRetention:
    """How long a queue's log keeps records (None: forever)."""

    topic: str
    retention_ms: int | None

    @classmethod
    def check(cls, queue: str, topic: str, config: Mapping[str, str]) -> LogRetention:
        """The retention of ``topic`` (its broker settings ``config``); ValueError naming the
        queue and the topic when the log is compacted: the queue would lose messages."""
        policy = {part.strip() for part in config.get("cleanup.policy", "delete").split(",")}
        if "compact" in policy:
            raise ValueError(
                f"queue {queue!r}: its log {topic!r} is compacted (cleanup.policy="
                f"{config.get('cleanup.policy')}); a queue reads its messages from the log, and "
                "compaction drops superseded records it has not delivered. Use cleanup.policy="
                "delete with retention.ms=-1 (the engine's default)"
            )
        raw = config.get("retention.ms", "-1")
        try:
            retention = int(raw)
        except ValueError:
            raise ValueError(
                f"queue {queue!r}: its log {topic!r} has retention.ms={raw!r}, not a number"
            ) from None
        return cls(topic, retention if retention >= 0 else None)

    def outlives(self, lifetime_ms: int | None) -> bool:
        """Whether messages living ``lifetime_ms`` (None: until acknowledged) can outlive the
        log's records."""
        if self.retention_ms is None:
            return False
        return lifetime_ms is None or lifetime_ms > self.retention_ms

    def alarmed(self, oldest_ms: int | None, now_ms: int) -> bool:
        """Whether a message from ``oldest_ms`` is close to (or past) the log's retention."""
        if self.retention_ms is None or oldest_ms is None:
            return False
        return now_ms - oldest_ms >= self.retention_ms * ALARM_SHARE
