"""Evaluate filters in Python: the AST is compiled once into nested closures.

Each node becomes a closure that takes the record, so per-record work is a handful of calls
with no tree walking or dispatch. Predicates return ``True``, ``False`` or ``None`` (UNKNOWN);
value closures return a plain value, ``None`` for NULL, or a ``_Many`` when a path crossed an
array. ``python -m sowstream.filters.evaluate`` prints a timing of the hot path.
"""

from __future__ import annotations

import functools
import math
import operator
import re
import zlib
from collections.abc import Callable, Iterator, Mapping
from itertools import product
from typing import Any

from . import ast
from .parser import parse_filter
from .values import collect_path, str_to_number
from .values import scalar_text as _text

__all__ = ["Filter", "StageInput", "compile_filter", "compile_predicate", "compile_value"]

Record = Mapping[str, Any]
Truth = bool | None
Predicate = Callable[[Record], Truth]
ValueFn = Callable[[Record], Any]
Tester = Callable[[Any], Truth]
Op = Callable[[Any, Any], bool]

_OPS: dict[str, Op] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
# Rewrites `literal op value` as `value op' literal` so literal testers only face one shape.
_FLIPPED: dict[ast.CompareOp, ast.CompareOp] = {
    "=": "=",
    "!=": "!=",
    "<": ">",
    "<=": ">=",
    ">": "<",
    ">=": "<=",
}


class _Many(tuple[Any, ...]):
    """Several values read through arrays; records never hold one, so ``type(v) is _Many``
    tells a multi-valued result from a plain value."""

    __slots__ = ()


# ---------------------------------------------------------------------------- value helpers


def _from_list(values: list[Any]) -> Any:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return _Many(values)


def _expand(items: Any) -> Any:
    out: list[Any] = []
    collect_path(items, (), 0, out)
    return _from_list(out)


def _each(value: Any) -> tuple[Any, ...]:
    return value if type(value) is _Many else (value,)


def _any(test: Tester, values: _Many) -> Truth:
    result: Truth = False
    for x in values:
        r = test(x)
        if r:
            return True
        if r is None:
            result = None
    return result


def _apply(test: Tester, value: Any) -> Truth:
    if type(value) is _Many:
        return _any(test, value)
    return test(value)


def _number(value: Any) -> int | float | None:
    kind = type(value)
    if kind is int or kind is float:
        number: int | float = value
        return number
    if kind is str:
        return str_to_number(value)
    return None


def _nullish(value: Any) -> bool:
    if value is None:
        return True
    kind = type(value)
    if kind is str:
        return not value
    if kind is _Many:
        return all(x is None or (type(x) is str and not x) for x in value)
    return False


def _compare(a: Any, b: Any, op: Op) -> Truth:
    """Compare two single values under the language's typing rules."""
    ta, tb = type(a), type(b)
    if ta is str:
        if not a:
            return None
        if tb is str:
            return op(a, b) if b else None
        if tb is int or tb is float:
            x = str_to_number(a)
            return None if x is None else op(x, b)
        return None
    if ta is int or ta is float:
        if tb is int or tb is float:
            return op(a, b)
        if tb is str:
            y = str_to_number(b)
            return None if y is None else op(a, y)
        return None
    if ta is bool:
        return op(a, b) if tb is bool else None
    return None


def _compare_any(a: Any, b: Any, op: Op) -> Truth:
    if type(a) is _Many or type(b) is _Many:
        result: Truth = False
        for x in _each(a):
            for y in _each(b):
                r = _compare(x, y, op)
                if r:
                    return True
                if r is None:
                    result = None
        return result
    return _compare(a, b, op)


def _tester(literal: ast.Scalar, op: Op) -> Tester:
    """``lambda v: compare(v, literal)`` specialised on the literal's type, which is known now."""
    if literal is None or literal == "":

        def test_null(v: Any) -> Truth:
            return None

        return test_null

    if isinstance(literal, bool):
        flag = literal

        def test_bool(v: Any) -> Truth:
            return op(v, flag) if type(v) is bool else None

        return test_bool

    if isinstance(literal, str):
        text = literal
        number = str_to_number(text)

        def test_str(v: Any) -> Truth:
            kind = type(v)
            if kind is str:
                return op(v, text) if v else None
            if number is not None and (kind is int or kind is float):
                return op(v, number)
            return None

        return test_str

    num = literal

    def test_number(v: Any) -> Truth:
        kind = type(v)
        if kind is int or kind is float:
            return op(v, num)
        if kind is str:
            x = str_to_number(v)
            return None if x is None else op(x, num)
        return None

    return test_number


def _and3(a: Truth, b: Truth) -> Truth:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


# ---------------------------------------------------------------------------- compilation


def compile_predicate(expr: ast.Expr) -> Predicate:
    """A function giving ``expr``'s three-valued result (True, False, None) for a record."""
    return _pred(expr)


# Functions whose value comes from the StageInput rather than from their arguments.
_CONTEXT_FUNCTIONS = frozenset({"AMPS_INSTANCE_NAME", "UNIX_TIMESTAMP"})


def _has_path(node: ast.Expr) -> bool:
    """Whether the value depends on the record (else it is folded to a constant)."""
    return any(
        isinstance(n, ast.Path) or (isinstance(n, ast.Func) and n.name in _CONTEXT_FUNCTIONS)
        for n in ast.walk(node)
    )


def _pred(node: ast.Expr) -> Predicate:
    fn = _pred_raw(node)
    if not _has_path(node):
        # No field is read, so the answer is the same for every record (`1=1` is common).
        const = fn({})
        return lambda rec: const
    return fn


def _value(node: ast.Expr) -> ValueFn:
    fn = _value_raw(node)
    if not _has_path(node):
        const = fn({})
        return lambda rec: const
    return fn


def compile_value(expr: ast.Expr) -> ValueFn:
    """Compile a value expression (path, literal, arithmetic, function) to ``record -> value``.

    The result is None for NULL and a tuple subclass when a path crossed an array (one item
    per value), the same values filters compare.
    """
    return _value(expr)


def _literal_value(node: ast.Expr) -> tuple[bool, ast.Scalar]:
    if isinstance(node, ast.Literal):
        return True, node.value
    return False, None


def _pred_raw(node: ast.Expr) -> Predicate:
    match node:
        case ast.Compare():
            return _compile_compare(node)
        case ast.And(operands=ops):
            return _compile_and([_pred(o) for o in ops])
        case ast.Or(operands=ops):
            return _compile_or([_pred(o) for o in ops])
        case ast.Not(operand=operand):
            inner = _pred(operand)

            def not_(rec: Record) -> Truth:
                r = inner(rec)
                return None if r is None else not r

            return not_
        case ast.In():
            return _compile_in(node)
        case ast.Between():
            return _compile_between(node)
        case ast.Like(value=value, pattern=pattern):
            search = re.compile(pattern).search

            def like_test(x: Any) -> Truth:
                s = _text(x)
                return None if s is None else search(s) is not None

            return _on_values(_value(value), like_test)
        case ast.IsNull(value=value):
            get = _value(value)
            return lambda rec: _nullish(get(rec))
        case ast.BeginsWith(value=value, prefixes=items):
            return _compile_affix(value, items, str.startswith)
        case ast.EndsWith(value=value, suffixes=items):
            return _compile_affix(value, items, str.endswith)
    # Anything else is a value in boolean position, which means `value = TRUE`.
    return _on_values(_value(node), _tester(True, operator.eq))


def _on_values(get: ValueFn, test: Tester) -> Predicate:
    def pred(rec: Record) -> Truth:
        v = get(rec)
        if type(v) is _Many:
            return _any(test, v)
        return test(v)

    return pred


def _compile_compare(node: ast.Compare) -> Predicate:
    op_name, left, right = node.op, node.left, node.right
    left_is_lit = isinstance(left, ast.Literal)
    if left_is_lit and not isinstance(right, ast.Literal):
        op_name, left, right, left_is_lit = _FLIPPED[op_name], right, left, False
    right_is_lit, right_lit = _literal_value(right)
    op = _OPS[op_name]
    if right_is_lit and not left_is_lit:
        test = _tester(right_lit, op)
        if isinstance(left, ast.Path) and len(left.steps) == 1:
            return _single_key_compare(left.steps[0], test)
        return _on_values(_value(left), test)
    get_left, get_right = _value(left), _value(right)
    return lambda rec: _compare_any(get_left(rec), get_right(rec), op)


def _single_key_compare(key: str, test: Tester) -> Predicate:
    # The hot path (`/price > 100`): path lookup inlined, one extra call for the test.
    def pred(rec: Record) -> Truth:
        v = rec.get(key)
        kind = type(v)
        if kind is list or kind is tuple:
            v = _expand(v)
            if type(v) is _Many:
                return _any(test, v)
        return test(v)

    return pred


def _compile_and(fns: list[Predicate]) -> Predicate:
    if len(fns) == 2:
        first, second = fns

        def and2(rec: Record) -> Truth:
            a = first(rec)
            if a is False:
                return False
            b = second(rec)
            if b is False:
                return False
            return None if a is None or b is None else True

        return and2

    def and_n(rec: Record) -> Truth:
        result: Truth = True
        for fn in fns:
            r = fn(rec)
            if r is False:
                return False
            if r is None:
                result = None
        return result

    return and_n


def _compile_or(fns: list[Predicate]) -> Predicate:
    if len(fns) == 2:
        first, second = fns

        def or2(rec: Record) -> Truth:
            a = first(rec)
            if a is True:
                return True
            b = second(rec)
            if b is True:
                return True
            return None if a is None or b is None else False

        return or2

    def or_n(rec: Record) -> Truth:
        result: Truth = False
        for fn in fns:
            r = fn(rec)
            if r is True:
                return True
            if r is None:
                result = None
        return result

    return or_n


def _compile_in(node: ast.In) -> Predicate:
    get = _value(node.value)
    if all(isinstance(o, ast.Literal) for o in node.options):
        literals = [o.value for o in node.options if isinstance(o, ast.Literal)]
        return _on_values(get, _in_tester(literals))
    option_fns = [_value(o) for o in node.options]
    eq = operator.eq

    def in_dynamic(rec: Record) -> Truth:
        v = get(rec)
        result: Truth = False
        for fn in option_fns:
            r = _compare_any(v, fn(rec), eq)
            if r:
                return True
            if r is None:
                result = None
        return result

    return in_dynamic


def _in_tester(options: list[ast.Scalar]) -> Tester:
    """Set-based ``v IN (literals)`` with exactly the result of OR-ing ``v = option``.

    Membership answers TRUE in O(1); whether a miss is FALSE or UNKNOWN depends only on the kinds
    of option present (a NULL option, or one the value's type cannot be compared with).
    """
    strings: set[str] = set()
    numbers: set[int | float] = set()
    string_numbers: set[int | float] = set()
    flags: set[bool] = set()
    has_null = has_non_numeric_string = False
    for o in options:
        if o is None or o == "":
            has_null = True
        elif isinstance(o, bool):
            flags.add(o)
        elif isinstance(o, str):
            strings.add(o)
            n = str_to_number(o)
            if n is None:
                has_non_numeric_string = True
            else:
                string_numbers.add(n)
        else:
            numbers.add(o)
    str_miss: Truth = None if has_null or flags else False
    num_miss: Truth = None if has_null or flags or has_non_numeric_string else False
    bool_miss: Truth = None if has_null or strings or numbers else False

    def test(v: Any) -> Truth:
        kind = type(v)
        if kind is str:
            if not v:
                return None
            if v in strings:
                return True
            if numbers:
                x = str_to_number(v)
                if x is None:
                    return None
                if x in numbers:
                    return True
            return str_miss
        if kind is int or kind is float:
            if v in numbers or v in string_numbers:
                return True
            return num_miss
        if kind is bool:
            return True if v in flags else bool_miss
        return None

    return test


def _compile_between(node: ast.Between) -> Predicate:
    get = _value(node.value)
    ge, le = operator.ge, operator.le
    low_is_lit, low = _literal_value(node.low)
    high_is_lit, high = _literal_value(node.high)
    if low_is_lit and high_is_lit:
        low_test, high_test = _tester(low, ge), _tester(high, le)

        def between_test(x: Any) -> Truth:
            a = low_test(x)
            if a is False:
                return False
            b = high_test(x)
            if b is False:
                return False
            return None if a is None or b is None else True

        return _on_values(get, between_test)

    get_low, get_high = _value(node.low), _value(node.high)

    def between_dynamic(rec: Record) -> Truth:
        lo, hi = get_low(rec), get_high(rec)
        return _apply(lambda x: _and3(_compare_any(x, lo, ge), _compare_any(x, hi, le)), get(rec))

    return between_dynamic


def _compile_affix(
    value: ast.Expr, items: tuple[ast.Expr, ...], method: Callable[[str, Any], bool]
) -> Predicate:
    get = _value(value)
    if all(isinstance(i, ast.Literal) for i in items):
        texts = [_text(i.value) for i in items if isinstance(i, ast.Literal)]
        affixes = tuple(t for t in texts if t is not None)
        miss: Truth = None if len(affixes) < len(texts) else False

        def affix_test(x: Any) -> Truth:
            s = _text(x)
            if s is None:
                return None
            return True if method(s, affixes) else miss

        return _on_values(get, affix_test)

    item_fns = [_value(i) for i in items]

    def affix_dynamic(rec: Record) -> Truth:
        found: list[str] = []
        unknown = False
        for fn in item_fns:
            for y in _each(fn(rec)):
                t = _text(y)
                if t is None:
                    unknown = True
                else:
                    found.append(t)
        affixes = tuple(found)
        miss: Truth = None if unknown else False

        def test(x: Any) -> Truth:
            s = _text(x)
            if s is None:
                return None
            return True if method(s, affixes) else miss

        return _apply(test, get(rec))

    return affix_dynamic


# ---------------------------------------------------------------------------- values


def _value_raw(node: ast.Expr) -> ValueFn:
    match node:
        case ast.Path():
            return _compile_path(node.steps)
        case ast.Previous(path=path):
            read = _compile_path(path.steps)

            def previous(rec: Record) -> Any:
                stored = rec.previous  # type: ignore[attr-defined]  # a StageInput
                return None if stored is None else read(stored)

            return previous
        case ast.Literal(value=value):
            const = None if value == "" else value
            return lambda rec: const
        case ast.Arith(op=op, left=left, right=right):
            return _compile_arith(op, _value(left), _value(right))
        case ast.Neg(operand=operand):
            get = _value(operand)
            return lambda rec: _map1(_negate, get(rec))
        case ast.Func():
            return _compile_func(node)
    # Predicates used as values yield their truth value (UNKNOWN is NULL).
    return _pred(node)


def _compile_path(steps: tuple[str, ...]) -> ValueFn:
    if len(steps) == 1:
        key = steps[0]

        def get_one(rec: Record) -> Any:
            v = rec.get(key)
            kind = type(v)
            if kind is list or kind is tuple:
                return _expand(v)
            return v

        return get_one

    def get_many(rec: Record) -> Any:
        cur: Any = rec
        for i, key in enumerate(steps):
            kind = type(cur)
            if kind is dict:
                cur = cur.get(key)
            elif kind is list or kind is tuple:
                out: list[Any] = []
                collect_path(cur, steps, i, out)
                return _from_list(out)
            elif isinstance(cur, Mapping):
                cur = cur.get(key)
            else:
                return None
        kind = type(cur)
        if kind is list or kind is tuple:
            return _expand(cur)
        return cur

    return get_many


def _map1(fn: Callable[[Any], Any], value: Any) -> Any:
    if type(value) is _Many:
        return _from_list([fn(x) for x in value])
    return fn(value)


def _negate(v: Any) -> Any:
    x = _number(v)
    return None if x is None else -x


def _divide(x: float, y: float) -> float | None:
    return None if y == 0 else x / y


def _modulo(x: float, y: float) -> float | None:
    # SQL's remainder takes the dividend's sign (Python's % takes the divisor's).
    if y == 0:
        return None
    if isinstance(x, int) and isinstance(y, int):
        r = abs(x) % abs(y)
        return -r if x < 0 else r
    return math.fmod(x, y)


_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": _divide,
    "%": _modulo,
}


def _compile_arith(op: str, get_left: ValueFn, get_right: ValueFn) -> ValueFn:
    fn = _ARITH[op]

    def scalar(a: Any, b: Any) -> Any:
        x, y = _number(a), _number(b)
        if x is None or y is None:
            return None
        try:
            return fn(x, y)
        except (OverflowError, ValueError):  # huge int to float, fmod of infinity
            return None

    def arith(rec: Record) -> Any:
        a, b = get_left(rec), get_right(rec)
        if type(a) is _Many or type(b) is _Many:
            return _from_list([scalar(x, y) for x in _each(a) for y in _each(b)])
        return scalar(a, b)

    return arith


# ---------------------------------------------------------------------------- functions


def _upper(v: Any) -> str | None:
    s = _text(v)
    return None if s is None else s.upper()


def _lower(v: Any) -> str | None:
    s = _text(v)
    return None if s is None else s.lower()


def _length(v: Any) -> int | None:
    s = _text(v)
    return None if s is None else len(s)


def _instr(v: Any, sub: Any) -> int | None:
    s, t = _text(v), _text(sub)
    return None if s is None or t is None else s.find(t) + 1


def _instr_i(v: Any, sub: Any) -> int | None:
    s, t = _text(v), _text(sub)
    return None if s is None or t is None else s.lower().find(t.lower()) + 1


def _strequal_i(a: Any, b: Any) -> bool | None:
    s, t = _text(a), _text(b)
    return None if s is None or t is None else s.lower() == t.lower()


def _concat(*parts: Any) -> str | None:
    return "".join(t for t in map(_text, parts) if t is not None) or None


def _crc32(v: Any) -> int | None:
    s = _text(v)
    return None if s is None else zlib.crc32(s.encode("utf-8"))


_SCALAR_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "CRC32": _crc32,
    "UPPER": _upper,
    "LOWER": _lower,
    "LENGTH": _length,
    "INSTR": _instr,
    "INSTR_I": _instr_i,
    "STREQUAL_I": _strequal_i,
    "CONCAT": _concat,
}


def _compile_func(node: ast.Func) -> ValueFn:
    if node.name == "IF":
        return _compile_if(*node.args)
    if node.name == "UNIX_TIMESTAMP":
        return lambda rec: rec.timestamp_ms / 1000  # type: ignore[attr-defined]
    if node.name == "AMPS_INSTANCE_NAME":
        return lambda rec: rec.instance_name  # type: ignore[attr-defined]
    getters = [_value(a) for a in node.args]
    if node.name == "COALESCE":

        def coalesce(rec: Record) -> Any:
            for get in getters:
                v = get(rec)
                if not _nullish(v):
                    return v
            return None

        return coalesce

    fn = _SCALAR_FUNCTIONS[node.name]
    if len(getters) == 1:
        (get,) = getters
        return lambda rec: _map1(fn, get(rec))

    def call(rec: Record) -> Any:
        args = [get(rec) for get in getters]
        if any(type(a) is _Many for a in args):
            # Multi-valued arguments: the function over every combination of their values.
            return _from_list([fn(*combo) for combo in product(*map(_each, args))])
        return fn(*args)

    return call


def _compile_if(condition: ast.Expr, then: ast.Expr, otherwise: ast.Expr) -> ValueFn:
    # UNKNOWN takes the else branch, as a SQL CASE does.
    test, get_then, get_else = _pred(condition), _value(then), _value(otherwise)
    return lambda rec: get_then(rec) if test(rec) is True else get_else(rec)


class StageInput(Mapping[str, Any]):
    """What a Preprocessing or Enrichment expression reads: paths read ``current`` (the message
    being processed), ``OF PREVIOUS`` reads ``previous`` (the stored record, or None),
    ``UNIX_TIMESTAMP()`` is ``timestamp_ms`` in seconds and ``AMPS_INSTANCE_NAME()`` is
    ``instance_name``."""

    __slots__ = ("current", "instance_name", "previous", "timestamp_ms")

    def __init__(
        self,
        current: Mapping[str, Any],
        previous: Mapping[str, Any] | None,
        timestamp_ms: int,
        instance_name: str,
    ) -> None:
        self.current = current
        self.previous = previous
        self.timestamp_ms = timestamp_ms
        self.instance_name = instance_name

    def get(self, key: str, default: Any = None) -> Any:
        return self.current.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.current[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.current)

    def __len__(self) -> int:
        return len(self.current)


# ---------------------------------------------------------------------------- public API


class Filter:
    """A parsed and compiled content filter; immutable, cheap to share across threads."""

    __slots__ = ("_predicate", "ast", "paths", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.ast: ast.Expr = parse_filter(text)
        self.paths: frozenset[str] = ast.paths(self.ast)
        self._predicate = _pred(self.ast)

    @classmethod
    def parse(cls, text: str) -> Filter:
        """Same as ``Filter(text)``; reads better at call sites that parse user input."""
        return cls(text)

    def matches(self, record: Record) -> bool:
        """Whether ``record`` (parsed JSON) satisfies the filter; UNKNOWN does not match."""
        return self._predicate(record) is True

    def evaluate(self, record: Record) -> bool | None:
        """The three-valued result: True, False, or None for UNKNOWN (e.g. a NULL comparison)."""
        return self._predicate(record)

    def __repr__(self) -> str:
        return f"Filter({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Filter) and other.ast == self.ast

    def __hash__(self) -> int:
        return hash(self.ast)


@functools.lru_cache(maxsize=4096)
def compile_filter(text: str) -> Filter:
    """``Filter(text)``, memoised: subscriptions and queries reuse the same few filter texts."""
    return Filter(text)


if __name__ == "__main__":  # pragma: no cover - a manual timing check, not a test
    import timeit

    flt = compile_filter("/price > 100 AND /sym = 'IBM'")
    sample = {"sym": "IBM", "price": 120.5, "qty": 300, "side": "buy"}
    runs = 1_000_000
    seconds = min(timeit.repeat(lambda: flt.matches(sample), number=runs, repeat=3))
    print(f"{flt.text!r}: {seconds / runs * 1e9:.0f} ns per record")
