"""Rebuild a topic's SOW from its transaction log on Spark, with exactly the engine's semantics.

The log is read with Spark's Kafka source over an offset range fixed up front
(``plan_log_range``). Deletes by filter are partition-wide and rare, so they are collected and
shipped to every task; every other record is routed by its Kafka key (the SowKey), sorted by
(key, partition, offset) and folded per key by ``sowstream.sow.fold``, the same operations the
engine applies. Work spreads over keys, not log partitions, so it scales with the cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sowstream.config.models import TopicConfig
from sowstream.config.root import SowstreamConfig
from sowstream.errors import PipelineError
from sowstream.pipeline.log_range import LogRange, plan_log_range
from sowstream.sow.compiled import compile_topic
from sowstream.sow.fold import FilterDeletes, fold_sorted, reads_previous, state_row
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
    # Repeated header names: the last wins, as header_map() does (session.SESSION_CONF).
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


def require_supported(topic: TopicConfig) -> None:
    """What the Spark jobs can rebuild: json topics (filters become Spark JSON columns) without
    a Pattern (they fold per Kafka key, which the names of a regular expression topic share);
    others are refused with a PipelineError that says why."""
    if topic.pattern is not None:
        raise PipelineError(
            f"topic {topic.name!r} is a regular expression topic (Pattern "
            f"{topic.pattern!r}): the Spark pipeline does not rebuild Pattern topics yet; "
            "their workers rebuild them from the log"
        )
    if topic.message_type != "json":
        raise PipelineError(
            f"{topic.message_type} topic {topic.name!r}: the Spark pipeline rebuilds json topics "
            f"only for now; {topic.message_type} topics are rebuilt by their workers from the log"
        )


def fold_log(topic: TopicConfig, log: DataFrame, until_ms: int, partitions: int) -> DataFrame:
    """The SOW (``STATE_SCHEMA`` rows) that folding ``log`` (from ``read_log``) gives.

    A full publish replaces its record whatever came before (unless the topic's Enrichment reads
    the record before it), so only each key's records from its last full publish on are sent to
    Python (the JVM finds that point with a window); the
    rare key whose last publish the engine would reject or re-key is folded again from its
    whole history.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    is_fdel = _filter_delete_condition()
    fdel_rows = [_raw(r.asDict()) for r in log.where(is_fdel).collect()]
    keyed = log.where(~is_fdel & log["key"].isNotNull()).repartition(partitions, "key", "partition")
    if reads_previous(compile_topic(topic)):
        # Each publish's Enrichment reads the record before it: every key folds its whole log.
        whole = keyed.sortWithinPartitions("key", "partition", "offset")
        return whole.mapInArrow(
            _folder(topic, fdel_rows, until_ms, anchored=False), FOLD_SCHEMA
        ).drop("refold")
    command = F.coalesce(F.col("headers")[h.COMMAND], F.lit(h.PUBLISH))
    is_publish = (command == h.PUBLISH) & F.col("value").isNotNull()
    anchor = F.max(F.when(is_publish, F.col("offset"))).over(Window.partitionBy("key", "partition"))
    pruned = (
        keyed.withColumn("anchor", anchor)
        .where(F.col("anchor").isNull() | (F.col("offset") >= F.col("anchor")))
        .drop("anchor")
        .sortWithinPartitions("key", "partition", "offset")
    )
    folded = pruned.mapInArrow(_folder(topic, fdel_rows, until_ms, anchored=True), FOLD_SCHEMA)
    folded = folded.cache()
    again = [r.refold for r in folded.where(F.col("refold").isNotNull()).collect()]
    state = folded.where(F.col("refold").isNull()).drop("refold")
    if again:
        full = keyed.where(F.col("key").isin(again)).sortWithinPartitions(
            "key", "partition", "offset"
        )
        rest = full.mapInArrow(_folder(topic, fdel_rows, until_ms, anchored=False), FOLD_SCHEMA)
        state = state.unionByName(rest.drop("refold"))
    return state


FOLD_SCHEMA = STATE_SCHEMA + ", refold binary"


def _folder(
    topic: TopicConfig, fdel_rows: list[RawRecord], until_ms: int, *, anchored: bool
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The per-task fold: sorted log rows in, ``FOLD_SCHEMA`` rows out."""

    def fold(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        compiled = compile_topic(topic)  # once per task, on the executor that folds
        by_partition: dict[int, list[RawRecord]] = {}
        for rec in fdel_rows:
            by_partition.setdefault(rec.partition, []).append(rec)
        deletes = {p: FilterDeletes.of(compiled, recs) for p, recs in by_partition.items()}

        def records() -> Iterator[RawRecord]:
            for batch in batches:
                for row in batch.to_pylist():
                    yield _raw(row)

        out: list[dict[str, Any]] = []
        folded = fold_sorted(compiled, records(), deletes, until_ms=until_ms, anchored=anchored)
        for partition, key, state in folded:
            if state is None:
                out.append({"refold": key})
            else:
                out.append({**state_row(state, partition), "refold": None})
            if len(out) >= OUT_BATCH_ROWS:
                yield pa.RecordBatch.from_pylist(out, schema=_arrow_schema())
                out = []
        if out:
            yield pa.RecordBatch.from_pylist(out, schema=_arrow_schema())

    return fold


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
            ("refold", pa.binary()),
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
    require_supported(topic)
    log_topic = TopicNames(config.engine.topic_prefix).log(topic.name)
    rng = plan_log_range(
        bootstrap, log_topic, start=start, until_ms=until_ms, kafka=config.engine.kafka
    )
    if rng.records == 0:
        return RebuildResult(spark.createDataFrame([], STATE_SCHEMA), rng)
    log = read_log(spark, bootstrap, rng, config.engine.kafka)
    partitions = max(2, spark.sparkContext.defaultParallelism * 2)
    return RebuildResult(fold_log(topic, log, rng.until_ms, partitions), rng)
