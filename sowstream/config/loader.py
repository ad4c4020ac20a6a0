"""Loading a configuration: sowstream YAML, or an AMPS XML file, told apart by the first character.

The YAML topic and queue keys are the AMPS element names (``Name``, ``Key``, ``LeasePeriod``, ...)
so AMPS users recognise them; the ``engine`` keys are snake_case like the model fields.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sowstream.config.amps import (
    NOT_WITH_PATTERN,
    UNSUPPORTED_TOPIC_ELEMENTS,
    load_amps_xml,
    message_type_supported,
    not_with_pattern,
)
from sowstream.config.conflated import FIELD_ELEMENTS as CONFLATED_FIELD_ELEMENTS
from sowstream.config.conflated import (
    ConflatedProblem,
    ConflatedTopicConfig,
    check_conflated_topics,
    conflated_from_yaml,
    definition_order,
)
from sowstream.config.errors import (
    ConfigError,
    FieldProblem,
    Loc,
    from_validation_error,
    skip_or_raise,
)
from sowstream.config.fields import schema_path
from sowstream.config.models import (
    EngineConfig,
    Entitlements,
    RocksDBConfig,
    SlowConsumerConfig,
    TopicConfig,
)
from sowstream.config.queues import (
    FIELD_ELEMENTS,
    QUEUE_ELEMENTS,
    QUEUE_MESSAGE_TYPES,
    QueueConfig,
    QueueProblem,
    check_queues,
    implicit_topics,
)
from sowstream.config.root import SowstreamConfig
from sowstream.config.views import FIELD_ELEMENTS as VIEW_FIELD_ELEMENTS
from sowstream.config.views import (
    ViewConfig,
    ViewProblem,
    check_view_sources,
    check_views,
    view_from_yaml,
    warn_unprojected_indexes,
)

# YAML key -> TopicConfig field.
TOPIC_KEYS: dict[str, str] = {
    "Name": "name",
    "MessageType": "message_type",
    "Key": "keys",
    "KeyDomain": "key_domain",
    "KeyGenerator": "key_generator",
    "Durability": "durability",
    "RecoveryPoint": "recovery_point",
    "Expiration": "expiration",
    "HashIndex": "hash_indexes",
    "Index": "indexes",
    "Partitions": "partitions",
    "History": "history",
    "Schema": "schema_file",
    "Parts": "parts",
    "Pattern": "pattern",
    "Preprocessing": "preprocessing",
    "Enrichment": "enrichment",
}
# What a plain (non-SOW) topic under ``topics:`` may set.
PLAIN_TOPIC_KEYS = frozenset({"Name", "MessageType", "Key", "Partitions", "Schema", "Parts"})
HISTORY_KEYS: dict[str, str] = {"Window": "window_ms", "Granularity": "granularity_ms"}
KEY_GENERATOR_KEYS: dict[str, str] = {"Module": "module", "Options": "options"}
_TOPIC_FIELD_KEYS = {field: key for key, field in TOPIC_KEYS.items()}
_HISTORY_FIELD_KEYS = {field: key for key, field in HISTORY_KEYS.items()}
# YAML keys of a queue: the AMPS elements, plus Kind for the element that declares it.
QUEUE_KEYS: tuple[str, ...] = ("Kind", *QUEUE_ELEMENTS)
_QUEUE_INTERVALS = ("LeasePeriod", "Expiration", "DeferredAckExpiration")

_BOM = "\ufeff"


def load_config(path: str | os.PathLike[str], *, skip_unsupported: bool = False) -> SowstreamConfig:
    """The configuration in the file at ``path``: AMPS XML if it starts with ``<``, else YAML.

    ``skip_unsupported`` turns "not supported yet" errors into warnings that skip the topic or
    element, so an AMPS file can be migrated step by step.
    """
    source = os.fspath(path)
    try:
        data = Path(source).read_bytes()
    except OSError as exc:
        raise ConfigError(
            source=source, element="file", problem=f"cannot read it: {exc.strerror or exc}"
        ) from None
    if data.lstrip(_BOM.encode()).lstrip()[:1] == b"<":
        # Bytes, so that the XML declaration's encoding is honoured.
        return load_amps_xml(data, source, skip_unsupported=skip_unsupported)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            source=source, element=f"byte {exc.start}", problem="the file is not UTF-8 text"
        ) from None
    return load_yaml_text(text, source, skip_unsupported=skip_unsupported)


def load_config_text(
    text: str, source: str = "<string>", *, skip_unsupported: bool = False
) -> SowstreamConfig:
    """Like :func:`load_config` for text already in memory; ``source`` names it in errors."""
    if text.lstrip(_BOM).lstrip()[:1] == "<":
        return load_amps_xml(text, source, skip_unsupported=skip_unsupported)
    return load_yaml_text(text, source, skip_unsupported=skip_unsupported)


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key repeated in one mapping is an error.

    Plain ``safe_load`` keeps the last value, so an AMPS habit like two ``Key:`` lines would
    silently lose a key field.
    """


def _mapping_without_repeats(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        try:
            repeated = key in seen
            seen.add(key)
        except TypeError:
            continue  # unhashable; construct_mapping reports it
        if repeated:
            hint = "; list a composite key as Key: [/a, /b]" if key == "Key" else ""
            raise yaml.constructor.ConstructorError(
                None, None, f"{key!r} appears twice in the same mapping{hint}", key_node.start_mark
            )
    return loader.construct_mapping(node)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_repeats)


def _parse_yaml(text: str, source: str) -> Any:
    """The YAML document, or a ConfigError with the line of the syntax error."""
    try:
        return yaml.load(text, Loader=_Loader)  # safe: _Loader derives from SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        element = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "document"
        problem = exc.problem or exc.context or "unreadable"
        raise ConfigError(
            source=source, element=element, problem=f"malformed YAML: {problem}"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            source=source, element="document", problem=f"malformed YAML: {exc}"
        ) from None


def load_yaml_text(
    text: str, source: str = "<string>", *, skip_unsupported: bool = False
) -> SowstreamConfig:
    """The configuration in sowstream YAML ``text`` (top-level ``engine`` and ``sow``)."""
    document = _parse_yaml(text, source)
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise ConfigError(
            source=source,
            element="document",
            problem=f"expected a mapping with 'engine' and 'sow' keys, got {_kind(document)}",
        )
    _check_keys(
        document,
        (
            "engine",
            "sow",
            "topics",
            "queues",
            "conflated_topics",
            "views",
            "entitlements",
            "publish_entitlements",
        ),
        "",
        source,
    )
    engine = _engine(document.get("engine"), source)

    sow = _items(document.get("sow"), "sow", "topics ('- Name: orders' items)", source)
    topics: list[TopicConfig] = []
    defined_at: dict[str, str] = {}
    for number, item in enumerate(sow):
        element = f"sow[{number}]"
        topic = _topic(item, element, source, skip_unsupported)
        if topic is None:
            continue
        if topic.ident in defined_at:
            raise ConfigError(
                source=source,
                element=f"{element}.Name",
                problem=f"{topic.message_type} topic {topic.name!r} is already defined by "
                f"{defined_at[topic.ident]}",
            )
        defined_at[topic.ident] = element
        topics.append(topic)
    # An empty `topics:` mapping has always been taken as no topics.
    plain = _items(
        document.get("topics") or None, "topics", "topics ('- Name: trades' items)", source
    )
    for number, item in enumerate(plain):
        element = f"topics[{number}]"
        if isinstance(item, dict):
            for key in item:
                if key in TOPIC_KEYS and key not in PLAIN_TOPIC_KEYS:
                    raise ConfigError(
                        source=source,
                        element=f"{element}.{key}",
                        problem=f"{key} only applies to SOW topics: define the topic under 'sow:'",
                    )
        topic = _topic(item, element, source, skip_unsupported)
        if topic is None:
            continue
        if topic.ident in defined_at:
            raise ConfigError(
                source=source,
                element=f"{element}.Name",
                problem=f"{topic.message_type} topic {topic.name!r} is already defined by "
                f"{defined_at[topic.ident]}",
            )
        defined_at[topic.ident] = element
        topics.append(topic.model_copy(update={"sow": False}))
    queues = _queues(document.get("queues"), topics, source, skip_unsupported)
    views_read = _view_items(document.get("views"), source)
    conflated = _conflated(document.get("conflated_topics"), topics, queues, source, views_read)
    views = _views(views_read, topics, queues, source, conflated)
    try:
        config = SowstreamConfig(
            engine=engine,
            topics=tuple(topics),
            queues=queues,
            conflated_topics=conflated,
            views=views,
            source=source,
        )
    except ValidationError as exc:
        raise from_validation_error(exc, source=source, element_of=lambda _: "sow") from None
    for section in ("entitlements", "publish_entitlements"):
        raw = document.get(section)
        if raw is None:
            continue
        try:
            queue_names = [q.name for q in config.queues] if section == "entitlements" else []
            rules = Entitlements.parse(raw, config.topics, section, queue_names)
        except FieldProblem as exc:
            raise ConfigError(source=source, element=exc.field, problem=str(exc)) from None
        config = config.model_copy(update={section: rules})
    return config.stamped()


def _engine(raw: Any, source: str) -> EngineConfig:
    """The ``engine:`` mapping as an EngineConfig; absent means all defaults."""
    if raw is None:
        return EngineConfig()
    if not isinstance(raw, dict):
        raise ConfigError(
            source=source, element="engine", problem=f"must be a mapping, got {_kind(raw)}"
        )
    _check_keys(raw, EngineConfig.model_fields, "engine.", source)
    if isinstance(raw.get("rocksdb"), dict):
        _check_keys(raw["rocksdb"], RocksDBConfig.model_fields, "engine.rocksdb.", source)
    if isinstance(raw.get("slow_consumer"), dict):
        _check_keys(
            raw["slow_consumer"], SlowConsumerConfig.model_fields, "engine.slow_consumer.", source
        )
    settings = {key: value for key, value in raw.items() if value is not None}
    try:
        return EngineConfig(**settings)
    except ValidationError as exc:
        raise from_validation_error(
            exc, source=source, element_of=lambda loc: ".".join(["engine", *map(str, loc)])
        ) from None


def _topic(item: Any, element: str, source: str, skip: bool) -> TopicConfig | None:
    """One ``sow:`` item as a TopicConfig, or None when skipped as unsupported."""
    if not isinstance(item, dict):
        raise ConfigError(
            source=source,
            element=element,
            problem=f"each topic must be a mapping like '- Name: orders', got {_kind(item)}",
        )
    name = item.get("Name")
    skipping = f"topic {name!r}" if isinstance(name, str) else f"topic {element}"
    if item.get("Pattern") is not None:
        for key in item:
            if key in NOT_WITH_PATTERN:
                raise ConfigError(
                    source=source,
                    element=f"{element}.{key}",
                    problem=not_with_pattern(key, name if isinstance(name, str) else None),
                )
    for key in item:
        if key in UNSUPPORTED_TOPIC_ELEMENTS:
            error = ConfigError(
                source=source,
                element=f"{element}.{key}",
                problem=f"{key} is not supported by sowstream yet",
            )
            skip_or_raise(error, skip=skip, skipping=skipping)
            return None
    message_type = item.get("MessageType")
    if isinstance(message_type, str) and not message_type_supported(
        message_type,
        source=source,
        element=f"{element}.MessageType",
        skip=skip,
        skipping=skipping,
    ):
        return None
    _check_keys(item, TOPIC_KEYS, f"{element}.", source)

    fields: dict[str, Any] = {}
    for key, value in item.items():
        if value is None:
            continue  # "Key:" with nothing after it means "not given", as if the line were absent
        if key == "HashIndex":
            value = _hash_indexes(value, f"{element}.HashIndex", source)
        elif key == "History":
            value = _history(value, f"{element}.History", source)
        elif key == "KeyGenerator":
            value = _key_generator(value, f"{element}.KeyGenerator", source)
        elif key == "Schema" and isinstance(value, str):
            value = schema_path(value, source)
        fields[TOPIC_KEYS[key]] = value

    def element_of(loc: Loc) -> str:
        if not loc:
            return element
        field = str(loc[0])
        path = f"{element}.{_TOPIC_FIELD_KEYS.get(field, field)}"
        if field == "history" and len(loc) > 1:
            path += f".{_HISTORY_FIELD_KEYS.get(str(loc[1]), str(loc[1]))}"
        if field == "key_generator" and len(loc) > 1:
            path += ".Options" if str(loc[1]) == "options" else ".Module"
        return path

    try:
        return TopicConfig(**fields)
    except ValidationError as exc:
        raise from_validation_error(exc, source=source, element_of=element_of) from None


def _queues(
    raw: Any, topics: list[TopicConfig], source: str, skip: bool
) -> tuple[QueueConfig, ...]:
    """The ``queues:`` list, checked against ``topics``; unsupported ones skipped with ``skip``."""
    queues: list[QueueConfig] = []
    elements: list[str] = []
    for number, item in enumerate(_items(raw, "queues", "queues ('- Name: work' items)", source)):
        element = f"queues[{number}]"
        queue = _queue(item, element, source, skip)
        if queue is not None:
            queues.append(queue)
            elements.append(element)
    topics.extend(implicit_topics(queues, topics))
    try:
        check_queues(queues, topics)
    except QueueProblem as exc:
        key = FIELD_ELEMENTS.get(exc.field, exc.field)
        raise ConfigError(
            source=source, element=f"{elements[exc.index]}.{key}", problem=str(exc)
        ) from None
    return tuple(queues)


def _conflated(
    raw: Any,
    topics: list[TopicConfig],
    queues: tuple[QueueConfig, ...],
    source: str,
    views: list[ViewConfig],
) -> tuple[ConflatedTopicConfig, ...]:
    """The ``conflated_topics:`` list, checked against the topics and views (each conflated
    topic counts as defined right after what it reads, ``definition_order``)."""
    items = _items(raw, "conflated_topics", "conflated topics ('- Name: orders-C' items)", source)
    found = [
        conflated_from_yaml(item, f"conflated_topics[{n}]", source) for n, item in enumerate(items)
    ]
    defined = definition_order(topics, queues, found, views)
    try:
        check_conflated_topics(found, topics, defined, views)
    except ConflatedProblem as exc:
        key = CONFLATED_FIELD_ELEMENTS.get(exc.field, exc.field)
        raise ConfigError(
            source=source, element=f"conflated_topics[{exc.index}].{key}", problem=str(exc)
        ) from None
    return tuple(found)


def _view_items(raw: Any, source: str) -> list[ViewConfig]:
    """The ``views:`` list, each view read on its own (checked by :func:`_views`)."""
    items = _items(raw, "views", "views ('- Name: by_region' items)", source)
    return [view_from_yaml(item, f"views[{n}]", source) for n, item in enumerate(items)]


def _views(
    views: list[ViewConfig],
    topics: list[TopicConfig],
    queues: tuple[QueueConfig, ...],
    source: str,
    conflated: tuple[ConflatedTopicConfig, ...] = (),
) -> tuple[ViewConfig, ...]:
    """The views, checked against the topics, queues and conflated topics (a view reads those
    and the views before it, ``definition_order``)."""
    defined = definition_order(topics, queues, conflated, views)
    try:
        check_views(views, defined)
        check_view_sources(
            views, topics, [q.name for q in queues if q.message_type in QUEUE_MESSAGE_TYPES]
        )
    except ViewProblem as exc:
        key = VIEW_FIELD_ELEMENTS.get(exc.field, exc.field)
        raise ConfigError(
            source=source, element=f"views[{exc.index}].{key}", problem=str(exc)
        ) from None
    for number, view in enumerate(views):
        warn_unprojected_indexes(view, f"views[{number}].HashIndex", source)
    return tuple(views)


def _queue(item: Any, element: str, source: str, skip: bool) -> QueueConfig | None:
    """One ``queues:`` item as a QueueConfig, or None when skipped as unsupported."""
    if not isinstance(item, dict):
        raise ConfigError(
            source=source,
            element=element,
            problem=f"each queue must be a mapping like '- Name: work', got {_kind(item)}",
        )
    _check_keys(item, QUEUE_KEYS, f"{element}.", source)
    name = item.get("Name")
    message_type = item.get("MessageType")
    if isinstance(message_type, str) and not message_type_supported(
        message_type,
        source=source,
        element=f"{element}.MessageType",
        skip=skip,
        skipping=f"queue {name!r}" if isinstance(name, str) else f"queue {element}",
        queue=True,
    ):
        return None
    fields: dict[str, Any] = {}
    for key, value in item.items():
        if value is None:
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if key in _QUEUE_INTERVALS and number:
            value = str(value)  # a bare number is seconds, as in AMPS
        fields["kind" if key == "Kind" else QUEUE_ELEMENTS[key]] = value

    def element_of(loc: Loc) -> str:
        if not loc:
            return element
        field = str(loc[0])
        return f"{element}.{'Kind' if field == 'kind' else FIELD_ELEMENTS.get(field, field)}"

    try:
        return QueueConfig(**fields)
    except ValidationError as exc:
        raise from_validation_error(exc, source=source, element_of=element_of) from None


def _hash_indexes(value: Any, element: str, source: str) -> list[Any]:
    """HashIndex in any accepted shape as a list of path lists.

    Each item is a list of paths (one composite index), a ``{Key: ...}`` map, or a single path
    (an index on that one field). A bare string is one single-field index.
    """
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise ConfigError(
            source=source,
            element=element,
            problem=f"must be a list of indexes, each a list of paths, got {_kind(value)}",
        )
    indexes: list[Any] = []
    for number, item in enumerate(items):
        if isinstance(item, dict):
            _check_keys(item, ("Key",), f"{element}[{number}].", source)
            if item.get("Key") is None:
                raise ConfigError(
                    source=source,
                    element=f"{element}[{number}].Key",
                    problem="a HashIndex needs at least one Key",
                )
            item = item["Key"]
        indexes.append([item] if isinstance(item, str) else item)
    return indexes


def _history(value: Any, element: str, source: str) -> dict[str, Any]:
    """``History: {Window: 7d, Granularity: 15m}`` as HistoryConfig fields."""
    if not isinstance(value, dict):
        raise ConfigError(
            source=source,
            element=element,
            problem=f"must be a mapping like {{Window: 7d, Granularity: 15m}}, got {_kind(value)}",
        )
    _check_keys(value, HISTORY_KEYS, f"{element}.", source)
    history: dict[str, Any] = {}
    for key, item in value.items():
        if item is None:
            continue
        if isinstance(item, int | float) and not isinstance(item, bool):
            item = str(item)  # a bare number is seconds, as in AMPS
        history[HISTORY_KEYS[key]] = item
    return history


def _key_generator(value: Any, element: str, source: str) -> dict[str, Any]:
    """``KeyGenerator: {Module: pkg.mod:factory, Options: {...}}`` as KeyGeneratorConfig fields."""
    if isinstance(value, str):
        value = {"Module": value}
    if not isinstance(value, dict):
        raise ConfigError(
            source=source,
            element=element,
            problem="must be a mapping like {Module: package.module:callable, Options: {...}}, "
            f"got {_kind(value)}",
        )
    _check_keys(value, KEY_GENERATOR_KEYS, f"{element}.", source)
    return {KEY_GENERATOR_KEYS[k]: v for k, v in value.items() if v is not None}


def _check_keys(mapping: dict[Any, Any], allowed: Iterable[str], prefix: str, source: str) -> None:
    """Refuse keys outside ``allowed`` (typos would otherwise be dropped silently)."""
    allowed = list(allowed)
    for key in mapping:
        if isinstance(key, str) and key in allowed:
            continue
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(
            source=source,
            element=f"{prefix}{key}",
            problem=f"unknown key; {hint}expected one of: {', '.join(allowed)}",
        )


def _items(value: Any, element: str, what: str, source: str) -> list[Any]:
    """A top-level list of the document (absent: empty), or the error that says what it holds."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(
            source=source, element=element, problem=f"must be a list of {what}, got {_kind(value)}"
        )
    return value


def _kind(value: Any) -> str:
    """How YAML would describe ``value``'s type, for error messages."""
    names: dict[type, str] = {dict: "a mapping", list: "a list", str: "a string"}
    return names.get(type(value), repr(value))
