"""A queue reads its messages from its topics' logs, so a worker checks those logs on a real
broker when it starts: a compacted log is refused and a finite retention is warned about, both
naming the queue."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from sowstream.config.loader import load_config
from sowstream.engine.app import Engine
from sowstream.errors import SowstreamError
from sowstream.wire.kafka import TopicSpec, ensure_topics
from sowstream.wire.topics import TopicNames
from tests.support.engine import write_config

pytestmark = pytest.mark.integration


def engine_over(bootstrap: str, tmp_path: Path, log_config: dict[str, str]) -> Engine:
    """A worker of a queue ``WQ`` over topic ``jobs``, whose log exists with ``log_config``."""
    prefix = f"ret{uuid.uuid4().hex[:8]}"
    ensure_topics(bootstrap, [TopicSpec(TopicNames(prefix).log("jobs"), 1, log_config)])
    path = write_config(
        tmp_path / "config.yaml",
        [],
        prefix=prefix,
        plain_topics=[{"Name": "jobs", "Partitions": 1}],
        queues=[{"Name": "WQ", "UnderlyingTopic": "jobs", "Expiration": "2d"}],
    )
    return Engine(load_config(path), bootstrap=bootstrap, data_dir=tmp_path / "data")


def test_a_queue_over_a_compacted_log_is_refused_at_start(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    engine = engine_over(kafka_bootstrap, tmp_path, {"cleanup.policy": "compact"})
    with pytest.raises(SowstreamError, match=r"queue 'WQ': its log '\S+\.log\.jobs' is compacted"):
        engine.prepare(20)


def test_a_log_kept_shorter_than_the_queues_messages_live_is_warned_about(
    kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = engine_over(kafka_bootstrap, tmp_path, {"retention.ms": str(3_600_000)})
    with caplog.at_level(logging.WARNING, "sowstream.engine"):
        engine.prepare(20)
    assert "queue WQ: its log" in caplog.text and "keeps records 3600 s" in caplog.text
    assert "live 172800 s (Expiration)" in caplog.text
    (runtime,) = engine.topology.queues.values()
    assert runtime.retention["jobs"].retention_ms == 3_600_000


def test_a_log_kept_forever_raises_nothing(
    kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = engine_over(kafka_bootstrap, tmp_path, {"retention.ms": "-1"})
    with caplog.at_level(logging.WARNING, "sowstream.engine"):
        engine.prepare(20)
    assert "queue WQ" not in caplog.text
    (runtime,) = engine.topology.queues.values()
    assert runtime.retention["jobs"].retention_ms is None
