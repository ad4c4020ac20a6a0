"""What the engine says about its topics: Kafka topic specs and the meta-topic records clients read.

Clients learn a topic's definition (keys, partitions, log and control topics, schema...) from the
compacted meta topic; the worker writes a record per topic at start, and one per topic created on
first use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import Producer

from sowstream.config.models import TopicConfig
from sowstream.errors import SowstreamError
from sowstream.messagetypes import MessageType, registry
from sowstream.wire.avro import encode
from sowstream.wire.kafka import TopicSpec, producer_config
from sowstream.wire.topics import TopicNames
from sowstream.wire.versions import PRODUCE_HEADERS

# A meta-topic record (schemas/TopicInfo.avsc) per topic identity (or queue name).
Infos = dict[str, dict[str, Any]]

CONTROL_RETENTION_MS = 3_600_000  # commands only matter until answered
INPUT_RETENTION_MS = 7 * 24 * 3_600_000  # change events only matter until applied


def log_topic_spec(
    names: TopicNames, topic: str, partitions: int, message_type: str = "json"
) -> TopicSpec:
    """The transaction log of ``topic`` as the engine creates it.

    Kept forever by default; LogAppendTime: the broker stamps each record, so expiration,
    History and RecoveryPoint timestamps all use one clock.
    """
    return TopicSpec(
        names.log(topic, message_type),
        partitions,
        {"retention.ms": "-1", "message.timestamp.type": "LogAppendTime"},
    )


def control_topic_spec(name: str, partitions: int) -> TopicSpec:
    """A control topic (commands to a topic's partitions) as the engine creates it."""
    return TopicSpec(name, partitions, {"retention.ms": str(CONTROL_RETENTION_MS)})


def input_topic_spec(name: str, partitions: int) -> TopicSpec:
    """The input topic of a view or conflated topic (change events of its underlying topics)."""
    return TopicSpec(name, partitions, {"retention.ms": str(INPUT_RETENTION_MS)})


def topic_info(
    topic: TopicConfig,
    names: TopicNames,
    *,
    auto: bool = False,
    codec: MessageType | None = None,
) -> dict[str, Any]:
    """The meta-topic record describing ``topic`` (schemas/TopicInfo.avsc), under the key
    ``topic.ident``; ``auto`` for a topic created on first use, whose commands go to the shared
    control topic; ``codec``: the topic's message type, when the caller has it compiled."""
    if codec is None:
        codec = registry.get(topic.message_type, topic)
    exp = topic.expiration
    expiration = exp.mode if exp.mode != "default" else f"{exp.default_ms}ms"
    return {
        "name": topic.name,
        "message_type": topic.message_type,
        "keys": list(topic.keys),
        # A Pattern topic's names are their own key domains unless KeyDomain is set ("").
        "key_domain": topic.effective_key_domain
        if topic.pattern is None
        else topic.key_domain or "",
        "partitions": topic.partitions,
        "log_topic": names.log(topic.name, topic.message_type),
        "control_topic": names.auto_control
        if auto
        else names.control(topic.name, topic.message_type),
        "hash_indexes": [list(i) for i in topic.hash_indexes],
        "expiration": expiration,
        "durability": topic.durability,
        "sow": topic.sow,
        "key_generator": topic.key_generator.module if topic.key_generator else None,
        "key_generator_options": dict(topic.key_generator.options) if topic.key_generator else {},
        "auto": auto,
        "schema": getattr(codec, "schema_text", ""),
        "pattern": topic.pattern or "",
        "preprocessing": list(topic.preprocessing),
        "instance_name": topic.instance_name,
        "delta_keys": list(topic.delta_keys),
    }


def write_meta(
    bootstrap: str, kafka: Mapping[str, str], names: TopicNames, infos: Mapping[str, Any]
) -> None:
    """Publish topic definitions to the meta topic and wait until Kafka has them (blocking)."""
    producer = Producer(producer_config(bootstrap, kafka))
    for name, info in infos.items():
        producer.produce(
            names.meta,
            key=name.encode(),
            value=encode("TopicInfo", info),
            headers=PRODUCE_HEADERS,
        )
    if producer.flush(30) != 0:
        raise SowstreamError("could not publish topic definitions to the meta topic")
