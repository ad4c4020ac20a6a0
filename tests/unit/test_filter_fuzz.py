"""Property tests: the parser only ever raises FilterError, and evaluation agrees with a small,
independently written reference evaluator."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sowstream.filters import Filter, FilterError, parse_filter
from sowstream.filters import ast as A

FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ----------------------------------------------------------------------------- parser robustness

VALID = [
    "/price > 100 AND /sym = 'IBM'",
    "/a IN (1, 'x', NULL) OR NOT /b BETWEEN -1 AND 2.5",
    "/s LIKE '(?i)^ab\\d+$' AND /t NOT LIKE 'z'",
    "/x IS NOT NULL AND /y IS NULL",
    "/s BEGINS WITH ('a', 'b') OR /s NOT ENDS WITH ('c')",
    "UPPER(/a) = LOWER(/b) AND LENGTH(/c) >= INSTR(/d, 'e')",
    "COALESCE(/a, /b, 0) + 2 * -/c % 3 / 4 <> 5",
    "CONCAT(/first, ' ', /last) == \"Ada Lovelace\" AND STREQUAL_I(/x, 'Y')",
    "(/a = 1 OR /b = 2) AND (/c = 3 OR NOT (/d = 4))",
    "/legs/qty > 10 AND /55 = 'FIX' AND /active",
    "1=1",
    "INSTR_I(/s, 'O''Brien') > 0",
]

TOKENS = [
    "/a", "/b/c", "/55", "/x-y", "'s'", "''", '"d"', "'\\''", "'(('", "1", "2.5", ".5", "-",
    "+", "*", "/", "%", "=", "==", "!=", "<>", "<", "<=", ">", ">=", "(", ")", ",", "AND",
    "OR", "NOT", "IN", "BETWEEN", "LIKE", "IS", "NULL", "BEGINS", "ENDS", "WITH", "TRUE",
    "false", "UPPER", "concat", "COALESCE", "foo", "#", "'", '"', "\\", "1e999", "9" * 30, "\n",
]  # fmt: skip

token_soup = st.lists(st.sampled_from(TOKENS), max_size=25).flatmap(
    lambda toks: st.lists(
        st.sampled_from([" ", "", "  "]), min_size=len(toks), max_size=len(toks)
    ).map(lambda seps: "".join(t + s for t, s in zip(toks, seps, strict=True)))
)


@st.composite
def mutated(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(VALID))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 6)))
        kind = draw(st.sampled_from(["delete", "insert", "replace", "duplicate"]))
        if kind == "delete":
            text = text[:i] + text[j:]
        elif kind == "insert":
            text = text[:i] + draw(st.sampled_from(TOKENS) | st.text(max_size=3)) + text[i:]
        elif kind == "replace":
            text = text[:i] + draw(st.text(max_size=3)) + text[j:]
        else:
            text = text[:j] + text[i:j] + text[j:]
    return text


SAMPLE_RECORDS: list[dict[str, Any]] = [
    {},
    {"a": 1, "b": {"c": "x"}, "s": "abc", "price": "120", "sym": "IBM", "active": True},
    {"a": [1, None, "2", {"q": 1}], "b": [], "c": [[0.5]], "s": "", "x": None, "55": "FIX"},
    {"a": "9" * 40, "b": {"c": [True, False]}, "d": 1e308, "legs": [{"qty": 20}]},
]


def check_parse(text: str) -> None:
    try:
        tree = parse_filter(text)
    except FilterError as err:
        assert 0 <= err.position <= len(text)
        assert err.line >= 1 and err.column >= 1
        assert "internal error" not in str(err), str(err)
        return
    # What parses must print back to an equal tree, compile, and evaluate without raising.
    assert parse_filter(A.to_text(tree)) == tree
    flt = Filter(text)
    for record in SAMPLE_RECORDS:
        assert flt.evaluate(record) in (True, False, None)


@FAST
@given(st.text(max_size=60))
def test_random_text_only_raises_filter_error(text: str) -> None:
    check_parse(text)


@FAST
@given(token_soup)
def test_random_token_sequences_only_raise_filter_error(text: str) -> None:
    check_parse(text)


@FAST
@given(mutated())
def test_mutated_valid_filters_only_raise_filter_error(text: str) -> None:
    check_parse(text)


def test_the_seed_filters_are_valid() -> None:
    for text in VALID:
        parse_filter(text)


# ----------------------------------------------------------------------------- evaluation oracle
#
# The reference below is deliberately naive: it follows the documented rules literally, one
# helper per rule, with none of the evaluator's specialisation.

PATHS = ["/a", "/b", "/c/x"]
OPS = ["=", "!=", "<", "<=", ">", ">="]
NUMERIC = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.5, -1.5, 2.0]),
    st.sampled_from(["", "a", "b", "B", "1", "2.0", "-1", " 3 ", "x1", "1e0", "ab"]),
)
field_values = st.one_of(scalars, st.lists(scalars, max_size=3), st.just({"k": 1}))
records = st.fixed_dictionaries(
    {},
    optional={
        "a": field_values,
        "b": field_values,
        "c": st.one_of(st.fixed_dictionaries({}, optional={"x": field_values}), field_values),
    },
)
literals = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.5, -1.5, 2.0]),
    st.sampled_from(["", "a", "b", "1", "2.0", "x1", "it's"]),
)

leaf = st.one_of(
    st.tuples(st.just("cmp"), st.sampled_from(PATHS), st.sampled_from(OPS), literals),
    st.tuples(st.just("in"), st.sampled_from(PATHS), st.lists(literals, min_size=1, max_size=3)),
    st.tuples(st.just("isnull"), st.sampled_from(PATHS)),
    st.tuples(st.just("between"), st.sampled_from(PATHS), literals, literals),
    st.tuples(st.just("bare"), st.sampled_from(PATHS)),
)
specs = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.tuples(st.just("and"), inner, inner),
        st.tuples(st.just("or"), inner, inner),
        st.tuples(st.just("not"), inner),
    ),
    max_leaves=6,
)


def lit_text(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


def render(spec: tuple[Any, ...]) -> str:
    kind = spec[0]
    if kind == "cmp":
        return f"{spec[1]} {spec[2]} {lit_text(spec[3])}"
    if kind == "in":
        return f"{spec[1]} IN ({', '.join(lit_text(v) for v in spec[2])})"
    if kind == "isnull":
        return f"{spec[1]} IS NULL"
    if kind == "between":
        return f"{spec[1]} BETWEEN {lit_text(spec[2])} AND {lit_text(spec[3])}"
    if kind == "bare":
        return spec[1]
    if kind == "not":
        return f"NOT ({render(spec[1])})"
    return f"({render(spec[1])}) {kind.upper()} ({render(spec[2])})"


def ref_values(node: Any, steps: list[str]) -> list[Any]:
    if isinstance(node, list):
        return [v for item in node for v in ref_values(item, steps)]
    if not steps:
        return [node]
    if isinstance(node, dict) and steps[0] in node:
        return ref_values(node[steps[0]], steps[1:])
    return []


def ref_null(v: Any) -> bool:
    return v is None or v == ""


def ref_num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str) and NUMERIC.fullmatch(v):
        return float(v)
    return None


def ref_op(a: Any, b: Any, op: str) -> bool:
    return {
        "=": a == b,
        "!=": a != b,
        "<": a < b,
        "<=": a <= b,
        ">": a > b,
        ">=": a >= b,
    }[op]


def ref_cmp1(a: Any, b: Any, op: str) -> bool | None:
    if ref_null(a) or ref_null(b):
        return None
    if isinstance(a, bool) or isinstance(b, bool):
        return ref_op(a, b, op) if isinstance(a, bool) and isinstance(b, bool) else None
    if isinstance(a, str) and isinstance(b, str):
        return ref_op(a, b, op)
    if isinstance(a, dict | list) or isinstance(b, dict | list):
        return None
    x, y = ref_num(a), ref_num(b)
    return None if x is None or y is None else ref_op(x, y, op)


def ref_or(results: list[bool | None]) -> bool | None:
    if True in results:
        return True
    return None if None in results else False


def ref_and(results: list[bool | None]) -> bool | None:
    if False in results:
        return False
    return None if None in results else True


def ref_not(r: bool | None) -> bool | None:
    return None if r is None else not r


def ref_any(values: list[Any], test: Any) -> bool | None:
    return ref_or([test(v) for v in values]) if values else None


def ref_eval(spec: tuple[Any, ...], record: dict[str, Any]) -> bool | None:
    kind = spec[0]
    if kind in ("and", "or"):
        results = [ref_eval(spec[1], record), ref_eval(spec[2], record)]
        return ref_and(results) if kind == "and" else ref_or(results)
    if kind == "not":
        return ref_not(ref_eval(spec[1], record))
    values = ref_values(record, spec[1][1:].split("/"))
    if kind == "cmp":
        return ref_any(values, lambda v: ref_cmp1(v, spec[3], spec[2]))
    if kind == "in":
        return ref_any(values, lambda v: ref_or([ref_cmp1(v, o, "=") for o in spec[2]]))
    if kind == "isnull":
        return all(ref_null(v) for v in values)
    if kind == "between":
        lo, hi = spec[2], spec[3]
        return ref_any(values, lambda v: ref_and([ref_cmp1(v, lo, ">="), ref_cmp1(v, hi, "<=")]))
    assert kind == "bare"
    return ref_any(values, lambda v: ref_cmp1(v, True, "="))


@settings(max_examples=800, deadline=None)
@given(specs, st.lists(records, min_size=1, max_size=5))
def test_evaluation_agrees_with_the_reference(spec: tuple[Any, ...], recs: list[Any]) -> None:
    text = render(spec)
    flt = Filter(text)
    for record in recs:
        expected = ref_eval(spec, record)
        assert flt.evaluate(record) is expected, (text, record)
        assert flt.matches(record) is (expected is True)


@settings(max_examples=200, deadline=None)
@given(records, st.sampled_from(PATHS))
def test_get_path_agrees_with_the_reference(record: dict[str, Any], path: str) -> None:
    from sowstream.filters.values import get_path

    assert get_path(record, path) == ref_values(record, path[1:].split("/"))
