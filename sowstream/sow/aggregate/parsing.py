"""The ``grouping=[...]`` and ``projection=[...]`` options of an aggregated query, as text.

The brackets and the commas between entries belong to the option and are scanned here (outside
string literals); each projection entry is a projection field of the filter grammar
(``sowstream.filters.parser.parse_projection_field``) and each grouping entry a field path.
Every problem is an :class:`AggregationError` naming the option and the position.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from sowstream.errors import InvalidCommandError
from sowstream.filters import FilterError, ast, parse_filter
from sowstream.filters.parser import mask_strings
from sowstream.filters.parser import parse_projection_field as parse_field
from sowstream.filters.values import path_steps

from .accumulators import AGGREGATE_FUNCTIONS

__all__ = [
    "PROJECTION_FUNCTIONS",
    "AggregationError",
    "parse_grouping",
    "parse_grouping_field",
    "parse_projection",
    "parse_projection_field",
]


# Functions otherwise kept for Preprocessing and Enrichment that a projection (an aggregated
# query or subscription, a view) may use: they give the same result on every worker and every
# replay (UNIX_TIMESTAMP and AMPS_INSTANCE_NAME do not).
PROJECTION_FUNCTIONS = frozenset({"IF", "CRC32"})


class AggregationError(InvalidCommandError):
    """A ``grouping`` or ``projection`` option that cannot be used, with where and why.

    ``option`` is ``"grouping"`` or ``"projection"``; ``position`` is the 0-based character offset
    of the problem in that option's text (plus the offset the caller passed in).
    """

    def __init__(self, option: str, position: int, problem: str) -> None:
        super().__init__(f"{option} error at position {position}: {problem}")
        self.option = option
        self.position = position
        self.problem = problem


@dataclass(frozen=True, slots=True)
class _Source:
    """One option's text as the scanners see it, and how to report a problem in it."""

    option: str
    text: str
    masked: str
    offset: int

    def error(self, position: int, problem: str) -> AggregationError:
        """An error at ``position`` in ``text``."""
        return AggregationError(self.option, self.offset + position, problem)

    def fragment(self, start: int, end: int) -> str:
        piece = self.text[start:end].strip()
        return piece if len(piece) <= 40 else piece[:37] + "..."

    def field(
        self,
        start: int,
        end: int,
        aggregates: Sequence[str] = AGGREGATE_FUNCTIONS,
        stage: bool = False,
        functions: Collection[str] = PROJECTION_FUNCTIONS,
    ) -> ast.ProjectionField:
        """The projection field ``text[start:end]``; its positions include ``offset``."""
        padded = " " * (self.offset + start) + self.text[start:end]
        try:
            return parse_field(padded, aggregates=aggregates, stage=stage, functions=functions)
        except FilterError as exc:
            raise AggregationError(self.option, exc.position, exc.reason) from None


def _source(option: str, text: str, offset: int) -> _Source:
    # Tolerate the whole `option=[...]` item as well as just its value.
    prefix = re.match(rf"\s*{option}\s*=", text, re.I)
    if prefix:
        text = " " * prefix.end() + text[prefix.end() :]
    masked, unclosed = mask_strings(text)
    src = _Source(option, text, masked, offset)
    if unclosed is not None:
        raise src.error(unclosed, "unterminated string literal")
    return src


def _list_entries(src: _Source) -> list[tuple[int, int]]:
    """The (start, end) spans of the bracketed list's comma-separated entries, trimmed."""
    masked = src.masked
    first = len(masked) - len(masked.lstrip())
    end = len(masked.rstrip())
    example = f"{src.option}=[/field]" if src.option == "grouping" else "projection=[/a, ...]"
    if not masked.strip():
        raise src.error(first, f"{src.option} needs a bracketed list like {example}")
    if masked[first] != "[":
        raise src.error(first, f"the {src.option} list must start with '[', like {example}")
    if masked[end - 1] != "]" or end - 1 == first:
        closing = masked.find("]", first + 1)
        if closing != -1:
            after = closing + 1 + len(masked[closing + 1 :]) - len(masked[closing + 1 :].lstrip())
            raise src.error(
                after, f"unexpected text after the closing ']' of the {src.option} list"
            )
        raise src.error(end, f"the {src.option} list has no closing ']'")
    spans: list[tuple[int, int]] = []
    depth = 0
    start = first + 1
    for i in range(first + 1, end - 1):
        ch = masked[i]
        if ch == "[":
            raise src.error(i, f"unexpected '[' inside the {src.option} list (lists do not nest)")
        if ch == "]":
            raise src.error(i, f"unexpected ']' before the end of the {src.option} list")
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)  # a stray ')' is left for the parser to point at
        elif ch == "," and depth == 0:
            spans.append((start, i))
            start = i + 1
    spans.append((start, end - 1))
    if len(spans) == 1 and not masked[spans[0][0] : spans[0][1]].strip():
        raise src.error(first, f"the {src.option} list is empty: give at least one entry")
    trimmed: list[tuple[int, int]] = []
    for s, e in spans:
        piece = masked[s:e]
        if not piece.strip():
            raise src.error(e if e < end - 1 else s, f"empty entry in the {src.option} list")
        trimmed.append((s + len(piece) - len(piece.lstrip()), s + len(piece.rstrip())))
    return trimmed


def _grouping_path(src: _Source, start: int, end: int) -> str:
    try:
        node: ast.Expr | None = parse_filter(" " * start + src.text[start:end])
    except FilterError:
        node = None
    if not isinstance(node, ast.Path):
        raise src.error(
            start, f"grouping lists field paths such as /region, not {src.fragment(start, end)!r}"
        )
    return node.text


def parse_grouping(text: str, offset: int = 0) -> list[str]:
    """The field paths of a ``grouping`` option value (``[/a, ...]``), each listed once."""
    src = _source("grouping", text, offset)
    paths: list[str] = []
    for start, end in _list_entries(src):
        path = _grouping_path(src, start, end)
        if path in paths:
            raise src.error(start, f"{path} is listed twice in grouping")
        paths.append(path)
    return paths


def parse_projection(text: str, offset: int = 0) -> list[ast.ProjectionField]:
    """The fields of a ``projection`` option value (``[/a, SUM(/b) AS /s]``).

    Positions in the fields are offsets in ``text`` plus ``offset``; no two fields may write
    the same output path or one inside another.
    """
    src = _source("projection", text, offset)
    fields: list[ast.ProjectionField] = []
    for start, end in _list_entries(src):
        field = src.field(start, end)
        steps = path_steps(field.output)
        for other in fields:
            other_steps = path_steps(other.output)
            shorter = min(len(steps), len(other_steps))
            if steps == other_steps:
                raise AggregationError(
                    "projection",
                    field.output_at,
                    f"output path {field.output} is already produced (at position "
                    f"{other.output_at})",
                )
            if steps[:shorter] == other_steps[:shorter]:
                raise AggregationError(
                    "projection",
                    field.output_at,
                    f"output path {field.output} clashes with {other.output} (at position "
                    f"{other.output_at}): one would hold the other",
                )
        fields.append(field)
    return fields


def parse_projection_field(
    text: str,
    *,
    aggregates: Sequence[str] = AGGREGATE_FUNCTIONS,
    stage: bool = False,
    functions: Collection[str] = (),
) -> ast.ProjectionField:
    """Parse one projection entry (``SUM(/qty) AS /total``), without the surrounding list.

    ``aggregates`` names the functions read as aggregate calls (views accept more than queries);
    ``stage`` reads a Preprocessing or Enrichment field (``parse_filter``'s ``stage``),
    ``functions`` admits some stage-only functions (``parse_filter``'s ``functions``).
    Raises :class:`AggregationError` with the 0-based position in ``text``.
    """
    src = _source("projection", text, 0)
    return src.field(0, len(src.text), aggregates, stage, functions)


def parse_grouping_field(text: str) -> str:
    """The field path of one grouping entry (``/region``); AggregationError if it is not one."""
    src = _source("grouping", text, 0)
    start = len(text) - len(text.lstrip())
    try:
        node: ast.Expr | None = parse_filter(text)
    except FilterError:
        node = None
    if not isinstance(node, ast.Path):
        raise src.error(
            start, f"grouping lists field paths such as /region, not {src.fragment(0, len(text))!r}"
        )
    return node.text
