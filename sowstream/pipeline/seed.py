"""Turn a Spark rebuild into the state a worker recovers from (a *seed*).

A worker that lost its RocksDB normally restores each partition from the table's changelog
(faust, one record at a time) or, for transient topics, replays the log. A seed lets it start
from the rebuild instead: per log partition an SST file holding exactly what the engine's store
would hold (records, hash-index entries, the applied watermark), ingested by RocksDB as a whole
file. So that later restores from the changelog agree with the seed, the job also writes the
seed's entries to the changelog and deletes (tombstones) every record or index entry the seed no
longer has; the manifest records the changelog offsets this leaves, which the worker hands to
faust as the point its store is up to date with.

Workers of the engine must be stopped while a seed is written: they write the same changelog.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from sowstream.config.models import TopicConfig
from sowstream.config.root import SowstreamConfig
from sowstream.errors import PipelineError
from sowstream.pipeline.log_range import META_TIMEOUT_S
from sowstream.pipeline.rebuild import RebuildResult, require_supported
from sowstream.sow.compiled import compile_topic
from sowstream.sow.history import HISTORY_PREFIX
from sowstream.sow.layout import (
    FAUST_OFFSET_KEY,
    RESERVED_PREFIX,
    SEED_MANIFEST,
    SeedManifest,
    store_entries,
)
from sowstream.sow.record import SowRecord
from sowstream.wire.kafka import TopicSpec, ensure_topics
from sowstream.wire.topics import kafka_part

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

ENTRY_SCHEMA = "partition int, key binary, value binary"


def changelog_topic(config: SowstreamConfig, topic: TopicConfig) -> str:
    """The faust changelog topic of a persistent SOW topic's table."""
    return f"{config.engine.app_id}-sow-{kafka_part(topic.name)}-changelog"


def seed_dir_for(root: Path, topic: str) -> Path:
    """Where the seed of ``topic`` lives under a seed root."""
    return root / kafka_part(topic)


def _check_workers_stopped(bootstrap: str, app_id: str, kafka: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **kafka})
    try:
        group = admin.describe_consumer_groups([app_id])[app_id].result(META_TIMEOUT_S)
    except KafkaException:
        return  # no such group: no worker ever ran, or none is known to the broker
    if group.members:
        raise PipelineError(
            f"{len(group.members)} worker(s) of engine {app_id!r} are running: stop them before "
            "writing a seed (they write the same changelog)"
        )


def _store_entries(
    topic: TopicConfig, state: DataFrame, watermarks: dict[int, int], partitions: int
) -> DataFrame:
    """(partition, key, value) of every store entry the seed holds.

    Each Spark partition of the result holds whole log partitions, so SST files can be written
    from it without another shuffle.
    """
    indexes = [tuple(f) for f in topic.hash_indexes]
    memo = tuple(topic.indexes)
    codec = compile_topic(topic).codec

    def entries(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        by_partition: dict[int, list[SowRecord]] = {}
        for batch in batches:
            for row in batch.to_pylist():
                by_partition.setdefault(row["log_partition"], []).append(
                    SowRecord(
                        row["sow_key"],
                        row["data"].encode(),
                        row["log_offset"],
                        row["log_timestamp"],
                        row["expiration"],
                    )
                )
        for p, records in by_partition.items():
            rows = [
                {"partition": p, "key": k, "value": v}
                for k, v in store_entries(indexes, records, watermarks[p], codec, memo)
            ]
            yield pa.RecordBatch.from_pylist(rows, schema=_entry_schema())

    return state.repartition(partitions, "log_partition").mapInArrow(entries, ENTRY_SCHEMA)


def _entry_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([("partition", pa.int32()), ("key", pa.binary()), ("value", pa.binary())])


def _write_sst_files(entries: DataFrame, directory: Path) -> dict[int, int]:
    """One SST file per log partition; returns how many entries each holds.

    ``entries`` must keep each log partition within one Spark partition (``_store_entries``).
    """
    target = str(directory)

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from rocksdict import Options, SstFileWriter

        counts: dict[int, int] = {}
        writer = None
        current = None
        for batch in batches:
            for row in batch.to_pylist():
                if row["partition"] != current:
                    if writer is not None:
                        writer.finish()
                    current = row["partition"]
                    writer = SstFileWriter(Options(raw_mode=True))
                    writer.open(f"{target}/p{current}.sst")
                    counts[current] = 0
                assert writer is not None
                writer[row["key"]] = row["value"]
                counts[row["partition"]] += 1
        if writer is not None:
            writer.finish()
        yield pa.RecordBatch.from_pylist(
            [{"partition": p, "entries": n} for p, n in counts.items()],
            schema=pa.schema([("partition", pa.int32()), ("entries", pa.int64())]),
        )

    rows = (
        entries.sortWithinPartitions("partition", "key")
        .mapInArrow(write, "partition int, entries long")
        .collect()
    )
    return {r.partition: r.entries for r in rows}


def _starts(column: str, prefix: bytes) -> Any:
    """A binary column begins with ``prefix``."""
    from pyspark.sql import functions as F

    return F.col(column).substr(1, len(prefix)) == F.lit(bytearray(prefix))


def _changelog_ends(
    bootstrap: str, topic: str, partitions: int, kafka: dict[str, str]
) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "sowstream-seed", **kafka})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=META_TIMEOUT_S)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def write_seed(
    spark: SparkSession,
    config: SowstreamConfig,
    result: RebuildResult,
    topic_name: str,
    bootstrap: str,
    root: Path,
) -> SeedManifest:
    """Write ``result`` as the seed of ``topic_name`` under ``root`` and align the changelog."""
    from pyspark.sql import functions as F

    topic = config.topic(topic_name)
    require_supported(topic)
    if topic.durability != "persistent" or not topic.sow:
        raise PipelineError(
            f"topic {topic.name!r} keeps no persistent SOW: its workers rebuild it from the log"
        )
    kafka = dict(config.engine.kafka)
    _check_workers_stopped(bootstrap, config.engine.app_id, kafka)
    changelog = changelog_topic(config, topic)
    ensure_topics(
        bootstrap,
        [TopicSpec(changelog, topic.partitions, {"cleanup.policy": "compact"})],
        replication_factor=config.engine.replication_factor,
        extra=kafka,
    )
    rng = result.log_range
    watermarks = {p: rng.end.get(p, 0) - 1 for p in range(topic.partitions)}
    entries = _store_entries(topic, result.state, watermarks, topic.partitions)
    # partitions with no record still get their watermark
    present = {r.log_partition for r in result.state.select("log_partition").distinct().collect()}
    codec = compile_topic(topic).codec
    missing = [
        (p, *store_entries([], [], w, codec)[0]) for p, w in watermarks.items() if p not in present
    ]
    if missing:
        entries = entries.unionByName(spark.createDataFrame(missing, ENTRY_SCHEMA))
    entries = entries.persist()
    directory = seed_dir_for(root, topic.name)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / SEED_MANIFEST).unlink(missing_ok=True)  # not a seed until the manifest is back

    # Tombstones: whatever the changelog holds that the seed does not (History is kept).
    old = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .options(**{f"kafka.{k}": v for k, v in kafka.items()})
        .option("subscribe", changelog)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
        .select("partition", "key")
        .where(
            ~_starts("key", HISTORY_PREFIX) & (F.col("key") != F.lit(bytearray(FAUST_OFFSET_KEY)))
        )
        .distinct()
    )
    gone = old.join(entries.select("partition", "key"), ["partition", "key"], "left_anti")
    tombstones = gone.select("partition", "key", F.lit(None).cast("binary").alias("value"))
    (
        entries.where(~_starts("key", RESERVED_PREFIX))
        .unionByName(tombstones)
        .unionByName(entries.where(_starts("key", RESERVED_PREFIX)))
        .write.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .options(**{f"kafka.{k}": v for k, v in kafka.items()})
        .option("topic", changelog)
        .save()
    )
    counts = _write_sst_files(entries, directory)
    entries.unpersist()
    ends = _changelog_ends(bootstrap, changelog, topic.partitions, kafka)
    manifest = SeedManifest(
        topic=topic.name,
        app_id=config.engine.app_id,
        log_topic=rng.topic,
        changelog_topic=changelog,
        until_ms=rng.until_ms,
        created_ms=int(time.time() * 1000),
        partitions={
            p: {
                "file": f"p{p}.sst",
                "entries": counts.get(p, 0),
                "watermark": watermarks[p],
                "changelog_offset": ends[p] - 1,
            }
            for p in range(topic.partitions)
        },
    )
    manifest.save(directory)
    return manifest
