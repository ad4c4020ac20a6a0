"""Which offsets of a transaction log a pipeline job reads, checked before Spark starts.

Spark's Kafka source retries a missing broker or topic for a long time and reports offsets lost
to retention deep inside a task failure; asking Kafka first, with short timeouts, turns each of
those into one clear error and a fixed, reproducible offset range per partition.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from sowstream.errors import PipelineError

META_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class LogRange:
    """Per partition, the first offset to read and the offset to stop before."""

    topic: str
    start: dict[int, int]
    end: dict[int, int]
    until_ms: int

    @property
    def records(self) -> int:
        """How many offsets the range spans (an upper bound on records read)."""
        return sum(max(0, self.end[p] - self.start[p]) for p in self.start)

    def spark_options(self) -> dict[str, str]:
        """The Kafka source options that read exactly this range."""
        return {
            "assign": json.dumps({self.topic: sorted(self.start)}),
            "startingOffsets": json.dumps({self.topic: {str(p): o for p, o in self.start.items()}}),
            "endingOffsets": json.dumps({self.topic: {str(p): o for p, o in self.end.items()}}),
        }


def plan_log_range(
    bootstrap: str,
    topic: str,
    *,
    start: str | int = "epoch",
    until_ms: int | None = None,
    kafka: Mapping[str, str] | None = None,
) -> LogRange:
    """Offsets of ``topic`` from ``start`` (epoch, now or a time in ms) up to ``until_ms``.

    Raises PipelineError when the broker does not answer, the topic does not exist, or records
    the range needs were already removed by retention.
    """
    conf: dict[str, str | int | float | bool] = {
        "bootstrap.servers": bootstrap,
        "log_level": 3,
        **(kafka or {}),
    }
    admin = AdminClient(conf)
    try:
        meta = admin.list_topics(timeout=META_TIMEOUT_S)  # naming the topic could auto-create it
    except KafkaException as exc:
        raise PipelineError(
            f"cannot reach Kafka at {bootstrap} within {META_TIMEOUT_S:.0f}s: {exc}"
        ) from exc
    info = meta.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        raise PipelineError(f"log topic {topic!r} does not exist on the broker at {bootstrap}")
    partitions = sorted(info.partitions)
    until = int(time.time() * 1000) if until_ms is None else until_ms
    consumer = Consumer(
        {**conf, "group.id": f"sowstream-pipeline-{uuid.uuid4().hex}", "enable.auto.commit": False}
    )
    try:
        marks = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=META_TIMEOUT_S)
            for p in partitions
        }
        end = _offsets_at(consumer, topic, marks, until + 1)
        if start == "epoch":
            begin = {p: 0 for p in partitions}
        elif start == "now":
            begin = dict(end)
        else:
            begin = _offsets_at(consumer, topic, marks, int(start))
        _check_retained(consumer, topic, marks, begin, start)
    except KafkaException as exc:
        raise PipelineError(f"log topic {topic!r}: cannot read offsets: {exc}") from exc
    finally:
        consumer.close()
    begin = {p: min(begin[p], end[p]) for p in partitions}
    return LogRange(topic, begin, end, until)


def _offsets_at(
    consumer: Consumer, topic: str, marks: Mapping[int, tuple[int, int]], millis: int
) -> dict[int, int]:
    """Per partition, the first offset whose timestamp is at or after ``millis``."""
    found = consumer.offsets_for_times(
        [TopicPartition(topic, p, millis) for p in marks], timeout=META_TIMEOUT_S
    )
    # -1: no record that late, so the partition's end
    return {tp.partition: tp.offset if tp.offset >= 0 else marks[tp.partition][1] for tp in found}


def _check_retained(
    consumer: Consumer,
    topic: str,
    marks: Mapping[int, tuple[int, int]],
    begin: Mapping[int, int],
    start: str | int,
) -> None:
    """Fail when records the range starts with were deleted by retention."""
    for p, (low, high) in marks.items():
        if low == 0 or start == "now":
            continue
        if start == "epoch":
            raise PipelineError(
                f"log topic {topic!r} partition {p}: offsets 0..{low - 1} aged out of retention, "
                "so a rebuild from epoch would miss them (rebuild from a later time, or restore "
                "the log)"
            )
        # From a time: records at or after it may have been among the deleted ones when the
        # oldest record still there is already later than the time asked for.
        if begin[p] <= low < high and _timestamp_at(consumer, topic, p, low) > int(start):
            raise PipelineError(
                f"log topic {topic!r} partition {p}: records from the requested time aged out "
                f"of retention (the oldest retained record, offset {low}, is later)"
            )


def _timestamp_at(consumer: Consumer, topic: str, partition: int, offset: int) -> int:
    consumer.assign([TopicPartition(topic, partition, offset)])
    deadline = time.monotonic() + META_TIMEOUT_S
    while time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            return int(msg.timestamp()[1])
    raise PipelineError(f"log topic {topic!r} partition {partition}: offset {offset} unreadable")
