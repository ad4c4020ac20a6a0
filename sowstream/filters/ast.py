"""The syntax tree of a content filter: the one description every backend compiles from.

Nodes are frozen dataclasses holding only plain data (no callables), so the same tree can be
evaluated in Python, turned into Spark Column expressions or printed back as text. Every node
carries ``pos``, the 0-based character offset where its text starts, for error messages; it is
left out of equality and hashing so that trees parsed from differently spaced text compare equal.

Semantics every backend must implement (see docs/filters.md for the user-facing version):

* NULL is a missing field, JSON ``null`` or the empty string; logic is SQL three-valued.
* A ``Path`` that crosses a JSON array is multi-valued; a predicate holds if it holds for ANY
  value (``Between`` tests each value against both bounds). Negated forms (``NOT IN``,
  ``NOT LIKE``, ``IS NOT NULL``, ...) are parsed as ``Not`` around the positive node.
* An expression that is not a predicate, used where a condition is expected, means
  ``expr = TRUE``.

Projection fields (``SUM(/qty) * 2 AS /total``) use the same expressions, plus ``Aggregate``
calls, which no filter holds; ``ProjectionField`` is one parsed field.
"""

from __future__ import annotations

import typing as t
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = [
    "AGGREGATES",
    "FUNCTIONS",
    "STAGE_FUNCTIONS",
    "Aggregate",
    "And",
    "Arith",
    "ArithOp",
    "BeginsWith",
    "Between",
    "Compare",
    "CompareOp",
    "EndsWith",
    "Expr",
    "Func",
    "In",
    "IsNull",
    "Like",
    "Literal",
    "Neg",
    "Not",
    "Or",
    "Path",
    "Previous",
    "ProjectionField",
    "Scalar",
    "children",
    "depth",
    "is_predicate",
    "paths",
    "quote_string",
    "to_text",
    "walk",
    "walk_outside_aggregates",
]

Scalar = str | int | float | bool | None
CompareOp = t.Literal["=", "!=", "<", "<=", ">", ">="]
ArithOp = t.Literal["+", "-", "*", "/", "%"]

# Name -> (minimum, maximum or None for variadic) argument count.
FUNCTIONS: dict[str, tuple[int, int | None]] = {
    "UPPER": (1, 1),
    "LOWER": (1, 1),
    "LENGTH": (1, 1),
    "INSTR": (2, 2),
    "INSTR_I": (2, 2),
    "STREQUAL_I": (2, 2),
    "CONCAT": (1, None),
    "COALESCE": (1, None),
}

# Functions of Preprocessing and Enrichment fields only (sowstream.sow.enrich): the parser
# refuses them in filters, which other backends (Spark columns, indexes) compile too.
STAGE_FUNCTIONS: dict[str, tuple[int, int | None]] = {
    "IF": (3, 3),
    "CRC32": (1, 1),
    "AMPS_INSTANCE_NAME": (0, 0),
    "UNIX_TIMESTAMP": (0, 0),
}

# The aggregate functions the grammar knows (its AGGREGATE terminal). Aggregated queries,
# aggregated subscriptions and views accept them all (sowstream.sow.aggregate); Preprocessing and
# Enrichment none.
AGGREGATES: tuple[str, ...] = (
    "ANY",
    "AVG",
    "COUNT",
    "COUNT_DISTINCT",
    "DISTINCT_LIST",
    "MAX",
    "MIN",
    "STDDEV_POP",
    "STDDEV_SAMP",
    "SUM",
)
# Aggregates that take a second argument, a string literal: DISTINCT_LIST's delimiter.
AGGREGATES_WITH_DELIMITER = frozenset({"DISTINCT_LIST"})


@dataclass(frozen=True, slots=True)
class Expr:
    """Base class of all nodes."""

    pos: int = field(default=-1, compare=False, repr=False, kw_only=True)


@dataclass(frozen=True, slots=True)
class Path(Expr):
    """A field path such as ``/order/qty``; arrays along the way make it multi-valued."""

    text: str

    @property
    def steps(self) -> tuple[str, ...]:
        """The object keys to follow, in order (``/a/b`` -> ``("a", "b")``)."""
        return tuple(self.text[1:].split("/"))


@dataclass(frozen=True, slots=True)
class Previous(Expr):
    """``/path OF PREVIOUS`` (Enrichment only): the path read in the record stored under the
    message's SowKey, NULL when there is none."""

    path: Path


@dataclass(frozen=True, slots=True)
class Literal(Expr):
    """A constant; ``None`` is NULL. An empty string is kept as written but behaves as NULL."""

    value: Scalar


@dataclass(frozen=True, slots=True)
class Compare(Expr):
    """``left op right``; ``==`` and ``<>`` are normalised to ``=`` and ``!=``."""

    op: CompareOp
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class And(Expr):
    """Conjunction of two or more operands (nested ANDs are flattened by the parser)."""

    operands: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Or(Expr):
    """Disjunction of two or more operands (nested ORs are flattened by the parser)."""

    operands: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Not(Expr):
    """Three-valued negation: NOT UNKNOWN is UNKNOWN."""

    operand: Expr


@dataclass(frozen=True, slots=True)
class In(Expr):
    """``value IN (options...)``: true when ``value = option`` for some option."""

    value: Expr
    options: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Between(Expr):
    """``value BETWEEN low AND high``, both bounds inclusive."""

    value: Expr
    low: Expr
    high: Expr


@dataclass(frozen=True, slots=True)
class Like(Expr):
    """``value LIKE 'pattern'``: an unanchored regular-expression search, case-sensitive."""

    value: Expr
    pattern: str


@dataclass(frozen=True, slots=True)
class IsNull(Expr):
    """``value IS NULL``: true when no non-NULL value is present. Never UNKNOWN."""

    value: Expr


@dataclass(frozen=True, slots=True)
class BeginsWith(Expr):
    """``value BEGINS WITH (prefixes...)``: the value's text starts with one of them."""

    value: Expr
    prefixes: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class EndsWith(Expr):
    """``value ENDS WITH (suffixes...)``: the value's text ends with one of them."""

    value: Expr
    suffixes: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Arith(Expr):
    """Binary arithmetic; numeric strings are coerced, anything else non-numeric gives NULL."""

    op: ArithOp
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Neg(Expr):
    """Unary minus of a non-literal (``-5`` is parsed straight to ``Literal(-5)``)."""

    operand: Expr


@dataclass(frozen=True, slots=True)
class Func(Expr):
    """A call of one of ``FUNCTIONS`` (or ``STAGE_FUNCTIONS``); ``name`` is upper case."""

    name: str
    args: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Aggregate(Expr):
    """An aggregate call in a projection field, ``SUM(/qty)``; ``name`` is upper case.

    ``end`` is the offset just past its closing parenthesis (``pos`` is that of its name), so
    ``text[pos:end]`` is the call as written; like ``pos`` it is left out of equality.
    """

    name: str
    arg: Expr
    delimiter: str | None = None  # DISTINCT_LIST's second argument, when given
    end: int = field(default=-1, compare=False, repr=False, kw_only=True)


@dataclass(frozen=True, slots=True)
class ProjectionField:
    """One parsed projection field: ``expr AS /output``, or a lone path that is its own output.

    ``output_at`` is where the output path is written (the field's start without ``AS``);
    ``text`` is the parsed text, which positions index.
    """

    expr: Expr
    output: str
    output_at: int
    text: str

    @property
    def calls(self) -> dict[int, Aggregate]:
        """The aggregate calls of ``expr`` in text order, keyed by their position."""
        return {n.pos: n for n in walk_outside_aggregates(self.expr) if isinstance(n, Aggregate)}

    def call_text(self, call: Aggregate) -> str:
        """``call`` as written, runs of whitespace made one space (``count ( /b )``)."""
        return " ".join(self.text[call.pos : call.end].split())


def children(node: Expr) -> tuple[Expr, ...]:
    """The direct sub-expressions of ``node``, left to right."""
    match node:
        case Path() | Literal():
            return ()
        case Compare(left=left, right=right) | Arith(left=left, right=right):
            return (left, right)
        case And(operands=ops) | Or(operands=ops):
            return ops
        case Not(operand=operand) | Neg(operand=operand):
            return (operand,)
        case Previous(path=path):
            return (path,)
        case In(value=value, options=items) | BeginsWith(value=value, prefixes=items):
            return (value, *items)
        case EndsWith(value=value, suffixes=items):
            return (value, *items)
        case Between(value=value, low=low, high=high):
            return (value, low, high)
        case Like(value=value) | IsNull(value=value):
            return (value,)
        case Func(args=args):
            return args
        case Aggregate(arg=arg):
            return (arg,)
    raise TypeError(f"not a filter expression node: {node!r}")


def walk(node: Expr) -> Iterator[Expr]:
    """Every node of the tree, pre-order; iterative so that deep trees cannot overflow."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(children(current)))


def walk_outside_aggregates(node: Expr) -> Iterator[Expr]:
    """Like ``walk``, but without the arguments of aggregate calls (the calls themselves come)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if not isinstance(current, Aggregate):
            stack.extend(reversed(children(current)))


def paths(node: Expr) -> frozenset[str]:
    """The field paths the expression reads."""
    return frozenset(n.text for n in walk(node) if isinstance(n, Path))


def depth(node: Expr) -> int:
    """The number of nodes on the longest root-to-leaf chain (a lone literal has depth 1)."""
    best = 0
    stack = [(node, 1)]
    while stack:
        current, level = stack.pop()
        best = max(best, level)
        stack.extend((child, level + 1) for child in children(current))
    return best


_PREDICATE_FUNCTIONS = frozenset({"STREQUAL_I"})


def is_predicate(node: Expr) -> bool:
    """Whether ``node`` yields a truth value by itself (else boolean context means ``= TRUE``)."""
    if isinstance(node, Func):
        return node.name in _PREDICATE_FUNCTIONS
    if isinstance(node, Literal):
        return isinstance(node.value, bool)
    return isinstance(
        node, Compare | And | Or | Not | In | Between | Like | IsNull | BeginsWith | EndsWith
    )


def quote_string(value: str) -> str:
    """``value`` as a single-quoted filter string literal that parses back to ``value``."""
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _literal_text(value: Scalar) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return quote_string(value)
    if isinstance(value, float) and value != value:  # NaN has no literal; no predicate holds
        return "NULL"
    if value in (float("inf"), float("-inf")):
        return "1e999" if value > 0 else "-1e999"
    return repr(value)


def to_text(node: Expr) -> str:
    """Filter text for ``node``, fully parenthesised; parsing it gives back an equal tree."""
    match node:
        case Path(text=text):
            return text
        case Previous(path=path):
            return f"{path.text} OF PREVIOUS"
        case Literal(value=value):
            return _literal_text(value)
        case Compare(op=op, left=left, right=right) | Arith(op=op, left=left, right=right):
            return f"({to_text(left)} {op} {to_text(right)})"
        case And(operands=ops):
            return "(" + " AND ".join(to_text(o) for o in ops) + ")"
        case Or(operands=ops):
            return "(" + " OR ".join(to_text(o) for o in ops) + ")"
        case Not(operand=operand):
            return f"(NOT {to_text(operand)})"
        case Neg(operand=operand):
            return f"(- {to_text(operand)})"
        case In(value=value, options=items):
            return f"({to_text(value)} IN {_list_text(items)})"
        case BeginsWith(value=value, prefixes=items):
            return f"({to_text(value)} BEGINS WITH {_list_text(items)})"
        case EndsWith(value=value, suffixes=items):
            return f"({to_text(value)} ENDS WITH {_list_text(items)})"
        case Between(value=value, low=low, high=high):
            return f"({to_text(value)} BETWEEN {to_text(low)} AND {to_text(high)})"
        case Like(value=value, pattern=pattern):
            return f"({to_text(value)} LIKE {quote_string(pattern)})"
        case IsNull(value=value):
            return f"({to_text(value)} IS NULL)"
        case Func(name=name, args=args):
            return f"{name}({', '.join(to_text(a) for a in args)})"
        case Aggregate(name=name, arg=arg, delimiter=delimiter):
            extra = "" if delimiter is None else f", {quote_string(delimiter)}"
            return f"{name}({to_text(arg)}{extra})"
    raise TypeError(f"not a filter expression node: {node!r}")


def _list_text(items: tuple[Expr, ...]) -> str:
    return "(" + ", ".join(to_text(i) for i in items) + ")"
