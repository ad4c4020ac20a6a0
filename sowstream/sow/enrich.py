"""Preprocessing and Enrichment: the Field directives that rewrite a message on a SOW topic.

A stage is a list of fields, each ``expression AS /target [HINT hint[, hint]]`` in the filter
language (plus ``IF``, ``CRC32``, ``UNIX_TIMESTAMP()``, ``AMPS_INSTANCE_NAME()`` and, in
Enrichment, ``/path OF PREVIOUS``). *Preprocessing* runs on the message as published, before
its SowKey is computed, so it may build key fields. *Enrichment* runs once the key is known, on
the incoming message (for a delta_publish, the delta, merged afterwards), and reads the record
stored under the key with ``OF PREVIOUS``. docs/enrichment.md has the rules for users.

Every function here is pure, and a stage gives the same result for the same log record wherever
it runs: ``UNIX_TIMESTAMP()`` is the record's log time (set by the broker when it took the
publish), not the clock of whoever evaluates it. That is what lets the engine, a replay and
the Spark rebuild agree (sowstream.sow.ops applies the stages for all three).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sowstream.filters import ast, compile_value
from sowstream.filters.evaluate import StageInput
from sowstream.filters.values import is_null
from sowstream.sow.aggregate import (
    AGGREGATE_FUNCTIONS,
    AggregationError,
    mask_strings,
    parse_projection_field,
)

__all__ = [
    "ENRICHMENT",
    "PREPROCESSING",
    "FieldDirective",
    "Stage",
    "StageError",
    "StageFailure",
    "TopicStages",
    "compile_stage",
]

PREPROCESSING = "Preprocessing"
ENRICHMENT = "Enrichment"
HINTS = ("OPTIONAL", "SET_CURRENT")

# Every aggregate, so that each gets "not allowed here" rather than "unknown function".
_AGGREGATES = AGGREGATE_FUNCTIONS
_NONDETERMINISTIC = frozenset({"UNIX_TIMESTAMP"})
# HINT as a word, not inside a path such as /hint.
_HINT = re.compile(r"(?<![\w.$@/-])hint(?![\w.$@-])", re.I)

ValueFn = Callable[[Mapping[str, Any]], Any]


class StageError(ValueError):
    """A Preprocessing or Enrichment field that cannot be used; ``element`` names it
    (``Enrichment/Field[2]``) and ``problem`` says why."""

    def __init__(self, element: str, problem: str) -> None:
        super().__init__(f"{element}: {problem}")
        self.element = element
        self.problem = problem


class StageFailure(ValueError):
    """A field that could not be applied to one message: that message is rejected."""

    def __init__(self, field: FieldDirective, problem: str) -> None:
        super().__init__(f"{field.element} {field.text!r}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True, slots=True)
class FieldDirective:
    """One compiled ``expression AS /target`` with its hints."""

    element: str
    text: str
    target: str
    steps: tuple[str, ...]
    value: ValueFn
    optional: bool
    set_current: bool
    reads_previous: bool


@dataclass(frozen=True, slots=True)
class Stage:
    """A compiled Preprocessing or Enrichment element (immutable, safe to share)."""

    kind: str
    fields: tuple[FieldDirective, ...]
    instance_name: str

    @property
    def reads_previous(self) -> bool:
        """Whether a field reads the stored record (``OF PREVIOUS``)."""
        return any(f.reads_previous for f in self.fields)

    def apply(
        self,
        message: dict[str, Any],
        previous: Mapping[str, Any] | None,
        timestamp_ms: int,
    ) -> dict[str, Any]:
        """The message after every field; ``message`` is left as it was.

        Fields read the message as it entered the stage, except what a ``SET_CURRENT`` field
        before them wrote; the others' results are written at the end, in field order.
        Raises StageFailure naming the field that could not be applied.
        """
        view = message
        pending: list[tuple[FieldDirective, Any]] = []
        for field in self.fields:
            try:
                value = field.value(StageInput(view, previous, timestamp_ms, self.instance_name))
            except Exception as exc:  # one odd message must not stop the partition
                raise StageFailure(field, f"{type(exc).__name__}: {exc}") from exc
            if field.set_current:
                view = _written(view, field, value)
            else:
                pending.append((field, value))
        for field, value in pending:
            view = _written(view, field, value)
        return view


@dataclass(frozen=True, slots=True)
class TopicStages:
    """A topic's two stages (None where the topic has none)."""

    preprocessing: Stage | None = None
    enrichment: Stage | None = None


NO_STAGES = TopicStages()


def compile_stage(
    kind: str,
    texts: Iterable[str],
    *,
    instance_name: str = "sowstream",
    key_fields: Iterable[str] = (),
) -> Stage:
    """Compile a ``Preprocessing`` or ``Enrichment`` element's Field texts.

    ``key_fields`` are the topic's Key paths, which Enrichment may not write (the key is fixed
    before it runs). StageError names the field and the problem.
    """
    fields = tuple(_compile_field(kind, n, text) for n, text in enumerate(texts, 1))
    if not fields:
        raise StageError(kind, f"{kind} needs at least one Field, like <Field>/a AS /b</Field>")
    if kind == ENRICHMENT:
        for field in fields:
            for key in key_fields:
                key_steps = tuple(key[1:].split("/"))
                shorter = min(len(key_steps), len(field.steps))
                if key_steps[:shorter] == field.steps[:shorter]:
                    raise StageError(
                        field.element,
                        f"writes {field.target}, which holds the Key field {key}: the SowKey is "
                        "computed before Enrichment runs, so key fields can only be set in "
                        "Preprocessing",
                    )
    return Stage(kind, fields, instance_name)


def _compile_field(kind: str, number: int, text: object) -> FieldDirective:
    element = f"{kind}/Field[{number}]"
    if not isinstance(text, str) or not text.strip():
        raise StageError(element, f"a Field must be text like '/a * 2 AS /b', got {text!r}")
    expression, hints = _split_hint(text, element)
    try:
        entry = parse_projection_field(expression, aggregates=_AGGREGATES, stage=True)
    except AggregationError as exc:
        raise StageError(element, f"position {exc.position}: {_problem(exc.problem)}") from None
    for call in entry.calls.values():
        raise StageError(
            element,
            f"aggregate function {call.name} cannot be used in {kind}: a Field computes a value "
            "from one message (aggregates belong in views)",
        )
    expr = entry.expr
    if isinstance(expr, ast.Path) and entry.output_at == expr.pos:
        raise StageError(
            element, f"{text.strip()!r} names no target: write it like '{text.strip()} AS /b'"
        )
    nodes = list(ast.walk(expr))
    reads_previous = any(isinstance(n, ast.Previous) for n in nodes)
    if kind == PREPROCESSING:
        if reads_previous:
            raise StageError(
                element,
                "OF PREVIOUS cannot be used in Preprocessing: the record's SowKey, and so its "
                "stored state, is not known yet (use it in Enrichment)",
            )
        for n in nodes:
            if isinstance(n, ast.Func) and n.name in _NONDETERMINISTIC:
                raise StageError(
                    element,
                    f"{n.name}() cannot be used in Preprocessing: publishers compute the "
                    "SowKey from the preprocessed message to choose its partition, so "
                    "Preprocessing must give the same result wherever it runs (use it in "
                    "Enrichment)",
                )
    return FieldDirective(
        element=element,
        text=" ".join(text.split()),
        target=entry.output,
        steps=tuple(entry.output[1:].split("/")),
        value=compile_value(expr),
        optional="OPTIONAL" in hints,
        set_current="SET_CURRENT" in hints,
        reads_previous=reads_previous,
    )


def _split_hint(text: str, element: str) -> tuple[str, frozenset[str]]:
    """The field's text before ``HINT`` and the hints named after it."""
    masked, _ = mask_strings(text)
    found = [
        m
        for m in _HINT.finditer(masked)
        if masked[: m.start()].count("(") == masked[: m.start()].count(")")
    ]
    if not found:
        return text, frozenset()
    if len(found) > 1:
        raise StageError(element, "a Field takes one HINT clause, like HINT SET_CURRENT, OPTIONAL")
    at = found[0]
    names = [part.strip().upper() for part in text[at.end() :].split(",")]
    if names == [""]:
        raise StageError(element, f"HINT needs a hint: {' or '.join(HINTS)}")
    for name in names:
        if name not in HINTS:
            raise StageError(
                element,
                f"unknown hint {name or '(empty)'!r} at position {at.end()}: the hints are "
                f"{', '.join(HINTS)}",
            )
    return text[: at.start()], frozenset(names)


def _problem(problem: str) -> str:
    """The parser's complaint, with the functions of these fields listed where it helps."""
    if problem.startswith("unknown function"):
        head = problem.split(": the aggregate functions")[0]
        names = sorted({*ast.FUNCTIONS, *ast.STAGE_FUNCTIONS})
        return f"{head}: the functions are {', '.join(names)}"
    return problem


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


def _written(message: dict[str, Any], field: FieldDirective, value: Any) -> dict[str, Any]:
    """``message`` with ``value`` at the field's target (copied along the path, never changed in
    place); a NULL under ``HINT OPTIONAL`` removes the target instead."""
    if isinstance(value, tuple):  # several values read through arrays
        value = [v for v in value if not is_null(v)] or None
    steps = field.steps
    remove = field.optional and is_null(value)
    if remove:
        node: Any = message
        for step in steps[:-1]:
            node = node.get(step) if isinstance(node, dict) else None
        if not isinstance(node, dict) or steps[-1] not in node:
            return message  # nothing to remove
    out = dict(message)
    node = out
    for depth, step in enumerate(steps[:-1], 1):
        child = node.get(step)
        if child is None:
            child = {}
        elif isinstance(child, dict):
            child = dict(child)
        else:
            raise StageFailure(
                field,
                f"cannot write {field.target}: /{'/'.join(steps[:depth])} holds {_kind(child)}, "
                "not an object",
            )
        node[step] = child
        node = child
    if remove:
        del node[steps[-1]]
    else:
        node[steps[-1]] = value
    return out
