"""Text to AST for content filters, OrderBy headers and projection fields, with precise errors."""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from importlib import resources
from typing import Any

from lark import Lark, Token, Transformer
from lark.exceptions import (
    LarkError,
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)

from sowstream.errors import SowstreamError

from . import ast

__all__ = ["MAX_DEPTH", "FilterError", "mask_strings", "parse_filter", "parse_projection_field"]

# Evaluation compiles the tree into nested closures, one or two Python frames per level; this
# bound keeps absurd nesting far from the interpreter's recursion limit.
MAX_DEPTH = 100

_EXCERPT_WIDTH = 72


class FilterError(SowstreamError, ValueError):
    """A filter (or OrderBy) text that cannot be parsed or compiled, with where and why.

    Part of the :class:`~sowstream.errors.SowstreamError` tree; a ``ValueError`` too, so the
    configuration's validators report it like any bad value.

    ``position`` is a 0-based character offset into ``text``; ``line`` and ``column`` are
    1-based; ``expected`` lists what the parser would have accepted there (may be empty).
    """

    def __init__(
        self, message: str, *, text: str, position: int, expected: Iterable[str] = ()
    ) -> None:
        position = max(0, min(position, len(text)))
        line = text.count("\n", 0, position) + 1
        column = position - (text.rfind("\n", 0, position) + 1) + 1
        full = (
            f"filter error at position {position} (line {line}, column {column}): {message}\n"
            f"{_excerpt(text, position)}"
        )
        super().__init__(full)
        self.reason = message
        self.text = text
        self.position = position
        self.line = line
        self.column = column
        self.expected: list[str] = list(expected)


def _excerpt(text: str, position: int) -> str:
    """The line holding ``position``, clipped around it, with a caret under it."""
    start = text.rfind("\n", 0, position) + 1
    end = text.find("\n", position)
    line = text[start : end if end != -1 else len(text)]
    column = position - start
    left = max(0, min(column - _EXCERPT_WIDTH // 2, len(line) - _EXCERPT_WIDTH))
    shown = line[left : left + _EXCERPT_WIDTH]
    prefix = "..." if left > 0 else ""
    suffix = "..." if left + _EXCERPT_WIDTH < len(line) else ""
    # Control characters would misplace the caret or garble a terminal.
    shown = "".join(ch if ch.isprintable() else " " for ch in shown)
    return f"  {prefix}{shown}{suffix}\n  {' ' * (len(prefix) + column - left)}^"


class _SemanticError(Exception):
    """Raised from tree-building callbacks, which do not know the text; parse adds it."""

    def __init__(self, message: str, position: int, expected: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.position = position
        self.expected = list(expected)


_DISPLAY = {
    "$END": "end of input",
    "PATH": "path",
    "NAME": "function name",
    "AGGREGATE": "function name",
    "NUMBER": "number",
    "STRING": "string",
    "COMPARE_OP": "comparison operator",
    "PLUS": "'+'",
    "MINUS": "'-'",
    "STAR": "'*'",
    "SLASH": "'/'",
    "PERCENT": "'%'",
    "_LPAR": "'('",
    "_RPAR": "')'",
    "_COMMA": "','",
}
_KEYWORDS = (
    "OR AND NOT IN BETWEEN LIKE IS BEGINS ENDS WITH TRUE FALSE NULL ASC DESC".split()  # noqa: SIM905
)
# Keywords of Preprocessing and Enrichment fields only: not offered in a filter's errors.
_STAGE_KEYWORDS = ("OF", "CURRENT", "PREVIOUS")
_DISPLAY.update({k: f"'{k}'" for k in (*_KEYWORDS, *_STAGE_KEYWORDS)})


def _display_expected(names: Iterable[str], stage: bool = False) -> list[str]:
    shown = {_DISPLAY[n] for n in names if n in _DISPLAY and (stage or n not in _STAGE_KEYWORDS)}
    # Quoted tokens first, in a stable order, then the descriptive words.
    return sorted(shown, key=lambda s: (not s.startswith("'"), s))


def _describe_found(text: str) -> str:
    if len(text) > 24:
        text = text[:21] + "..."
    return "'" + text.replace("'", "\\'") + "'"


def _expected_message(expected: list[str], found: str) -> str:
    if not expected:
        return f"unexpected {found}"
    if len(expected) == 1:
        return f"expected {expected[0]} but found {found}"
    return f"expected one of {', '.join(expected)} but found {found}"


def decode_string(raw: str) -> str:
    """The value of a quoted string token: ``\\`` escapes a quote or a backslash, ``''`` is ``'``.

    Other backslash sequences are kept verbatim so that regexes such as ``'\\d+'`` read naturally.
    """
    quote, body = raw[0], raw[1:-1]
    if "\\" not in body and quote * 2 not in body:
        return body
    out: list[str] = []
    i, n = 0, len(body)
    while i < n:
        ch = body[i]
        if ch == "\\" and i + 1 < n:
            nxt = body[i + 1]
            out.append(nxt if nxt in "\\'\"" else ch + nxt)
            i += 2
        elif ch == quote:  # the lexer only lets quotes through in doubled pairs
            out.append(quote)
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


_COMPARE_OPS: dict[str, ast.CompareOp] = {
    "=": "=",
    "==": "=",
    "!=": "!=",
    "<>": "!=",
    "<": "<",
    "<=": "<=",
    ">": ">",
    ">=": ">=",
}
_ARITH_OPS: dict[str, ast.ArithOp] = {"+": "+", "-": "-", "*": "*", "/": "/", "%": "%"}


@dataclass(frozen=True, slots=True)
class _Projection:
    """What the parse of a projection field accepts beyond a filter (parse_projection_field)."""

    aggregates: tuple[str, ...]
    stage: bool
    functions: frozenset[str]


# The builder is bound into the one LALR parser when that is built, so a projection field's parse
# tells it what the field may hold through this variable (None while parsing anything else).
_PROJECTION: ContextVar[_Projection | None] = ContextVar("_PROJECTION", default=None)


def _unknown_function(name_tok: Token) -> _SemanticError:
    message = f"unknown function '{name_tok}'"
    projection = _PROJECTION.get()
    if projection is not None:  # name the aggregates too, which a projection field also takes
        message += (
            f": the aggregate functions are {', '.join(projection.aggregates)} and the other "
            f"functions {', '.join(sorted({*ast.FUNCTIONS, *projection.functions}))}"
        )
    return _SemanticError(message, _pos(name_tok), expected=sorted(ast.FUNCTIONS))


def _exprs(children: list[Any]) -> list[ast.Expr]:
    return [c for c in children if isinstance(c, ast.Expr)]


def _token(children: list[Any], kind: str) -> Token:
    return next(c for c in children if isinstance(c, Token) and c.type == kind)


def _pos(tok: Token) -> int:
    return tok.start_pos if tok.start_pos is not None else -1


class _Builder(Transformer[Token, Any]):
    """Builds AST nodes while the LALR parser reduces, so no intermediate parse tree exists."""

    # ---- leaves

    def path(self, c: list[Token]) -> ast.Path:
        # `/a OF CURRENT` is `/a`: the message being processed is what a path reads anyway.
        return ast.Path(str(c[0]), pos=_pos(c[0]))

    def previous(self, c: list[Token]) -> ast.Previous:
        return ast.Previous(ast.Path(str(c[0]), pos=_pos(c[0])), pos=_pos(c[0]))

    def string(self, c: list[Token]) -> ast.Literal:
        return ast.Literal(decode_string(str(c[0])), pos=_pos(c[0]))

    def number(self, c: list[Token]) -> ast.Literal:
        tok = c[0]
        text = str(tok)
        value: int | float
        try:
            value = int(text) if text.isdigit() else float(text)
        except ValueError:
            raise _SemanticError("number literal has too many digits", _pos(tok)) from None
        if value in (float("inf"), float("-inf")):
            raise _SemanticError("number literal is out of range", _pos(tok))
        return ast.Literal(value, pos=_pos(tok))

    def true(self, c: list[Token]) -> ast.Literal:
        return ast.Literal(True, pos=_pos(c[0]))

    def false(self, c: list[Token]) -> ast.Literal:
        return ast.Literal(False, pos=_pos(c[0]))

    def null(self, c: list[Token]) -> ast.Literal:
        return ast.Literal(None, pos=_pos(c[0]))

    # ---- values

    def func_args(self, c: list[Any]) -> tuple[ast.Expr, ...]:
        return tuple(_exprs(c))

    def value_list(self, c: list[Any]) -> tuple[ast.Expr, ...]:
        return tuple(_exprs(c))

    def func(self, c: list[Any]) -> ast.Func:
        name_tok = c[0]
        args: tuple[ast.Expr, ...] = c[1] if len(c) > 1 else ()
        name = str(name_tok).upper()
        arity = ast.FUNCTIONS.get(name) or ast.STAGE_FUNCTIONS.get(name)
        if arity is None:
            raise _unknown_function(name_tok)
        low, high = arity
        if len(args) < low or (high is not None and len(args) > high):
            wanted = f"{low}" if low == high else f"at least {low}"
            plural = "" if low == 1 else "s"
            raise _SemanticError(
                f"{name} takes {wanted} argument{plural} but was given {len(args)}",
                _pos(name_tok),
            )
        return ast.Func(name, args, pos=_pos(name_tok))

    def extra_args(self, c: list[Any]) -> tuple[Any, ...]:
        # Arguments after an aggregate's first, with the commas before them (all an error).
        return (*(c[0] if isinstance(c[0], tuple) else (c[0],)), *c[1:])

    def aggregate(self, c: list[Any]) -> ast.Aggregate:
        # Children: the name, '(', the argument, then any extra_args, ')'.
        name_tok, open_tok, *inside, close_tok = c
        if inside and isinstance(inside[-1], tuple):
            inside = [*inside[:-1], *inside[-1]]
        name = str(name_tok).upper()
        projection = _PROJECTION.get()
        if projection is None or name not in projection.aggregates:
            raise _unknown_function(name_tok)
        at = _pos(name_tok)
        args = _exprs(inside)
        for inner in (n for arg in args for n in ast.walk(arg)):
            if isinstance(inner, ast.Aggregate):
                raise _SemanticError(
                    f"aggregate {inner.name} is nested inside {name} (at position "
                    f"{at}): aggregate functions cannot be nested",
                    inner.pos,
                )
        commas = [t for t in inside if isinstance(t, Token)]
        delimiter: str | None = None
        if commas and name in ast.AGGREGATES_WITH_DELIMITER:
            if len(commas) > 1:
                raise _SemanticError(f"{name} takes one or two arguments", _pos(commas[1]))
            second = args[1]
            if not isinstance(second, ast.Literal) or not isinstance(second.value, str):
                raise _SemanticError(
                    f"{name}'s second argument is its delimiter, a string literal like ', '",
                    second.pos,
                )
            delimiter, args = second.value, args[:1]
        elif commas:
            raise _SemanticError(f"{name} takes exactly one argument", _pos(commas[0]))
        if not args:
            raise _SemanticError(f"{name} needs an argument, like {name}(/field)", _pos(open_tok))
        try:
            _check_mode(args[0], projection.stage, projection.functions)
        except _SemanticError as exc:
            raise _SemanticError(
                f"{exc.message} (in the argument of {name})", exc.position
            ) from None
        end = close_tok.end_pos if close_tok.end_pos is not None else -1
        return ast.Aggregate(name, args[0], delimiter, pos=at, end=end)

    def neg(self, c: list[Any]) -> ast.Expr:
        minus, operand = c
        value = operand.value if isinstance(operand, ast.Literal) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return ast.Literal(-value, pos=_pos(minus))
        return ast.Neg(operand, pos=_pos(minus))

    def arith(self, c: list[Any]) -> ast.Arith:
        left, op, right = c
        return ast.Arith(_ARITH_OPS[str(op)], left, right, pos=left.pos)

    # ---- predicates

    def compare(self, c: list[Any]) -> ast.Compare:
        left, op, right = c
        return ast.Compare(_COMPARE_OPS[str(op)], left, right, pos=left.pos)

    def in_(self, c: list[Any]) -> ast.In:
        return ast.In(c[0], c[-1], pos=c[0].pos)

    def not_in(self, c: list[Any]) -> ast.Not:
        return ast.Not(self.in_(c), pos=_pos(_token(c, "NOT")))

    def between(self, c: list[Any]) -> ast.Between:
        value, low, high = _exprs(c)
        return ast.Between(value, low, high, pos=value.pos)

    def not_between(self, c: list[Any]) -> ast.Not:
        return ast.Not(self.between(c), pos=_pos(_token(c, "NOT")))

    def like(self, c: list[Any]) -> ast.Like:
        value, tok = c[0], c[-1]
        pattern = decode_string(str(tok))
        try:
            re.compile(pattern)
        except Exception as exc:  # re.error, OverflowError, RecursionError on odd patterns
            detail = getattr(exc, "msg", None) or str(exc) or type(exc).__name__
            raise _SemanticError(f"invalid regular expression: {detail}", _pos(tok)) from None
        return ast.Like(value, pattern, pos=value.pos)

    def not_like(self, c: list[Any]) -> ast.Not:
        return ast.Not(self.like(c), pos=_pos(_token(c, "NOT")))

    def is_null(self, c: list[Any]) -> ast.IsNull:
        return ast.IsNull(c[0], pos=c[0].pos)

    def is_not_null(self, c: list[Any]) -> ast.Not:
        return ast.Not(self.is_null(c), pos=_pos(_token(c, "NOT")))

    def begins_with(self, c: list[Any]) -> ast.BeginsWith:
        return ast.BeginsWith(c[0], c[-1], pos=c[0].pos)

    def not_begins_with(self, c: list[Any]) -> ast.Not:
        return ast.Not(self.begins_with(c), pos=_pos(_token(c, "NOT")))

    def ends_with(self, c: list[Any]) -> ast.EndsWith:
        return ast.EndsWith(c[0], c[-1], pos=c[0].pos)

    def not_ends_with(self, c: list[Any]) -> ast.Not:
        return ast.Not(self.ends_with(c), pos=_pos(_token(c, "NOT")))

    # ---- logic

    def not_(self, c: list[Any]) -> ast.Not:
        return ast.Not(c[-1], pos=_pos(c[0]))

    def and_(self, c: list[Any]) -> ast.And:
        ops = _exprs(c)
        flat = tuple(x for o in ops for x in (o.operands if isinstance(o, ast.And) else (o,)))
        return ast.And(flat, pos=ops[0].pos)

    def or_(self, c: list[Any]) -> ast.Or:
        ops = _exprs(c)
        flat = tuple(x for o in ops for x in (o.operands if isinstance(o, ast.Or) else (o,)))
        return ast.Or(flat, pos=ops[0].pos)

    # ---- OrderBy: plain tuples, order_by.py turns them into SortField objects

    def sort_field(self, c: list[Token]) -> tuple[str, bool, int]:
        descending = len(c) > 1 and c[1].type == "DESC"
        return (str(c[0]), descending, _pos(c[0]))

    def order_by(self, c: list[Any]) -> tuple[tuple[str, bool, int], ...]:
        return tuple(x for x in c if isinstance(x, tuple))


@functools.cache
def _lark() -> Lark:
    grammar = resources.files(__package__).joinpath("grammar.lark").read_text(encoding="utf-8")
    return Lark(
        grammar,
        parser="lalr",
        lexer="contextual",
        start=["filter", "order_by", "projection"],
        transformer=_Builder(),
        maybe_placeholders=False,
    )


def _expected_at(text: str, start: str, position: int) -> set[str] | None:
    """The terminals that can continue ``text[:position]``, or None if that can't be worked out.

    The exception's own parser state is not used: LALR may already have reduced on the bad
    token (its merged lookaheads allow that), which hides operators that were still possible.
    So the prefix is replayed up to the error and every terminal is tried from there.
    """
    try:
        interactive = _lark().parse_interactive(text, start=start)
        state: Any = interactive.parser_state
        state.parse_conf = copy.copy(state.parse_conf)
        state.parse_conf.callbacks = {}  # building AST nodes for a replay would be wasted work
        tokens = interactive.lexer_thread.lex(state)  # type: ignore[no-untyped-call]
        while True:
            try:
                token = next(tokens)
            except (StopIteration, UnexpectedInput):
                break
            if token.start_pos is None or token.start_pos >= position:
                break
            state.feed_token(token)
        accepted: set[str] = set()
        for name in state.parse_conf.states[state.position]:
            if not name.isupper():
                continue
            trial = state.copy(deepcopy_values=False)
            try:
                trial.feed_token(Token(name, ""), is_end=name == "$END")
            except UnexpectedInput:
                continue
            accepted.add(name)
        return accepted or None
    except Exception:
        return None


def _convert(exc: BaseException, text: str, start: str, stage: bool = False) -> FilterError:
    """Turn whatever the parsing machinery raised into a FilterError pointing into ``text``."""
    if isinstance(exc, VisitError):
        exc = exc.orig_exc
    if isinstance(exc, _SemanticError):
        return FilterError(exc.message, text=text, position=exc.position, expected=exc.expected)
    if isinstance(exc, UnexpectedToken):
        if exc.token.type == "$END":
            position = len(text)
            found = "end of input" + (" (the filter is empty)" if not text.strip() else "")
        else:
            position = exc.token.start_pos if exc.token.start_pos is not None else 0
            found = _describe_found(str(exc.token))
        names = _expected_at(text, start, position) or set(exc.expected)
        expected = _display_expected(names, stage)
        message = _expected_message(expected, found)
        if names == {"_LPAR"}:
            message += " (a name must be a function call; field paths start with '/')"
        return FilterError(message, text=text, position=position, expected=expected)
    if isinstance(exc, UnexpectedCharacters):
        position = exc.pos_in_stream or 0
        names = _expected_at(text, start, position) or set(exc.allowed or ())
        expected = _display_expected(names, stage)
        char = text[position] if position < len(text) else ""
        if char in ("'", '"'):
            message = "unterminated string literal"
        else:
            message = _expected_message(expected, _describe_found(char))
        return FilterError(message, text=text, position=position, expected=expected)
    if isinstance(exc, UnexpectedEOF):
        expected = _display_expected(exc.expected, stage)
        return FilterError(
            _expected_message(expected, "end of input"),
            text=text,
            position=len(text),
            expected=expected,
        )
    if isinstance(exc, RecursionError):
        return FilterError("filter is nested too deeply", text=text, position=0)
    if isinstance(exc, LarkError):
        return FilterError(f"cannot parse filter: {exc}", text=text, position=0)
    return FilterError(f"internal error while parsing: {exc!r}", text=text, position=0)


def _parse(text: str, start: str, stage: bool = False) -> Any:
    if not isinstance(text, str):
        raise TypeError(f"filter text must be a str, not {type(text).__name__}")
    try:
        return _lark().parse(text, start=start)
    except FilterError:
        raise
    except Exception as exc:  # the contract: only FilterError leaves, whatever lark does
        raise _convert(exc, text, start, stage) from None


def parse_filter(text: str, *, stage: bool = False, functions: Collection[str] = ()) -> ast.Expr:
    """Parse filter text into its AST; any problem is a FilterError with a position.

    ``stage`` admits what only a SOW topic's Preprocessing and Enrichment fields may use:
    ``OF PREVIOUS`` and ``ast.STAGE_FUNCTIONS`` (sowstream.sow.enrich says where each applies);
    ``functions`` admits some of those functions elsewhere (views take the deterministic ones).
    """
    tree = _parse(text, "filter", stage)
    if not isinstance(tree, ast.Expr):  # pragma: no cover - the grammar only yields nodes
        raise FilterError("internal error: no expression", text=text, position=0)
    try:
        _check_mode(tree, stage, functions)
    except _SemanticError as exc:
        raise FilterError(exc.message, text=text, position=exc.position) from None
    return tree


def _check_mode(tree: ast.Expr, stage: bool, functions: Collection[str]) -> None:
    """Refuse a tree nested too deeply or, outside a stage, using what only stages may use.

    Aggregate calls in ``tree`` count as leaves: the parser checked their arguments already.
    """
    _check_depth(tree)
    if not stage:
        _refuse_stage_only(tree, functions)


def _refuse_stage_only(tree: ast.Expr, allowed: Collection[str]) -> None:
    for node in ast.walk_outside_aggregates(tree):
        if isinstance(node, ast.Previous):
            raise _SemanticError(
                "OF PREVIOUS is only available in the Enrichment fields of a SOW topic",
                max(node.pos, 0),
            )
        if (
            isinstance(node, ast.Func)
            and node.name in ast.STAGE_FUNCTIONS
            and node.name not in allowed
        ):
            raise _SemanticError(
                f"{node.name} is only available in the Preprocessing and Enrichment fields of "
                "a SOW topic",
                max(node.pos, 0),
            )


def _check_depth(tree: ast.Expr) -> None:
    stack = [(tree, 1)]
    while stack:
        node, level = stack.pop()
        if level > MAX_DEPTH:
            raise _SemanticError(
                f"filter is nested too deeply (more than {MAX_DEPTH} levels)", max(node.pos, 0)
            )
        if not isinstance(node, ast.Aggregate):
            stack.extend((child, level + 1) for child in ast.children(node))


def parse_order_by_fields(text: str) -> Sequence[tuple[str, bool, int]]:
    """The raw (path, descending, position) triples of an OrderBy header; see order_by.py."""
    result: Sequence[tuple[str, bool, int]] = _parse(text, "order_by")
    return result


# ---------------------------------------------------------------------------- projection fields

# The AS keyword (case-insensitive, as in AMPS's `SUM(/qty) as /quantity`).
_AS = re.compile(r"(?<![\w.$@/-])as(?![\w.$@-])", re.I)


def mask_strings(text: str) -> tuple[str, int | None]:
    """``text`` with the inside of every string literal blanked, and where an unclosed one starts.

    Commas, parentheses, brackets and words inside quotes are data, not structure; blanking them
    lets a scanner work on plain text while positions stay those of ``text``. Escapes follow the
    grammar's STRING.
    """
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        quote = text[i]
        if quote not in "'\"":
            i += 1
            continue
        start = i
        i += 1
        while i < n:
            ch = text[i]
            # A backslash escapes the next character; a doubled quote stands for one quote.
            if i + 1 < n and (ch == "\\" or (ch == quote and text[i + 1] == quote)):
                out[i] = out[i + 1] = " "
                i += 2
            elif ch == quote:
                break
            else:
                out[i] = " "
                i += 1
        if i >= n:
            return "".join(out), start
        i += 1
    return "".join(out), None


def _depths(masked: str, start: int, end: int) -> Iterator[int]:
    """The parenthesis depth at each position of ``masked[start:end]``."""
    depth = 0
    for i in range(start, end):
        ch = masked[i]
        if ch == ")":
            depth = max(0, depth - 1)  # a stray ')' is left for the parser to point at
        yield depth
        if ch == "(":
            depth += 1


def _fragment(text: str, start: int, end: int) -> str:
    piece = text[start:end].strip()
    return piece if len(piece) <= 40 else piece[:37] + "..."


def parse_projection_field(
    text: str,
    *,
    aggregates: Sequence[str] = ast.AGGREGATES,
    stage: bool = False,
    functions: Collection[str] = (),
) -> ast.ProjectionField:
    """Parse one projection field, ``expr AS /output`` or a lone path, into its AST.

    ``expr`` is a filter expression in which calls of ``aggregates`` (some of ast.AGGREGATES,
    named in that order in errors) may stand; ``stage`` and ``functions`` are parse_filter's.
    Positions, in the result and in the FilterError raised for any problem, are offsets in
    ``text``; a caller that cut the field out of a longer text can pad it with spaces to keep
    that text's positions. The ``AS`` that splits off the output is found at parenthesis depth 0
    outside strings, before the expression is parsed, so its problems are reported first.
    """
    unknown = [name for name in aggregates if name not in ast.AGGREGATES]
    if unknown:
        raise ValueError(f"not aggregate functions of the grammar: {', '.join(unknown)}")

    def error(position: int, problem: str) -> FilterError:
        return FilterError(problem, text=text, position=position)

    masked, unclosed = mask_strings(text)
    if unclosed is not None:
        raise error(unclosed, "unterminated string literal")
    start = len(masked) - len(masked.lstrip())
    end = len(masked.rstrip())
    if start >= end:
        raise error(0, "the projection field is empty")
    depths = list(_depths(masked, start, end))
    hits = [m for m in _AS.finditer(masked, start, end) if depths[m.start() - start] == 0]
    if len(hits) > 1:
        raise error(hits[1].start(), "a projection entry takes one AS")
    expr_end = end
    output: ast.Path | None = None
    if hits:
        expr_end = hits[0].start()
        target_start = hits[0].end()
        target_start += len(masked[target_start:end]) - len(masked[target_start:end].lstrip())
        if target_start >= end:
            raise error(hits[0].start(), "AS needs an output path, like AS /total")
        if not masked[start:expr_end].strip():
            raise error(start, "nothing to project before AS")
        try:
            target: ast.Expr | None = parse_filter(
                " " * target_start + text[target_start:end], stage=stage, functions=functions
            )
        except FilterError:
            target = None
        if not isinstance(target, ast.Path):
            raise error(
                target_start,
                "AS must be followed by a field path such as /total, not "
                f"{_fragment(text, target_start, end)!r}",
            )
        output = target
        expr_end = len(masked[:expr_end].rstrip())

    # Padded, so that positions (and an error at the end of input) are those of ``text``.
    expr_text = " " * start + text[start:expr_end]
    mode = _Projection(tuple(aggregates), stage, frozenset(functions))
    reset = _PROJECTION.set(mode)
    try:
        expr = _parse(expr_text, "projection", stage)
    finally:
        _PROJECTION.reset(reset)
    try:
        _check_mode(expr, stage, functions)
    except _SemanticError as exc:
        raise error(exc.position, exc.message) from None

    if output is None:
        if not isinstance(expr, ast.Path):
            raise error(
                start,
                f"{_fragment(text, start, expr_end)!r} is computed and needs an output path: "
                "add AS /name",
            )
        return ast.ProjectionField(expr, expr.text, start, text)
    return ast.ProjectionField(expr, output.text, output.pos, text)
