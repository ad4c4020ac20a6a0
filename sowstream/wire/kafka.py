"""confluent-kafka plumbing shared by the client, the engine's bootstrap step and the tools."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from sowstream.errors import KafkaUnreachableError, SowstreamError

# The largest record the engine's producers send: Kafka's default message.max.bytes (1 MiB),
# which is also the largest record batch a broker takes by default.
MAX_RECORD_BYTES = 1_048_576
# The largest log record (value, key and headers) the engine takes: what it writes again for a
# record (its changelog form, a dead letter, a re-keyed copy, replies and subscription messages)
# adds its own fields, and must still fit MAX_RECORD_BYTES. A larger one is a dead letter.
LARGEST_LOG_RECORD = MAX_RECORD_BYTES - 16 * 1024


class KafkaLog:
    """Where librdkafka's own log lines go (confluent-kafka's ``logger`` setting): DEBUG records
    of the ``sowstream.kafka`` logger, their syslog severity in the text.

    Without a ``logger`` librdkafka writes to stderr itself, so a command-line user saw lines
    such as ``%6|…|BGQUEUE|… Purging 1 unserved events``; our own errors already say what went
    wrong. confluent-kafka forwards the lines when the client is polled or flushed, and drops
    those of a client being destroyed.
    """

    SEVERITY = ("emerg", "alert", "crit", "error", "warning", "notice", "info", "debug")

    def __init__(self, name: str = "sowstream.kafka") -> None:
        self.logger = logging.getLogger(name)

    def log(self, level: int, msg: str, *args: object) -> None:
        """confluent-kafka's call: ``level`` is a Python level mapped from the syslog one."""
        self.logger.debug("librdkafka %s: " + msg, logging.getLevelName(level).lower(), *args)


KAFKA_LOG = KafkaLog()


def quiet(conf: Mapping[str, Any]) -> dict[str, Any]:
    """``conf`` with librdkafka's log lines routed to :data:`KAFKA_LOG` (a setting in ``conf``
    wins). Any: confluent-kafka's stubs type settings as scalars, though ``logger`` is an
    object."""
    return {"logger": KAFKA_LOG, **conf}


def producer_config(bootstrap: str, extra: Mapping[str, str] | None = None) -> dict[str, object]:
    """Settings for every confluent-kafka producer we create.

    ``murmur2_random`` makes librdkafka pick the same partition for a key as the Java client and
    aiokafka (faust) do; librdkafka's own default (CRC32) would scatter a record's updates.
    """
    conf: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "partitioner": "murmur2_random",
        "enable.idempotence": True,
        "linger.ms": 5,
        "compression.type": "lz4",
        "log_level": 4,  # librdkafka's info lines (e.g. purged queues on close) are noise here
    }
    conf.update(extra or {})
    return conf


@dataclass(frozen=True)
class TopicSpec:
    """A topic we need, with the settings that matter to sowstream."""

    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


def ensure_topics(
    bootstrap: str,
    specs: list[TopicSpec],
    *,
    replication_factor: int = 1,
    extra: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> None:
    """Create the topics that are missing; fail if an existing one has another partition count.

    A changed partition count would silently re-route keys, so it is an error, not a fix-up.
    """
    admin = AdminClient(quiet({"bootstrap.servers": bootstrap, **(extra or {})}))
    try:
        _ensure(admin, bootstrap, specs, replication_factor, timeout)
    finally:
        admin.poll(0)  # its log lines (e.g. why a broker did not answer) to KAFKA_LOG


def _ensure(
    admin: AdminClient,
    bootstrap: str,
    specs: list[TopicSpec],
    replication_factor: int,
    timeout: float,
) -> None:
    """ensure_topics' work, on its admin client."""
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        reason = exc.args[0].str() if exc.args else str(exc)
        raise KafkaUnreachableError(
            f"cannot reach Kafka at {bootstrap} within {timeout:.0f}s ({reason})"
        ) from exc
    for spec in specs:
        meta = existing.get(spec.name)
        if meta is not None and meta.error is None and len(meta.partitions) != spec.partitions:
            raise SowstreamError(
                f"Kafka topic {spec.name!r} has {len(meta.partitions)} partitions but the "
                f"configuration needs {spec.partitions}; keys would land on other partitions"
            )
    missing = [
        NewTopic(
            s.name,
            num_partitions=s.partitions,
            replication_factor=replication_factor,
            config=s.config,
        )
        for s in specs
        if s.name not in existing
    ]
    if not missing:
        return
    for name, future in admin.create_topics(missing, operation_timeout=timeout).items():
        try:
            future.result(timeout)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue  # another worker created it meanwhile
            raise SowstreamError(f"could not create Kafka topic {name!r}: {exc}") from exc


def delete_topics(
    bootstrap: str, names: list[str], extra: Mapping[str, str] | None = None, timeout: float = 10.0
) -> None:
    """Delete topics, ignoring ones that are already gone."""
    if not names:
        return
    admin = AdminClient(quiet({"bootstrap.servers": bootstrap, **(extra or {})}))
    for future in admin.delete_topics(names, operation_timeout=timeout).values():
        with contextlib.suppress(KafkaException):  # already gone
            future.result(timeout)
    admin.poll(0)  # hand its log lines to KAFKA_LOG before it goes


def topic_configs(
    bootstrap: str, names: list[str], extra: Mapping[str, str] | None = None, timeout: float = 10.0
) -> dict[str, dict[str, str]]:
    """Each existing topic's settings as the broker reports them (defaults included); a topic
    the broker does not describe is left out."""
    if not names:
        return {}
    admin = AdminClient(quiet({"bootstrap.servers": bootstrap, **(extra or {})}))
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in names]
    out: dict[str, dict[str, str]] = {}
    try:
        for resource, future in admin.describe_configs(resources, request_timeout=timeout).items():
            try:
                entries = future.result(timeout)
            except KafkaException:
                continue
            out[resource.name] = {
                key: entry.value for key, entry in entries.items() if entry.value is not None
            }
    finally:
        admin.poll(0)
    return out
