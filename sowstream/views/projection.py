"""Compile a view's Projection, Grouping and Filter into functions over one contributing row.

A *row* is what feeds a view's groups: the underlying message itself for a single-topic view, or
for a join one joined row, a mapping from each topic's alias (``"0"``, ``"1"``, ...) to that
topic's message (absent when the outer join extended it with NULLs). Qualified identifiers such
as ``[ORDERS]./Tick``, ``[ORDERS].[/Tick]``, ``[json].[ORDERS]./Tick`` or ``ORDERS./Tick`` are
rewritten to plain paths into that row before the filter parser sees the text; the rewrite keeps
every other character where it was, so parser positions still point into the configured text.

The expression language, the aggregate-call parsing, the slots that feed each output and the
value rules (what is NULL, how group values compare and are spelled) are those of aggregated
queries (``sowstream.sow.aggregate``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from sowstream.filters import FilterError, ast, compile_predicate, compile_value, parse_filter
from sowstream.filters.parser import mask_strings
from sowstream.filters.values import get_path, is_null, path_steps
from sowstream.sow.aggregate import (
    AGGREGATE_FUNCTIONS,
    PROJECTION_FUNCTIONS,
    Accumulator,
    AggregationError,
    ProjectionLayout,
    accumulator,
    component_text,
    field_value,
    group_component,
    parse_grouping_field,
    parse_projection_field,
)

__all__ = [
    "VIEW_AGGREGATE_FUNCTIONS",
    "FieldRef",
    "JoinCondition",
    "TopicRef",
    "ViewDefinitionError",
    "ViewProjection",
    "compile_projection",
    "parse_join",
    "parse_topic_ref",
]

# A view takes what an aggregated query takes (sowstream.sow.aggregate): every aggregate, and IF
# and CRC32 of the functions otherwise kept for Preprocessing and Enrichment.
VIEW_FUNCTIONS = PROJECTION_FUNCTIONS
VIEW_AGGREGATE_FUNCTIONS: tuple[str, ...] = AGGREGATE_FUNCTIONS

Row = Mapping[str, Any]
ValueFn = Callable[[Row], Any]


class ViewDefinitionError(ValueError):
    """A view element that cannot be used: ``element`` names it (``Projection/Field[2]``)."""

    def __init__(self, element: str, problem: str) -> None:
        super().__init__(f"{element}: {problem}")
        self.element = element
        self.problem = problem


# ---------------------------------------------------------------------------- topic references


@dataclass(frozen=True, slots=True)
class TopicRef:
    """An underlying topic as written: ``ORDERS``, ``[ORDERS]`` or ``[json].[ORDERS]``."""

    topic: str
    message_type: str | None = None

    def __str__(self) -> str:
        if self.message_type:
            return f"[{self.message_type}].[{self.topic}]"
        return self.topic


@dataclass(frozen=True, slots=True)
class FieldRef:
    """A qualified field: a topic and a path in its messages."""

    topic: TopicRef
    path: str

    def __str__(self) -> str:
        return f"[{self.topic.topic}].{self.path}"


@dataclass(frozen=True, slots=True)
class JoinCondition:
    """One ``Join``: ``left.path = right.path``, compared as strings."""

    left: FieldRef
    right: FieldRef
    text: str


_SEGMENT = r"\[(?P<{name}>[^\[\]]+)\]"
_PATH = r"/[\w.$@-]+(?:/[\w.$@-]+)*"
_TOPIC_REF = re.compile(
    rf"\s*(?:{_SEGMENT.format(name='t1')}\s*\.\s*)?{_SEGMENT.format(name='t2')}\s*\Z"
    rf"|\s*(?P<plain>[^\s\[\]]+)\s*\Z"
)
# A qualified identifier: one or two bracketed qualifiers, then `./path` or `.[/path]`.
_QUALIFIED = re.compile(
    rf"(?:{_SEGMENT.format(name='q1')}\.)?{_SEGMENT.format(name='q2')}\."
    rf"(?:\[(?P<bpath>{_PATH})\]|(?P<path>{_PATH}))"
)
# The unbracketed form `ORDERS./Tick`; taken as qualified only when ORDERS is an underlying topic.
_BARE_QUALIFIED = re.compile(rf"(?<![\w.$@/\]-])(?P<topic>[A-Za-z_][\w-]*)\.(?P<path>{_PATH})")


def parse_topic_ref(text: str) -> TopicRef:
    """``ORDERS``, ``[ORDERS]`` or ``[json].[ORDERS]`` as a TopicRef; ValueError otherwise."""
    match = _TOPIC_REF.match(text)
    if not match:
        raise ValueError(
            f"{text!r} is not a topic name (write ORDERS, [ORDERS] or [json].[ORDERS])"
        )
    if match["plain"]:
        return TopicRef(match["plain"])
    return TopicRef(match["t2"].strip(), (match["t1"] or "").strip().lower() or None)


def parse_join(text: str) -> JoinCondition:
    """One Join element, ``[A]./x = [B]./y``; ValueError naming the problem otherwise."""
    if not text or not text.strip():
        raise ValueError("a Join needs a condition like [ORDERS]./Tick = [COMPANIES]./Tick")
    masked, unclosed = mask_strings(text)
    if unclosed is not None:
        raise ValueError(f"Join {text!r}: unterminated string literal at position {unclosed}")
    sides = masked.split("=")
    if len(sides) != 2 or "==" in masked or not sides[0].strip() or not sides[1].strip():
        raise ValueError(
            f"Join {text.strip()!r} must be one equality between two qualified fields, "
            "like [ORDERS]./Tick = [COMPANIES]./Tick"
        )
    at = len(sides[0]) + 1
    refs = [_field_ref(text[: len(sides[0])], 0, text), _field_ref(text[at:], at, text)]
    if refs[0].topic.topic == refs[1].topic.topic:
        raise ValueError(
            f"Join {text.strip()!r} relates topic {refs[0].topic.topic!r} to itself; a Join "
            "relates two different topics"
        )
    return JoinCondition(refs[0], refs[1], text.strip())


def _field_ref(side: str, offset: int, text: str) -> FieldRef:
    match = _QUALIFIED.fullmatch(side.strip())
    if match is None:
        lead = len(side) - len(side.lstrip())
        raise ValueError(
            f"Join {text.strip()!r}: {side.strip()!r} (position {offset + lead}) is not a "
            "qualified field such as [ORDERS]./Tick or [ORDERS].[/Tick]"
        )
    topic = TopicRef(match["q2"].strip(), (match["q1"] or "").strip().lower() or None)
    return FieldRef(topic, match["bpath"] or match["path"])


# ---------------------------------------------------------------------------- rewriting


@dataclass(frozen=True, slots=True)
class _Rewritten:
    text: str
    qualified: frozenset[int]  # positions of the paths that came from qualified identifiers
    bare_output: dict[int, str]  # position -> the field path a qualified identifier named


class _Resolver:
    """Maps a view's topic references to row aliases and rewrites expression text."""

    def __init__(self, topics: Sequence[TopicRef]) -> None:
        self.topics = tuple(topics)
        self.joined = len(self.topics) > 1

    def alias(self, ref: TopicRef, element: str) -> int:
        for index, topic in enumerate(self.topics):
            if topic.topic == ref.topic and (
                ref.message_type is None
                or topic.message_type is None
                or topic.message_type == ref.message_type
            ):
                return index
        names = ", ".join(str(t) for t in self.topics)
        raise ViewDefinitionError(
            element,
            f"topic {str(ref)!r} is not an underlying topic of this view (its underlying "
            f"topics: {names})",
        )

    def rewrite(self, text: str, element: str) -> _Rewritten:
        masked, _ = mask_strings(text)
        out = list(text)
        qualified: set[int] = set()
        bare: dict[int, str] = {}
        names = {t.topic for t in self.topics}

        def replace(start: int, end: int, ref: TopicRef, path: str) -> None:
            alias = self.alias(ref, f"{element}, position {start}")
            new = f"/{alias}{path}" if self.joined else path
            if len(new) > end - start:
                raise ViewDefinitionError(
                    f"{element}, position {start}",
                    f"write {text[start:end]!r} with brackets, like [{ref.topic}]./field",
                )
            out[start:end] = list(new.ljust(end - start))
            qualified.add(start)
            bare[start] = path

        taken: list[tuple[int, int]] = []
        for m in _QUALIFIED.finditer(masked):
            ref = TopicRef(m["q2"].strip(), (m["q1"] or "").strip().lower() or None)
            replace(m.start(), m.end(), ref, text[m.start("bpath") : m.end("bpath")] or m["path"])
            taken.append((m.start(), m.end()))
        for m in _BARE_QUALIFIED.finditer(masked):
            if m["topic"] in names and not any(s <= m.start() < e for s, e in taken):
                replace(m.start(), m.end(), TopicRef(m["topic"]), m["path"])
        return _Rewritten("".join(out), frozenset(qualified), bare)

    def check_unqualified(self, tree: ast.Expr, rewritten: _Rewritten, element: str) -> None:
        """Refuse, in a join view, a path that names no topic (aggregate arguments excluded)."""
        if not self.joined:
            return
        for node in ast.walk_outside_aggregates(tree):
            if isinstance(node, ast.Path) and node.pos not in rewritten.qualified:
                names = ", ".join(str(t) for t in self.topics)
                raise ViewDefinitionError(
                    f"{element}, position {node.pos}",
                    f"{node.text} does not say which topic it reads: in a view over several "
                    f"topics ({names}) qualify it, like [{self.topics[0].topic}].{node.text}",
                )


# ---------------------------------------------------------------------------- the projection


@dataclass(frozen=True, slots=True)
class Aggregate:
    """One distinct aggregate call of the projection: its function and per-row input."""

    name: str
    text: str
    arg: ValueFn
    accumulator: Accumulator


class ViewProjection:
    """A view's compiled Projection, Grouping and Filter (immutable, safe to share).

    ``grouping`` holds the grouping fields' paths into a row, ``aggregates`` the distinct
    aggregate calls, ``loose`` the paths read outside aggregates that are not grouping fields
    (they take the group's last processed row), ``outputs`` the view's field paths.
    """

    def __init__(
        self,
        topics: Sequence[TopicRef],
        grouping: Sequence[str],
        entries: Sequence[tuple[str, ast.ProjectionField]],
        filter_fn: Callable[[Row], bool] | None,
    ) -> None:
        self.topics = tuple(topics)
        self.joined = len(self.topics) > 1
        self.grouping = tuple(grouping)
        self._group_steps = tuple(path_steps(p) for p in self.grouping)
        self._filter = filter_fn
        layout = ProjectionLayout(self.grouping, entries)
        self._layout = layout
        self.aggregates: tuple[Aggregate, ...] = tuple(
            Aggregate(call.name, text, compile_value(call.arg), accumulator(call))
            for call, text in zip(layout.calls, layout.call_texts, strict=True)
        )
        self.loose: tuple[str, ...] = layout.loose
        self._loose_steps = tuple(path_steps(p) for p in layout.loose)
        self.outputs: tuple[str, ...] = tuple(o.path for o in layout.outputs)
        # The view fields that show grouping fields, in Grouping order: what names a view
        # record in a delta (send_keys).
        shown = {o.index: o.path for o in layout.outputs if o.kind == "group"}
        self.shown_grouping: tuple[str, ...] = tuple(shown[i] for i in sorted(shown))
        # The same when every grouping field is shown (the automatic hash index), else None.
        self.grouping_outputs: tuple[str, ...] | None = (
            self.shown_grouping if len(shown) == len(self.grouping) else None
        )

    def __repr__(self) -> str:
        return f"ViewProjection(grouping={self.grouping!r}, outputs={self.outputs!r})"

    # ---- per row

    def matches(self, row: Row) -> bool:
        """Whether the row passes the view's Filter (always, without one)."""
        return self._filter is None or self._filter(row)

    def group_values(self, row: Row) -> list[Any]:
        """The row's value of each grouping field (None for NULL, a list when several)."""
        return [field_value(get_path(row, steps)) for steps in self._group_steps]

    def loose_values(self, row: Row) -> list[Any]:
        """The row's value of each non-grouped field read outside aggregates."""
        return [field_value(get_path(row, steps)) for steps in self._loose_steps]

    def inputs(self, row: Row) -> list[list[Any]]:
        """Per aggregate, the non-NULL values this row contributes (several through arrays)."""
        out: list[list[Any]] = []
        for agg in self.aggregates:
            value = agg.arg(row)
            if isinstance(value, tuple):
                out.append([v for v in value if not is_null(v)])
            else:
                out.append([] if is_null(value) else [value])
        return out

    # ---- per group

    def assemble(
        self, group_values: Sequence[Any], results: Sequence[Any], loose: Sequence[Any]
    ) -> dict[str, Any]:
        """The view record: each output in projection order; NULL values are left out."""
        return self._layout.record(group_values, results, loose)


def group_key(values: Sequence[Any]) -> str:
    """The text that identifies a group: equal canonical texts group together, NULL by itself."""
    return orjson.dumps([group_component(v) for v in values]).decode()


def key_texts(values: Sequence[Any]) -> list[str]:
    """The grouping values as SowKey parts: canonical text ("" for NULL, JSON for several)."""
    return [component_text(group_component(v)) for v in values]


def compile_projection(
    topics: Sequence[TopicRef],
    projection: Sequence[str],
    grouping: Sequence[str],
    filter_text: str | None = None,
) -> ViewProjection:
    """Compile a view's fields; ViewDefinitionError names the element, position and problem.

    ``topics`` are the underlying topics (one, or the joined ones in alias order).
    """
    if not projection:
        raise ViewDefinitionError("Projection", "a view needs at least one Projection Field")
    if not grouping:
        raise ViewDefinitionError("Grouping", "a view needs at least one Grouping Field")
    resolver = _Resolver(topics)
    paths: list[str] = []
    for number, text in enumerate(grouping, 1):
        element = f"Grouping/Field[{number}]"
        rewritten = resolver.rewrite(text, element)
        try:
            path = parse_grouping_field(rewritten.text)
        except AggregationError as exc:
            raise ViewDefinitionError(f"{element}, position {exc.position}", exc.problem) from None
        lead = len(rewritten.text) - len(rewritten.text.lstrip())
        resolver.check_unqualified(ast.Path(path, pos=lead), rewritten, element)
        if path in paths:
            raise ViewDefinitionError(element, f"{text.strip()} is already a Grouping Field")
        paths.append(path)

    entries: list[tuple[str, ast.ProjectionField]] = []
    for number, text in enumerate(projection, 1):
        element = f"Projection/Field[{number}]"
        rewritten = resolver.rewrite(text, element)
        try:
            entry = parse_projection_field(
                rewritten.text, aggregates=VIEW_AGGREGATE_FUNCTIONS, functions=VIEW_FUNCTIONS
            )
        except AggregationError as exc:
            raise ViewDefinitionError(f"{element}, position {exc.position}", exc.problem) from None
        resolver.check_unqualified(entry.expr, rewritten, element)
        for call in entry.calls.values():
            resolver.check_unqualified(call.arg, rewritten, element)
        output = entry.output
        if entry.output_at in rewritten.bare_output:  # a bare qualified field keeps its path
            output = rewritten.bare_output[entry.output_at]
        steps = path_steps(output)
        for other, _ in entries:
            other_steps = path_steps(other)
            shorter = min(len(steps), len(other_steps))
            if steps[:shorter] == other_steps[:shorter]:
                same = steps == other_steps
                raise ViewDefinitionError(
                    element,
                    f"output path {output} "
                    + ("is already produced" if same else f"clashes with {other}")
                    + " by an earlier Field"
                    + ("" if same else ": one would hold the other"),
                )
        entries.append((output, entry))

    filter_fn: Callable[[Row], bool] | None = None
    if filter_text is not None:
        rewritten = resolver.rewrite(filter_text, "Filter")
        try:
            tree = parse_filter(rewritten.text, functions=VIEW_FUNCTIONS)
        except FilterError as exc:
            raise ViewDefinitionError(f"Filter, position {exc.position}", exc.reason) from None
        predicate = compile_predicate(tree)

        def filter_fn(row: Row) -> bool:
            return predicate(row) is True

    return ViewProjection(topics, paths, entries, filter_fn)
