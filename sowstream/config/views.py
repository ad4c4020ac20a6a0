"""View definitions (AMPS ``View``, old synonym ``ViewDefinition``): model, checks and parsers.

:class:`ViewConfig` checks one definition on its own, including compiling its Projection,
Grouping and Filter, so a bad field is refused at start with its element and position.
:func:`check_views` checks definitions against each other and the other SOW definitions
(unknown underlying topics, references to later definitions, cycles of views).
:func:`view_from_yaml` and :func:`view_from_xml` read one ``views:`` item or ``<View>`` element.

Choice on the issue's "non-aggregate field outside Grouping": AMPS allows such a field (it shows
the group's last processed value), so sowstream does too; what is refused instead is a Projection
identifier that resolves to no underlying topic (an unknown ``[TOPIC]``, or an unqualified path in
a join view) and an aggregate where none is allowed (nested aggregates, aggregates in Grouping or
Filter).
"""

from __future__ import annotations

import logging
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import ValidationError, field_validator, model_validator

from sowstream.config.errors import (
    ConfigError,
    FieldProblem,
    Loc,
    child_texts,
    element_text,
    from_validation_error,
)
from sowstream.config.fields import (
    MAX_PARTITIONS,
    MIN_PARTITIONS,
    SUPPORTED_MESSAGE_TYPES,
    Frozen,
    amps_topic_name,
    bounded_int,
    one_of,
)
from sowstream.config.models import TopicConfig
from sowstream.config.queues import available_topic_name
from sowstream.views.joins import PRESERVE, JoinPlan, Side
from sowstream.views.ports import CompiledView
from sowstream.views.projection import (
    JoinCondition,
    TopicRef,
    ViewDefinitionError,
    compile_projection,
    parse_join,
    parse_topic_ref,
)

__all__ = [
    "VIEW_ELEMENTS",
    "VIEW_TAGS",
    "Definition",
    "ViewConfig",
    "ViewProblem",
    "check_view_sources",
    "check_views",
    "view_from_xml",
    "view_from_yaml",
    "warn_unprojected_indexes",
]

Conflation = Literal["none", "inline"]

# AMPS element name -> ViewConfig field (YAML keys and XML child elements).
VIEW_ELEMENTS: dict[str, str] = {
    "Name": "name",
    "MessageType": "message_type",
    "UnderlyingTopic": "underlying_topic",
    "Projection": "projection",
    "Grouping": "grouping",
    "KeyDomain": "key_domain",
    "Conflation": "conflation",
    "Filter": "filter",
    "HashIndex": "hash_indexes",
    "JoinNullEquivalency": "join_null_equivalency",
    "FileName": "file_name",
    "Partitions": "partitions",  # sowstream's own, as on SOW topics
}
FIELD_ELEMENTS: dict[str, str] = {field: tag for tag, field in VIEW_ELEMENTS.items()}
FIELD_ELEMENTS["joins"] = "UnderlyingTopic"
VIEW_TAGS = ("View", "ViewDefinition")
_SECTIONS = {"Projection": "projection", "Grouping": "grouping", "Filter": "filter"}

log = logging.getLogger("sowstream.config")


class ViewConfig(Frozen):
    """One view: its underlying topic or joins, Projection, Grouping and options.

    ``joins`` holds the ``Join`` texts (``[A]./x = [B]./y``); exactly one of it and
    ``underlying_topic`` is given. ``key_domain`` None means the view's name.
    """

    name: str
    message_type: str = "json"
    underlying_topic: str | None = None
    joins: tuple[str, ...] = ()
    projection: tuple[str, ...]
    grouping: tuple[str, ...]
    filter: str | None = None
    key_domain: str | None = None
    hash_indexes: tuple[tuple[str, ...], ...] = ()
    conflation: Conflation = "none"
    join_null_equivalency: bool = False
    file_name: str | None = None  # accepted for AMPS files, unused (as in AMPS)
    partitions: int = 4  # the view's own log, table and input topic

    @field_validator("partitions", mode="before")
    @classmethod
    def _partitions(cls, value: object) -> int:
        return bounded_int(value, "Partitions", MIN_PARTITIONS, MAX_PARTITIONS)

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: object) -> str:
        return amps_topic_name(value, "view name")

    @field_validator("message_type", mode="before")
    @classmethod
    def _message_type(cls, value: object) -> str:
        if isinstance(value, str) and value.strip().lower() == "binary":
            raise ValueError("the binary message type has no fields, so a view cannot produce it")
        if isinstance(value, str) and value.strip().lower() in SUPPORTED_MESSAGE_TYPES:
            return value.strip().lower()
        supported = ", ".join(SUPPORTED_MESSAGE_TYPES)
        raise ValueError(
            f"message type {value!r} is not supported for views; supported: {supported}"
        )

    @field_validator("projection", "grouping", mode="before")
    @classmethod
    def _fields(cls, value: object, info: Any) -> tuple[str, ...]:
        what = "Projection" if info.field_name == "projection" else "Grouping"
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not items:
            raise ValueError(f"{what} needs at least one Field")
        for number, item in enumerate(items, 1):
            if not isinstance(item, str) or not item.strip():
                raise ValueError(f"{what} Field[{number}] must be a non-empty text, got {item!r}")
        return tuple(items)

    @field_validator("joins", mode="before")
    @classmethod
    def _joins(cls, value: object) -> tuple[str, ...]:
        items = [value] if isinstance(value, str) or value is None else value
        if not isinstance(items, list | tuple):
            raise ValueError(f"Join must be a condition or a list of them, got {value!r}")
        out: list[str] = []
        for number, item in enumerate(items, 1):
            if not isinstance(item, str) or not item.strip():
                raise ValueError(
                    f"Join[{number}] has no condition: write it like "
                    "[ORDERS]./Tick = [COMPANIES]./Tick"
                )
            try:
                parse_join(item)
            except ValueError as exc:
                raise ValueError(f"Join[{number}]: {exc}") from None
            out.append(item.strip())
        return tuple(out)

    @field_validator("conflation", mode="before")
    @classmethod
    def _conflation(cls, value: object) -> str:
        return one_of(value, "Conflation", ("none", "inline"))

    @field_validator("join_null_equivalency", mode="before")
    @classmethod
    def _null_equivalency(cls, value: object) -> bool:
        if isinstance(value, bool):
            return value
        return one_of(value, "JoinNullEquivalency", ("enabled", "disabled")) == "enabled"

    @field_validator("hash_indexes", mode="before")
    @classmethod
    def _hash_indexes(cls, value: object) -> tuple[tuple[str, ...], ...]:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ValueError(f"HashIndex must be a list of Key lists, got {value!r}")
        out: list[tuple[str, ...]] = []
        for item in items:
            keys = (item,) if isinstance(item, str) else tuple(item)
            if not keys or not all(isinstance(k, str) and k.startswith("/") for k in keys):
                raise ValueError(f"a HashIndex holds Key paths like /region, got {item!r}")
            out.append(keys)
        return tuple(out)

    @field_validator("underlying_topic", mode="before")
    @classmethod
    def _underlying(cls, value: object) -> object:
        if isinstance(value, str):
            parse_topic_ref(value)  # ValueError names the problem
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ViewConfig:
        if self.underlying_topic is None and not self.joins:
            raise FieldProblem(
                "underlying_topic", "is required: name one topic, or give Join elements"
            )
        if self.underlying_topic is not None and self.joins:
            raise FieldProblem(
                "underlying_topic", "holds either one topic name or Join elements, not both"
            )
        if self.filter is not None and self.joins:
            raise FieldProblem(
                "filter",
                "a Filter is only allowed on a view over a single topic, not with Join; filter "
                "the view's records in the subscription instead",
            )
        self.compile()  # FieldProblem names the element at fault
        return self

    # ---- derived

    @property
    def effective_key_domain(self) -> str:
        """The seed of the view records' SowKeys: KeyDomain, else the view's name."""
        return self.key_domain or self.name

    @property
    def join_conditions(self) -> tuple[JoinCondition, ...]:
        return tuple(parse_join(text) for text in self.joins)

    @property
    def topics(self) -> tuple[TopicRef, ...]:
        """The underlying topics: the single one, or the joined ones (preserved first)."""
        if self.underlying_topic is not None:
            return (parse_topic_ref(self.underlying_topic),)
        return JoinPlan(self.join_conditions).topics

    @property
    def underlying_names(self) -> tuple[str, ...]:
        return tuple(t.topic for t in self.topics)

    @property
    def unprojected_index_keys(self) -> tuple[str, ...]:
        """HashIndex Keys the view does not project. AMPS loads such an index (chapter 05's own
        hash-sample-view indexes /name); it stays empty, so the loaders only warn."""
        outputs = set(self.compile().projection.outputs)
        keys = (key for index in self.hash_indexes for key in index if key not in outputs)
        return tuple(dict.fromkeys(keys))

    @property
    def all_hash_indexes(self) -> tuple[tuple[str, ...], ...]:
        """HashIndex elements plus the automatic one on the Grouping fields, when projected."""
        automatic = self.compile().projection.grouping_outputs
        extra = tuple(k for k in self.hash_indexes if k != automatic)
        return ((automatic,) if automatic else ()) + extra

    def topic_config(self) -> TopicConfig:
        """The view as a SOW topic for readers: no Key fields (the maintainer supplies each
        record's SowKey, made from the Grouping values with the KeyDomain), its own partitions,
        the hash indexes of the view (the Grouping one first), and the view fields showing the
        Grouping fields as the fields that name a record in a delta (send_keys)."""
        return TopicConfig(
            name=self.name,
            message_type=self.message_type,
            partitions=self.partitions,
            hash_indexes=self.all_hash_indexes,
            record_keys=self.compile().projection.shown_grouping,
        )

    def compile(self, preserve: Side = PRESERVE) -> CompiledView:
        """The join plan and compiled projection; FieldProblem names the element at fault."""
        try:
            plan = JoinPlan(self.join_conditions, preserve) if self.joins else None
        except ValueError as exc:
            raise FieldProblem("joins", str(exc)) from None
        topics = plan.topics if plan else self.topics
        try:
            projection = compile_projection(topics, self.projection, self.grouping, self.filter)
        except ViewDefinitionError as exc:
            section, _, rest = exc.element.partition("/")
            section = section.split(",")[0]
            field = _SECTIONS.get(section, "projection")
            where = rest or exc.element.removeprefix(section).lstrip(", ")
            raise FieldProblem(field, f"{where}: {exc.problem}" if where else exc.problem) from None
        return CompiledView(plan, projection)


# ---------------------------------------------------------------------------- cross checks


class ViewProblem(FieldProblem):
    """A check across definitions failed: ``index`` is the view's position, ``field`` its field."""

    def __init__(self, index: int, field: str, message: str) -> None:
        super().__init__(field, message)
        self.index = index


Definition = tuple[str, str | None]
"""A SOW definition as views see it: its name and message type (None: not known yet, as for a
conflated topic that takes its underlying topic's type)."""


def _same(a: Definition, b: Definition) -> bool:
    """Whether two definitions (or a reference and a definition) may name the same topic:
    topics are per message type, so one name can hold a json topic and an nvfix view (V12)."""
    return a[0] == b[0] and (a[1] is None or b[1] is None or a[1] == b[1])


def warn_unprojected_indexes(view: ViewConfig, element: str, source: str) -> None:
    """Log, once per load, each HashIndex Key of ``view`` (at ``element``) it does not project.

    Not a model validator: pydantic runs those again whenever a config holding the view is
    built, which would repeat the warning."""
    for key in view.unprojected_index_keys:
        log.warning(
            "%s: %s: HashIndex Key %s is not a field of view %s (its fields: %s); the index "
            "stays empty and an exact match on %s finds no record",
            source,
            element,
            key,
            view.name,
            ", ".join(view.compile().projection.outputs),
            key,
        )


def check_views(views: Sequence[ViewConfig], definitions: Sequence[Definition]) -> None:
    """Check views against all SOW definitions, given as (name, message type) in definition
    order.

    ``definitions`` lists every SOW topic, queue, conflated topic and view in the order of the
    configuration (the views themselves included). A view's underlying topics must be defined
    before it; views must not form a cycle. Raises :class:`ViewProblem`.
    """
    defs = list(definitions)
    earliest: dict[tuple[int, int], int] = {}  # (view, reference) -> first definition it reads
    for i, view in enumerate(views):
        own = (view.name, view.message_type)
        if sum(_same(own, d) for d in defs) > 1:
            raise ViewProblem(
                i,
                "name",
                f"{view.name!r} is defined more than once; a view needs its own Name (or a "
                "MessageType of its own)",
            )
        for r, ref in enumerate(view.topics):
            wanted = (ref.topic, ref.message_type)
            found = [n for n, d in enumerate(defs) if _same(wanted, d) and d != own]
            if found:
                earliest[i, r] = min(found)
            elif not _same(wanted, own):  # a view reading itself is reported as a cycle below
                raise ViewProblem(
                    i,
                    _field(view),
                    f"view {view.name!r} reads topic {str(ref)!r}, which is not defined: declare "
                    "it as a SOW topic, queue, conflated topic or view before this view",
                )
    for i, view in enumerate(views):
        cycle = _cycle(i, views)
        if cycle:
            raise ViewProblem(
                i,
                _field(view),
                f"views form a cycle: {' -> '.join(cycle)}; a view cannot read itself, directly "
                "or through other views",
            )
    for i, view in enumerate(views):
        at = next((n for n, d in enumerate(defs) if d == (view.name, view.message_type)), len(defs))
        for r, ref in enumerate(view.topics):
            if earliest.get((i, r), -1) > at:
                raise ViewProblem(
                    i,
                    _field(view),
                    f"view {view.name!r} reads {str(ref)!r}, which is defined after it; a view "
                    "can only read definitions that come earlier in the configuration",
                )


def check_view_sources(
    views: Sequence[ViewConfig], topics: Sequence[TopicConfig], queues: Sequence[str] = ()
) -> None:
    """What the engine needs of each underlying topic: a SOW it can follow.

    A view reads a SOW topic, a queue or an earlier view; a topic without
    a SOW (``topics:``) has no before images to retract. A view's name must not take the Kafka
    topics of a SOW topic, nor may a topic take the name of the topic the engine keeps for a
    queue a view reads. Raises :class:`ViewProblem`.
    """
    by_name: dict[str, list[TopicConfig]] = {}
    for topic in topics:
        by_name.setdefault(topic.name, []).append(topic)
    view_names = {v.name for v in views}
    kafka_names = {t.kafka_name: t for t in topics}
    for i, view in enumerate(views):
        clash = kafka_names.get(view.topic_config().kafka_name)
        if clash is not None:
            raise ViewProblem(
                i,
                "name",
                f"view {view.name!r} would share the Kafka topics of {clash.message_type} topic "
                f"{clash.name!r}; a view needs a name of its own",
            )
        for ref in view.topics:
            if ref.topic in view_names:
                continue
            if ref.topic in queues and ref.topic not in by_name:
                # check_views found it as a queue of its type (queues are json).
                kept = available_topic_name(ref.topic)
                if kept in by_name or kept in view_names:
                    raise ViewProblem(
                        i,
                        _field(view),
                        f"view {view.name!r} reads queue {ref.topic!r}, whose available "
                        f"messages the engine keeps as topic {kept!r}, but a topic or view is "
                        "already called that: rename it",
                    )
                continue
            found = [
                t
                for t in by_name.get(ref.topic, ())
                if ref.message_type is None or t.message_type == ref.message_type
            ]
            if found and not any(t.sow for t in found):
                raise ViewProblem(
                    i,
                    _field(view),
                    f"view {view.name!r} reads topic {ref.topic!r}, which keeps no SOW (it is "
                    "declared under topics:); a view needs the records' previous states, so "
                    "declare the topic under sow:",
                )


def _field(view: ViewConfig) -> str:
    return "joins" if view.joins else "underlying_topic"


def _cycle(start: int, views: Sequence[ViewConfig]) -> list[str] | None:
    """The first cycle through view ``start`` along underlying views, as a name path, if any."""

    def reads(view: ViewConfig) -> list[int]:
        return [
            n
            for ref in view.topics
            for n, other in enumerate(views)
            if _same((ref.topic, ref.message_type), (other.name, other.message_type))
        ]

    stack: list[tuple[int, list[str]]] = [(start, [views[start].name])]
    seen: set[int] = set()
    while stack:
        index, path = stack.pop()
        for n in reads(views[index]):
            if n == start:
                return [*path, views[start].name]
            if n not in seen:
                seen.add(n)
                stack.append((n, [*path, views[n].name]))
    return None


# ---------------------------------------------------------------------------- YAML


def _kind(value: Any) -> str:
    names: dict[type, str] = {dict: "a mapping", list: "a list", str: "a string"}
    return names.get(type(value), repr(value))


def _field_list(value: Any, tag: str, element: str, source: str) -> list[Any]:
    """Projection / Grouping as a list of Field texts: a list, ``{Field: [...]}`` or one text."""
    if isinstance(value, dict):
        extra = [k for k in value if k != "Field"]
        if extra:
            raise ConfigError(
                source=source,
                element=f"{element}.{extra[0]}",
                problem=f"unknown key; a {tag} holds only Field",
            )
        value = value.get("Field")
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise ConfigError(
            source=source,
            element=element,
            problem=f"must be a list of Field texts, got {_kind(value)}",
        )
    return value


def view_from_yaml(item: Any, element: str, source: str) -> ViewConfig:
    """One ``views:`` item (AMPS element names as keys) as a ViewConfig.

    ``UnderlyingTopic`` is a topic name or ``{Join: [...]}``; ``Projection`` and ``Grouping``
    are lists (or ``{Field: [...]}``); ``HashIndex`` is a list of Key lists (or ``{Key: [...]}``).
    Raises ConfigError naming ``element`` (for example ``views[2].Projection``).
    """
    if not isinstance(item, dict):
        raise ConfigError(
            source=source,
            element=element,
            problem=f"each view must be a mapping like '- Name: by_region', got {_kind(item)}",
        )
    allowed = [*VIEW_ELEMENTS, "Topic"]
    for key in item:
        if key not in allowed:
            raise ConfigError(
                source=source,
                element=f"{element}.{key}",
                problem=f"unknown key; expected one of: {', '.join(allowed)}",
            )
    fields: dict[str, Any] = {}
    for key, value in item.items():
        if value is None:
            continue
        where = f"{element}.{key}"
        if key == "Topic":
            if "Name" in item and item["Name"] != value:
                raise ConfigError(
                    source=source,
                    element=where,
                    problem=f"Name and Topic disagree ({item['Name']!r} and {value!r})",
                )
            fields["name"] = value
        elif key == "UnderlyingTopic" and isinstance(value, dict):
            extra = [k for k in value if k != "Join"]
            if extra:
                raise ConfigError(
                    source=source,
                    element=f"{where}.{extra[0]}",
                    problem="unknown key; an UnderlyingTopic mapping holds only Join",
                )
            fields["joins"] = value.get("Join") if value.get("Join") is not None else [None]
        elif key in ("Projection", "Grouping"):
            fields[VIEW_ELEMENTS[key]] = _field_list(value, key, where, source)
        elif key == "HashIndex":
            items = value if isinstance(value, list) else [value]
            fields["hash_indexes"] = [i.get("Key") if isinstance(i, dict) else i for i in items]
        else:
            fields[VIEW_ELEMENTS[key]] = value

    def element_of(loc: Loc) -> str:
        if not loc:
            return element
        return f"{element}.{FIELD_ELEMENTS.get(str(loc[0]), str(loc[0]))}"

    try:
        return ViewConfig(**fields)
    except ValidationError as exc:
        raise from_validation_error(exc, source=source, element_of=element_of) from None


# ---------------------------------------------------------------------------- AMPS XML


def view_from_xml(
    element: ET.Element, section: str, position: int, source: str
) -> tuple[ViewConfig, str]:
    """One ``<View>`` / ``<ViewDefinition>`` element as a ViewConfig and its element path.

    ``position`` is the view's 1-based position among the section's views (for a nameless one).
    """
    name = next(
        ((c.text or "").strip() for c in element if c.tag in ("Name", "Topic") and not len(c)),
        "",
    )
    path = f"{section}/{element.tag}[{name or f'#{position}'}]"
    counts = Counter(c.tag for c in element)
    for tag, count in counts.items():
        if count > 1 and tag != "HashIndex":
            raise ConfigError(
                source=source,
                element=f"{path}/{tag}",
                problem=f"<{tag}> appears {count} times; it may appear only once",
            )
    fields: dict[str, Any] = {}
    tag_of: dict[str, str] = {}
    for child in element:
        where = f"{path}/{child.tag}"
        if child.tag not in VIEW_ELEMENTS and child.tag != "Topic":
            raise ConfigError(
                source=source, element=where, problem=f"unknown element <{child.tag}> in a view"
            )
        if child.tag == "UnderlyingTopic":
            if len(child):
                joins: list[str | None] = []
                for join in child:
                    if join.tag != "Join":
                        raise ConfigError(
                            source=source,
                            element=f"{where}/{join.tag}",
                            problem="an <UnderlyingTopic> holds a topic name or <Join> elements",
                        )
                    joins.append((join.text or "").strip() or None)
                fields["joins"] = joins
                tag_of["joins"] = "UnderlyingTopic/Join"
            else:
                fields["underlying_topic"] = element_text(child, where, source)
        elif child.tag in ("Projection", "Grouping"):
            fields[VIEW_ELEMENTS[child.tag]] = child_texts(
                child, "Field", where, source, required=False
            )
        elif child.tag == "HashIndex":
            keys = child_texts(child, "Key", where, source)
            fields.setdefault("hash_indexes", []).append(keys)
        else:
            field = "name" if child.tag == "Topic" else VIEW_ELEMENTS[child.tag]
            text = element_text(child, where, source)
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
        return ViewConfig(**fields), path
    except ValidationError as exc:
        raise from_validation_error(exc, source=source, element_of=element_of) from None
