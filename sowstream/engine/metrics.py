"""Prometheus metrics of a worker (served on ``engine.web_port`` when set)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

UPDATES = Counter("sowstream_updates_applied_total", "Log operations applied to the SOW", ["topic"])
REJECTED = Counter(
    "sowstream_updates_rejected_total", "Log records sent to the dead-letter topic", ["topic"]
)
EXPIRED = Counter("sowstream_records_expired_total", "SOW records removed on expiry", ["topic"])
QUERY_SECONDS = Histogram(
    "sowstream_query_seconds", "Time to answer one partition's share of a sow query", ["topic"]
)
QUERY_PLANS = Counter(
    "sowstream_query_plans_total",
    "Partition queries by how their records were found (key, hash, memo, union or scan)",
    ["topic", "plan"],
)
MEMO_BUILDS = Counter(
    "sowstream_memo_index_builds_total", "Memo indexes built on a partition", ["topic"]
)
DELIVERED = Counter(
    "sowstream_subscription_messages_total",
    "Messages sent to subscribers (publish and oof)",
    ["topic"],
)
SUBSCRIPTIONS_DROPPED = Counter(
    "sowstream_subscriptions_dropped_total",
    "Subscriptions dropped by the slow-consumer policy or because the client went away",
    ["reason"],
)
REPLIES_PARKED_DROPPED = Counter(
    "sowstream_parked_replies_dropped_total",
    "Replies parked for a reply topic that did not appear in time or outgrew the bound",
)
LOGS_RECREATED = Counter(
    "sowstream_logs_recreated_total",
    "Log partitions found recreated below their stored watermark (the SOW is kept, the new log "
    "applied from its start)",
    ["topic", "partition"],
)
VIEW_EVENTS = Counter(
    "sowstream_view_events_total",
    "Change events sent to views' input topics, by underlying topic",
    ["topic"],
)
VIEW_CHANGES = Counter(
    "sowstream_view_changes_total",
    "View records written or deleted by view maintainers",
    ["view"],
)
VIEW_UPDATES = Counter(
    "sowstream_view_updates_total",
    "Underlying changes a view read (stage incoming) and applied (stage processed); with "
    "Conflation inline their ratio is the view's conflation ratio",
    ["view", "stage"],
)
QUEUE_MESSAGES = Counter(
    "sowstream_queue_messages_total",
    "Queue messages by what happened to them on this worker: delivered, acked, sent "
    "(at-most-once), barrier, or the expiry reason (time_limit, forced_expire, max_cancels, "
    "max_deliveries)",
    ["queue", "event"],
)
QUEUE_DEPTH = Gauge(
    "sowstream_queue_depth",
    "Messages in the queue on this worker (its partitions), available or leased",
    ["queue", "state"],
)
CONFLATED_INCOMING = Counter(
    "sowstream_conflated_incoming_total",
    "Changes of the underlying topic a conflated topic took in on this worker",
    ["topic"],
)
CONFLATED_PUBLISHED = Counter(
    "sowstream_conflated_published_total",
    "Records a conflated topic wrote to its log on this worker (incoming / published is its "
    "conflation ratio)",
    ["topic"],
)
