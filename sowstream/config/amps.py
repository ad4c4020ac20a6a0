"""Reading the ``<SOW>`` section of an AMPS configuration file as-is, so AMPS users can migrate.

Topics (with their Preprocessing and Enrichment), queues, conflated topics and views are read;
what sowstream cannot honour yet is an error, or with ``skip_unsupported`` a warning that
skips the topic or element. The instance's ``<Name>`` is what ``AMPS_INSTANCE_NAME()`` gives.
Storage-sizing elements are accepted and ignored: RocksDB manages storage here.
"""

from __future__ import annotations

import logging
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sowstream.config.conflated import (
    CONFLATED_TAGS,
    ConflatedProblem,
    ConflatedTopicConfig,
    check_conflated_topics,
    conflated_from_xml,
)
from sowstream.config.conflated import FIELD_ELEMENTS as CONFLATED_FIELD_ELEMENTS
from sowstream.config.errors import (
    ConfigError,
    Loc,
    child_texts,
    element_text,
    from_validation_error,
    skip_or_raise,
)
from sowstream.config.fields import schema_path
from sowstream.config.models import EngineConfig, TopicConfig
from sowstream.config.queues import (
    ELEMENT_KINDS,
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
    VIEW_TAGS,
    Definition,
    ViewConfig,
    ViewProblem,
    check_view_sources,
    check_views,
    view_from_xml,
    warn_unprojected_indexes,
)
from sowstream.messagetypes import registry
from sowstream.units import parse_size

log = logging.getLogger("sowstream.config")

ROOTS = ("AMPSConfig", "SOW", "TopicMetaData")
SOW_SECTIONS = ("SOW", "TopicMetaData")
TOPIC_ELEMENTS = ("Topic", "TopicDefinition")
UNSUPPORTED_DEFINITIONS: tuple[str, ...] = ()
UNSUPPORTED_TOPIC_ELEMENTS: tuple[str, ...] = ()
# Elements holding a list of <Field> children (sowstream.sow.enrich).
STAGE_ELEMENTS = {"Preprocessing": "preprocessing", "Enrichment": "enrichment"}
# What a regular expression topic (with a Pattern) may not have, as AMPS documents.
NOT_WITH_PATTERN = ("History", "Preprocessing", "Enrichment")

_STORAGE_FILE = "sowstream keeps SOW state in RocksDB under engine.data_dir, not in a SOW file"
_STORAGE_SIZE = "RocksDB manages storage growth itself, so AMPS slab and record sizing do not apply"
IGNORED_TOPIC_ELEMENTS: dict[str, str] = {
    "FileName": _STORAGE_FILE,
    "SlabSize": _STORAGE_SIZE,
    "InitialSlabCount": _STORAGE_SIZE,
    "RecordSize": _STORAGE_SIZE,
    "InitialSize": _STORAGE_SIZE,
    "IncrementSize": _STORAGE_SIZE,
    "ExpectedKeyCountHint": "RocksDB sizes its own key structures, so no hint is needed",
}
_SIZE_ELEMENTS = ("SlabSize", "RecordSize")
# The limits AMPS documents for ignored elements: a file AMPS refuses is refused here too.
_IGNORED_LIMITS: dict[str, tuple[int, int]] = {"InitialSlabCount": (1, 1024)}

# AMPS element -> TopicConfig field, for the elements that carry one value.
_SCALARS: dict[str, str] = {
    "MessageType": "message_type",
    "KeyDomain": "key_domain",
    "Durability": "durability",
    "Duration": "durability",
    "RecoveryPoint": "recovery_point",
    "Expiration": "expiration",
    "Partitions": "partitions",
    "Schema": "schema_file",  # sowstream's own: an avro or protobuf topic's schema file
    "Parts": "parts",  # sowstream's own: a composite topic's part types (or <MessageTypes>)
    "Pattern": "pattern",
}
_NAME_TAGS = ("Name", "Topic")
_REPEATABLE = ("Key", "HashIndex", "Index")
_KNOWN_TOPIC_ELEMENTS = frozenset(
    [
        *_SCALARS,
        *_NAME_TAGS,
        *_REPEATABLE,
        "History",
        "KeyGenerator",
        *STAGE_ELEMENTS,
        *IGNORED_TOPIC_ELEMENTS,
    ]
)
_HISTORY_FIELDS = {"Window": "window_ms", "Granularity": "granularity_ms"}
_HISTORY_TAGS = {field: tag for tag, field in _HISTORY_FIELDS.items()}
# Element named in errors about a field, unless the topic spelled it differently (Duration, Topic).
_DEFAULT_TAGS = {
    **{field: tag for tag, field in _SCALARS.items() if tag != "Duration"},
    "name": "Name",
    "keys": "Key",
    "hash_indexes": "HashIndex",
    "indexes": "Index",
    "history": "History",
    "key_generator": "KeyGenerator",
    **{field: tag for tag, field in STAGE_ELEMENTS.items()},
}


def not_with_pattern(element: str, name: str | None) -> str:
    """The error for an element a regular expression topic may not have."""
    topic = f"topic {name!r}" if name else "this topic"
    return f"{element} cannot be used with Pattern: {topic} is a regular expression topic"


def message_type_supported(
    message_type: str,
    *,
    source: str,
    element: str,
    skip: bool,
    skipping: str,
    queue: bool = False,
) -> bool:
    """Whether a topic's (or with ``queue`` a queue's: they carry every type) MessageType is one
    sowstream handles; if not, raise or (with ``skip``) log that the topic is skipped and return
    False."""
    supported = registry.names()
    if message_type.strip().lower() in supported:
        return True
    error = ConfigError(
        source=source,
        element=element,
        problem=f"message type {message_type!r} is not supported by sowstream yet "
        f"(supported: {', '.join(supported)})",
    )
    skip_or_raise(error, skip=skip, skipping=skipping)
    return False


def load_amps_xml(
    data: str | bytes, source: str = "<string>", *, skip_unsupported: bool = False
) -> SowstreamConfig:
    """The SOW topics of an AMPS configuration: a whole ``<AMPSConfig>`` or a bare ``<SOW>``."""
    root = _parse(data, source)
    if root.tag not in ROOTS:
        raise ConfigError(
            source=source,
            element=root.tag,
            problem="not an AMPS configuration: expected <AMPSConfig>, <SOW> or <TopicMetaData> "
            "as the top element",
        )
    sections = [root] if root.tag in SOW_SECTIONS else [s for s in root if s.tag in SOW_SECTIONS]
    # <Modules><Module> Name -> Library (pkg.mod:factory): a KeyGenerator may name one.
    modules = {
        _child_text(m, "Name") or "": _child_text(m, "Library") or ""
        for section in root.iter("Modules")
        for m in section.iter("Module")
    }
    declared = _declared_types(root, source)
    topics: list[TopicConfig] = []
    defined_at: dict[str, str] = {}
    queues: list[tuple[QueueConfig, str, dict[str, str]]] = []
    views: list[tuple[ViewConfig, str]] = []
    conflated: list[tuple[ConflatedTopicConfig, str]] = []
    # Every definition in document order (views and conflated topics read earlier ones).
    defined: list[Definition] = []
    for section in sections:
        position = 0
        queue_position = 0
        view_position = 0
        conflated_position = 0
        for child in section:
            if child.tag in ELEMENT_KINDS:
                queue_position += 1
                queue = _queue(child, section.tag, queue_position, source, skip_unsupported)
                if queue is not None:
                    queues.append(queue)
                    defined.append((queue[0].name, queue[0].message_type))
            elif child.tag in CONFLATED_TAGS:
                conflated_position += 1
                conflated.append(conflated_from_xml(child, section.tag, conflated_position, source))
                defined.append((conflated[-1][0].name, conflated[-1][0].message_type))
            elif child.tag in VIEW_TAGS:
                view_position += 1
                views.append(view_from_xml(child, section.tag, view_position, source))
                defined.append((views[-1][0].name, views[-1][0].message_type))
            elif child.tag in TOPIC_ELEMENTS:
                position += 1
                found = _topic(
                    child, section.tag, position, source, skip_unsupported, modules, declared
                )
                if found is None:
                    continue
                topic, path = found
                if topic.ident in defined_at:
                    raise ConfigError(
                        source=source,
                        element=f"{path}/Name",
                        problem=f"{topic.message_type} topic {topic.name!r} is already defined "
                        f"at {defined_at[topic.ident]}; each SOW topic of a message type needs "
                        "its own Name",
                    )
                defined_at[topic.ident] = path
                topics.append(topic)
                defined.append((topic.name, topic.message_type))
            else:
                _not_a_topic(child, section.tag, source, skip_unsupported)
    for implicit in implicit_topics([queue for queue, _, _ in queues], topics):
        topics.append(implicit)
        defined.append((implicit.name, implicit.message_type))
    try:
        check_queues([queue for queue, _, _ in queues], topics)
    except QueueProblem as exc:
        _, path, tag_of = queues[exc.index]
        tag = tag_of.get(exc.field, FIELD_ELEMENTS.get(exc.field, exc.field))
        raise ConfigError(source=source, element=f"{path}/{tag}", problem=str(exc)) from None
    try:
        check_conflated_topics([c for c, _ in conflated], topics, defined, [v for v, _ in views])
    except ConflatedProblem as exc:
        path = conflated[exc.index][1]
        tag = CONFLATED_FIELD_ELEMENTS.get(exc.field, exc.field)
        raise ConfigError(source=source, element=f"{path}/{tag}", problem=str(exc)) from None
    try:
        check_views([v for v, _ in views], defined)
        viewable = [q.name for q, _, _ in queues if q.message_type in QUEUE_MESSAGE_TYPES]
        check_view_sources([v for v, _ in views], topics, viewable)
    except ViewProblem as exc:
        view_path = views[exc.index][1]
        tag = VIEW_FIELD_ELEMENTS.get(exc.field, exc.field)
        raise ConfigError(source=source, element=f"{view_path}/{tag}", problem=str(exc)) from None
    for view, view_path in views:
        warn_unprojected_indexes(view, f"{view_path}/HashIndex", source)
    instance = _child_text(root, "Name") if root.tag == "AMPSConfig" else None
    try:
        return SowstreamConfig(
            engine=EngineConfig(instance_name=instance),
            topics=tuple(topics),
            queues=tuple(q for q, _, _ in queues),
            views=tuple(v for v, _ in views),
            conflated_topics=tuple(c for c, _ in conflated),
            source=source,
        ).stamped()
    except ValidationError as exc:
        raise from_validation_error(exc, source=source, element_of=lambda _: "SOW") from None


def _parse(data: str | bytes, source: str) -> ET.Element:
    """The document's root element, or a ConfigError with the line of the syntax error."""
    if isinstance(data, str):
        data = data.lstrip("\ufeff")
    try:
        return ET.fromstring(data)
    except ET.ParseError as exc:
        line, column = exc.position
        message = str(exc).split(": line ")[0]
        raise ConfigError(
            source=source,
            element=f"line {line}, column {column + 1}",
            problem=f"malformed XML: {message}",
        ) from None


def _not_a_topic(element: ET.Element, section: str, source: str, skip: bool) -> None:
    """Report a SOW-section element that does not define a SOW topic."""
    label = _child_text(element, "Name") or _child_text(element, "Topic")
    path = f"{section}/{element.tag}" + (f"[{label}]" if label else "")
    if element.tag in UNSUPPORTED_DEFINITIONS:
        problem = f"<{element.tag}> definitions are not supported by sowstream yet"
    else:
        problem = f"unknown element <{element.tag}> in <{section}>"
    error = ConfigError(source=source, element=path, problem=problem)
    skip_or_raise(error, skip=skip, skipping=f"the <{element.tag}> element")


def _topic(
    element: ET.Element,
    section: str,
    position: int,
    source: str,
    skip: bool,
    modules: Mapping[str, str],
    declared: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[TopicConfig, str] | None:
    """One ``<Topic>`` as a TopicConfig and its element path, or None when skipped; a
    MessageType declared under ``<MessageTypes>`` (``declared``) stands for its module and
    settings."""
    declared = declared or {}
    name = _child_text(element, "Name") or _child_text(element, "Topic")
    path = f"{section}/{element.tag}[{name or f'#{position}'}]"
    skipping = f"topic {name!r}" if name else f"topic #{position} of <{section}>"
    children = list(element)

    for tag, count in Counter(c.tag for c in children).items():
        if count > 1 and tag not in _REPEATABLE:
            raise ConfigError(
                source=source,
                element=f"{path}/{tag}",
                problem=f"<{tag}> appears {count} times; it may appear only once",
            )
    if any(c.tag == "Pattern" for c in children):
        for child in children:
            if child.tag in NOT_WITH_PATTERN:
                raise ConfigError(
                    source=source,
                    element=f"{path}/{child.tag}",
                    problem=not_with_pattern(child.tag, name),
                )
    for child in children:
        if child.tag in UNSUPPORTED_TOPIC_ELEMENTS or child.tag not in _KNOWN_TOPIC_ELEMENTS:
            problem = (
                f"<{child.tag}> is not supported by sowstream yet"
                if child.tag in UNSUPPORTED_TOPIC_ELEMENTS
                else f"unknown element <{child.tag}> in a SOW topic"
            )
            error = ConfigError(source=source, element=f"{path}/{child.tag}", problem=problem)
            skip_or_raise(error, skip=skip, skipping=skipping)
            return None
        if child.tag == "MessageType":
            message_type = element_text(child, f"{path}/MessageType", source)
            if message_type in declared:
                continue
            if not message_type_supported(
                message_type,
                source=source,
                element=f"{path}/MessageType",
                skip=skip,
                skipping=skipping,
            ):
                return None

    fields: dict[str, Any] = {}
    tag_of: dict[str, str] = {}
    # AMPS before 5.0 named the topic with <Topic>; both may appear only if they agree.
    named = {
        c.tag: element_text(c, f"{path}/{c.tag}", source) for c in children if c.tag in _NAME_TAGS
    }
    if len(set(named.values())) > 1:
        raise ConfigError(
            source=source,
            element=f"{path}/Topic",
            problem=f"<Topic> {named['Topic']!r} disagrees with <Name> {named['Name']!r}",
        )
    for tag in _NAME_TAGS:
        if tag in named:
            fields["name"], tag_of["name"] = named[tag], tag
            break
    keys: list[str] = []
    hash_indexes: list[list[str]] = []
    indexes: list[str] = []
    for child in children:
        tag, where = child.tag, f"{path}/{child.tag}"
        if tag in IGNORED_TOPIC_ELEMENTS:
            _check_ignored(child, where, source)
            log.info("%s: %s: ignored: %s", source, where, IGNORED_TOPIC_ELEMENTS[tag])
        elif tag in _NAME_TAGS:
            pass  # read above
        elif tag == "Key":
            keys.append(element_text(child, where, source))
        elif tag == "Index":
            indexes.append(element_text(child, where, source))
        elif tag == "HashIndex":
            hash_indexes.append(_hash_index(child, f"{where}[{len(hash_indexes) + 1}]", source))
        elif tag == "History":
            fields["history"] = _history(child, where, source)
            tag_of["history"] = "History"
        elif tag == "KeyGenerator":
            fields["key_generator"] = _key_generator(child, where, source, modules)
        elif tag in STAGE_ELEMENTS:
            fields[STAGE_ELEMENTS[tag]] = _stage_fields(child, where, source)
        else:
            field = _SCALARS[tag]
            if field in tag_of and tag_of[field] != tag:
                raise ConfigError(
                    source=source,
                    element=where,
                    problem=f"give <{tag_of[field]}> or <{tag}>, not both (they are synonyms)",
                )
            fields[field] = element_text(child, where, source)
            tag_of[field] = tag
    if keys:
        fields["keys"] = tuple(keys)
    if hash_indexes:
        fields["hash_indexes"] = tuple(tuple(i) for i in hash_indexes)
    if indexes:
        fields["indexes"] = tuple(indexes)
    declared_type = declared.get(fields.get("message_type", ""))
    if declared_type is not None:
        for field in declared_type:
            if field in fields and field != "message_type":
                raise ConfigError(
                    source=source,
                    element=f"{path}/{_DEFAULT_TAGS.get(field, field)}",
                    problem=f"message type {fields['message_type']!r} is declared in "
                    "<MessageTypes>, which sets this already",
                )
        fields.update(declared_type)
    elif "schema_file" in fields:
        fields["schema_file"] = schema_path(fields["schema_file"], source)

    def element_of(loc: Loc) -> str:
        if not loc:
            return path
        field = str(loc[0])
        tag = tag_of.get(field, _DEFAULT_TAGS.get(field, field))
        if field == "history" and len(loc) > 1:
            return f"{path}/{tag}/{_HISTORY_TAGS.get(str(loc[1]), str(loc[1]))}"
        if field == "key_generator" and len(loc) > 1:
            return f"{path}/{tag}/{'Options' if str(loc[1]) == 'options' else 'Module'}"
        return f"{path}/{tag}"

    try:
        return TopicConfig(**fields), path
    except ValidationError as exc:
        raise from_validation_error(exc, source=source, element_of=element_of) from None


def _key_generator(
    element: ET.Element, where: str, source: str, modules: Mapping[str, str]
) -> dict[str, Any]:
    """``<KeyGenerator><Module>…</Module><Options><Name>value</Name>…</Options>``: each child of
    Options becomes one option, named by its tag. A Module named in ``<Modules>`` stands for its
    ``<Library>``, which must be a Python ``package.module:callable`` here."""
    fields: dict[str, Any] = {}
    for child in element:
        if child.tag == "Module":
            name = element_text(child, f"{where}/Module", source)
            fields["module"] = modules.get(name) or name
        elif child.tag == "Options":
            fields["options"] = {o.tag: (o.text or "").strip() for o in child}
        else:
            raise ConfigError(
                source=source,
                element=f"{where}/{child.tag}",
                problem=f"unknown element <{child.tag}> in a KeyGenerator (Module, Options)",
            )
    if "module" not in fields:
        raise ConfigError(source=source, element=where, problem="a KeyGenerator needs a <Module>")
    return fields


def _queue(
    element: ET.Element, section: str, position: int, source: str, skip: bool
) -> tuple[QueueConfig, str, dict[str, str]] | None:
    """One queue definition, its element path and the tag each field was spelled with.

    None when it is skipped (an unknown child element or message type, with ``skip``).
    """
    name = _child_text(element, "Name") or _child_text(element, "Topic")
    path = f"{section}/{element.tag}[{name or f'#{position}'}]"
    skipping = f"queue {name!r}" if name else f"queue #{position} of <{section}>"
    children = list(element)
    for tag, count in Counter(c.tag for c in children).items():
        if count > 1:
            raise ConfigError(
                source=source,
                element=f"{path}/{tag}",
                problem=f"<{tag}> appears {count} times; it may appear only once",
            )
    fields: dict[str, Any] = {"kind": ELEMENT_KINDS[element.tag]}
    tag_of: dict[str, str] = {}
    for child in children:
        where = f"{path}/{child.tag}"
        if child.tag not in QUEUE_ELEMENTS and child.tag != "Topic":
            error = ConfigError(
                source=source, element=where, problem=f"unknown element <{child.tag}> in a queue"
            )
            skip_or_raise(error, skip=skip, skipping=skipping)
            return None
        text = element_text(child, where, source)
        if child.tag == "MessageType" and not message_type_supported(
            text, source=source, element=where, skip=skip, skipping=skipping, queue=True
        ):
            return None
        field = "name" if child.tag == "Topic" else QUEUE_ELEMENTS[child.tag]
        if field in fields and fields[field] != text:
            raise ConfigError(
                source=source,
                element=where,
                problem=f"<Name> and <Topic> disagree ({fields[field]!r} and {text!r})",
            )
        fields[field] = text
        tag_of.setdefault(field, child.tag)

    def element_of(loc: Loc) -> str:
        if not loc:
            return path
        field = str(loc[0])
        return f"{path}/{tag_of.get(field, FIELD_ELEMENTS.get(field, field))}"

    try:
        return QueueConfig(**fields), path, tag_of
    except ValidationError as exc:
        raise from_validation_error(exc, source=source, element_of=element_of) from None


# The modules a <MessageTypes><MessageType> may name, and what each takes from it.
_TYPE_MODULES = ("composite-local", "composite-global", "protobuf")


def _declared_types(root: ET.Element, source: str) -> dict[str, dict[str, Any]]:
    """The named message types of ``<MessageTypes>``: per Name, the TopicConfig fields a topic
    of that type gets (``message_type`` the module, and ``parts`` or ``schema_file``).

    A composite lists its parts as ``<MessageType>`` children; protobuf names its file with
    ``<ProtoPath>`` (a folder) and ``<ProtoFile>``, or ``<Schema>``, and its message with
    ``<Type>``. A declaration of another module (a custom type) is left for the topic to refuse.
    """
    declared: dict[str, dict[str, Any]] = {}
    for section in root.iter("MessageTypes"):
        for index, element in enumerate(section.findall("MessageType"), start=1):
            name = _child_text(element, "Name")
            where = f"MessageTypes/MessageType[{name or f'#{index}'}]"
            module = (_child_text(element, "Module") or "").lower()
            if name is None or module not in _TYPE_MODULES:
                continue
            if module == "protobuf":
                proto_file = _child_text(element, "ProtoFile") or _child_text(element, "Schema")
                if proto_file is None:
                    raise ConfigError(
                        source=source,
                        element=f"{where}/ProtoFile",
                        problem="a protobuf message type needs its <ProtoFile> (a .proto file "
                        "or a descriptor set)",
                    )
                folder = _child_text(element, "ProtoPath")
                file = str(Path(folder) / proto_file) if folder else proto_file
                kind = _child_text(element, "Type")
                file = schema_path(file, source) + (f"#{kind}" if kind else "")
                declared[name] = {"message_type": module, "schema_file": file}
            else:
                parts = [
                    element_text(part, f"{where}/MessageType[{number}]", source)
                    for number, part in enumerate(element.findall("MessageType"), start=1)
                ]
                if not parts:
                    raise ConfigError(
                        source=source,
                        element=f"{where}/MessageType",
                        problem=f"a {module} message type lists its parts as <MessageType> "
                        "elements",
                    )
                declared[name] = {"message_type": module, "parts": tuple(parts)}
    return declared


def _child_text(element: ET.Element, tag: str) -> str | None:
    """Stripped text of the first ``tag`` child, if it holds any."""
    child = element.find(tag)
    if child is None or len(child) or not (child.text or "").strip():
        return None
    return (child.text or "").strip()


def _hash_index(element: ET.Element, where: str, source: str) -> list[str]:
    """The ``<Key>`` paths of one ``<HashIndex>``."""
    return child_texts(element, "Key", where, source)


def _stage_fields(element: ET.Element, where: str, source: str) -> list[str]:
    """The ``<Field>`` texts of a ``<Preprocessing>`` or ``<Enrichment>``, in order."""
    return child_texts(
        element, "Field", where, source, like="<Field>/qty * /price AS /total</Field>"
    )


def _history(element: ET.Element, where: str, source: str) -> dict[str, str]:
    """``<Window>`` and ``<Granularity>`` of a ``<History>``, as HistoryConfig fields."""
    history = {}
    for child in element:
        if child.tag not in _HISTORY_FIELDS:
            raise ConfigError(
                source=source,
                element=f"{where}/{child.tag}",
                problem="a <History> holds only <Window> and <Granularity>",
            )
        if _HISTORY_FIELDS[child.tag] in history:
            raise ConfigError(
                source=source,
                element=f"{where}/{child.tag}",
                problem=f"<{child.tag}> may appear only once",
            )
        history[_HISTORY_FIELDS[child.tag]] = element_text(child, f"{where}/{child.tag}", source)
    return history


def _check_ignored(element: ET.Element, where: str, source: str) -> None:
    """Refuse malformed values even in ignored elements, as AMPS itself would."""
    text = element_text(element, where, source)
    if element.tag in _SIZE_ELEMENTS:
        try:
            parse_size(text)
        except ValueError as exc:
            raise ConfigError(source=source, element=where, problem=str(exc)) from None
    elif element.tag != "FileName" and not text.isdigit():
        raise ConfigError(
            source=source,
            element=where,
            problem=f"<{element.tag}> must be a whole number, got {text!r}",
        )
    limit = _IGNORED_LIMITS.get(element.tag)
    if limit is not None and not limit[0] <= int(text) <= limit[1]:
        raise ConfigError(
            source=source,
            element=where,
            problem=f"<{element.tag}> must be between {limit[0]} and {limit[1]}, got {text}",
        )
