"""Names of the Kafka topics sowstream uses, all under one prefix so engines can share a cluster."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "sowstream"


@dataclass(frozen=True)
class TopicNames:
    """The Kafka topic names under one prefix."""

    prefix: str = DEFAULT_PREFIX

    def log(self, sow_topic: str) -> str:
        """The transaction log of a SOW topic: every publish, delta and delete, keyed by SowKey."""
        return f"{self.prefix}.log.{sow_topic}"

    def control(self, sow_topic: str) -> str:
        """Commands that read a SOW topic (queries); co-partitioned with its log."""
        return f"{self.prefix}.ctl.{sow_topic}"

    @property
    def meta(self) -> str:
        """Compacted topic holding each SOW topic's definition, for clients."""
        return f"{self.prefix}.meta"

    @property
    def dead_letter(self) -> str:
        """Rejected log records with the reason."""
        return f"{self.prefix}.deadletter"

    @property
    def subscriptions(self) -> str:
        """Compacted registry of live subscriptions, read by every worker."""
        return f"{self.prefix}.subs"

    def queue_expired(self, queue: str) -> str:
        """Expiry events of a queue (time limit, forced, MaxCancels, MaxDeliveries) as JSON."""
        return f"{self.prefix}.queue.{queue}.expired"

    def reply(self, client_id: str) -> str:
        """A client's private reply topic."""
        return f"{self.prefix}.reply.{client_id}"
