"""The offset range a pipeline job reads, and its errors, against a real broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sowstream.errors import PipelineError
from sowstream.pipeline.log_range import plan_log_range

pytestmark = pytest.mark.integration


@pytest.fixture()
def log_topic(kafka_bootstrap: str) -> Iterator[str]:
    """A 2-partition topic with 5 records per partition, written ~0.3 s apart in two waves."""
    name = f"lr{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(30)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for wave in range(2):
        for i in range(wave * 5, wave * 5 + 5):
            for p in (0, 1):
                producer.produce(name, value=b"{}", partition=p, key=str(i).encode())
        producer.flush(10)
        time.sleep(0.3)
    yield name
    admin.delete_topics([name])


def test_whole_log_until_now(kafka_bootstrap: str, log_topic: str) -> None:
    rng = plan_log_range(kafka_bootstrap, log_topic)
    assert rng.start == {0: 0, 1: 0} and rng.end == {0: 10, 1: 10} and rng.records == 20
    opts = rng.spark_options()
    assert f'"{log_topic}": {{"0": 10, "1": 10}}' in opts["endingOffsets"]


def test_now_reads_nothing_and_until_cuts_by_broker_time(
    kafka_bootstrap: str, log_topic: str
) -> None:
    assert plan_log_range(kafka_bootstrap, log_topic, start="now").records == 0
    assert plan_log_range(kafka_bootstrap, log_topic, until_ms=0).records == 0
    # the time of the sixth record of partition 0 splits the two waves
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": uuid.uuid4().hex})
    c.assign([TopicPartition(log_topic, 0, 5)])
    msg = None
    while msg is None:
        msg = c.poll(1)
    second_wave = msg.timestamp()[1]
    c.close()
    first = plan_log_range(kafka_bootstrap, log_topic, until_ms=second_wave - 1)
    assert first.end == {0: 5, 1: 5}
    later = plan_log_range(kafka_bootstrap, log_topic, start=second_wave)
    assert later.start == {0: 5, 1: 5} and later.end == {0: 10, 1: 10}


def test_unknown_topic_is_named(kafka_bootstrap: str) -> None:
    with pytest.raises(PipelineError, match="log topic 'no-such-log' does not exist"):
        plan_log_range(kafka_bootstrap, "no-such-log")


def test_unreachable_broker_fails_fast() -> None:
    started = time.monotonic()
    with pytest.raises(PipelineError, match=r"cannot reach Kafka at 127\.0\.0\.1:1"):
        plan_log_range("127.0.0.1:1", "anything")
    assert time.monotonic() - started < 30


def test_records_aged_out_of_retention(kafka_bootstrap: str, log_topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    # what retention does to old segments, done explicitly: partition 1 now starts at offset 3
    futures = admin.delete_records([TopicPartition(log_topic, 1, 3)])
    for fut in futures.values():
        fut.result(30)
    with pytest.raises(PipelineError, match=r"partition 1: offsets 0\.\.2 aged out of retention"):
        plan_log_range(kafka_bootstrap, log_topic)
    with pytest.raises(PipelineError, match="records from the requested time aged out"):
        plan_log_range(kafka_bootstrap, log_topic, start=0)
    # from a time after the deleted records: nothing is missing
    assert plan_log_range(kafka_bootstrap, log_topic, start="now").records == 0
