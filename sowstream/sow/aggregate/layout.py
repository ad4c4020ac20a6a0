"""How a projection's fields are computed from a group: aggregate slots, grouping values and
loose paths, and the record built from them. Aggregated queries and views share it, so that the
same projection gives the same records in both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sowstream.filters import ast, compile_value
from sowstream.filters.values import is_null, path_steps

__all__ = ["Output", "ProjectionLayout", "ValueFn", "rewrite_expr", "set_output_path"]

ValueFn = Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True, slots=True)
class Output:
    """How one projection field's value is produced from a finished group."""

    path: str
    steps: tuple[str, ...]
    kind: Literal["aggregate", "group", "loose", "expr"]  # the first three index their list
    index: int
    fn: ValueFn | None  # for "expr": evaluated over the group's flat record (see record)


def rewrite_expr(node: ast.Expr, replace: Callable[[ast.Expr], ast.Expr | None]) -> ast.Expr:
    """A copy of ``node`` with the nodes for which ``replace`` returns a node replaced."""
    new = replace(node)
    if new is not None:
        return new
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if isinstance(value, ast.Expr):
            changes[f.name] = rewrite_expr(value, replace)
        elif isinstance(value, tuple) and any(isinstance(v, ast.Expr) for v in value):
            changes[f.name] = tuple(
                rewrite_expr(v, replace) if isinstance(v, ast.Expr) else v for v in value
            )
    return dataclasses.replace(node, **changes) if changes else node


def set_output_path(record: dict[str, Any], steps: tuple[str, ...], value: Any) -> None:
    """Put ``value`` at the path ``steps`` of ``record``, making the objects on the way."""
    for step in steps[:-1]:
        record = record.setdefault(step, {})
    record[steps[-1]] = value


class ProjectionLayout:
    """A projection's fields over a grouping, as slots of the group's values (immutable).

    ``calls`` are the distinct aggregate calls in first-use order (equal calls in several fields
    share one slot) and ``call_texts`` each as first written; ``loose`` the paths read outside
    aggregates that are not grouping fields, in first-use order; ``outputs`` one per field.
    """

    __slots__ = ("call_texts", "calls", "loose", "outputs")

    def __init__(
        self, grouping: Sequence[str], fields: Sequence[tuple[str, ast.ProjectionField]]
    ) -> None:
        """``fields`` pairs each parsed field with its output path (views may rename it)."""
        group_index = {p: i for i, p in enumerate(grouping)}
        calls: list[ast.Aggregate] = []
        texts: list[str] = []
        loose: list[str] = []
        outputs: list[Output] = []
        for output, field in fields:

            def slot(node: ast.Expr, field: ast.ProjectionField = field) -> ast.Expr | None:
                # The field's expression reads a flat record of the group's values: a<slot>
                # for aggregates, g<i> for grouping fields, r<j> for the other paths.
                if isinstance(node, ast.Aggregate):
                    if node not in calls:
                        calls.append(node)
                        texts.append(field.call_text(node))
                    return ast.Path(f"/a{calls.index(node)}")
                if not isinstance(node, ast.Path):
                    return None
                if node.text in group_index:
                    return ast.Path(f"/g{group_index[node.text]}")
                if node.text not in loose:
                    loose.append(node.text)
                return ast.Path(f"/r{loose.index(node.text)}")

            flat = rewrite_expr(field.expr, slot)
            steps = path_steps(output)
            if isinstance(flat, ast.Path):  # a plain reference needs no evaluation
                kind = _KINDS[flat.text[1]]
                outputs.append(Output(output, steps, kind, int(flat.text[2:]), None))
            else:
                outputs.append(Output(output, steps, "expr", -1, compile_value(flat)))
        self.calls: tuple[ast.Aggregate, ...] = tuple(calls)
        self.call_texts: tuple[str, ...] = tuple(texts)
        self.loose: tuple[str, ...] = tuple(loose)
        self.outputs: tuple[Output, ...] = tuple(outputs)

    def record(
        self, group_values: Sequence[Any], results: Sequence[Any], loose: Sequence[Any]
    ) -> dict[str, Any]:
        """One group's output record, fields in projection order; NULL values are left out.

        ``results`` holds one value per call, ``loose`` one per loose path.
        """
        record: dict[str, Any] = {}
        flat: dict[str, Any] | None = None
        for out in self.outputs:
            if out.kind == "aggregate":
                value = results[out.index]
            elif out.kind == "group":
                value = group_values[out.index]
            elif out.kind == "loose":
                value = loose[out.index]
            else:
                if flat is None:
                    flat = {f"a{i}": v for i, v in enumerate(results)}
                    flat.update((f"g{i}", v) for i, v in enumerate(group_values))
                    flat.update((f"r{i}", v) for i, v in enumerate(loose))
                assert out.fn is not None
                value = out.fn(flat)
                if isinstance(value, tuple):  # multi-valued result
                    value = [v for v in value if not is_null(v)] or None
            if not is_null(value):
                set_output_path(record, out.steps, value)
        return record


_KINDS: dict[str, Literal["aggregate", "group", "loose"]] = {
    "a": "aggregate",
    "g": "group",
    "r": "loose",
}
