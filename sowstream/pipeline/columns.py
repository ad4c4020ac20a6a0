"""Content filters as Spark Column expressions, with the Python evaluator's semantics exactly.

``filter_column("/qty > 5 AND /sym = 'IBM'", "body")`` is a boolean Column that is true on the
rows whose JSON text in ``body`` ``compile_filter(...).matches`` accepts. It is built from Spark's
own functions (no Python UDF), so Spark can optimise and distribute it like any other filter.
``value_column`` gives the value of an expression (``/qty * /px``, ``UPPER(/sym)``) for
projections and aggregates.

How JSON values are represented
-------------------------------
Each row's text is parsed once with ``try_parse_json`` into a VARIANT. A path is followed with
``try_variant_get`` one key at a time, flattening the arrays met on the way (nested arrays too)
with higher-order functions, so every path yields an ``array<struct>`` of its values; an absent
path yields one NULL value, which the evaluator treats the same as no value. A value is a struct
``(t, s, i, d, b)``: ``t`` is its kind (NULL -- a missing field, JSON null or ``""`` --, string,
integer, float, boolean, or object), ``s`` a non-empty string, ``i`` an integer's exact value as
``decimal(38,0)``, ``d`` a number as double, ``b`` a boolean; only the fields of its kind are set.
Comparisons, arithmetic and the text that string functions see follow ``sowstream.filters``
rule by rule, including NaN and infinities. Multi-valued operands are combined with ``exists``
(three-valued, as ANY needs) and ``transform`` over every combination, like the evaluator.

Known differences from the Python evaluator (all need unusual data)
-------------------------------------------------------------------
* Integers are exact up to 38 digits; larger ones (from arithmetic, numeric strings or literals)
  are approximated by doubles, whereas Python's integers are unbounded.
* ``int / int`` with an operand beyond 2**53 may differ in the last bit: Python rounds the exact
  quotient, Spark divides the rounded doubles.
* Spark's JSON reader drops a zero fraction, so a float such as ``10000000000000000000.0``
  (between 2**63 and 2**64) reads as an integer; this only shows in arithmetic beyond 2**53.
* ``UPPER``/``LOWER`` use Java's Unicode tables; characters added in recent Unicode versions may
  map differently. A case-insensitive back-reference (``(?i)(a)\\1``) uses Java's case folding.
* Java's regex engine recurses on some repetitions of alternatives (``(a|b)*``) and can fail
  with a stack overflow on strings of many thousands of characters where Python succeeds.
* Duplicate keys in a record need ``spark.sql.variant.allowDuplicateKeys=true`` (the last one
  wins, as in orjson); ``spark_session`` sets it. Without it such a record reads as empty.
* Three-valued ANY relies on ``spark.sql.legacy.followThreeValuedLogicInArrayExists`` keeping
  its default (true).

Constructs rejected at compile time with a ``FilterError``: regex conditional groups
(``(?(1)a|b)``) and repetition counts above 2**31-1, which Java's engine lacks; hand-built ASTs
with a path key containing both kinds of quote.
"""

from __future__ import annotations

import functools
import importlib
import math
import operator
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from itertools import chain
from typing import Any, Literal

from pyspark.sql import Column
from pyspark.sql import functions as F

from sowstream.filters import FilterError, ast, compile_predicate, parse_filter
from sowstream.filters.values import canonical_text, str_to_number

__all__ = [
    "UnsupportedRegexError",
    "filter_column",
    "java_regex",
    "truth_column",
    "value_column",
]

Cond = Column | bool  # a condition known only per row, or already at compile time
ValueType = Literal["auto", "double", "long", "string", "boolean"]

# Value kinds (the ``t`` field).
_NULL, _STR, _INT, _FLT, _BOOL, _OBJ = range(6)
_ALL = frozenset(range(6))
_NUMERIC = frozenset({_INT, _FLT})

_DEC = "decimal(38,0)"
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

_COMPARE: dict[str, Callable[[Any, Any], Column]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


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
    tree = _re_parser.parse(pattern)
    return _regex_seq(tree, tree.state.flags)


# ============================================================================ small helpers


def _null(type_: str) -> Column:
    return F.lit(None).cast(type_)


def _col(cond: Cond) -> Column:
    return F.lit(cond) if isinstance(cond, bool) else cond


def _and(*conds: Cond) -> Cond:
    out: Cond = True
    for c in conds:
        if c is False:
            return False
        if c is not True:
            out = c if out is True else out & c
    return out


def _or(*conds: Cond) -> Cond:
    out: Cond = False
    for c in conds:
        if c is True:
            return True
        if c is not False:
            out = c if out is False else out | c
    return out


def _not(cond: Cond) -> Cond:
    return (not cond) if isinstance(cond, bool) else ~cond


def _case(branches: Iterable[tuple[Cond, Column]], default: Column) -> Column:
    """CASE WHEN ... END, dropping branches decided at compile time."""
    out: Column | None = None
    for cond, value in branches:
        if cond is False:
            continue
        if cond is True:
            return value if out is None else out.otherwise(value)
        out = F.when(cond, value) if out is None else out.when(cond, value)
    return default if out is None else out.otherwise(default)


def _let(value: Column, body: Callable[[Column], Column]) -> Column:
    """``body(value)`` with ``value`` computed once.

    Spark has no let, but a lambda binds its argument, and nothing is shared otherwise inside
    higher-order functions: without this, a value used twice would be computed twice, and the
    expression would grow exponentially with the nesting of the filter.
    """
    return F.transform(F.array(value), body)[0]


def _disjunction(parts: Sequence[Column]) -> Column:
    return functools.reduce(operator.or_, parts)


def _conjunction(parts: Sequence[Column]) -> Column:
    return functools.reduce(operator.and_, parts)


# ============================================================================ values


@dataclass(frozen=True)
class _Val:
    """One value. Only the field of its kind is set, so e.g. ``b`` is NULL unless a boolean.

    Fields are cheap expressions (of a lambda variable or a literal) so they can be repeated.
    """

    t: Column
    s: Column
    i: Column
    d: Column
    b: Column
    kinds: frozenset[int]  # the kinds ``t`` can take, known at compile time
    nan: bool = False  # whether ``d`` can be NaN (only arithmetic makes NaN)
    const: tuple[ast.Scalar] | None = None  # (value,) for a literal


def _value(
    kinds: Iterable[int],
    t: Column,
    *,
    s: Column | None = None,
    i: Column | None = None,
    d: Column | None = None,
    b: Column | None = None,
    nan: bool = False,
    const: tuple[ast.Scalar] | None = None,
) -> _Val:
    return _Val(
        t=t,
        s=_null("string") if s is None else s,
        i=_null(_DEC) if i is None else i,
        d=_null("double") if d is None else d,
        b=_null("boolean") if b is None else b,
        kinds=frozenset(kinds),
        nan=nan,
        const=const,
    )


def _pack(v: _Val) -> Column:
    return F.struct(
        v.t.cast("int").alias("t"),
        v.s.cast("string").alias("s"),
        v.i.cast(_DEC).alias("i"),
        v.d.cast("double").alias("d"),
        v.b.cast("boolean").alias("b"),
    )


def _unpack(x: Column, kinds: frozenset[int], nan: bool) -> _Val:
    return _Val(x["t"], x["s"], x["i"], x["d"], x["b"], kinds, nan)


def _literal(value: ast.Scalar) -> _Val:
    const = (value,)
    if value is None or value == "":
        return _value({_NULL}, F.lit(_NULL), const=(None,))
    if isinstance(value, bool):
        return _value({_BOOL}, F.lit(_BOOL), b=F.lit(value), const=const)
    if isinstance(value, str):
        return _value({_STR}, F.lit(_STR), s=F.lit(value), const=const)
    if isinstance(value, int):
        exact = abs(value) < _DEC_LIMIT
        return _value(
            {_INT},
            F.lit(_INT),
            i=F.lit(Decimal(value)).cast(_DEC) if exact else None,
            d=F.lit(_to_float(value)).cast("double"),
            const=const,
        )
    return _value(
        {_FLT}, F.lit(_FLT), d=F.lit(value).cast("double"), nan=math.isnan(value), const=const
    )


def _to_float(value: int) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.copysign(_INF, value)


def _null_struct() -> Column:
    return _pack(_literal(None))


@dataclass(frozen=True)
class _Vals:
    """An expression's values: one literal (``one``) or an ``array<struct>`` (``many``).

    Computed values are always arrays, even of one element: consumers then read them through
    a lambda variable, which is what keeps every field reference cheap.
    """

    kinds: frozenset[int]
    nan: bool = False
    one: _Val | None = None
    many: Column | None = None


def _one(v: _Val) -> _Vals:
    return _Vals(v.kinds, v.nan, one=v)


def _element(vs: _Vals, x: Column) -> _Val:
    return _unpack(x, vs.kinds, vs.nan)


def _many(vs: _Vals) -> Column:
    assert vs.many is not None
    return vs.many


def _array(vs: _Vals) -> Column:
    if vs.many is not None:
        return vs.many
    assert vs.one is not None
    return F.array(_pack(vs.one))


def _any(vs: _Vals, test: Callable[[_Val], Column]) -> Column:
    """ANY in three-valued logic: TRUE if one value passes, else UNKNOWN if one is UNKNOWN."""
    if vs.one is not None:
        return test(vs.one)
    return F.exists(_many(vs), lambda x: test(_element(vs, x)))


def _bind(vss: Sequence[_Vals], body: Callable[[list[_Vals]], Column], *, skip: int = 0) -> Column:
    """``body`` with the arrays of ``vss`` (but the first ``skip`` ones) computed once."""
    out: list[_Vals] = []

    def step(k: int) -> Column:
        if k == len(vss):
            return body(out)
        vs = vss[k]
        if vs.many is None or k < skip:
            out.append(vs)
            return step(k + 1)

        def bound(arr: Column) -> Column:
            out.append(replace(vs, many=arr))
            return step(k + 1)

        return _let(vs.many, bound)

    return step(0)


def _first_many(vss: Sequence[_Vals]) -> int:
    """How many leading operands need no binding: up to and including the first array."""
    for k, vs in enumerate(vss):
        if vs.many is not None:
            return k + 1
    return len(vss)


def _product(
    vss: Sequence[_Vals],
    fn: Callable[[list[_Val]], Column],
    kinds: Iterable[int],
    nan: bool,
) -> _Vals:
    """``fn`` (giving a packed value) over every combination of the operands' values."""

    def build(bound: list[_Vals]) -> Column:
        def rec(k: int, chosen: list[_Val]) -> tuple[Column, bool]:
            if k == len(bound):
                return fn(chosen), False
            vs = bound[k]
            if vs.one is not None:
                return rec(k + 1, [*chosen, vs.one])
            nested = [False]

            def body(x: Column) -> Column:
                col, is_array = rec(k + 1, [*chosen, _element(vs, x)])
                nested[0] = is_array
                return col

            out = F.transform(_many(vs), body)
            return (F.flatten(out) if nested[0] else out), True

        col, is_array = rec(0, [])
        return col if is_array else F.array(col)

    return _Vals(frozenset(kinds), nan, many=_bind(vss, build, skip=_first_many(vss)))


def _any_product(vss: Sequence[_Vals], test: Callable[[list[_Val]], Column]) -> Column:
    """ANY of ``test`` over every combination of the operands' values."""

    def build(bound: list[_Vals]) -> Column:
        def rec(k: int, chosen: list[_Val]) -> Column:
            if k == len(bound):
                return test(chosen)
            vs = bound[k]
            if vs.one is not None:
                return rec(k + 1, [*chosen, vs.one])
            return F.exists(_many(vs), lambda x: rec(k + 1, [*chosen, _element(vs, x)]))

        return rec(0, [])

    return _bind(vss, build, skip=_first_many(vss))


def _is(v: _Val, kinds: frozenset[int]) -> Cond:
    """Whether ``v`` is of one of ``kinds``, decided at compile time when its kinds allow."""
    want = v.kinds & kinds
    if not want:
        return False
    if v.kinds <= kinds:
        return True
    if len(want) == 1:
        return v.t == next(iter(want))
    return v.t.isin(*sorted(want))


# ============================================================================ numbers


@dataclass(frozen=True)
class _Num:
    """The numeric reading of a value (numbers, and strings that spell one)."""

    ok: Cond  # it is a number
    isint: Cond  # of integer type (Python int)
    exact: Cond  # an integer held exactly in ``i``
    i: Column  # decimal(38,0)
    d: Column  # double
    big: Cond  # its magnitude may be 2**53 or more (only then can doubles be inexact)
    nan: bool  # it may be NaN


def _num_const(value: ast.Scalar) -> _Num:
    number: int | float | None = None
    if isinstance(value, str):
        number = str_to_number(value) if value else None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = value
    if number is None:
        return _Num(False, False, False, _null(_DEC), _null("double"), False, False)
    if isinstance(number, int):
        exact = abs(number) < _DEC_LIMIT
        return _Num(
            ok=True,
            isint=True,
            exact=exact,
            i=F.lit(Decimal(number)).cast(_DEC) if exact else _null(_DEC),
            d=F.lit(_to_float(number)).cast("double"),
            big=abs(number) >= 2**53,
            nan=False,
        )
    return _Num(
        ok=True,
        isint=False,
        exact=False,
        i=_null(_DEC),
        d=F.lit(number).cast("double"),
        big=not abs(number) < _TWO53,
        nan=math.isnan(number),
    )


def _num(v: _Val) -> tuple[_Num, bool]:
    """``v``'s numeric reading, and whether it parses a string (then worth binding once)."""
    if v.const is not None:
        return _num_const(v.const[0]), False
    big = F.abs(v.d) >= _TWO53
    if _STR not in v.kinds:
        is_int = _is(v, frozenset({_INT}))
        exact: Cond = _and(is_int, v.i.isNotNull()) if is_int is not False else False
        return _Num(_is(v, _NUMERIC), is_int, exact, v.i, v.d, big, v.nan), False
    spaced = F.btrim(v.s, F.lit(_SPACES))
    is_number = F.coalesce(v.s.rlike(_JAVA_NUMBER), F.lit(False))
    is_integer = F.coalesce(v.s.rlike(_JAVA_INTEGER), F.lit(False))
    i = F.when(is_integer, spaced.try_cast(_DEC))
    d = F.when(is_number, spaced.try_cast("double"))
    if _INT in v.kinds:
        i = F.coalesce(v.i, i)
    if v.kinds & _NUMERIC:
        d = F.coalesce(v.d, d)
    ok = _or(_is(v, _NUMERIC), is_number)
    isint = _or(_is(v, frozenset({_INT})), is_integer)
    return _Num(ok, isint, i.isNotNull(), i, d, big, v.nan), True


def _with_nums(vals: Sequence[_Val], body: Callable[[list[_Num]], Column]) -> Column:
    """``body`` over the values' numeric readings, string parsing done once per value."""
    readings = [_num(v) for v in vals]
    if not any(parsed for _, parsed in readings):
        return body([n for n, _ in readings])
    fields = [
        F.struct(
            _col(n.ok).alias("ok"),
            _col(n.isint).alias("isint"),
            n.i.cast(_DEC).alias("i"),
            n.d.cast("double").alias("d"),
        ).alias(f"n{k}")
        for k, (n, parsed) in enumerate(readings)
        if parsed
    ]

    def bound(p: Column) -> Column:
        nums = []
        for k, (n, parsed) in enumerate(readings):
            if parsed:
                x = p[f"n{k}"]
                n = _Num(
                    x["ok"],
                    x["isint"],
                    x["i"].isNotNull(),
                    x["i"],
                    x["d"],
                    F.abs(x["d"]) >= _TWO53,
                    n.nan,
                )
            nums.append(n)
        return body(nums)

    return _let(F.struct(*fields), bound)


def _sign(a: Column, b: Column) -> Column:
    return F.when(a < b, -1).when(a > b, 1).otherwise(0)


def _exact_decimal(f: Column) -> Column:
    """The exact value of an integral double below 10**38 as decimal(38,0).

    Spark's own cast goes through the shortest decimal string (1e23 -> 10**23, while the double
    is 99999999999999991611392). Here f = q * 2**k with q < 2**56 exactly, and both factors are
    integers Spark multiplies exactly.
    """
    a = F.abs(f)
    k = F.greatest(F.floor(F.log2(a)).cast("int") - 54, F.lit(0))
    q = (a / F.pow(F.lit(2.0), k)).cast("long")
    low = F.pow(F.lit(2.0), F.least(k, F.lit(62))).cast("long").cast(_DEC)
    high = F.pow(F.lit(2.0), F.greatest(k - 62, F.lit(0))).cast("long").cast(_DEC)
    magnitude = q.cast(_DEC) * (low * high)
    return F.when(f < 0, -magnitude).otherwise(magnitude)


def _order(x: _Num, y: _Num) -> Column:
    """-1, 0 or 1 as Python orders the two numbers, 2 if unordered (NaN), NULL if not numbers."""
    nan = _or(x.d.isNaN() if x.nan else False, y.d.isNaN() if y.nan else False)
    by_double = _case(
        [
            (nan, F.lit(2)),
            (x.d < y.d, F.lit(-1)),
            (x.d > y.d, F.lit(1)),
            # Equal doubles: an exact integer may still differ from a float beyond 2**53.
            (_and(x.exact, _not(y.isint), y.big), _sign(x.i, _exact_decimal(y.d))),
            (_and(y.exact, _not(x.isint), x.big), _sign(_exact_decimal(x.d), y.i)),
        ],
        F.lit(0),
    )
    return _case(
        [
            (_not(_and(x.ok, y.ok)), _null("int")),
            (_and(x.exact, y.exact), _sign(x.i, y.i)),
        ],
        by_double,
    )


def _holds(order: Column, op: str) -> Column:
    """Whether ``op`` holds for an ``_order`` result (NaN: only ``!=``)."""
    match op:
        case "=":
            return order == 0
        case "!=":
            return order != 0
        case "<":
            return order == -1
        case "<=":
            return order.isin(-1, 0)
        case ">":
            return order == 1
        case ">=":
            return order.isin(0, 1)
    raise ValueError(f"not a comparison operator: {op}")


def _compare(a: _Val, b: _Val, op: str) -> Column:
    """One comparison under the language's typing rules (``evaluate._compare``)."""
    strings = _and(_is(a, frozenset({_STR})), _is(b, frozenset({_STR})))
    numbers = _or(_is(a, _NUMERIC), _is(b, _NUMERIC))
    branches: list[tuple[Cond, Column]] = []
    if strings is not False:
        branches.append((strings, _COMPARE[op](a.s, b.s)))
    if numbers is not False:
        branches.append((numbers, _with_nums([a, b], lambda n: _holds(_order(n[0], n[1]), op))))
    # Whatever is left compares only if both are booleans (b is NULL for anything else).
    both_bool = _BOOL in a.kinds and _BOOL in b.kinds
    return _case(branches, _COMPARE[op](a.b, b.b) if both_bool else _null("boolean"))


# ============================================================================ text


def _py_text(value: ast.Scalar) -> str | None:
    """The text of a literal, as ``evaluate._text`` spells it."""
    if value is None or value == "":
        return None
    return value if isinstance(value, str) else canonical_text(value)


def _big_integral_text(d: Column) -> Column:
    """Exact decimal digits of an integral double of 10**38 or more (Python's ``str(int(d))``).

    d = q * 2**k; q's digits in base-10**9 limbs are doubled k times (a carry only ever comes
    from the limb just below, so each doubling is one ``transform``).
    """
    a = F.abs(d)
    k = F.floor(F.log2(a)).cast("int") - 54
    q = F.lpad((a / F.pow(F.lit(2.0), k)).cast("long").cast("string"), 27, "0")
    start = F.array(*(F.substring(q, pos, 9).cast("long") for pos in (19, 10, 1)))

    def double(acc: Column, _: Column) -> Column:
        def limb(x: Column, j: Column) -> Column:
            below = F.element_at(acc, F.greatest(j, F.lit(1)))
            return (x * 2) % _LIMB + F.when((j > 0) & (below * 2 >= _LIMB), 1).otherwise(0)

        carry = F.when(
            F.element_at(acc, -1) * 2 >= _LIMB, F.array(F.lit(1).cast("long"))
        ).otherwise(F.array().cast("array<bigint>"))
        return F.concat(F.transform(acc, limb), carry)

    def render(rev: Column) -> Column:
        tail = F.transform(F.slice(rev, 2, F.size(rev)), lambda x: F.lpad(x.cast("string"), 9, "0"))
        digits = F.concat(F.element_at(rev, 1).cast("string"), F.array_join(tail, ""))
        return F.regexp_replace(digits, "^0+(?=[0-9])", "")

    limbs = F.aggregate(F.sequence(F.lit(1), k), start, double)
    text = _let(F.reverse(limbs), render)
    return F.concat(F.when(d < 0, "-").otherwise(""), text)


def _integral_text(d: Column) -> Column:
    """Python's ``str(int(d))`` for a finite integral double."""
    a = F.abs(d)
    return (
        F.when(a < _TWO63, d.cast("long").cast("string"))
        .when(a < 1e38, _exact_decimal(d).cast("string"))
        .otherwise(_big_integral_text(d))
    )


def _fraction_text(d: Column) -> Column:
    """Python's ``repr`` of a finite non-integral double, from Spark's (shortest) digits.

    Spark prints 1.0E-5 or 1.23456789123E8 where Python prints 1e-05 and 123456789.123.
    """
    js = F.regexp_replace(d.cast("string"), "^-", "")
    digits = F.regexp_replace(
        F.regexp_replace(F.regexp_extract(js, "^([0-9.]+)E", 1), r"\.", ""), "0+$", ""
    )
    e = F.regexp_extract(js, "E(-?[0-9]+)$", 1).cast("int")
    n = F.length(digits)
    scientific = F.concat(
        F.substring(digits, 1, 1),
        F.when(n > 1, F.concat(F.lit("."), digits.substr(F.lit(2), n))).otherwise(""),
        F.lit("e-"),
        F.lpad((-e).cast("string"), 2, "0"),
    )
    small = F.concat(F.lit("0."), F.repeat(F.lit("0"), -e - 1), digits)
    large = F.concat(digits.substr(F.lit(1), e + 1), F.lit("."), digits.substr(e + 2, n))
    body = (
        F.when(~js.contains("E"), js).when(e < -4, scientific).when(e < 0, small).otherwise(large)
    )
    return F.concat(F.when(d < 0, "-").otherwise(""), body)


def _float_text(d: Column) -> Column:
    """``canonical_text`` of a float: nan, inf, integral values without ``.0``, else repr."""
    return (
        F.when(d.isNull(), _null("string"))
        .when(d.isNaN(), "nan")
        .when(d == _INF, "inf")
        .when(d == -_INF, "-inf")
        .when(d % 1.0 == 0, _integral_text(d))
        .otherwise(_fraction_text(d))
    )


def _text(v: _Val) -> Column:
    """The text string predicates and functions see (``evaluate._text``); NULL if none."""
    if v.const is not None:
        return F.lit(_py_text(v.const[0])).cast("string")
    parts: list[Column] = []
    if _STR in v.kinds:
        parts.append(v.s)
    if _BOOL in v.kinds:
        parts.append(F.when(v.b, "true").when(~v.b, "false"))
    if _INT in v.kinds:
        parts.append(v.i.cast("string"))
    if v.kinds & _NUMERIC:  # floats, and integers too large to hold exactly
        parts.append(_float_text(v.d))
    if not parts:
        return _null("string")
    return parts[0] if len(parts) == 1 else F.coalesce(*parts)


def _text_value(text: Column) -> Column:
    """A packed string value (``""`` and NULL are NULL)."""

    def pack(s: Column) -> Column:
        present = s.isNotNull() & (s != "")
        return _pack(
            _value({_NULL, _STR}, F.when(present, _STR).otherwise(_NULL), s=F.when(present, s))
        )

    return _let(text, pack)


def _int_value(n: Column) -> Column:
    def pack(x: Column) -> Column:
        kind = F.when(x.isNull(), _NULL).otherwise(_INT)
        return _pack(_value({_NULL, _INT}, kind, i=x.cast(_DEC), d=x.cast("double")))

    return _let(n, pack)


def _bool_value(p: Column) -> Column:
    def pack(x: Column) -> Column:
        return _pack(_value({_NULL, _BOOL}, F.when(x.isNull(), _NULL).otherwise(_BOOL), b=x))

    return _let(p, pack)


# ============================================================================ arithmetic


def _arith(op: str, a: _Val, b: _Val) -> Column:
    """A packed value: ``evaluate._compile_arith`` on one pair of values."""

    def body(n: list[_Num]) -> Column:
        x, y = n
        ok = _and(x.ok, y.ok)
        both_int = _and(x.isint, y.isint)
        both_exact = _and(x.exact, y.exact)
        kinds = {_NULL, _INT, _FLT}
        if op in ("+", "-", "*"):
            exact_op = {"+": F.try_add, "-": F.try_subtract, "*": F.try_multiply}[op]
            float_op = {"+": operator.add, "-": operator.sub, "*": operator.mul}[op]
            i = F.when(_col(both_exact), exact_op(x.i, y.i)) if both_exact is not False else None
            d = float_op(x.d, y.d)
            if i is not None:  # an exact result, else (past 38 digits) the double approximation
                d = F.coalesce(i.cast("double"), d)
            kind = _case([(_not(ok), F.lit(_NULL)), (both_int, F.lit(_INT))], F.lit(_FLT))
            return _pack(_value(kinds, kind, i=i, d=d))
        zero = y.d == 0
        if op == "/":
            kind = _case([(_not(ok), F.lit(_NULL)), (zero, F.lit(_NULL))], F.lit(_FLT))
            return _pack(_value(kinds, kind, d=F.when(~zero, x.d / y.d)))
        # % takes the dividend's sign; Python's math.fmod refuses an infinite dividend.
        refused = (F.abs(x.d) == _INF) & ~y.d.isNaN()
        i = F.when(_col(both_exact) & ~zero, x.i % y.i) if both_exact is not False else None
        fmod = x.d % y.d
        int_d = fmod if i is None else F.coalesce(i.cast("double"), fmod)
        null = _null("double")
        branches: list[tuple[Cond, Column]] = [(_not(ok), null), (zero, null), (both_int, int_d)]
        d = _case([*branches, (refused, null)], fmod)
        kind = _case(
            [
                (_not(ok), F.lit(_NULL)),
                (zero, F.lit(_NULL)),
                (both_int, F.lit(_INT)),
                (refused, F.lit(_NULL)),
            ],
            F.lit(_FLT),
        )
        return _pack(_value(kinds, kind, i=i, d=d))

    return _with_nums([a, b], body)


def _negate(a: _Val) -> Column:
    def body(n: list[_Num]) -> Column:
        (x,) = n
        kind = _case([(_not(x.ok), F.lit(_NULL)), (x.isint, F.lit(_INT))], F.lit(_FLT))
        return _pack(_value({_NULL, _INT, _FLT}, kind, i=-x.i, d=-x.d))

    return _with_nums([a], body)


def _may_nan(vss: Iterable[_Vals]) -> bool:
    # Infinities come from floats and numeric strings ("1e999"); inf - inf is NaN.
    return any(vs.nan or vs.kinds & {_STR, _FLT} for vs in vss)


# ============================================================================ JSON paths


def _is_array(v: Column) -> Column:
    return F.try_variant_get(v, "$", "array<variant>").isNotNull()


def _flatten_once(nodes: Column) -> Column:
    return F.flatten(
        F.transform(
            nodes, lambda e: F.coalesce(F.try_variant_get(e, "$", "array<variant>"), F.array(e))
        )
    )


def _flatten_nested(items: Column, source: Column) -> Column:
    """The elements of a JSON array with arrays inside it flattened, at any depth.

    There is no recursion in Spark expressions, so the flattening is repeated as many times as
    the JSON has ``[`` (a bound on the depth), each round a no-op once nothing is nested.
    """

    def deep(arr: Column) -> Column:
        def step(state: Column, _: Column) -> Column:
            def next_state(flat: Column) -> Column:
                return F.struct(flat.alias("a"), (~F.exists(flat, _is_array)).alias("done"))

            return F.when(state["done"], state).otherwise(
                _let(_flatten_once(state["a"]), next_state)
            )

        rounds = F.size(F.split(F.to_json(source), r"\[")) - 1
        start = F.struct(arr.alias("a"), F.lit(False).alias("done"))
        flat = F.aggregate(F.sequence(F.lit(1), rounds), start, step, lambda s: s["a"])
        return F.when(F.exists(arr, _is_array), flat).otherwise(arr)

    return _let(items, deep)


def _expand(child: Column) -> Column:
    """The values a variant contributes: none if SQL NULL (absent), its elements if an array."""

    def expand(c: Column) -> Column:
        items = F.try_variant_get(c, "$", "array<variant>")
        return F.coalesce(_flatten_nested(items, c), F.filter(F.array(c), lambda x: x.isNotNull()))

    return _let(child, expand)


def _child(step: str) -> Callable[[Column], Column]:
    # A one-argument lambda: pyspark reads a second parameter as the element's index.
    return lambda n: _expand(F.try_variant_get(n, step, "variant"))


def _leaf(n: Column) -> Column:
    """A packed value for a variant that is not an array."""

    def typed(ty: Column) -> Column:
        text = F.try_variant_get(n, "$", "string")
        dec = F.try_variant_get(n, "$", _DEC)
        # orjson reads integers up to 2**64-1 as int and larger ones as float; Spark keeps
        # integers beyond a long as DECIMAL(p,0), the same as a float written "1.0".
        unsigned = (dec > _LONG_MAX) & (dec <= F.lit(Decimal(_U64_MAX)))
        kind = (
            F.when(ty == "STRING", F.when(text != "", _STR).otherwise(_NULL))
            .when(ty == "BOOLEAN", _BOOL)
            .when(ty.isin("TINYINT", "SMALLINT", "INT", "BIGINT"), _INT)
            .when(ty.startswith("DECIMAL(") & ty.endswith(",0)") & unsigned, _INT)
            .when(ty.startswith("DECIMAL(") | ty.isin("DOUBLE", "FLOAT"), _FLT)
            .when(ty == "VOID", _NULL)
            .otherwise(_OBJ)
        )

        def fields(t: Column) -> Column:
            return _pack(
                _value(
                    _ALL,
                    t,
                    s=F.when(t == _STR, text),
                    i=F.when(t == _INT, dec),
                    d=F.when(t.isin(_INT, _FLT), F.try_variant_get(n, "$", "double")),
                    b=F.when(t == _BOOL, F.try_variant_get(n, "$", "boolean")),
                )
            )

        return _let(kind, fields)

    return _let(F.schema_of_variant(n), typed)


# ============================================================================ compiler


class _Compiler:
    """Turns one filter tree into Columns over ``root``, the parsed record (a VARIANT)."""

    def __init__(self, text: str, source: bool, root: Column) -> None:
        self.text = text
        self.source = source  # whether node positions point into ``text``
        self.root = root

    def error(self, message: str, node: ast.Expr) -> FilterError:
        position = node.pos if self.source and node.pos >= 0 else 0
        return FilterError(message, text=self.text, position=position)

    # ---------------------------------------------------------------- predicates

    def pred(self, node: ast.Expr) -> Column:
        """The three-valued truth of ``node`` (NULL for UNKNOWN)."""
        if not ast.paths(node):
            # Nothing is read from the record: the evaluator's answer is the answer.
            return F.lit(compile_predicate(node)({})).cast("boolean")
        match node:
            case ast.Compare(op=op, left=left, right=right):
                operands = [self.vals(left), self.vals(right)]
                return _any_product(operands, lambda v: _compare(v[0], v[1], op))
            case ast.And(operands=ops):
                return _conjunction([self.pred(o) for o in ops])
            case ast.Or(operands=ops):
                return _disjunction([self.pred(o) for o in ops])
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
                    return F.lit(vs.one.const is None or _py_text(vs.one.const[0]) is None)
                return F.forall(_many(vs), lambda x: x["t"] == _NULL)
            case ast.BeginsWith(value=value, prefixes=items):
                return self.affix(value, items, ends=False)
            case ast.EndsWith(value=value, suffixes=items):
                return self.affix(value, items, ends=True)
        # A value where a condition is expected means `value = TRUE`.
        return _any(self.vals(node), lambda x: x.b if _BOOL in x.kinds else _null("boolean"))

    def in_(self, node: ast.In) -> Column:
        value = self.vals(node.value)
        # Non-numeric string literals compare equal only to that string: one set lookup.
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

        def body(options: list[_Vals]) -> Column:
            def test(x: _Val) -> Column:
                parts = [_any(o, lambda y: _compare(x, y, "=")) for o in options]
                if words:
                    parts.insert(0, x.s.isin(*words) if _STR in x.kinds else _null("boolean"))
                return _disjunction(parts)

            return _any(value, test)

        return _bind(others, body)

    def between(self, value: ast.Expr, low: ast.Expr, high: ast.Expr) -> Column:
        v = self.vals(value)

        def body(bounds: list[_Vals]) -> Column:
            lo, hi = bounds
            return _any(
                v,
                lambda x: (
                    _any(lo, lambda y: _compare(x, y, ">="))
                    & _any(hi, lambda y: _compare(x, y, "<="))
                ),
            )

        return _bind([self.vals(low), self.vals(high)], body)

    def affix(self, value: ast.Expr, items: tuple[ast.Expr, ...], *, ends: bool) -> Column:
        v = self.vals(value)
        if all(isinstance(i, ast.Literal) for i in items):
            texts = [_py_text(i.value) for i in items if isinstance(i, ast.Literal)]
            affixes = sorted({t for t in texts if t is not None})
            unknown = None in texts

            def literal_test(s: Column) -> Column:
                parts = [s.endswith(a) if ends else s.startswith(a) for a in affixes]
                if unknown:  # a NULL affix: a miss is UNKNOWN rather than FALSE
                    parts.append(_null("boolean"))
                return _disjunction(parts)

            if len(affixes) <= 1:
                return _any(v, lambda x: literal_test(_text(x)))
            return _any(v, lambda x: _let(_text(x), literal_test))

        # Every value of every item is an affix; NULL ones make a miss UNKNOWN (3-valued exists).
        arrays = [_text_array(self.vals(i)) for i in items]
        affix_fn = F.endswith if ends else F.startswith

        def dynamic(all_affixes: Column) -> Column:
            def test(s: Column) -> Column:
                return F.exists(all_affixes, lambda a: affix_fn(s, a))

            return _any(v, lambda x: _let(_text(x), test))

        return _let(F.concat(*arrays) if len(arrays) > 1 else arrays[0], dynamic)

    # ---------------------------------------------------------------- values

    def vals(self, node: ast.Expr) -> _Vals:
        """The values of ``node``: one literal, or an array of packed values."""
        match node:
            case ast.Path():
                return self.path(node)
            case ast.Literal(value=value):
                return _one(_literal(value))
            case ast.Arith(op=op, left=left, right=right):
                operands = [self.vals(left), self.vals(right)]
                kinds = {_NULL, _FLT} if op == "/" else {_NULL, _INT, _FLT}
                return _product(
                    operands, lambda v: _arith(op, v[0], v[1]), kinds, _may_nan(operands)
                )
            case ast.Neg(operand=operand):
                vs = self.vals(operand)
                return _product([vs], lambda v: _negate(v[0]), {_NULL, _INT, _FLT}, _may_nan([vs]))
            case ast.Func():
                return self.func(node)
        # A predicate used as a value: its truth value (UNKNOWN is NULL).
        return _Vals(frozenset({_NULL, _BOOL}), many=F.array(_bool_value(self.pred(node))))

    def path(self, node: ast.Path) -> _Vals:
        nodes = F.array(self.root)
        for key in node.steps:
            if "'" not in key:
                step = f"$['{key}']"
            elif '"' not in key and "\\" not in key:
                step = f'$["{key}"]'
            else:
                raise self.error(f"the field name {key!r} cannot be addressed on Spark", node)
            nodes = F.flatten(F.transform(nodes, _child(step)))
        leaves = F.transform(nodes, _leaf)
        # No value at all reads as NULL, exactly as the evaluator's empty result does.
        values = _let(leaves, lambda a: F.when(F.size(a) > 0, a).otherwise(F.array(_null_struct())))
        return _Vals(_ALL, many=values)

    def func(self, node: ast.Func) -> _Vals:
        args = [self.vals(a) for a in node.args]
        name = node.name
        texts = {_NULL, _STR}
        if name == "COALESCE":
            return _coalesce(args)
        if name in ("UPPER", "LOWER"):
            case_fn = F.upper if name == "UPPER" else F.lower
            return _product(args, lambda v: _text_value(case_fn(_text(v[0]))), texts, False)
        if name == "LENGTH":
            return _product(args, lambda v: _int_value(F.length(_text(v[0]))), {_NULL, _INT}, False)
        if name in ("INSTR", "INSTR_I"):
            fold: Callable[[Column], Column] = F.lower if name == "INSTR_I" else (lambda c: c)

            def instr(v: list[_Val]) -> Column:
                return _int_value(F.instr(fold(_text(v[0])), fold(_text(v[1]))))

            return _product(args, instr, {_NULL, _INT}, False)
        if name == "STREQUAL_I":
            return _product(
                args,
                lambda v: _bool_value(F.lower(_text(v[0])) == F.lower(_text(v[1]))),
                {_NULL, _BOOL},
                False,
            )
        if name == "CONCAT":
            return _product(
                args, lambda v: _text_value(F.concat_ws("", *(_text(x) for x in v))), texts, False
            )
        raise self.error(f"the function {name} has no Spark translation", node)


def _is_word(value: ast.Scalar) -> bool:
    """A non-empty string that does not spell a number: equal only to itself."""
    return isinstance(value, str) and bool(value) and str_to_number(value) is None


def _text_array(vs: _Vals) -> Column:
    if vs.one is not None:
        return F.array(_text(vs.one))
    return F.transform(_many(vs), lambda x: _text(_element(vs, x)))


def _coalesce(args: list[_Vals]) -> _Vals:
    """The first argument with a non-NULL value, all its values (``evaluate``'s COALESCE)."""
    kinds = frozenset(chain.from_iterable(a.kinds for a in args))
    nan = any(a.nan for a in args)
    if all(a.one is not None for a in args):
        for a in args:
            assert a.one is not None
            if a.one.const is None or _py_text(a.one.const[0]) is not None:
                return a
        return _one(_literal(None))

    def body(bound: list[_Vals]) -> Column:
        branches: list[tuple[Cond, Column]] = []
        for a in bound:
            if a.one is not None:
                present: Cond = a.one.const is None or _py_text(a.one.const[0]) is not None
            else:
                present = F.exists(_many(a), lambda x: x["t"] != _NULL)
            branches.append((present, _array(a)))
        return _case(branches, F.array(_null_struct()))

    return _Vals(kinds, nan, many=_bind(args, body))


# ============================================================================ public API


def _parse(filter: str | ast.Expr) -> tuple[str, bool, ast.Expr]:
    if isinstance(filter, str):
        return filter, True, parse_filter(filter)
    return ast.to_text(filter), False, filter


def _body(body_col: str | Column) -> Column:
    return F.col(body_col) if isinstance(body_col, str) else body_col


def truth_column(filter: str | ast.Expr, body_col: str | Column = "body") -> Column:
    """The filter's three-valued result per row: true, false, or NULL for UNKNOWN.

    ``body_col`` holds each record's JSON text. Raises ``FilterError`` for an invalid filter or
    one of the few constructs Spark cannot run (see the module docstring).
    """
    text, source, node = _parse(filter)
    if not ast.paths(node):
        return F.lit(compile_predicate(node)({})).cast("boolean")
    return _let(
        F.try_parse_json(_body(body_col)), lambda root: _Compiler(text, source, root).pred(node)
    )


def filter_column(filter: str | ast.Expr, body_col: str | Column = "body") -> Column:
    """A boolean Column, true exactly where ``compile_filter(filter).matches`` is (never NULL)."""
    return F.coalesce(truth_column(filter, body_col), F.lit(False))


def value_column(
    expr: str | ast.Expr, body_col: str | Column = "body", *, as_type: ValueType = "auto"
) -> Column:
    """The value of an expression such as ``/qty * /px`` or ``UPPER(/sym)`` per row.

    A multi-valued path gives its first value (as OrderBy sorts by it). ``as_type`` chooses the
    result type: ``double`` (numbers and numeric strings), ``long`` (integers within a long),
    ``string`` (the text string functions see), ``boolean`` (JSON booleans and conditions), or
    ``auto``: long for integer-only expressions (LENGTH, INSTR), double for other arithmetic,
    string for text functions, boolean for conditions, and string for anything that may hold
    several kinds (paths, COALESCE). Values of another type are NULL.
    """
    text, source, node = _parse(expr)
    if as_type == "auto":
        as_type = _auto_type(node)
    target = as_type

    def convert(v: _Val) -> Column:
        if target == "string":
            return _text(v)
        if target == "boolean":
            return v.b if _BOOL in v.kinds else _null("boolean")
        if target == "double":
            return _with_nums([v], lambda n: F.when(_col(n[0].ok), n[0].d)).cast("double")
        return _with_nums([v], lambda n: F.when(_col(n[0].exact), n[0].i.try_cast("long")))

    def first(root: Column) -> Column:
        vs = _Compiler(text, source, root).vals(node)
        if vs.one is not None:
            return convert(vs.one)
        return _let(F.element_at(_many(vs), 1), lambda x: convert(_element(vs, x)))

    return _let(F.try_parse_json(_body(body_col)), first)


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
