"""The validated, immutable models of SOW topics and engine settings.

The root of a whole configuration (:class:`~sowstream.config.root.SowstreamConfig`) sits above
these, with queues, views and conflated topics; the field helpers sit below
(:mod:`sowstream.config.fields`).

Field names are snake_case; the loaders map the AMPS element names (``Key``, ``HashIndex``, ...)
onto them. Constructing a model directly raises pydantic's ``ValidationError`` (a ``ValueError``);
the loaders turn that into a ``ConfigError`` that names the file and element.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Literal, get_args

from pydantic import Field, ValidationInfo, field_validator, model_validator

from sowstream.auth.verify import AuthenticationSettings
from sowstream.config.errors import FieldProblem
from sowstream.config.fields import (
    MAX_PARTITIONS,
    MAX_PREFIX,
    MIB,
    MIN_PARTITIONS,
    Frozen,
    MessageType,
    amps_topic_name,
    bounded_int,
    field_paths,
    interval_millis,
    kafka_safe_name,
    message_type_name,
    no_repeats,
    one_of,
    parse_recovery_point,
    recovery_point_ms,
)
from sowstream.errors import InvalidCommandError
from sowstream.filters import Filter, FilterError, compile_filter
from sowstream.messagetypes import MessageTypeConfigError, registry
from sowstream.sow.compiled import compile_stages
from sowstream.sow.enrich import ENRICHMENT, PREPROCESSING, StageError
from sowstream.sow.keygen import KeyGeneratorError, load_key_generator
from sowstream.sow.patterns import compile_pattern
from sowstream.units import parse_interval, parse_size
from sowstream.wire.topics import kafka_topic_part, topic_ident

# The message types whose topic names a schema file (``Schema``).
SCHEMA_TYPES = ("avro", "protobuf")

Durability = Literal["persistent", "transient"]
ExpirationMode = Literal["disabled", "enabled", "default"]
RestoreMode = Literal["batched", "faust"]
# Who folds a SOW topic's log: the compiled fold (on, falling back to Python per record),
# only the Python fold (off), or both, compared (shadow).
NativeMode = Literal["on", "off", "shadow"]

DEFAULT_INSTANCE_NAME = "sowstream"


class ExpirationPolicy(Frozen):
    """How a topic expires records (AMPS ``Expiration``): not at all, per message, or by default.

    ``disabled`` still stores per-message expirations without acting on them; ``enabled`` acts
    only on per-message values; ``default`` gives messages without one ``default_ms`` to live.
    """

    mode: ExpirationMode = "disabled"
    default_ms: int | None = None

    @classmethod
    def parse(cls, value: str | int | float) -> ExpirationPolicy:
        """The policy an AMPS ``Expiration`` value names: disabled, enabled or an interval.

        An interval of zero means ``enabled`` with no default; a bare number is seconds.
        """
        if isinstance(value, str) and value.strip().lower() in ("disabled", "enabled"):
            return cls(mode="disabled" if value.strip().lower() == "disabled" else "enabled")
        try:
            millis = parse_interval(value)
        except ValueError as exc:
            raise ValueError(
                f"Expiration must be 'disabled', 'enabled' or an interval like '30s': {exc}"
            ) from None
        return cls(mode="enabled") if millis == 0 else cls(mode="default", default_ms=millis)

    @model_validator(mode="after")
    def _default_matches_mode(self) -> ExpirationPolicy:
        if self.mode == "default" and (self.default_ms is None or self.default_ms <= 0):
            raise FieldProblem("default_ms", "mode 'default' needs a default_ms above 0")
        if self.mode != "default" and self.default_ms is not None:
            raise FieldProblem("default_ms", f"mode {self.mode!r} takes no default_ms")
        return self


class HistoryConfig(Frozen):
    """Point-in-time query support (AMPS ``History``); stored now, used by a later feature."""

    window_ms: int | None = None
    granularity_ms: int = 0

    @field_validator("window_ms", mode="before")
    @classmethod
    def _window(cls, value: object) -> int | None:
        if value is None:
            return None
        millis = interval_millis(value, "Window")
        if millis <= 0:
            raise ValueError("Window must be longer than 0 (leave it out to keep history forever)")
        return millis

    @field_validator("granularity_ms", mode="before")
    @classmethod
    def _granularity(cls, value: object) -> int:
        return interval_millis(value, "Granularity")

    @model_validator(mode="after")
    def _granularity_fits(self) -> HistoryConfig:
        if self.granularity_ms < 0:
            raise FieldProblem("granularity_ms", "Granularity cannot be negative")
        if self.window_ms is not None and self.granularity_ms > self.window_ms:
            raise FieldProblem(
                "granularity_ms",
                f"Granularity ({self.granularity_ms} ms) is longer than Window "
                f"({self.window_ms} ms), so no history would be kept",
            )
        return self


class KeyGeneratorConfig(Frozen):
    """A topic's SowKey generator: a ``package.module:callable`` factory and its Options."""

    module: str
    options: tuple[tuple[str, str], ...] = ()

    @field_validator("module", mode="before")
    @classmethod
    def _module(cls, value: object) -> str:
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"Module must name 'package.module:callable', got {value!r}")
        return value.strip()

    @field_validator("options", mode="before")
    @classmethod
    def _options(cls, value: object) -> tuple[tuple[str, str], ...]:
        if value is None:
            return ()
        if isinstance(value, Mapping):
            return tuple(sorted((str(k), _option_text(v)) for k, v in value.items()))
        if isinstance(value, list | tuple):
            return tuple(value)  # already pairs (a frozen copy)
        raise ValueError(f"Options must be a mapping of names to values, got {value!r}")

    @model_validator(mode="after")
    def _loads(self) -> KeyGeneratorConfig:
        # Load it now: a typo in the module or a refused option fails at start, not per message.
        try:
            load_key_generator(self.module, dict(self.options))
        except KeyGeneratorError as exc:
            raise FieldProblem("module", str(exc)) from exc
        return self


def _option_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise ValueError(f"an Option value must be a string or a number, got {value!r}")


class TopicConfig(Frozen):
    """One topic: how records are identified, indexed, stored, expired and partitioned.

    Most topics keep a SOW; ``sow=False`` marks a plain topic that only carries messages to
    subscribers (it has a log and can be subscribed to, but nothing is stored or queried).
    A topic is identified by its message type and name together (:attr:`ident`).
    """

    name: str
    message_type: MessageType = "json"
    # avro: the record schema; protobuf: a .proto file or descriptor set (the ``Schema`` element)
    schema_file: str | None = None
    # composite-local / composite-global: the parts' message types, in order (``Parts``)
    parts: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    key_domain: str | None = None
    key_generator: KeyGeneratorConfig | None = None
    durability: Durability = "persistent"
    recovery_point: str = "epoch"  # epoch, now or a timestamp (parse_recovery_point)
    expiration: ExpirationPolicy = ExpirationPolicy()
    hash_indexes: tuple[tuple[str, ...], ...] = ()
    indexes: tuple[str, ...] = ()
    partitions: int = 4
    history: HistoryConfig | None = None
    sow: bool = True  # False: a plain topic (subscriptions only, nothing is stored)
    # A regular expression topic (AMPS ``Pattern``): the records of every topic name it matches
    # whole share this definition, its Kafka topics and its stores (see sowstream.sow.patterns).
    pattern: str | None = None
    # The Field texts of the topic's Preprocessing and Enrichment (sowstream.sow.enrich).
    preprocessing: tuple[str, ...] = ()
    enrichment: tuple[str, ...] = ()
    # Set by the loaders from the whole configuration (SowstreamConfig.stamped), because every
    # log record of the topic needs them: what AMPS_INSTANCE_NAME() gives, and the publish
    # entitlements as (identity, filter) pairs.
    instance_name: str = DEFAULT_INSTANCE_NAME
    publish_filters: tuple[tuple[str, str], ...] = ()
    # Set by the configuration for a view's or conflated topic's SOW topic, which has no Key
    # fields (its records carry SowKeys made elsewhere): the fields that still name a record,
    # so deltas carry them (send_keys). A view's Grouping fields as it shows them; a conflated
    # topic's underlying record key fields. No configuration element sets it.
    record_keys: tuple[str, ...] = ()

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: object) -> str:
        return amps_topic_name(value, "topic name")

    @field_validator("message_type", mode="before")
    @classmethod
    def _message_type(cls, value: object) -> str:
        return message_type_name(value)

    @field_validator("schema_file", mode="before")
    @classmethod
    def _schema_file(cls, value: object) -> object:
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"Schema must be the path of a schema file, got {value!r}")
        return value.strip() if isinstance(value, str) else value

    @field_validator("parts", mode="before")
    @classmethod
    def _parts(cls, value: object) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [p for p in value.replace(",", " ").split() if p]
        if not isinstance(value, list | tuple):
            raise ValueError(f"Parts must be a list of message types, got {value!r}")
        return tuple(message_type_name(p) for p in value)

    @field_validator("keys", mode="before")
    @classmethod
    def _keys(cls, value: object) -> tuple[str, ...]:
        return no_repeats(field_paths(value, "Key"), "Key")

    @field_validator("key_domain", mode="before")
    @classmethod
    def _key_domain(cls, value: object) -> object:
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"KeyDomain must be a non-empty string, got {value!r}")
        return value

    @field_validator("durability", mode="before")
    @classmethod
    def _durability(cls, value: object) -> str:
        return one_of(value, "Durability", get_args(Durability))

    @field_validator("recovery_point", mode="before")
    @classmethod
    def _recovery_point(cls, value: object, info: ValidationInfo) -> str:
        try:
            return parse_recovery_point(value)
        except ValueError as exc:
            name = info.data.get("name")
            raise ValueError(f"topic {name!r}: {exc}" if name else str(exc)) from None

    @field_validator("expiration", mode="before")
    @classmethod
    def _expiration(cls, value: object) -> object:
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            return ExpirationPolicy.parse(value)
        if isinstance(value, bool):
            raise ValueError(
                f"Expiration must be 'disabled', 'enabled' or an interval like '30s', got {value!r}"
                " (quote the word in YAML: a bare off/on/no/yes is a boolean there)"
            )
        return value

    @field_validator("hash_indexes", mode="before")
    @classmethod
    def _hash_indexes(cls, value: object) -> tuple[tuple[str, ...], ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple):
            raise ValueError(f"HashIndex must be a list of path lists, got {value!r}")
        result = []
        for index in value:
            paths = no_repeats(field_paths(index, "HashIndex Key"), "a HashIndex")
            if not paths:
                raise ValueError("a HashIndex needs at least one Key")
            result.append(paths)
        return tuple(result)

    @field_validator("hash_indexes", mode="after")
    @classmethod
    def _drop_implicit_and_repeated(
        cls, value: tuple[tuple[str, ...], ...], info: ValidationInfo
    ) -> tuple[tuple[str, ...], ...]:
        # An index is a set of fields; the one on the Key fields always exists (all_hash_indexes),
        # so declaring it again, or any index twice, would only maintain a redundant copy.
        seen = {frozenset(info.data.get("keys", ()))}
        kept = []
        for index in value:
            if frozenset(index) not in seen:
                seen.add(frozenset(index))
                kept.append(index)
        return tuple(kept)

    @field_validator("indexes", mode="before")
    @classmethod
    def _indexes(cls, value: object) -> tuple[str, ...]:
        return tuple(dict.fromkeys(field_paths(value, "Index")))

    @field_validator("partitions", mode="before")
    @classmethod
    def _partitions(cls, value: object) -> int:
        return bounded_int(value, "Partitions", MIN_PARTITIONS, MAX_PARTITIONS)

    @field_validator("preprocessing", "enrichment", mode="before")
    @classmethod
    def _fields(cls, value: object, info: ValidationInfo) -> tuple[str, ...]:
        what = PREPROCESSING if info.field_name == "preprocessing" else ENRICHMENT
        if isinstance(value, Mapping) and set(value) == {"Field"}:
            value = value["Field"]  # the AMPS shape, {Field: [...]}
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{what} must be a list of Fields like '/a * 2 AS /b', got {value!r}")
        if not value:
            raise ValueError(f"{what} needs at least one Field, like '/a * 2 AS /b'")
        return tuple(value)

    @field_validator("pattern", mode="before")
    @classmethod
    def _pattern(cls, value: object) -> object:
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise ValueError(
                f"Pattern must be a regular expression over topic names, got {value!r}"
            )
        text = value.strip()
        try:
            compile_pattern(text)
        except re.error as exc:
            raise ValueError(f"Pattern {text!r} is not a valid regular expression: {exc}") from None
        return text

    @model_validator(mode="after")
    def _message_type_fits(self) -> TopicConfig:
        kind = self.message_type
        if self.schema_file is not None and kind not in SCHEMA_TYPES:
            raise FieldProblem(
                "schema_file",
                f"Schema only applies to avro and protobuf topics; this one is {kind}",
            )
        if self.parts and kind not in registry.COMPOSITE:
            raise FieldProblem(
                "parts",
                f"Parts only applies to composite-local and composite-global; this is {kind}",
            )
        if kind == "composite-global" and (self.enrichment or self.preprocessing):
            raise FieldProblem(
                "enrichment" if self.enrichment else "preprocessing",
                f"topic {self.name!r} is composite-global: its records cannot be rewritten from "
                "their fields, so it takes no Enrichment or Preprocessing (use composite-local)",
            )
        if not registry.type_class(kind).has_fields:
            for field, label in (
                ("keys", "Key"),
                ("hash_indexes", "HashIndex"),
                ("indexes", "Index"),
            ):
                if getattr(self, field):
                    raise FieldProblem(
                        field,
                        f"topic {self.name!r} is {kind}: its messages are not parsed, so it cannot "
                        f"have {label} fields; publishers supply each record's SowKey instead",
                    )
        try:
            # A schema is read and checked here, once (the registry keeps the type).
            registry.get(kind, self)
        except MessageTypeConfigError as exc:
            field = "parts" if kind in registry.COMPOSITE else "schema_file"
            raise FieldProblem(field, str(exc)) from None
        return self

    @model_validator(mode="after")
    def _cross_checks(self) -> TopicConfig:
        if self.key_domain is not None and self.key_generator is not None:
            raise FieldProblem(
                "key_domain",
                "KeyDomain is not valid with a KeyGenerator: the generator makes the SowKeys",
            )
        if self.key_domain is not None and not self.keys:
            raise FieldProblem(
                "key_domain",
                "KeyDomain is only valid with Key fields: without them publishers supply the "
                "SowKey and no key is generated",
            )
        if self.pattern is not None and self.history is not None:
            raise FieldProblem(
                "history",
                f"topic {self.name!r} has a Pattern: a regular expression topic cannot have "
                "History",
            )
        if self.pattern is not None and not self.sow:
            raise FieldProblem(
                "pattern", f"topic {self.name!r}: Pattern applies to SOW topics only"
            )
        for field, kind in (("preprocessing", PREPROCESSING), ("enrichment", ENRICHMENT)):
            if not getattr(self, field):
                continue
            if self.pattern is not None:
                raise FieldProblem(
                    field,
                    f"{kind} cannot be used with Pattern: topic {self.name!r} is a regular "
                    "expression topic",
                )
            if not self.sow:
                raise FieldProblem(field, f"{kind} applies to SOW topics only")
            if not registry.type_class(self.message_type).has_fields:
                raise FieldProblem(
                    field,
                    f"topic {self.name!r} is {self.message_type}: its messages are not parsed, "
                    f"so it cannot have {kind}",
                )
        try:
            # Compiled here so a bad Field fails at load; whoever reads the topic's records
            # compiles its own (sowstream.sow.compiled).
            compile_stages(self)
        except StageError as exc:
            field = "preprocessing" if exc.element.startswith(PREPROCESSING) else "enrichment"
            where = exc.element.partition("/")[2]
            raise FieldProblem(field, f"{where}: {exc.problem}" if where else exc.problem) from None
        if self.history is not None and self.expiration.mode != "disabled":
            raise FieldProblem(
                "expiration",
                "Expiration must be 'disabled' when History is configured (historical state "
                "cannot expire)",
            )
        return self

    @property
    def recovery_point_ms(self) -> int | None:
        """The RecoveryPoint as epoch milliseconds; None for ``epoch`` and ``now``."""
        return recovery_point_ms(self.recovery_point)

    def publish_filter(self, identity: str) -> Filter | None:
        """The publish entitlement filter ``identity`` is held to on this topic (its own rule,
        else the ``*`` rule), or None."""
        if not self.publish_filters:
            return None
        rules = dict(self.publish_filters)
        text = rules.get(identity, rules.get(ANY_IDENTITY))
        return compile_filter(text) if text else None

    @property
    def ident(self) -> str:
        """The topic's identity: its name for json, ``<type>:<name>`` for other message types
        (a json and an nvfix topic may share a name)."""
        return topic_ident(self.name, self.message_type)

    @property
    def kafka_name(self) -> str:
        """The topic's part of Kafka topic names (``wire.topics.kafka_topic_part``)."""
        return kafka_topic_part(self.name, self.message_type)

    @property
    def effective_key_domain(self) -> str:
        """The seed of generated SowKeys: ``key_domain`` if set, else the topic name."""
        return self.key_domain if self.key_domain is not None else self.name

    def key_domain_of(self, name: str) -> str:
        """The key domain of records published under topic ``name``: on a Pattern topic each
        name is its own domain unless ``key_domain`` is set; elsewhere the topic's."""
        if self.pattern is None or self.key_domain is not None:
            return self.effective_key_domain
        return name

    def matches_name(self, name: str) -> bool:
        """Whether ``name`` belongs to this Pattern topic (its Pattern matches it whole)."""
        return (
            self.pattern is not None and compile_pattern(self.pattern).fullmatch(name) is not None
        )

    @property
    def delta_keys(self) -> tuple[str, ...]:
        """The fields a delta message carries to name its record (send_keys): the Key fields,
        else the record keys of a view or conflated topic (:attr:`record_keys`)."""
        return self.keys or self.record_keys

    @property
    def user_supplied_keys(self) -> bool:
        """True when neither Key fields nor a KeyGenerator are configured, so each publish must
        carry its SowKey."""
        return not self.keys and self.key_generator is None

    @property
    def all_hash_indexes(self) -> tuple[tuple[str, ...], ...]:
        """Every hash index to maintain: the implicit one on the Key fields first, if any."""
        if not self.keys:
            return self.hash_indexes
        key_set = frozenset(self.keys)
        return (self.keys, *(i for i in self.hash_indexes if frozenset(i) != key_set))


class RocksDBConfig(Frozen):
    """Per-partition RocksDB sizing, kept small so several topics fit on a laptop."""

    block_cache_size: int = 64 * MIB
    write_buffer_size: int = 16 * MIB
    max_write_buffer_number: int = 2

    @field_validator("block_cache_size", "write_buffer_size", mode="before")
    @classmethod
    def _size(cls, value: object, info: ValidationInfo) -> int:
        size = parse_size(value) if isinstance(value, str) else value
        return bounded_int(size, str(info.field_name), 1, 2**62)

    @field_validator("max_write_buffer_number", mode="before")
    @classmethod
    def _count(cls, value: object) -> int:
        return bounded_int(value, "max_write_buffer_number", 1, 64)


class SlowConsumerConfig(Frozen):
    """When a subscriber's unread backlog gets its subscriptions conflated, then dropped.

    Backlogs are counted in messages; intervals are milliseconds (YAML takes ``1s`` too).
    """

    conflate_after: int = 10_000
    drop_after: int = 100_000
    conflation_interval: int = 1_000
    check_interval: int = 2_000
    # A client whose reader has not shown a sign of life for this long is taken for dead.
    client_timeout: int = 30_000
    # Replies to a reply topic the worker's producer has no metadata for yet are parked (in
    # order) for up to this long, then the client is taken for gone.
    reply_topic_wait: int = 30_000
    # The most parked for one reply topic; past it the client's subscriptions end.
    max_parked_bytes: int = 16 * 1024 * 1024

    @field_validator("max_parked_bytes", mode="before")
    @classmethod
    def _bytes(cls, value: object, info: ValidationInfo) -> int:
        size = parse_size(value) if isinstance(value, str) else value
        return bounded_int(size, str(info.field_name), 1024, 2**40)

    @field_validator("conflate_after", "drop_after", mode="before")
    @classmethod
    def _messages(cls, value: object, info: ValidationInfo) -> int:
        return bounded_int(value, str(info.field_name), 1, 2**62)

    @field_validator(
        "conflation_interval", "check_interval", "client_timeout", "reply_topic_wait", mode="before"
    )
    @classmethod
    def _interval(cls, value: object, info: ValidationInfo) -> int:
        ms = parse_interval(value) if isinstance(value, str) else value
        return bounded_int(ms, str(info.field_name), 100, 86_400_000)

    @model_validator(mode="after")
    def _order(self) -> SlowConsumerConfig:
        if self.drop_after <= self.conflate_after:
            raise FieldProblem(
                "drop_after",
                f"drop_after ({self.drop_after}) must be above conflate_after "
                f"({self.conflate_after}): conflation is the first step, dropping the last",
            )
        return self


class EngineConfig(Frozen):
    """Settings of the engine process: Kafka connection, naming, local state and metrics."""

    app_id: str = "sowstream"
    bootstrap_servers: str | None = None
    data_dir: str = ".sowstream/data"
    topic_prefix: str = "sowstream"
    replication_factor: int = 1
    web_port: int | None = None
    kafka: dict[str, str] = Field(default_factory=dict)
    rocksdb: RocksDBConfig = RocksDBConfig()
    slow_consumer: SlowConsumerConfig = SlowConsumerConfig()
    # Topics that are in no configuration: publishing or subscribing creates them (as plain
    # topics, no SOW), as AMPS needs no declaration; false refuses them (production).
    auto_create_topics: bool = True
    auto_topic_partitions: int = 4
    # What AMPS_INSTANCE_NAME() gives in Preprocessing and Enrichment (default: app_id).
    instance_name: str | None = None
    # How a worker refills a partition store from its changelog when the store is missing or far
    # behind: ``batched`` (confluent-kafka into RocksDB WriteBatches) or ``faust`` (its recovery).
    restore: RestoreMode = "batched"
    # Credentials the engine checks (JWTs, HMAC secrets); unset, identities are asserted.
    authentication: AuthenticationSettings = AuthenticationSettings()
    # Whether the compiled fold (the sowstream_native package, built from native/) applies the
    # logs: on, off, or shadow (both run, differences counted). None: $SOWSTREAM_NATIVE, else on.
    native: NativeMode | None = None

    @field_validator("auto_create_topics", mode="before")
    @classmethod
    def _flag(cls, value: object, info: ValidationInfo) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"{info.field_name} must be true or false, got {value!r}")
        return value

    @field_validator("restore", mode="before")
    @classmethod
    def _restore(cls, value: object) -> object:
        if value not in get_args(RestoreMode):
            raise ValueError(f"restore must be batched or faust, got {value!r}")
        return value

    @field_validator("native", mode="before")
    @classmethod
    def _native(cls, value: object) -> object:
        if value is not None and value not in get_args(NativeMode):
            raise ValueError(f"native must be on, off or shadow, got {value!r}")
        return value

    @field_validator("auto_topic_partitions", mode="before")
    @classmethod
    def _auto_partitions(cls, value: object) -> int:
        return bounded_int(value, "auto_topic_partitions", MIN_PARTITIONS, MAX_PARTITIONS)

    @field_validator("app_id", "topic_prefix", mode="before")
    @classmethod
    def _names(cls, value: object, info: ValidationInfo) -> str:
        return kafka_safe_name(value, str(info.field_name), MAX_PREFIX)

    @property
    def effective_instance_name(self) -> str:
        """``instance_name`` if set, else ``app_id`` (the name every worker of an engine shares)."""
        return self.instance_name or self.app_id

    @field_validator("bootstrap_servers", "data_dir", "instance_name", mode="before")
    @classmethod
    def _non_empty(cls, value: object, info: ValidationInfo) -> object:
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"{info.field_name} must be a non-empty string, got {value!r}")
        return value.strip() if isinstance(value, str) else value

    @field_validator("replication_factor", mode="before")
    @classmethod
    def _replication(cls, value: object) -> int:
        return bounded_int(value, "replication_factor", 1, 32767)

    @field_validator("web_port", mode="before")
    @classmethod
    def _port(cls, value: object) -> int | None:
        return None if value is None else bounded_int(value, "web_port", 1, 65535)

    @field_validator("kafka", mode="before")
    @classmethod
    def _client_settings(cls, value: object) -> dict[str, str]:
        # librdkafka wants every setting as text; YAML hands over ints and bools.
        if not isinstance(value, Mapping):
            raise ValueError(f"kafka must be a mapping of client settings, got {value!r}")
        settings = {}
        for key, item in value.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"kafka setting names must be strings, got {key!r}")
            if isinstance(item, bool):
                item = "true" if item else "false"
            elif isinstance(item, int | float):
                item = str(item)
            elif not isinstance(item, str):
                raise ValueError(f"kafka setting {key!r} must be a single value, got {item!r}")
            settings[key] = item
        return settings


def match_topic_names(pattern: str, names: Iterable[str]) -> list[str]:
    """The names the regular expression ``pattern`` matches whole, in the given order.

    Shared by the engine's configuration and the client, so both read a topic pattern alike; an
    invalid pattern raises InvalidCommandError.
    """
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise InvalidCommandError(
            f"topic pattern {pattern!r} is not a valid regular expression: {exc}"
        ) from None
    return [name for name in names if regex.fullmatch(name)]


def ambiguous_pattern(name: str, topics: Iterable[str]) -> str:
    """The error for a topic name that the Patterns of several topics match."""
    listed = ", ".join(repr(t) for t in topics)
    return (
        f"topic name {name!r} matches the Pattern of several topics ({listed}): publish under "
        "a name only one Pattern matches, or declare the name as a topic of its own"
    )


ANY_IDENTITY = "*"


class Entitlements(Frozen):
    """Row-level entitlements: per identity and topic, a filter a record must pass to be seen.

    The identity ``*`` covers identities that have no rule of their own for a topic; a topic with
    no rule for an identity (and none under ``*``) is fully visible to it.
    """

    rules: dict[str, dict[str, str]] = Field(default_factory=dict)

    @classmethod
    def parse(
        cls,
        raw: object,
        topics: Iterable[TopicConfig],
        section: str = "entitlements",
        queues: Iterable[str] = (),
    ) -> Entitlements:
        """Validate ``identity -> topic -> filter``; FieldProblem names the bad element
        (under ``section``: ``entitlements`` or ``publish_entitlements``). ``queues``: queue
        names that may have rules too (what a subscriber leases and browses)."""
        names = {t.name for t in topics} | set(queues)
        if not isinstance(raw, Mapping):
            raise FieldProblem(section, f"must map identities to topics and filters, got {raw!r}")
        rules: dict[str, dict[str, str]] = {}
        for identity, per_topic in raw.items():
            where = f"{section}.{identity}"
            if not isinstance(identity, str) or not identity:
                raise FieldProblem(section, f"identity must be a string, got {identity!r}")
            if not isinstance(per_topic, Mapping):
                raise FieldProblem(where, f"must map topic names to filters, got {per_topic!r}")
            rules[identity] = {}
            for topic, text in per_topic.items():
                if topic not in names:
                    raise FieldProblem(f"{where}.{topic}", f"unknown topic {topic!r}")
                if not isinstance(text, str) or not text.strip():
                    raise FieldProblem(f"{where}.{topic}", f"must be a filter, got {text!r}")
                try:
                    compile_filter(text)
                except FilterError as exc:
                    raise FieldProblem(f"{where}.{topic}", f"bad filter: {exc}") from None
                rules[identity][topic] = text
        return cls(rules=rules)

    def filter_text(self, identity: str, topic: str) -> str | None:
        """The filter ``identity`` is held to on ``topic``, or None."""
        own = self.rules.get(identity, {})
        if topic in own:
            return own[topic]
        return self.rules.get(ANY_IDENTITY, {}).get(topic)
