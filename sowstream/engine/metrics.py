"""Prometheus metrics of a worker (served on ``engine.web_port`` when set)."""

from __future__ import annotations

import time

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
QUEUE_RETENTION_ALARM = Gauge(
    "sowstream_queue_retention_alarm",
    "1 while a queue message not yet finished with is older than 80% of its log's retention.ms "
    "(the log would delete its body), else 0",
    ["queue"],
)
QUEUE_LOST = Counter(
    "sowstream_queue_lost_offsets_total",
    "Log offsets a queue had not finished with that the log no longer held when a worker "
    "loaded the partition (deleted by retention)",
    ["queue"],
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

# A log batch's life in the worker, each stage timed from the moment its records were fetched
# (``fetch`` itself: from the oldest record's log timestamp to the fetch). Cumulative, so the
# stages read as a timeline; bench.subs_bench prints them next to its latency figures.
BATCH_STAGES = (
    "fetch",  # log timestamp of the fetch's oldest record -> fetched
    "locked",  # the partition lock held and the in-flight window open
    "folded",  # the fold done
    "replies_enqueued",  # subscription messages and view events handed to the producer
    "replies_acked",  # Kafka acknowledged the subscription messages
    "changelog_acked",  # Kafka acknowledged the changelog records
    "stored",  # written to RocksDB, after its changelog records: the batch is done
)
BATCH_STAGE_SECONDS = Histogram(
    "sowstream_batch_stage_seconds",
    "When each stage of a log batch's life ended, in seconds since its records were fetched "
    "(stage fetch: since the oldest record's log timestamp)",
    ["stage"],
    buckets=(
        0.0005,
        0.001,
        0.002,
        0.003,
        0.005,
        0.0075,
        0.01,
        0.015,
        0.02,
        0.03,
        0.05,
        0.075,
        0.1,
        0.15,
        0.2,
        0.3,
        0.5,
        1.0,
        2.0,
        5.0,
    ),
)
_STAGE = {stage: BATCH_STAGE_SECONDS.labels(stage) for stage in BATCH_STAGES}


class BatchLife:
    """Times one batch's stages since its fetch (see BATCH_STAGES)."""

    __slots__ = ("fetched",)

    def __init__(self, fetched: float | None = None) -> None:
        """``fetched``: the ``time.perf_counter()`` of the fetch (default: now)."""
        self.fetched = time.perf_counter() if fetched is None else fetched

    def mark(self, stage: str) -> None:
        """Stage ``stage`` of the batch ended now."""
        _STAGE[stage].observe(time.perf_counter() - self.fetched)


def fetched(oldest_timestamp_ms: int) -> float:
    """Note a fetch whose oldest record has log timestamp ``oldest_timestamp_ms``; returns the
    fetch's ``time.perf_counter()`` for the batches cut from it."""
    now = time.perf_counter()
    waited = time.time() - oldest_timestamp_ms / 1000
    if waited >= 0:
        _STAGE["fetch"].observe(waited)
    return now


NATIVE_RECORDS = Counter(
    "sowstream_native_records_total",
    "Log records folded by the compiled fold, and records left to the Python fold (from the "
    "first one it declined to the end of its chunk)",
    ["topic", "outcome"],
)
NATIVE_MISMATCHES = Counter(
    "sowstream_native_mismatches_total",
    "Chunks whose compiled fold differed from the Python fold (engine.native: shadow)",
    ["topic"],
)
NATIVE_PANICS = Counter(
    "sowstream_native_panics_total",
    "Chunks the compiled fold panicked or failed on (folded again by the Python fold)",
    ["topic"],
)
