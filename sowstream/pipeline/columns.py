"""Content filters as Spark Column expressions, with the Python evaluator's semantics exactly.

``filter_column("/qty > 5 AND /sym = 'IBM'", "body")`` is a boolean Column that is true on the
rows whose JSON text in ``body`` ``compile_filter(...).matches`` accepts. It is made of Spark's
own SQL functions (no Python UDF), so Spark optimises and distributes it like any other filter.
``truth_column`` keeps UNKNOWN as NULL, ``truth_array`` evaluates many filters with one parse,
``value_column`` gives the value of an expression (``/qty * /px``, ``UPPER(/sym)``) for
projections and aggregates, and ``filter_sql`` the SQL text for ``WHERE`` clauses.

How JSON values are represented
-------------------------------
Each row's text is parsed once with ``try_parse_json`` into a VARIANT, and each distinct path of
the filter is read once into an ``array<struct>`` of its values: arrays met on the way give all
their elements (nested arrays too); an absent path gives one NULL value, which the evaluator
treats the same as no value. A value is a struct ``(t, s, i, d, b, x, nd, ni, nk)``: ``t`` is
its kind (NULL -- a missing field, JSON null or ``""`` --, string, integer, float, boolean, or
object), ``s`` a non-empty string, ``i`` an integer's exact value as ``decimal(38,0)``, ``d`` a
number as double, ``b`` a boolean; ``x`` (its text) and ``nd``/``ni``/``nk`` (its numeric
reading, numeric strings included) are filled in once per value for the paths that need them.
Only the fields of a value's kind are set. Comparisons, arithmetic and the text of numbers
follow ``sowstream.filters`` rule by rule, NaN and infinities included. Multi-valued operands
are combined with ``exists`` (three-valued, as ANY needs) and ``transform`` over every
combination of values, as the evaluator does.

Why SQL text, and why its shape matters
---------------------------------------
The expression is generated as Spark SQL text and handed to ``F.expr``: building it from Column
objects costs a JVM round trip per node. Spark's analyzer resolves one level of nested function
calls per pass over the whole expression, so the cost of a filter grows with its size times its
nesting depth; the code below therefore keeps nesting shallow (see ``_let``), and groups with
``coalesce(x)`` rather than parentheses, which Spark's parser is slow to tell from lambdas.

Known differences from the Python evaluator (all need unusual data)
-------------------------------------------------------------------
* Integers are exact up to 38 digits; larger ones (from arithmetic, numeric strings or literals)
  are approximated by doubles, whereas Python's integers are unbounded.
* ``int / int`` with an operand beyond 2**53 may differ in the last bit: Python rounds the exact
  quotient, Spark divides the rounded doubles.
* Spark's JSON reader drops a zero fraction, so a float such as ``10000000000000000000.0``
  (between 2**63 and 2**64) reads as an integer; this only shows in arithmetic beyond 2**53.
* The text of a double comes from Java's shortest digits, which for the smallest subnormals
  have one digit more than Python's (``4.9e-324`` for ``5e-324``).
* ``UPPER``/``LOWER`` use Java's Unicode tables; characters added in recent Unicode versions may
  map differently. A case-insensitive back-reference (``(?i)(a)\\1``) uses Java's case folding.
* Java's regex engine recurses on some repetitions of alternatives (``(a|b)*``) and can fail
  with a stack overflow on strings of many thousands of characters where Python succeeds.
* Duplicate keys in a record need ``spark.sql.variant.allowDuplicateKeys=true`` (the last one
  wins, as in orjson); ``spark_session`` sets it. Without it such a record reads as empty, as
  does text that is not JSON; records are expected to be JSON objects, as the engine's are.
* Three-valued ANY relies on ``spark.sql.legacy.followThreeValuedLogicInArrayExists`` keeping
  its default (true).

Constructs rejected at compile time with a ``FilterError``: regex conditional groups
(``(?(1)a|b)``) and repetition counts above 2**31-1, which Java's engine lacks; hand-built ASTs
with a path key containing quotes or backslashes.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import math
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import chain
from typing import Any, Literal

from pyspark.sql import Column
from pyspark.sql import functions as F

from sowstream.filters import FilterError, ast, compile_predicate, parse_filter
from sowstream.filters.values import canonical_text, str_to_number

__all__ = [
    "UnsupportedRegexError",
    "filter_column",
    "filter_sql",
    "java_regex",
    "truth_array",
    "truth_column",
    "value_column",
]

ValueType = Literal["auto", "double", "long", "string", "boolean"]

# Value kinds (the ``t`` field).
_NULL, _STR, _INT, _FLT, _BOOL, _OBJ = range(6)
_ALL = frozenset(range(6))
_NUMERIC = frozenset({_INT, _FLT})
_STRING = frozenset({_STR})
_INTEGER = frozenset({_INT})

_DEC = "DECIMAL(38,0)"
_INF = math.inf
_TWO53 = 2.0**53
_TWO63 = 2.0**63
_LONG_MAX = 2**63 - 1
_U64_MAX = 2**64 - 1
_DEC_LIMIT = 10**38
_LIMB = 1_000_000_000  # base of the digit limbs used to print very large doubles exactly
# str_to_number's patterns in Java syntax (\z is the very end, like Python's \Z).
_JAVA_NUMBER = r"\A[ \t\n\r]*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[ \t\n\r]*\z"
_JAVA_INTEGER = r"\A[ \t\n\r]*[+-]?[0-9]+[ \t\n\r]*\z"
_SPACES = " \t\n\r"
# The functions that read their arguments' text.
_TEXT_FUNCTIONS = frozenset(
    {"UPPER", "LOWER", "LENGTH", "INSTR", "INSTR_I", "STREQUAL_I", "CONCAT"}
)

# ============================================================================ regex translation
#
# LIKE patterns use Python's syntax and Spark's rlike runs Java's engine. They differ in more than
# spelling (what \w, \s, ., $ and (?i) match, octal and brace rules, class set operations), so
# rather than patching syntax the pattern is parsed by Python's own regex parser and written out
# in a small Java subset without flags or shorthand classes: every character class becomes the
# explicit code-point ranges that Python's engine matches, found by running it over all of Unicode.

_re_parser: Any = importlib.import_module("re._parser")  # the parser behind re.compile
_re_constants: Any = importlib.import_module("re._constants")
_JAVA_MAX_REPEAT = 2**31 - 1
_EVERYTHING = r"[\x{0}-\x{10FFFF}]"
_NOTHING = r"[^\x{0}-\x{10FFFF}]"
# CPython before 3.14 never matches \B in an empty string; later versions do.
_B_MATCHES_EMPTY = re.search(r"\B", "") is not None
_CATEGORIES = {
    "CATEGORY_DIGIT": r"\d",
    "CATEGORY_NOT_DIGIT": r"\D",
    "CATEGORY_SPACE": r"\s",
    "CATEGORY_NOT_SPACE": r"\S",
    "CATEGORY_WORD": r"\w",
    "CATEGORY_NOT_WORD": r"\W",
}


class UnsupportedRegexError(ValueError):
    """A valid Python regex that Java's engine cannot express (e.g. a conditional group)."""


@functools.cache
def _all_chars() -> str:
    # Surrogates cannot occur in Spark strings (they are UTF-8), so they are left out.
    return "".join(map(chr, chain(range(0xD800), range(0xE000, 0x110000))))


def _jchar(code: int) -> str:
    return f"\\x{{{code:X}}}"


def _span(low: int, high: int) -> str:
    if low == high:
        return _jchar(low)
    if high == low + 1:
        return _jchar(low) + _jchar(high)
    return f"{_jchar(low)}-{_jchar(high)}"


def _ranges(chars: Iterable[str]) -> str:
    """Characters in ascending order as Java class ranges, e.g. ``\\x{61}-\\x{7A}\\x{5F}``."""
    out: list[str] = []
    start = prev = -2
    for ch in chars:
        code = ord(ch)
        if code != prev + 1:
            if start >= 0:
                out.append(_span(start, prev))
            start = code
        prev = code
    if start >= 0:
        out.append(_span(start, prev))
    return "".join(out)


@functools.lru_cache(maxsize=1024)
def _char_class(py_pattern: str, flags: int) -> str:
    """A Java class matching exactly the characters Python's one-character pattern matches."""
    rx = re.compile(py_pattern, flags)
    everything = _all_chars()
    hits = rx.findall(everything)
    if len(hits) * 2 > len(everything):  # mostly everything: list the characters it misses
        misses = rx.sub("", everything)
        return f"[^{_ranges(misses)}]" if misses else _EVERYTHING
    return f"[{_ranges(hits)}]" if hits else _NOTHING


def _py_char(code: int) -> str:
    return f"\\U{code:08x}"


def _py_class_item(op: Any, av: Any) -> str:
    name = str(op)
    if name == "NEGATE":
        return "^"
    if name == "LITERAL":
        return _py_char(av)
    if name == "RANGE":
        return f"{_py_char(av[0])}-{_py_char(av[1])}"
    if name == "CATEGORY":
        return _CATEGORIES[str(av)]
    raise UnsupportedRegexError(f"the character-class item {name} has no Java equivalent")


def _regex_seq(items: Iterable[tuple[Any, Any]], flags: int) -> str:
    return "".join(_regex_node(op, av, flags) for op, av in items)


def _chars(py_pattern: str, flags: int) -> str:
    return _char_class(py_pattern, flags & (re.IGNORECASE | re.DOTALL | re.ASCII))


def _regex_node(op: Any, av: Any, flags: int) -> str:
    name = str(op)
    if name == "LITERAL":
        return _chars(_py_char(av), flags) if flags & re.IGNORECASE else _jchar(av)
    if name == "NOT_LITERAL":
        return _chars(f"[^{_py_char(av)}]", flags)
    if name == "IN":
        return _chars("[" + "".join(_py_class_item(o, a) for o, a in av) + "]", flags)
    if name == "CATEGORY":
        return _chars(_CATEGORIES[str(av)], flags)
    if name == "ANY":
        return _EVERYTHING if flags & re.DOTALL else f"[^{_jchar(10)}]"
    if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
        low, high, item = av
        unbounded = high == _re_constants.MAXREPEAT
        if low > _JAVA_MAX_REPEAT or (not unbounded and high > _JAVA_MAX_REPEAT):
            raise UnsupportedRegexError(f"repetition counts above {_JAVA_MAX_REPEAT}")
        bound = f"{{{low},}}" if unbounded else f"{{{low},{high}}}"
        mode = {"MAX_REPEAT": "", "MIN_REPEAT": "?", "POSSESSIVE_REPEAT": "+"}[name]
        return f"(?:{_regex_seq(item, flags)}){bound}{mode}"
    if name == "SUBPATTERN":
        group, add, remove, item = av
        inner = _regex_seq(item, (flags | add) & ~remove)
        return f"(?:{inner})" if group is None else f"({inner})"
    if name == "BRANCH":
        return "(?:" + "|".join(_regex_seq(alt, flags) for alt in av[1]) + ")"
    if name in ("ASSERT", "ASSERT_NOT"):
        direction, item = av
        kind = {
            (1, "ASSERT"): "=",
            (1, "ASSERT_NOT"): "!",
            (-1, "ASSERT"): "<=",
            (-1, "ASSERT_NOT"): "<!",
        }
        return f"(?{kind[direction, name]}{_regex_seq(item, flags)})"
    if name == "ATOMIC_GROUP":
        return f"(?>{_regex_seq(av, flags)})"
    if name == "GROUPREF":
        # A case-insensitive back-reference is left to Java's own case folding.
        return f"(?iu:\\{av})" if flags & re.IGNORECASE else f"\\{av}"
    if name == "AT":
        return _regex_anchor(str(av), flags)
    if name == "GROUPREF_EXISTS":
        raise UnsupportedRegexError("conditional groups (?(group)yes|no) have no Java equivalent")
    raise UnsupportedRegexError(f"the regex construct {name} has no Java equivalent")


def _regex_anchor(name: str, flags: int) -> str:
    newline = _jchar(10)
    if name == "AT_BEGINNING":
        return f"(?:\\A|(?<={newline}))" if flags & re.MULTILINE else r"\A"
    if name == "AT_BEGINNING_STRING":
        return r"\A"
    if name == "AT_END":  # Python's $ also matches just before a final newline
        return f"(?={newline}|\\z)" if flags & re.MULTILINE else f"(?={newline}?\\z)"
    if name == "AT_END_STRING":
        return r"\z"
    word = _chars(r"\w", flags & re.ASCII)
    if name == "AT_BOUNDARY":
        return f"(?:(?<={word})(?!{word})|(?<!{word})(?={word}))"
    if name == "AT_NON_BOUNDARY":
        guard = "" if _B_MATCHES_EMPTY else r"(?!\A\z)"
        return f"(?:(?<={word})(?={word})|(?<!{word})(?!{word}){guard})"
    raise UnsupportedRegexError(f"the anchor {name} has no Java equivalent")


@functools.lru_cache(maxsize=1024)
def java_regex(pattern: str) -> str:
    """The Java regex that finds a match in exactly the strings where ``re.search`` does.

    Raises ``UnsupportedRegexError`` for the few Python constructs Java lacks, ``re.error`` if
    ``pattern`` is not a valid Python regex.
    """
    with warnings.catch_warnings():
        # parse_filter already warned about this pattern (e.g. a possible nested set).
        warnings.simplefilter("ignore", FutureWarning)
        tree = _re_parser.parse(pattern)
    return _regex_seq(tree, tree.state.flags)


# ============================================================================ SQL text

SqlScalar = str | int | float | bool | None


# Operator precedence, tightest last: a sub-expression is grouped only where it must be.
_OR, _AND, _NOT, _CMP, _ADD, _MUL, _UNARY, _ATOM = range(8)


class _E:
    """A Spark SQL expression being built as text. Operators and methods return new ones.

    Comparisons are methods (``eq``, ``lt``, ...) rather than ``==``/``<`` so that an ``_E`` is
    never mistaken for a Python truth value. Grouping uses ``coalesce(x)`` (the identity, which
    the optimizer removes) instead of parentheses: Spark's parser must look ahead through every
    parenthesis to tell a group from a lambda's parameter list, which makes nested parentheses
    very slow to parse.
    """

    __slots__ = ("prec", "sql", "type")

    def __init__(self, sql: str, prec: int = _ATOM, type_: str | None = None) -> None:
        self.sql = sql
        self.prec = prec
        self.type = type_  # the SQL type when known, to leave out redundant casts

    def typed(self, type_: str) -> _E:
        return _E(self.sql, self.prec, type_)

    def __repr__(self) -> str:
        return f"_E({self.sql!r})"

    def at(self, prec: int) -> str:
        """The text, grouped if it binds more loosely than ``prec``."""
        return self.sql if self.prec >= prec else f"coalesce({self.sql})"

    def __and__(self, other: _E) -> _E:
        return _E(f"{self.at(_AND)} AND {other.at(_AND)}", _AND)

    def __or__(self, other: _E) -> _E:
        return _E(f"{self.at(_OR)} OR {other.at(_OR)}", _OR)

    def __invert__(self) -> _E:
        return _E(f"NOT {self.at(_NOT)}", _NOT)

    def __neg__(self) -> _E:
        return _f("negative", self)

    def __add__(self, other: _E | SqlScalar) -> _E:
        return self.op("+", other)

    def __sub__(self, other: _E | SqlScalar) -> _E:
        return self.op("-", other)

    def __mul__(self, other: _E | SqlScalar) -> _E:
        return self.op("*", other)

    def __truediv__(self, other: _E | SqlScalar) -> _E:
        return self.op("/", other)

    def __mod__(self, other: _E | SqlScalar) -> _E:
        return self.op("%", other)

    def __getitem__(self, name: str) -> _E:
        return _E(f"{self.at(_ATOM)}.{name}")

    def op(self, op: str, other: _E | SqlScalar) -> _E:
        """A binary operator; arithmetic is left-associative, comparisons take no chains."""
        right = other if isinstance(other, _E) else _lit(other)
        if op in ("*", "/", "%"):
            return _E(f"{self.at(_MUL)} {op} {right.at(_MUL + 1)}", _MUL)
        if op in ("+", "-"):
            return _E(f"{self.at(_ADD)} {op} {right.at(_ADD + 1)}", _ADD)
        return _E(f"{self.at(_CMP + 1)} {op} {right.at(_CMP + 1)}", _CMP)

    def eq(self, other: _E | SqlScalar) -> _E:
        return self.op("=", other)

    def ne(self, other: _E | SqlScalar) -> _E:
        return self.op("<>", other)

    def lt(self, other: _E | SqlScalar) -> _E:
        return self.op("<", other)

    def le(self, other: _E | SqlScalar) -> _E:
        return self.op("<=", other)

    def gt(self, other: _E | SqlScalar) -> _E:
        return self.op(">", other)

    def ge(self, other: _E | SqlScalar) -> _E:
        return self.op(">=", other)

    def is_null(self) -> _E:
        return _E(f"{self.at(_CMP + 1)} IS NULL", _CMP)

    def not_null(self) -> _E:
        return _E(f"{self.at(_CMP + 1)} IS NOT NULL", _CMP)

    def cast(self, type_: str) -> _E:
        return self if self.type == type_ else _E(f"CAST({self.sql} AS {type_})", _ATOM, type_)

    def try_cast(self, type_: str) -> _E:
        return _E(f"TRY_CAST({self.sql} AS {type_})", _ATOM, type_)

    def isin(self, *values: _E | SqlScalar) -> _E:
        return _E(f"{self.at(_CMP + 1)} IN ({', '.join(_sql(v) for v in values)})", _CMP)

    def rlike(self, pattern: str) -> _E:
        return _E(f"{self.at(_CMP + 1)} RLIKE {_string(pattern)}", _CMP)

    def first(self) -> _E:
        return _E(f"{self.at(_ATOM)}[0]")


Cond = _E | bool  # a condition known only per row, or already at compile time


def _string(text: str) -> str:
    """A SQL string literal. Text with quotes, backslashes or control characters goes through
    hex, which reads the same whatever ``spark.sql.parser.escapedStringLiterals`` says."""
    if text.isprintable() and "'" not in text and "\\" not in text:
        return f"'{text}'"
    return f"decode(unhex('{text.encode().hex()}'), 'UTF-8')"


def _sql(value: _E | SqlScalar) -> str:
    if isinstance(value, _E):
        return value.sql
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        if -(2**31) < value < 2**31:
            return str(value)
        if -(2**63) < value < 2**63:
            return f"{value}L"
        return f"CAST('{value}' AS {_DEC})"
    if isinstance(value, float):
        text = "NaN" if math.isnan(value) else repr(value).replace("inf", "Infinity")
        return f"CAST('{text}' AS DOUBLE)"
    return _string(value)


def _lit(value: SqlScalar) -> _E:
    text = _sql(value)
    return _E(text, _UNARY if text.startswith("-") else _ATOM)


def _null(type_: str) -> _E:
    return _E(f"CAST(NULL AS {type_})", _ATOM, type_)


def _f(name: str, *args: _E | SqlScalar) -> _E:
    return _E(f"{name}({', '.join(_sql(a) for a in args)})")


_names = itertools.count()


def _lambda(body: Callable[..., _E], arity: int = 1) -> str:
    names = [f"lv{next(_names)}" for _ in range(arity)]
    params = names[0] if arity == 1 else "(" + ", ".join(names) + ")"
    return f"{params} -> {body(*(_E(n) for n in names)).sql}"


def _hof(name: str, arr: _E, body: Callable[..., _E], arity: int = 1) -> _E:
    return _E(f"{name}({arr.sql}, {_lambda(body, arity)})")


def _transform(arr: _E, body: Callable[[_E], _E]) -> _E:
    return _hof("transform", arr, body)


def _exists(arr: _E, body: Callable[[_E], _E]) -> _E:
    return _hof("exists", arr, body)


def _aggregate(arr: _E, zero: _E, merge: Callable[[_E, _E], _E]) -> _E:
    return _E(f"aggregate({arr.sql}, {zero.sql}, {_lambda(merge, 2)})")


def _let(value: _E, body: Callable[[_E], _E]) -> _E:
    """``body(value)`` with ``value`` computed once.

    Spark SQL has no let, but a lambda binds its argument; nothing else is shared inside
    higher-order functions, so a value used twice is otherwise computed twice, and repeated
    subexpressions can grow exponentially with the nesting of the filter. Each binding nests
    two function calls, though, which costs the analyzer passes: values that are cheap field
    references are repeated instead (``_bound``, ``_Vals.cheap``).
    """
    return _transform(_f("array", value), body).first()


def _case(branches: Iterable[tuple[Cond, _E]], default: _E) -> _E:
    """CASE WHEN ... END, leaving out the branches decided at compile time."""
    parts: list[str] = []
    types: set[str | None] = set()
    for cond, value in branches:
        if cond is False:
            continue
        if cond is True:
            default = value
            break
        parts.append(f"WHEN {cond.sql} THEN {value.sql}")
        types.add(value.type)
    if not parts:
        return default
    types.add(default.type)
    known = types.pop() if len(types) == 1 else None
    return _E(f"CASE {' '.join(parts)} ELSE {default.sql} END", _ATOM, known)


def _and(*conds: Cond) -> Cond:
    parts = [c for c in conds if c is not True]
    if any(c is False for c in parts):
        return False
    rows = [c for c in parts if isinstance(c, _E)]
    return _all_of(rows) if rows else True


def _or(*conds: Cond) -> Cond:
    parts = [c for c in conds if c is not False]
    if any(c is True for c in parts):
        return True
    rows = [c for c in parts if isinstance(c, _E)]
    return _any_of(rows) if rows else False


def _not(cond: Cond) -> Cond:
    return (not cond) if isinstance(cond, bool) else ~cond


def _cond(cond: Cond) -> _E:
    return _lit(cond) if isinstance(cond, bool) else cond


def _all_of(parts: Sequence[_E]) -> _E:
    return functools.reduce(lambda a, b: a & b, parts)


def _any_of(parts: Sequence[_E]) -> _E:
    return functools.reduce(lambda a, b: a | b, parts)


# ============================================================================ values


@dataclass(frozen=True)
class _Val:
    """One value. Only the field of its kind is set, so e.g. ``b`` is NULL unless a boolean.

    Fields are cheap expressions (of a lambda variable, or literals), so they can be repeated.
    """

    t: _E
    s: _E
    i: _E
    d: _E
    b: _E
    x: _E
    # The numeric reading (numbers, and strings that spell one): double, exact integer, and
    # whether of integer type. Filled in for the paths that take part in numeric operations.
    nd: _E
    ni: _E
    nk: _E
    kinds: frozenset[int]  # the kinds ``t`` can take, known at compile time
    nan: bool = False  # whether ``d`` can be NaN (only arithmetic makes NaN)
    text: bool = False  # whether ``x`` holds the text (else it is worked out when needed)
    number: bool = False  # whether nd, ni and nk hold the numeric reading
    const: tuple[ast.Scalar] | None = None  # (value,) for a literal


def _value(
    kinds: Iterable[int],
    t: _E,
    *,
    s: _E | None = None,
    i: _E | None = None,
    d: _E | None = None,
    b: _E | None = None,
    x: _E | None = None,
    const: tuple[ast.Scalar] | None = None,
) -> _Val:
    return _Val(
        t=t,
        s=_null("STRING") if s is None else s,
        i=_null(_DEC) if i is None else i,
        d=_null("DOUBLE") if d is None else d,
        b=_null("BOOLEAN") if b is None else b,
        x=_null("STRING") if x is None else x,
        nd=_null("DOUBLE"),
        ni=_null(_DEC),
        nk=_null("BOOLEAN"),
        kinds=frozenset(kinds),
        text=x is not None,
        const=const,
    )


def _pack(v: _Val) -> _E:
    return _f(
        "named_struct",
        "t",
        v.t.cast("INT"),
        "s",
        v.s.cast("STRING"),
        "i",
        v.i.cast(_DEC),
        "d",
        v.d.cast("DOUBLE"),
        "b",
        v.b.cast("BOOLEAN"),
        "x",
        v.x.cast("STRING"),
        "nd",
        v.nd.cast("DOUBLE"),
        "ni",
        v.ni.cast(_DEC),
        "nk",
        v.nk.cast("BOOLEAN"),
    )


def _to_float(value: int) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.copysign(_INF, value)


def _literal(value: ast.Scalar) -> _Val:
    const = (value,)
    if value is None or value == "":
        return _value({_NULL}, _lit(_NULL), const=(None,))
    if isinstance(value, bool):
        return _value({_BOOL}, _lit(_BOOL), b=_lit(value), const=const)
    if isinstance(value, str):
        return _value({_STR}, _lit(_STR), s=_lit(value), const=const)
    if isinstance(value, int):
        exact = abs(value) < _DEC_LIMIT
        i = _lit(value).cast(_DEC) if exact else None
        return _value({_INT}, _lit(_INT), i=i, d=_lit(_to_float(value)), const=const)
    v = _value({_FLT}, _lit(_FLT), d=_lit(value), const=const)
    return replace(v, nan=math.isnan(value))


def _null_struct() -> _E:
    return _pack(_literal(None))


@dataclass(frozen=True)
class _Vals:
    """An expression's values: one literal (``one``) or an ``array<struct>`` (``many``).

    Computed values are always arrays, even of one element: consumers then read them through
    a lambda variable, which keeps every field reference cheap.
    """

    kinds: frozenset[int]
    nan: bool = False
    text: bool = False
    number: bool = False
    one: _Val | None = None
    many: _E | None = None
    cheap: bool = False  # ``many`` is a reference (bound once already): no need to bind it


def _one(v: _Val) -> _Vals:
    return _Vals(v.kinds, v.nan, v.text, v.number, one=v)


def _element(vs: _Vals, x: _E) -> _Val:
    return _Val(
        x["t"], x["s"], x["i"], x["d"], x["b"], x["x"], x["nd"], x["ni"], x["nk"],
        vs.kinds, vs.nan, vs.text, vs.number,
    )  # fmt: skip


def _many(vs: _Vals) -> _E:
    assert vs.many is not None
    return vs.many


def _any(vs: _Vals, test: Callable[[_Val], _E]) -> _E:
    """ANY in three-valued logic: TRUE if a value passes, else UNKNOWN if one is UNKNOWN."""
    if vs.one is not None:
        return test(vs.one)
    return _exists(_many(vs), lambda x: test(_element(vs, x)))


def _bind(vss: Sequence[_Vals], body: Callable[[list[_Vals]], _E], *, skip: int = 0) -> _E:
    """``body`` with the arrays of ``vss`` (all but the first ``skip``) computed once."""
    out: list[_Vals] = []

    def step(k: int) -> _E:
        if k == len(vss):
            return body(out)
        vs = vss[k]
        if vs.many is None or vs.cheap or k < skip:
            out.append(vs)
            return step(k + 1)

        def bound(arr: _E) -> _E:
            out.append(replace(vs, many=arr, cheap=True))
            return step(k + 1)

        return _let(vs.many, bound)

    return step(0)


def _outer(vss: Sequence[_Vals]) -> int:
    """How many leading operands need no binding: up to the first array, the outermost loop."""
    for k, vs in enumerate(vss):
        if vs.many is not None:
            return k + 1
    return len(vss)


def _product(
    vss: Sequence[_Vals],
    fn: Callable[[list[_Val]], _E],
    kinds: Iterable[int],
    *,
    nan: bool = False,
    text: bool = False,
) -> _Vals:
    """``fn`` (giving a packed value) over every combination of the operands' values."""

    def build(bound: list[_Vals]) -> _E:
        def rec(k: int, chosen: list[_Val]) -> tuple[_E, bool]:
            if k == len(bound):
                return fn(chosen), False
            vs = bound[k]
            if vs.one is not None:
                return rec(k + 1, [*chosen, vs.one])
            nested = [False]

            def body(x: _E) -> _E:
                out, is_array = rec(k + 1, [*chosen, _element(vs, x)])
                nested[0] = is_array
                return out

            mapped = _transform(_many(vs), body)
            return (_f("flatten", mapped) if nested[0] else mapped), True

        out, is_array = rec(0, [])
        return out if is_array else _f("array", out)

    many = _bind(vss, build, skip=_outer(vss))
    return _Vals(frozenset(kinds), nan, text, many=many)


def _any_product(vss: Sequence[_Vals], test: Callable[[list[_Val]], _E]) -> _E:
    """ANY of ``test`` over every combination of the operands' values."""

    def build(bound: list[_Vals]) -> _E:
        def rec(k: int, chosen: list[_Val]) -> _E:
            if k == len(bound):
                return test(chosen)
            vs = bound[k]
            if vs.one is not None:
                return rec(k + 1, [*chosen, vs.one])
            return _exists(_many(vs), lambda x: rec(k + 1, [*chosen, _element(vs, x)]))

        return rec(0, [])

    return _bind(vss, build, skip=_outer(vss))


def _is(v: _Val, kinds: frozenset[int]) -> Cond:
    """Whether ``v`` is of one of ``kinds``, decided at compile time when its kinds allow."""
    want = v.kinds & kinds
    if not want:
        return False
    if v.kinds <= kinds:
        return True
    if len(want) == 1:
        return v.t.eq(next(iter(want)))
    return v.t.isin(*sorted(want))


# ============================================================================ numbers


@dataclass(frozen=True)
class _Num:
    """The numeric reading of a value (numbers, and strings that spell one)."""

    ok: Cond  # it is a number
    isint: Cond  # of integer type (a Python int)
    exact: Cond  # an integer held exactly in ``i``
    i: _E  # decimal(38,0)
    d: _E  # double
    big: Cond  # its magnitude may be 2**53 or more (only then are doubles inexact for integers)
    nan: bool  # it may be NaN


def _num_const(value: ast.Scalar) -> _Num:
    number: int | float | None = None
    if isinstance(value, str):
        number = str_to_number(value) if value else None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = value
    if number is None:
        return _Num(False, False, False, _null(_DEC), _null("DOUBLE"), False, False)
    if isinstance(number, int):
        exact = abs(number) < _DEC_LIMIT
        i = _lit(number).cast(_DEC) if exact else _null(_DEC)
        d = _lit(_to_float(number))
        return _Num(True, True, exact, i, d, abs(number) >= 2**53, False)
    big = not abs(number) < _TWO53
    return _Num(True, False, False, _null(_DEC), _lit(number), big, math.isnan(number))


def _num(v: _Val) -> tuple[_Num, bool]:
    """``v``'s numeric reading, and whether it parses a string (then worth binding once)."""
    if v.const is not None:
        return _num_const(v.const[0]), False
    if v.number:
        big = _f("abs", v.nd).ge(_TWO53)
        return _Num(v.nd.not_null(), v.nk, v.ni.not_null(), v.ni, v.nd, big, v.nan), False
    big = _f("abs", v.d).ge(_TWO53)
    if _STR not in v.kinds:
        is_int = _is(v, _INTEGER)
        exact = _and(is_int, v.i.not_null()) if is_int is not False else False
        return _Num(_is(v, _NUMERIC), is_int, exact, v.i, v.d, big, v.nan), False
    trimmed = _f("btrim", v.s, _SPACES)
    is_number = _f("coalesce", v.s.rlike(_JAVA_NUMBER), False)
    is_integer = _f("coalesce", v.s.rlike(_JAVA_INTEGER), False)
    i = _case([(is_integer, trimmed.try_cast(_DEC))], _null(_DEC))
    d = _case([(is_number, trimmed.try_cast("DOUBLE"))], _null("DOUBLE"))
    if _INT in v.kinds:
        i = _f("coalesce", v.i, i)
    if v.kinds & _NUMERIC:
        d = _f("coalesce", v.d, d)
    ok = _or(_is(v, _NUMERIC), is_number)
    isint = _or(_is(v, _INTEGER), is_integer)
    return _Num(ok, isint, i.not_null(), i, d, big, v.nan), True


def _with_nums(vals: Sequence[_Val], body: Callable[[list[_Num]], _E]) -> _E:
    """``body`` over the values' numeric readings, each string parsed once."""
    readings = [_num(v) for v in vals]
    if not any(parsed for _, parsed in readings):
        return body([n for n, _ in readings])
    fields: list[_E | SqlScalar] = []
    for k, (n, parsed) in enumerate(readings):
        if parsed:
            packed = _f(
                "named_struct", "ok", _cond(n.ok), "isint", _cond(n.isint), "i", n.i, "d", n.d
            )
            fields += [f"n{k}", packed]

    def bound(p: _E) -> _E:
        nums = []
        for k, (n, parsed) in enumerate(readings):
            if parsed:
                x = p[f"n{k}"]
                big = _f("abs", x["d"]).ge(_TWO53)
                n = _Num(x["ok"], x["isint"], x["i"].not_null(), x["i"], x["d"], big, n.nan)
            nums.append(n)
        return body(nums)

    return _let(_f("named_struct", *fields), bound)


def _sign(a: _E, b: _E) -> _E:
    return _case([(a.lt(b), _lit(-1)), (a.gt(b), _lit(1))], _lit(0))


def _exact_decimal(f: _E) -> _E:
    """The exact value of an integral double below 10**38 in magnitude, as decimal(38,0).

    Spark's cast goes through the shortest decimal string (1e23 becomes 10**23, whereas the
    double is 99999999999999991611392). Here f = q * 2**k with q below 2**56, exactly, and Spark
    multiplies those integers exactly.
    """

    k = _f("greatest", _f("floor", _f("log2", _f("abs", f))).cast("INT") - 54, 0)
    q = (f / _f("pow", 2.0, k)).cast("BIGINT").cast(_DEC)
    low = _f("pow", 2.0, _f("least", k, 62)).cast("BIGINT").cast(_DEC)
    high = _f("pow", 2.0, _f("greatest", k - 62, 0)).cast("BIGINT").cast(_DEC)
    return q * (low * high)


def _order(x: _Num, y: _Num) -> _E:
    """-1, 0 or 1 as Python orders two numbers, 2 if unordered (NaN), NULL if not numbers."""
    nan = _or(_f("isnan", x.d) if x.nan else False, _f("isnan", y.d) if y.nan else False)

    def exactly(a: _E, b: _E) -> _E:  # a and b are within one unit of each other
        return _f("signum", a - b).cast("INT")

    by_double = _case(
        [
            (nan, _lit(2)),
            (x.d.lt(y.d), _lit(-1)),
            (x.d.gt(y.d), _lit(1)),
            # Equal doubles: an exact integer may still differ from a float beyond 2**53.
            (_and(x.exact, _not(y.isint), x.big, y.big), exactly(x.i, _exact_decimal(y.d))),
            (_and(y.exact, _not(x.isint), x.big, y.big), exactly(_exact_decimal(x.d), y.i)),
        ],
        _lit(0),
    )
    return _case(
        [(_not(_and(x.ok, y.ok)), _null("INT")), (_and(x.exact, y.exact), _sign(x.i, y.i))],
        by_double,
    )


def _holds(order: _E, op: str) -> _E:
    """Whether ``op`` holds for an ``_order`` result (NaN: only ``!=``)."""
    match op:
        case "=":
            return order.eq(0)
        case "!=":
            return order.ne(0)
        case "<":
            return order.eq(-1)
        case "<=":
            return order.isin(-1, 0)
        case ">":
            return order.eq(1)
        case ">=":
            return order.isin(0, 1)
    raise ValueError(f"not a comparison operator: {op}")


_SQL_OPS = {"=": "=", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def _narrow(v: _Val, kinds: frozenset[int]) -> _Val:
    return v if v.const is not None else replace(v, kinds=v.kinds & kinds)


def _compare(a: _Val, b: _Val, op: str) -> _E:
    """One comparison under the language's typing rules (``evaluate._compare``)."""
    strings = _and(_is(a, _STRING), _is(b, _STRING))
    numbers = _or(_is(a, _NUMERIC), _is(b, _NUMERIC))
    branches: list[tuple[Cond, _E]] = []
    if strings is not False:
        branches.append((strings, a.s.op(_SQL_OPS[op], b.s)))
    if numbers is not False:
        # In this branch one side is a number; if the other cannot be, the one must be.
        x = a if b.kinds & _NUMERIC else _narrow(a, _NUMERIC)
        y = b if a.kinds & _NUMERIC else _narrow(b, _NUMERIC)
        branches.append((numbers, _with_nums([x, y], lambda n: _holds(_order(*n), op))))
    # Whatever is left compares only if both are booleans (b is NULL for anything else).
    both_bool = _BOOL in a.kinds and _BOOL in b.kinds
    return _case(branches, a.b.op(_SQL_OPS[op], b.b) if both_bool else _null("BOOLEAN"))


# ============================================================================ text


def _py_text(value: ast.Scalar) -> str | None:
    """The text of a literal, as ``evaluate._text`` spells it."""
    if value is None or value == "":
        return None
    return value if isinstance(value, str) else canonical_text(value)


def _big_integral_text(d: _E) -> _E:
    """Exact digits of an integral double of 10**38 or more (Python's ``str(int(d))``).

    d = q * 2**k; q's digits in base-10**9 limbs are doubled k times. A doubled limb carries at
    most 1, and only into the next limb, so each doubling is a single ``transform``.
    """

    k = _f("floor", _f("log2", _f("abs", d))).cast("INT") - 54
    q = _f("lpad", (_f("abs", d) / _f("pow", 2.0, k)).cast("BIGINT").cast("STRING"), 27, "0")
    start = _f("array", *(_f("substring", q, p, 9).cast("BIGINT") for p in (19, 10, 1)))

    def double(acc: _E, _: _E) -> _E:
        def limb(x: _E, j: _E) -> _E:
            below = _f("element_at", acc, _f("greatest", j, 1))
            carry = _case([(j.gt(0) & (below * 2).ge(_LIMB), _lit(1))], _lit(0))
            return (x * 2) % _LIMB + carry

        top = _case(
            [((_f("element_at", acc, -1) * 2).ge(_LIMB), _f("array", _lit(1).cast("BIGINT")))],
            _f("array").cast("ARRAY<BIGINT>"),
        )
        return _f("concat", _hof("transform", acc, limb, 2), top)

    # Every limb padded to nine digits, most significant first, then leading zeros dropped.
    limbs = _aggregate(_f("sequence", 1, k), start, double)
    padded = _transform(limbs, lambda x: _f("lpad", x.cast("STRING"), 9, "0"))
    digits = _f("array_join", _f("reverse", padded), "")
    text = _f("regexp_replace", digits, "^0+(?=[0-9])", "")
    return _f("concat", _case([(d.lt(0), _lit("-"))], _lit("")), text)


def _integral_text(d: _E) -> _E:
    """Python's ``str(int(d))`` for a finite integral double."""
    a = _f("abs", d)
    return _case(
        [
            (a.lt(_TWO63), d.cast("BIGINT").cast("STRING")),
            (a.lt(1e38), _exact_decimal(d).cast("STRING")),
        ],
        _big_integral_text(d),
    )


def _fraction_text(d: _E) -> _E:
    """Python's ``repr`` of a finite non-integral double, from Spark's (shortest) digits.

    Spark writes 1.0E-5 and 1.23456789123E8 where Python writes 1e-05 and 123456789.123.
    """

    js = _f("abs", d).cast("STRING")
    digits = _f("regexp_replace", js, "^([0-9])[.]([0-9]*?)0*E.*$", "$1$2")  # 1.50E-7: 15
    e = _f("substring_index", js, "E", -1).cast("INT")
    small = _f(
        "concat",
        _f("regexp_replace", digits, "^(.)(.+)$", "$1.$2"),
        "e-",
        _f("format_string", "%02d", -e),
    )
    fraction = _f("concat", "0.", _f("repeat", "0", -e - 1), digits)
    large = _f("concat", _f("substring", digits, 1, e + 1), ".", _f("substring", digits, e + 2))
    body = _case([(_f("instr", js, "E").eq(0), js), (e.lt(-4), small), (e.lt(0), fraction)], large)
    return _f("concat", _case([(d.lt(0), _lit("-"))], _lit("")), body)


def _float_text(d: _E) -> _E:
    """``canonical_text`` of a float: nan, inf, integral values without ``.0``, else repr."""
    return _case(
        [
            (d.is_null(), _null("STRING")),
            (_f("isnan", d), _lit("nan")),
            (d.eq(_INF), _lit("inf")),
            (d.eq(-_INF), _lit("-inf")),
            ((d % 1.0).eq(0), _integral_text(d)),
        ],
        _fraction_text(d),
    )


def _text(v: _Val) -> _E:
    """The text string predicates and functions see (``evaluate._text``); NULL if none."""
    if v.text:
        return v.x
    if v.const is not None:
        return _lit(_py_text(v.const[0])).cast("STRING")
    parts: list[_E] = []
    if _STR in v.kinds:
        parts.append(v.s)
    if _BOOL in v.kinds:
        parts.append(_case([(v.b, _lit("true")), (~v.b, _lit("false"))], _null("STRING")))
    if _INT in v.kinds:
        parts.append(v.i.cast("STRING"))
    if v.kinds & _NUMERIC:  # floats, and integers too large to hold exactly
        parts.append(_float_text(v.d))
    if not parts:
        return _null("STRING")
    return parts[0] if len(parts) == 1 else _f("coalesce", *parts)


def _cheap_text(v: _Val) -> bool:
    """Whether ``_text(v)`` is a mere field reference or literal (so it can be repeated)."""
    return v.text or v.const is not None or v.kinds <= {_NULL, _STR}


def _bound(value: _E, body: Callable[[_E], _E], *, cheap: bool) -> _E:
    """``body(value)``, binding ``value`` first unless it is cheap to repeat."""
    return body(value) if cheap else _let(value, body)


def _text_value(text: _E, *, cheap: bool = False) -> _E:
    """A packed string value ("" and NULL are NULL)."""

    def pack(s: _E) -> _E:
        present = s.not_null() & s.ne("")
        kind = _case([(present, _lit(_STR))], _lit(_NULL))
        value = _case([(present, s)], _null("STRING"))
        return _pack(_value({_NULL, _STR}, kind, s=value, x=value))

    return _bound(text, pack, cheap=cheap)


def _int_value(n: _E, *, cheap: bool = False) -> _E:
    def pack(x: _E) -> _E:
        kind = _case([(x.is_null(), _lit(_NULL))], _lit(_INT))
        return _pack(_value({_NULL, _INT}, kind, i=x, d=x, x=x.cast("STRING")))

    return _bound(n, pack, cheap=cheap)


def _bool_value(p: _E, *, cheap: bool = False) -> _E:
    def pack(x: _E) -> _E:
        kind = _case([(x.is_null(), _lit(_NULL))], _lit(_BOOL))
        text = _case([(x, _lit("true")), (~x, _lit("false"))], _null("STRING"))
        return _pack(_value({_NULL, _BOOL}, kind, b=x, x=text))

    return _bound(p, pack, cheap=cheap)


# ============================================================================ arithmetic


def _arith(op: str, a: _Val, b: _Val) -> _E:
    """A packed value: ``evaluate._compile_arith`` on one pair of values."""
    kinds = {_NULL, _INT, _FLT}
    null = _null("DOUBLE")

    def body(n: list[_Num]) -> _E:
        x, y = n
        bad = _not(_and(x.ok, y.ok))
        both_int = _and(x.isint, y.isint)
        both_exact = _and(x.exact, y.exact)
        if op in ("+", "-", "*"):
            exact_op = {"+": "try_add", "-": "try_subtract", "*": "try_multiply"}[op]
            float_d = x.d.op(op, y.d)
            i = _null(_DEC)
            d = float_d
            if both_exact is not False:  # exact, or past 38 digits the double approximation
                i = _case([(both_exact, _f(exact_op, x.i, y.i))], _null(_DEC))
                d = _f("coalesce", i.cast("DOUBLE"), float_d)
            kind = _case([(bad, _lit(_NULL)), (both_int, _lit(_INT))], _lit(_FLT))
            return _pack(_value(kinds, kind, i=i, d=d))
        zero = y.d.eq(0)
        if op == "/":
            kind = _case([(bad, _lit(_NULL)), (zero, _lit(_NULL))], _lit(_FLT))
            return _pack(_value(kinds, kind, d=_case([(zero, null)], x.d / y.d)))
        # % takes the dividend's sign; Python's math.fmod refuses an infinite dividend.
        refused = _f("abs", x.d).eq(_INF) & ~_f("isnan", y.d)
        i = _null(_DEC)
        int_d = x.d % y.d
        if both_exact is not False:
            i = _case([(zero, _null(_DEC)), (both_exact, x.i % y.i)], _null(_DEC))
            int_d = _f("coalesce", i.cast("DOUBLE"), x.d % y.d)
        branches: list[tuple[Cond, _E]] = [(bad, null), (zero, null), (both_int, int_d)]
        d = _case([*branches, (refused, null)], x.d % y.d)
        kind = _case(
            [
                (bad, _lit(_NULL)),
                (zero, _lit(_NULL)),
                (both_int, _lit(_INT)),
                (refused, _lit(_NULL)),
            ],
            _lit(_FLT),
        )
        return _pack(_value(kinds, kind, i=i, d=d))

    return _with_nums([a, b], body)


def _negate(a: _Val) -> _E:
    def body(n: list[_Num]) -> _E:
        (x,) = n
        kind = _case([(_not(x.ok), _lit(_NULL)), (x.isint, _lit(_INT))], _lit(_FLT))
        return _pack(_value({_NULL, _INT, _FLT}, kind, i=-x.i, d=-x.d))

    return _with_nums([a], body)


def _may_nan(vss: Iterable[_Vals]) -> bool:
    # Infinities come from floats and numeric strings ("1e999"); inf - inf is NaN.
    return any(vs.nan or vs.kinds & {_STR, _FLT} for vs in vss)


# ============================================================================ JSON paths


def _as_array(v: _E) -> _E:
    return _f("try_variant_get", v, "$", "array<variant>")


def _leaf(n: _E) -> _E:
    """A packed value for a variant that is not an array.

    The variant's type name is asked for at each use rather than bound once: binding would
    nest one more lambda, and a scalar's type name is cheap.
    """
    ty = _f("schema_of_variant", n)
    text = _f("try_variant_get", n, "$", "string").typed("STRING")
    dec = _f("try_variant_get", n, "$", "decimal(38,0)").typed(_DEC)
    is_str = ty.eq("STRING") & text.ne("")
    is_bool = ty.eq("BOOLEAN")
    # orjson reads integers up to 2**64-1 as int and larger ones as float; Spark keeps
    # integers beyond a long as DECIMAL(p,0), the same as a float written "1.0".
    is_int = ty.isin("TINYINT", "SMALLINT", "INT", "BIGINT") | (
        _f("endswith", ty, ",0)") & dec.gt(_LONG_MAX) & dec.le(_U64_MAX)
    )
    is_number = _f("startswith", ty, "DECIMAL(") | ty.isin(
        "TINYINT", "SMALLINT", "INT", "BIGINT", "DOUBLE", "FLOAT"
    )
    kind = _case(
        [
            (is_str, _lit(_STR)),
            (is_bool, _lit(_BOOL)),
            (is_int, _lit(_INT)),
            (is_number, _lit(_FLT)),
            (ty.isin("STRING", "VOID"), _lit(_NULL)),
        ],
        _lit(_OBJ),
    )
    double = _f("try_variant_get", n, "$", "double").typed("DOUBLE")
    boolean = _f("try_variant_get", n, "$", "boolean").typed("BOOLEAN")
    return _pack(
        _value(
            _ALL,
            kind,
            s=_case([(is_str, text)], _null("STRING")),
            i=_case([(is_int, dec)], _null(_DEC)),
            d=_case([(is_number, double)], _null("DOUBLE")),
            b=_case([(is_bool, boolean)], _null("BOOLEAN")),
        )
    )


def _with_reading(v: _Val) -> _Val:
    """``v`` with its numeric reading in nd, ni and nk."""
    reading, _ = _num(v)
    return replace(v, nd=reading.d, ni=reading.i, nk=_cond(reading.isint), number=True)


_NODES = "ARRAY<STRUCT<v: VARIANT, s: INT>>"


def _path(root: _E, rounds: _E, steps: tuple[str, ...], *, text: bool, number: bool) -> _E:
    """The values a path reads from the parsed record (an empty array if none).

    Spark expressions cannot recurse, so the walk is a loop over (variant, steps taken) pairs:
    each round replaces an array by its elements (arrays nest) or an object by its value at the
    next key, dropping what has no such key. ``rounds`` bounds the rounds needed: the path's
    length plus the number of ``[`` in the text, as deep as arrays can nest. A loop of fixed
    shape also keeps the expression's nesting the same for a path of any length, which is
    what the analyzer's cost depends on (see ``_let``).
    """
    end = len(steps)

    def node(v: _E, s: _E | int) -> _E:
        return _f("named_struct", "v", v, "s", s)

    def finished(e: _E) -> _E:
        return e["s"].eq(end) & _as_array(e["v"]).is_null()

    def advance(e: _E) -> _E:
        elements = _transform(_as_array(e["v"]), lambda x: node(x, e["s"]))
        branches: list[tuple[Cond, _E]] = [(_as_array(e["v"]).not_null(), elements)]
        for taken, key in enumerate(steps):
            child = _f("try_variant_get", e["v"], f'$["{key}"]', "variant")
            found = _case([(child.not_null(), _f("array", node(child, taken + 1)))], _null(_NODES))
            branches.append((e["s"].eq(taken), found))
        return _f("coalesce", _case(branches, _f("array", e)), _E(f"CAST(array() AS {_NODES})"))

    def step(acc: _E, _: _E) -> _E:
        return _case(
            [(_hof("forall", acc, finished), acc)], _f("flatten", _transform(acc, advance))
        )

    def leaves(acc: _E) -> _E:
        return _transform(acc, lambda e: _leaf(e["v"]))

    start = _f("array", node(root, 0))
    loop = _f("array_repeat", 0, rounds + end)
    values = _E(f"aggregate({loop.sql}, {start.sql}, {_lambda(step, 2)}, {_lambda(leaves)})")
    if text or number:

        def extend(x: _E) -> _E:
            v = _element(_Vals(_ALL), x)
            v = replace(v, x=_text(v)) if text else v
            return _pack(_with_reading(v) if number else v)

        values = _transform(values, extend)
    return values


def _present(values: _E) -> _E:
    """``values``, or one NULL if empty: the evaluator reads no value as NULL (cheap to repeat
    on a bound array)."""
    return _case([(_f("size", values).gt(0), values)], _f("array", _null_struct()))


# ============================================================================ compiler


def _direct_paths(node: ast.Expr) -> set[str]:
    """Paths whose own values ``node`` yields (through COALESCE too)."""
    if isinstance(node, ast.Path):
        return {node.text}
    if isinstance(node, ast.Func) and node.name == "COALESCE":
        return set().union(*(_direct_paths(a) for a in node.args))
    return set()


def _text_paths(tree: ast.Expr) -> set[str]:
    """The paths whose text some LIKE, BEGINS/ENDS WITH or string function reads."""
    out: set[str] = set()
    for node in ast.walk(tree):
        match node:
            case ast.Like(value=value):
                out |= _direct_paths(value)
            case (
                ast.BeginsWith(value=value, prefixes=items)
                | ast.EndsWith(value=value, suffixes=items)
            ):
                for item in (value, *items):
                    out |= _direct_paths(item)
            case ast.Func(name=name, args=args) if name in _TEXT_FUNCTIONS:
                for arg in args:
                    out |= _direct_paths(arg)
    return out


def _may_be_number(node: ast.Expr) -> bool:
    """Whether ``node`` can have a value of a numeric kind (a numeric string is a string)."""
    if isinstance(node, ast.Literal):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool)
    return not isinstance(node, ast.Func) or node.name not in ("UPPER", "LOWER", "CONCAT")


def _number_paths(tree: ast.Expr) -> set[str]:
    """The paths whose strings may have to be read as numbers: those compared with something
    that may be a number, and those in arithmetic."""
    out: set[str] = set()

    def pair(left: ast.Expr, right: ast.Expr) -> None:
        nonlocal out
        if _may_be_number(right):
            out |= _direct_paths(left)
        if _may_be_number(left):
            out |= _direct_paths(right)

    for node in ast.walk(tree):
        match node:
            case ast.Compare(left=left, right=right):
                pair(left, right)
            case ast.In(value=value, options=items):
                for item in items:
                    pair(value, item)
            case ast.Between(value=value, low=low, high=high):
                pair(value, low)
                pair(value, high)
            case ast.Arith(left=left, right=right):
                out |= _direct_paths(left) | _direct_paths(right)
            case ast.Neg(operand=operand):
                out |= _direct_paths(operand)
    return out


def _is_word(value: ast.Scalar) -> bool:
    """A non-empty string that does not spell a number: it equals only itself."""
    return isinstance(value, str) and bool(value) and str_to_number(value) is None


@dataclass(frozen=True)
class _Source:
    """A parsed filter and the text its node positions point into (for error messages)."""

    text: str
    positions: bool  # whether node positions refer to ``text`` (not so for hand-built trees)
    tree: ast.Expr


class _Compiler:
    """Turns filter trees into SQL over ``paths``, each distinct path's values read once."""

    def __init__(self, sources: Sequence[_Source]) -> None:
        self.source = sources[0]
        self.texts = set().union(*(_text_paths(s.tree) for s in sources))
        self.numbers = set().union(*(_number_paths(s.tree) for s in sources))
        self.order = sorted(set().union(*(ast.paths(s.tree) for s in sources)))
        self.paths: dict[str, _E] = {}
        for source in sources:
            self.source = source
            for node in ast.walk(source.tree):
                if isinstance(node, ast.Path) and any(
                    ("'" in k or '"' in k or "\\" in k) for k in node.steps
                ):
                    raise self.error(f"the path {node.text} cannot be addressed on Spark", node)

    def error(self, message: str, node: ast.Expr) -> FilterError:
        src = self.source
        position = node.pos if src.positions and node.pos >= 0 else 0
        return FilterError(message, text=src.text, position=position)

    def truth(self, source: _Source) -> _E:
        """The three-valued result of one of the filters."""
        self.source = source
        return self.pred(source.tree)

    def with_paths(self, body_col: str, build: Callable[[], _E]) -> _E:
        """``build()`` with the record parsed once and every path of the tree read once."""

        def with_root(record: _E) -> _E:
            def reads(path: str) -> _E:
                steps = ast.Path(path).steps
                text, number = path in self.texts, path in self.numbers
                return _path(record["r"], record["n"], steps, text=text, number=number)

            if len(self.order) == 1:

                def one(values: _E) -> _E:
                    self.paths[self.order[0]] = _present(values)
                    return build()

                return _let(reads(self.order[0]), one)

            fields: list[_E | SqlScalar] = []
            for k, path in enumerate(self.order):
                fields += [f"p{k}", reads(path)]

            def many(values: _E) -> _E:
                for k, path in enumerate(self.order):
                    self.paths[path] = _present(values[f"p{k}"])
                return build()

            return _let(_f("named_struct", *fields), many)

        body = _E(_column(body_col))
        # Every '[' may open an array: their number bounds how deep arrays nest.
        brackets = _f("length", body) - _f("length", _f("replace", body, "[", ""))
        record = _f("named_struct", "r", _f("try_parse_json", body), "n", brackets)
        return _let(record, with_root)

    # ---------------------------------------------------------------- predicates

    def pred(self, node: ast.Expr) -> _E:
        """The three-valued truth of ``node`` (NULL for UNKNOWN)."""
        if not ast.paths(node):
            # Nothing is read from the record: the evaluator's answer is the answer.
            return _lit(compile_predicate(node)({})).cast("BOOLEAN")
        match node:
            case ast.Compare(op=op, left=left, right=right):
                operands = [self.vals(left), self.vals(right)]
                return _any_product(operands, lambda v: _compare(v[0], v[1], op))
            case ast.And(operands=ops):
                return _all_of([self.pred(o) for o in ops])
            case ast.Or(operands=ops):
                return _any_of([self.pred(o) for o in ops])
            case ast.Not(operand=operand):
                return ~self.pred(operand)
            case ast.In():
                return self.in_(node)
            case ast.Between(value=value, low=low, high=high):
                return self.between(value, low, high)
            case ast.Like(value=value, pattern=pattern):
                try:
                    java = java_regex(pattern)
                except UnsupportedRegexError as exc:
                    raise self.error(f"LIKE pattern cannot run on Spark: {exc}", node) from None
                return _any(self.vals(value), lambda x: _text(x).rlike(java))
            case ast.IsNull(value=value):
                vs = self.vals(value)
                if vs.one is not None:
                    return _lit(vs.one.const is None or _py_text(vs.one.const[0]) is None)
                return _hof("forall", _many(vs), lambda x: x["t"].eq(_NULL))
            case ast.BeginsWith(value=value, prefixes=items):
                return self.affix(value, items, ends=False)
            case ast.EndsWith(value=value, suffixes=items):
                return self.affix(value, items, ends=True)
        # A value where a condition is expected means `value = TRUE`.
        return _any(self.vals(node), lambda x: x.b if _BOOL in x.kinds else _null("BOOLEAN"))

    def in_(self, node: ast.In) -> _E:
        value = self.vals(node.value)
        # Strings that spell no number equal only themselves: one IN list covers them all.
        words = sorted(
            {
                o.value
                for o in node.options
                if isinstance(o, ast.Literal) and isinstance(o.value, str) and _is_word(o.value)
            }
        )
        others = [
            self.vals(o)
            for o in node.options
            if not (isinstance(o, ast.Literal) and _is_word(o.value))
        ]

        def body(options: list[_Vals]) -> _E:
            def test(x: _Val) -> _E:
                parts = [_any(o, lambda y: _compare(x, y, "=")) for o in options]
                if words:
                    parts.insert(0, x.s.isin(*words) if _STR in x.kinds else _null("BOOLEAN"))
                return _any_of(parts)

            return _any(value, test)

        return _bind(others, body)

    def between(self, value: ast.Expr, low: ast.Expr, high: ast.Expr) -> _E:
        v = self.vals(value)

        def body(bounds: list[_Vals]) -> _E:
            lo, hi = bounds
            return _any(
                v,
                lambda x: (
                    _any(lo, lambda y: _compare(x, y, ">="))
                    & _any(hi, lambda y: _compare(x, y, "<="))
                ),
            )

        return _bind([self.vals(low), self.vals(high)], body)

    def affix(self, value: ast.Expr, items: tuple[ast.Expr, ...], *, ends: bool) -> _E:
        v = self.vals(value)
        fn = "endswith" if ends else "startswith"
        if all(isinstance(i, ast.Literal) for i in items):
            texts = [_py_text(i.value) for i in items if isinstance(i, ast.Literal)]
            affixes = sorted({t for t in texts if t is not None})

            def literal_test(s: _E) -> _E:
                parts = [_f(fn, s, a) for a in affixes]
                if None in texts:  # a NULL affix: a miss is UNKNOWN rather than FALSE
                    parts.append(_null("BOOLEAN"))
                return _any_of(parts)

            if len(affixes) <= 1:
                return _any(v, lambda x: literal_test(_text(x)))
            return _any(v, lambda x: _bound(_text(x), literal_test, cheap=_cheap_text(x)))

        # Every value of every item is an affix; a NULL one makes a miss UNKNOWN, which is
        # what the three-valued exists gives.
        arrays = [_text_array(self.vals(i)) for i in items]
        affixes_array = _f("concat", *arrays) if len(arrays) > 1 else arrays[0]

        def dynamic(all_affixes: _E) -> _E:
            def test(s: _E) -> _E:
                return _exists(all_affixes, lambda a: _f(fn, s, a))

            return _any(v, lambda x: _bound(_text(x), test, cheap=_cheap_text(x)))

        return _let(affixes_array, dynamic)

    # ---------------------------------------------------------------- values

    def vals(self, node: ast.Expr) -> _Vals:
        """The values of ``node``: one literal, or an array of packed values."""
        match node:
            case ast.Path(text=path):
                return _Vals(
                    _ALL,
                    text=path in self.texts,
                    number=path in self.numbers,
                    many=self.paths[path],
                    cheap=True,
                )
            case ast.Literal(value=value):
                return _one(_literal(value))
            case ast.Arith(op=op, left=left, right=right):
                operands = [self.vals(left), self.vals(right)]
                kinds = {_NULL, _FLT} if op == "/" else {_NULL, _INT, _FLT}
                return _product(
                    operands,
                    lambda v: _arith(op, v[0], v[1]),
                    kinds,
                    nan=_may_nan(operands),
                )
            case ast.Neg(operand=operand):
                vs = self.vals(operand)
                return _product(
                    [vs], lambda v: _negate(v[0]), {_NULL, _INT, _FLT}, nan=_may_nan([vs])
                )
            case ast.Func():
                return self.func(node)
        # A predicate used as a value: its truth value (UNKNOWN is NULL).
        return _Vals(
            frozenset({_NULL, _BOOL}), text=True, many=_f("array", _bool_value(self.pred(node)))
        )

    def func(self, node: ast.Func) -> _Vals:
        args = [self.vals(a) for a in node.args]
        texts = {_NULL, _STR}

        def cheap(v: list[_Val]) -> bool:
            return all(_cheap_text(x) for x in v)

        match node.name:
            case "COALESCE":
                return _coalesce(args)
            case "UPPER" | "LOWER" as name:
                fn = name.lower()

                def case_fold(v: list[_Val]) -> _E:
                    return _text_value(_f(fn, _text(v[0])), cheap=cheap(v))

                return _product(args, case_fold, texts, text=True)
            case "LENGTH":

                def length(v: list[_Val]) -> _E:
                    return _int_value(_f("length", _text(v[0])), cheap=cheap(v))

                return _product(args, length, {_NULL, _INT}, text=True)
            case "INSTR" | "INSTR_I" as name:

                def fold(e: _E) -> _E:
                    return _f("lower", e) if name == "INSTR_I" else e

                def instr(v: list[_Val]) -> _E:
                    found = _f("instr", fold(_text(v[0])), fold(_text(v[1])))
                    return _int_value(found, cheap=cheap(v))

                return _product(args, instr, {_NULL, _INT}, text=True)
            case "STREQUAL_I":

                def strequal(v: list[_Val]) -> _E:
                    same = _f("lower", _text(v[0])).eq(_f("lower", _text(v[1])))
                    return _bool_value(same, cheap=cheap(v))

                return _product(args, strequal, {_NULL, _BOOL}, text=True)
            case "CONCAT":

                def concat(v: list[_Val]) -> _E:
                    joined = _f("concat_ws", "", *(_text(x) for x in v))
                    return _text_value(joined, cheap=cheap(v))

                return _product(args, concat, texts, text=True)
        raise self.error(f"the function {node.name} has no Spark translation", node)


def _text_array(vs: _Vals) -> _E:
    if vs.one is not None:
        return _f("array", _text(vs.one))
    return _transform(_many(vs), lambda x: _text(_element(vs, x)))


def _coalesce(args: list[_Vals]) -> _Vals:
    """The first argument with a non-NULL value, with all its values (as ``evaluate`` does)."""
    kinds = frozenset(chain.from_iterable(a.kinds for a in args))
    nan = any(a.nan for a in args)
    text = all(a.text for a in args)
    if all(a.one is not None for a in args):
        for a in args:
            assert a.one is not None
            if a.one.const is None or _py_text(a.one.const[0]) is not None:
                return a
        return _one(_literal(None))

    def body(bound: list[_Vals]) -> _E:
        branches: list[tuple[Cond, _E]] = []
        for a in bound:
            if a.one is not None:
                present: Cond = a.one.const is None or _py_text(a.one.const[0]) is not None
                branches.append((present, _f("array", _pack(a.one))))
            else:
                present = _exists(_many(a), lambda x: x["t"].ne(_NULL))
                branches.append((present, _many(a)))
        return _case(branches, _f("array", _null_struct()))

    # A literal's x and numeric fields are not filled in: a mix must not rely on them.
    has_literal = any(a.one is not None for a in args)
    number = all(a.number for a in args) and not has_literal
    return _Vals(kinds, nan, text and not has_literal, number, many=_bind(args, body))


# ============================================================================ public API


def _parse(filter: str | ast.Expr) -> _Source:
    if isinstance(filter, str):
        return _Source(filter, True, parse_filter(filter))
    return _Source(ast.to_text(filter), False, filter)


def _column(name: str) -> str:
    """``name`` as SQL, with dots meaning struct fields as in ``F.col``."""
    return ".".join("`" + part.replace("`", "``") + "`" for part in name.split("."))


def _constant(source: _Source) -> _E:
    """A filter that reads no field: the evaluator's answer, as a literal."""
    return _lit(compile_predicate(source.tree)({})).cast("BOOLEAN")


def filter_sql(filter: str | ast.Expr, body_col: str = "body") -> str:
    """The Spark SQL expression of ``truth_column`` (for ``WHERE`` clauses, ``selectExpr``)."""
    source = _parse(filter)
    if not ast.paths(source.tree):
        return _constant(source).sql
    compiler = _Compiler([source])
    return compiler.with_paths(body_col, lambda: compiler.truth(source)).sql


def truth_column(filter: str | ast.Expr, body_col: str = "body") -> Column:
    """The filter's three-valued result per row: true, false, or NULL for UNKNOWN.

    ``body_col`` names the column holding each record's JSON text. Raises ``FilterError`` for
    an invalid filter or one of the few constructs Spark cannot run (see the module docstring).
    """
    return F.expr(filter_sql(filter, body_col))


def filter_column(filter: str | ast.Expr, body_col: str = "body") -> Column:
    """A boolean Column, true exactly where ``compile_filter(filter).matches`` is (never NULL)."""
    return F.expr(f"coalesce({filter_sql(filter, body_col)}, FALSE)")


def truth_array(filters: Sequence[str | ast.Expr], body_col: str = "body") -> Column:
    """``array<boolean>``: each filter's three-valued result, in order, per row.

    The record is parsed once and each distinct path read once for the whole batch, which is
    much cheaper than one ``truth_column`` per filter (e.g. to match many subscriptions).
    """
    sources = [_parse(f) for f in filters]
    if not any(ast.paths(s.tree) for s in sources):
        return F.expr(_f("array", *(_constant(s) for s in sources)).cast("ARRAY<BOOLEAN>").sql)
    compiler = _Compiler(sources)
    array = compiler.with_paths(
        body_col, lambda: _f("array", *(compiler.truth(s).cast("BOOLEAN") for s in sources))
    )
    return F.expr(array.sql)


def value_column(
    expr: str | ast.Expr, body_col: str = "body", *, as_type: ValueType = "auto"
) -> Column:
    """The value of an expression such as ``/qty * /px`` or ``UPPER(/sym)``, per row.

    A multi-valued path gives its first value (as OrderBy sorts by it). ``as_type`` chooses the
    result: ``double`` (numbers and numeric strings), ``long`` (integers that fit), ``string``
    (the text string functions see), ``boolean`` (JSON booleans and conditions), or ``auto``:
    long for LENGTH and INSTR, double for arithmetic, string for the other string functions,
    boolean for conditions, and string for what may hold several kinds (paths, COALESCE).
    Values that are not of the chosen type are NULL.
    """
    source = _parse(expr)
    target = _auto_type(source.tree) if as_type == "auto" else as_type

    def convert(v: _Val) -> _E:
        if target == "string":
            return _text(v)
        if target == "boolean":
            return v.b if _BOOL in v.kinds else _null("BOOLEAN")
        if target == "double":
            return _with_nums([v], lambda n: _case([(n[0].ok, n[0].d)], _null("DOUBLE")))
        return _with_nums(
            [v], lambda n: _case([(n[0].exact, n[0].i.try_cast("BIGINT"))], _null("BIGINT"))
        )

    compiler = _Compiler([source])

    def first() -> _E:
        vs = compiler.vals(source.tree)
        if vs.one is not None:
            return convert(vs.one)
        return _let(_f("element_at", _many(vs), 1), lambda x: convert(_element(vs, x)))

    if not ast.paths(source.tree):
        return F.expr(first().sql)
    return F.expr(compiler.with_paths(body_col, first).sql)


def _auto_type(node: ast.Expr) -> ValueType:
    if ast.is_predicate(node):
        return "boolean"
    match node:
        case ast.Literal(value=value):
            if isinstance(value, bool):
                return "boolean"
            if isinstance(value, int):
                return "long"
            return "double" if isinstance(value, float) else "string"
        case ast.Func(name="LENGTH" | "INSTR" | "INSTR_I"):
            return "long"
        case ast.Func(name="UPPER" | "LOWER" | "CONCAT"):
            return "string"
        case ast.Arith() | ast.Neg():
            return "double"
    return "string"
