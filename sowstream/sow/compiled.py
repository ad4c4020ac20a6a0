"""A topic's definition together with what its records go through, compiled once.

Every log record of a topic is parsed and written by its message type and goes through its
Preprocessing and Enrichment. :func:`compile_topic` makes both once from the definition; the
holder (:class:`CompiledTopic`) is kept by whoever reads the topic's records (the engine's topic
unit, a rebuild job, a test) and handed to the fold functions of :mod:`sowstream.sow.ops`, so
the per-record path reads plain attributes and the configuration models stay data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from sowstream.messagetypes import MessageType, registry
from sowstream.sow.enrich import ENRICHMENT, NO_STAGES, PREPROCESSING, TopicStages, compile_stage
from sowstream.sow.ports import TopicDefinition

__all__ = ["CompiledTopic", "compile_stages", "compile_topic"]

# Covariant: a CompiledTopic of a TopicConfig is one of a TopicDefinition (the fold's argument).
TopicT = TypeVar("TopicT", bound=TopicDefinition, covariant=True)
Definition = TypeVar("Definition", bound=TopicDefinition)


@dataclass(frozen=True, slots=True)
class CompiledTopic(Generic[TopicT]):
    """One topic's ``definition`` with its message type (``codec``) and compiled
    Preprocessing and Enrichment (``stages``), made from it by :func:`compile_topic`."""

    definition: TopicT
    codec: MessageType
    stages: TopicStages


def compile_stages(topic: TopicDefinition) -> TopicStages:
    """The topic's compiled Preprocessing and Enrichment (:data:`NO_STAGES` when it has none);
    a Field that does not compile raises :class:`~sowstream.sow.enrich.StageError`."""
    if not topic.preprocessing and not topic.enrichment:
        return NO_STAGES
    return TopicStages(
        compile_stage(PREPROCESSING, topic.preprocessing, instance_name=topic.instance_name)
        if topic.preprocessing
        else None,
        compile_stage(
            ENRICHMENT, topic.enrichment, instance_name=topic.instance_name, key_fields=topic.keys
        )
        if topic.enrichment
        else None,
    )


def compile_topic(topic: Definition) -> CompiledTopic[Definition]:
    """``topic`` with its message type (an avro one reads its schema file; the registry keeps one
    instance per type and schema) and its compiled stages."""
    return CompiledTopic(topic, registry.get(topic.message_type, topic), compile_stages(topic))
