"""What the SOW reads of a topic's configuration, as ports.

The SOW folds the log by its topic's definition but does not depend on how that definition is
validated: these protocols name only what ``sow`` reads, and the pydantic models of
``sowstream.config`` (``TopicConfig``, ``ExpirationPolicy``, ``HistoryConfig``,
``KeyGeneratorConfig``) satisfy them structurally, so ``config`` sits above ``sow``.
Members are read-only properties so that a frozen model's fields (``Literal`` types included)
fit them. What is compiled from a definition (its message type and stages) is not part of it:
:mod:`sowstream.sow.compiled` holds it.
"""

from __future__ import annotations

from typing import Protocol

from sowstream.filters import Filter

__all__ = ["ExpirationRule", "HistoryWindow", "KeyGeneratorSpec", "TopicDefinition"]


class ExpirationRule(Protocol):
    """A topic's Expiration: ``disabled``, ``enabled`` or ``default`` with ``default_ms``."""

    @property
    def mode(self) -> str: ...

    @property
    def default_ms(self) -> int | None: ...


class HistoryWindow(Protocol):
    """A topic's History: how far back (None: forever) and at what granularity (ms)."""

    @property
    def window_ms(self) -> int | None: ...

    @property
    def granularity_ms(self) -> int: ...


class KeyGeneratorSpec(Protocol):
    """A topic's SowKey generator: a ``package.module:callable`` factory and its Options."""

    @property
    def module(self) -> str: ...

    @property
    def options(self) -> tuple[tuple[str, str], ...]: ...


class TopicDefinition(Protocol):
    """One SOW topic as the log fold, the query planner and subscriptions read it."""

    @property
    def name(self) -> str: ...

    @property
    def message_type(self) -> str: ...

    @property
    def keys(self) -> tuple[str, ...]: ...

    @property
    def delta_keys(self) -> tuple[str, ...]:
        """The fields a delta carries to name its record: the Key fields, or a view's Grouping
        fields and a conflated topic's underlying key fields."""
        ...

    @property
    def hash_indexes(self) -> tuple[tuple[str, ...], ...]: ...

    @property
    def pattern(self) -> str | None: ...

    @property
    def key_generator(self) -> KeyGeneratorSpec | None: ...

    @property
    def expiration(self) -> ExpirationRule: ...

    @property
    def publish_filters(self) -> tuple[tuple[str, str], ...]: ...

    @property
    def effective_key_domain(self) -> str: ...

    @property
    def user_supplied_keys(self) -> bool: ...

    @property
    def schema_file(self) -> str | None:
        """An avro topic's record schema file (what its message type is made with)."""
        ...

    @property
    def preprocessing(self) -> tuple[str, ...]:
        """The Field texts of the topic's Preprocessing (compiled by ``sow.compiled``)."""
        ...

    @property
    def enrichment(self) -> tuple[str, ...]:
        """The Field texts of the topic's Enrichment."""
        ...

    @property
    def instance_name(self) -> str:
        """What ``AMPS_INSTANCE_NAME()`` gives in the topic's Preprocessing and Enrichment."""
        ...

    def key_domain_of(self, name: str) -> str: ...

    def matches_name(self, name: str) -> bool: ...

    def publish_filter(self, identity: str) -> Filter | None: ...
