"""Rebuild a topic's SOW from its transaction log on Spark, with exactly the engine's semantics.

The log is read with Spark's Kafka source over an offset range fixed up front
(``plan_log_range``). Deletes by filter are partition-wide and rare, so they are collected and
shipped to every task; every other record is routed by its Kafka key (the SowKey), sorted by
(key, partition, offset) and folded per key by ``sowstream.sow.fold``, the same operations the
engine applies. Work spreads over keys, not log partitions, so it scales with the cluster.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sowstream.config.models import SowstreamConfig, TopicConfig
from sowstream.pipeline.log_range import LogRange, plan_log_range
from sowstream.sow.fold import FilterDeletes, fold_sorted, state_row
from sowstream.sow.ops import RawRecord
from sowstream.wire import headers as h
from sowstream.wire.topics import TopicNames

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

# The rebuilt SOW: one row per live record, as the engine stores it.
STATE_SCHEMA = (
    "sow_key string, data string, log_partition int, log_offset long, "
    "log_timestamp long, expiration long"
)
OUT_BATCH_ROWS = 10_000


@dataclass(frozen=True)
class RebuildResult:
    """What a rebuild produced: the SOW as a DataFrame and the log range it folded."""

    state: DataFrame
    log_range: LogRange


def read_log(
    spark: SparkSession, bootstrap: str, rng: LogRange, kafka: Mapping[str, str]
) -> DataFrame:
    """The log records of ``rng`` with headers as a text map and the timestamp in ms."""
    from pyspark.sql import functions as F

    reader = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("includeHeaders", "true")
        .option("failOnDataLoss", "true")
    )
    for name, value in {
        **{f"kafka.{k}": v for k, v in kafka.items()},
        **rng.spark_options(),
    }.items():
        reader = reader.option(name, value)
    # header_map() semantics: the last header of a name wins
    spark.conf.set("spark.sql.mapKeyDedupPolicy", "LAST_WIN")
    headers = F.map_from_entries(
        F.transform(
            F.coalesce(F.col("headers"), F.array()),
            lambda e: F.struct(e["key"].alias("k"), F.decode(e["value"], "UTF-8").alias("v")),
        )
    )
    return reader.load().select(
        "partition",
        "offset",
        F.unix_millis("timestamp").alias("ts"),
        "key",
        "value",
        headers.alias("headers"),
    )


def _filter_delete_condition() -> Any:
    from pyspark.sql import functions as F

    hdr = F.col("headers")
    return (F.coalesce(hdr[h.COMMAND], F.lit("")) == h.SOW_DELETE) & hdr[h.FILTER].isNotNull()


def _raw(row: Mapping[str, Any]) -> RawRecord:
    return RawRecord(
        row["partition"],
        row["offset"],
        row["ts"],
        row["key"],
        row["value"],
        dict(row["headers"] or {}),
    )


def fold_log(topic: TopicConfig, log: DataFrame, until_ms: int, partitions: int) -> DataFrame:
    """The SOW (``STATE_SCHEMA`` rows) that folding ``log`` (from ``read_log``) gives."""
    is_fdel = _filter_delete_condition()
    fdel_rows = [_raw(r.asDict()) for r in log.where(is_fdel).collect()]
    keyed = (
        log.where(~is_fdel & log["key"].isNotNull())
        .repartition(partitions, "key")
        .sortWithinPartitions("key", "partition", "offset")
    )

    def fold(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        by_partition: dict[int, list[RawRecord]] = {}
        for rec in fdel_rows:
            by_partition.setdefault(rec.partition, []).append(rec)
        deletes = {p: FilterDeletes.of(topic, recs) for p, recs in by_partition.items()}

        def records() -> Iterator[RawRecord]:
            for batch in batches:
                for row in batch.to_pylist():
                    yield _raw(row)

        out: list[dict[str, Any]] = []
        for partition, state in fold_sorted(topic, records(), deletes, until_ms=until_ms):
            out.append(state_row(state, partition))
            if len(out) >= OUT_BATCH_ROWS:
                yield pa.RecordBatch.from_pylist(out, schema=_arrow_schema())
                out = []
        if out:
            yield pa.RecordBatch.from_pylist(out, schema=_arrow_schema())

    return keyed.mapInArrow(fold, STATE_SCHEMA)


def _arrow_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("sow_key", pa.string()),
            ("data", pa.string()),
            ("log_partition", pa.int32()),
            ("log_offset", pa.int64()),
            ("log_timestamp", pa.int64()),
            ("expiration", pa.int64()),
        ]
    )


def rebuild(
    spark: SparkSession,
    config: SowstreamConfig,
    topic_name: str,
    bootstrap: str,
    *,
    start: str | int = "epoch",
    until_ms: int | None = None,
) -> RebuildResult:
    """Fold ``topic_name``'s log from ``start`` up to ``until_ms`` (default: now) on Spark.

    ``start`` is ``"epoch"``, ``"now"`` or a time in ms (as a RecoveryPoint would be). Raises
    UnknownTopicError for a topic the config does not define and PipelineError when the log
    cannot be read completely.
    """
    topic = config.topic(topic_name)
    log_topic = TopicNames(config.engine.topic_prefix).log(topic.name)
    rng = plan_log_range(
        bootstrap, log_topic, start=start, until_ms=until_ms, kafka=config.engine.kafka
    )
    if rng.records == 0:
        return RebuildResult(spark.createDataFrame([], STATE_SCHEMA), rng)
    log = read_log(spark, bootstrap, rng, config.engine.kafka)
    partitions = max(2, spark.sparkContext.defaultParallelism * 2)
    return RebuildResult(fold_log(topic, log, rng.until_ms, partitions), rng)
