"""The subscription filter index: candidates are always a superset of the matching filters."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sowstream.filters import ast, compile_filter, parse_filter
from sowstream.subscriptions.index import FilterIndex

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def index_of(**filters: str | None) -> FilterIndex:
    index = FilterIndex()
    for sub_id, text in filters.items():
        index.add(sub_id, parse_filter(text) if text is not None else None)
    return index


# Record values that probe the evaluator's typing rules for `=`.
PROBES: list[Any] = [
    5, 5.0, "5", "5.0", " 5 ", "5e0", 6, "6", -5, True, False, "true", "false", 1, 0, "x", "X",
    "", None, 2.5, "2.5", float("inf"), "1e999", 1000, "1e3", "1000.0", {"v": 5}, [5],
]  # fmt: skip


@pytest.mark.parametrize(
    "text",
    [
        "/v = 5",
        "/v = 5.0",
        "/v = '5'",
        "/v = '5.0'",
        "/v = 'x'",
        "/v = true",
        "/v = 'true'",
        "/v = 2.5",
        "/v = 1e3",
        "5 = /v",
        "/v IN (5, 'x', false)",
        "/v IN ('5', 2.5)",
        "/v",
    ],
)
def test_single_equality_is_exact(text: str) -> None:
    """For a lone equality the index is exact, not just a superset: it follows `=` itself."""
    index = index_of(s=text)
    assert index.indexed_path("s") == "/v"
    flt = compile_filter(text)
    for value in PROBES:
        record = {"v": value}
        assert ("s" in index.candidates(record)) == flt.matches(record), (text, value)


def test_symbol_equality_is_indexed_not_scanned() -> None:
    index = index_of(ibm="/symbol = 'IBM'", msft="/symbol = 'MSFT'", both=None)
    assert index.unindexed == {"both"}
    assert index.indexed_path("ibm") == "/symbol"
    assert index.candidates({"symbol": "IBM", "px": 1}) == {"ibm", "both"}
    assert index.candidates({"symbol": "ORCL"}) == {"both"}
    assert len(index) == 3


def test_numbers_and_numeric_strings() -> None:
    index = index_of(num="/qty = 5", text="/qty = '5'", frac="/qty = 5.0")
    assert index.candidates({"qty": 5}) == {"num", "text", "frac"}
    assert index.candidates({"qty": 5.0}) == {"num", "text", "frac"}
    # A record string equals a number literal by value, but a string literal only as spelled.
    assert index.candidates({"qty": "5"}) == {"num", "text", "frac"}
    assert index.candidates({"qty": "5.0"}) == {"num", "frac"}
    assert index.candidates({"qty": " 5"}) == {"num", "frac"}
    assert index.candidates({"qty": 6}) == set()
    assert index.candidates({"qty": True}) == set()


def test_booleans_are_not_numbers_or_strings() -> None:
    index = index_of(flag="/ok = true", text="/ok = 'true'", one="/ok = 1")
    assert index.candidates({"ok": True}) == {"flag"}
    assert index.candidates({"ok": "true"}) == {"text"}
    assert index.candidates({"ok": 1}) == {"one"}
    assert index.candidates({"ok": False}) == set()


def test_bare_path_means_equal_to_true() -> None:
    index = index_of(s="/active AND /px > 3")
    assert index.indexed_path("s") == "/active"
    assert index.candidates({"active": True}) == {"s"}
    assert index.candidates({"active": "true"}) == set()


def test_in_list() -> None:
    index = index_of(s="/sym IN ('A', 'B', 7)")
    for value in ("A", "B", 7, 7.0, "7", "7.00"):
        assert index.candidates({"sym": value}) == {"s"}, value
    assert index.candidates({"sym": "C"}) == set()


def test_and_picks_the_most_selective_equality() -> None:
    index = index_of(s="/region IN ('EU', 'US', 'APAC') AND /px > 3 AND /sym = 'IBM'")
    assert index.indexed_path("s") == "/sym"
    assert index.candidates({"sym": "IBM", "region": "XX"}) == {"s"}


def test_nested_and_of_any_depth() -> None:
    # The parser flattens ANDs; built by hand, the tree can nest.
    inner = ast.And((ast.Compare(">", ast.Path("/px"), ast.Literal(1)),
                     ast.Compare("=", ast.Literal("IBM"), ast.Path("/sym"))))  # fmt: skip
    expr = ast.And((ast.Compare("<", ast.Path("/qty"), ast.Literal(9)), inner))
    index = FilterIndex()
    index.add("s", expr)
    assert index.indexed_path("s") == "/sym"
    assert index.candidates({"sym": "IBM"}) == {"s"}
    assert index.candidates({"sym": "X"}) == set()


@pytest.mark.parametrize(
    "text",
    [
        "/a = 1 OR /b = 2",
        "NOT /a = 1",
        "/a NOT IN (1, 2)",
        "/a != 1",
        "/a > 1",
        "/a = /b",
        "/a IN (/b, 1)",
        "/a + 0 = 1",
        "UPPER(/a) = 'X'",
        "1 = 1",
    ],
)
def test_unindexable_filters_are_always_checked(text: str) -> None:
    index = index_of(s=text)
    assert index.unindexed == {"s"}
    assert index.candidates({}) == {"s"}


@pytest.mark.parametrize(
    "text", ["/a = NULL", "/a = ''", "/a IN (NULL, '')", "/a = NULL AND /b = 1", "1 = 0 AND /a = 1"]
)
def test_filters_that_never_match_are_filed_nowhere(text: str) -> None:
    index = index_of(s=text)
    assert "s" in index
    assert index.unindexed == set()
    assert index.indexed_path("s") is None
    for value in PROBES:
        assert index.candidates({"a": value, "b": 1}) == set()


def test_null_options_are_dropped_from_in() -> None:
    index = index_of(s="/a IN (NULL, 1)")
    assert index.indexed_path("s") == "/a"
    assert index.candidates({"a": 1}) == {"s"}


def test_constant_true_conjunct_is_ignored() -> None:
    index = index_of(s="1 = 1 AND /a = 2")
    assert index.indexed_path("s") == "/a"


def test_arrays_give_several_values() -> None:
    index = index_of(tag="/tags = 'x'", leg="/legs/sym = 'A'", deep="/m/n = 3")
    assert index.candidates({"tags": ["y", "x"]}) == {"tag"}
    assert index.candidates({"tags": [["z", ["x"]]]}) == {"tag"}
    assert index.candidates({"legs": [{"sym": "B"}, {"sym": "A"}]}) == {"leg"}
    assert index.candidates({"legs": {"sym": "A"}}) == {"leg"}
    assert index.candidates({"m": [{"n": [1, 3]}]}) == {"deep"}
    assert index.candidates({"tags": []}) == set()


def test_missing_or_non_scalar_field() -> None:
    index = index_of(s="/a/b = 1")
    assert index.candidates({}) == set()
    assert index.candidates({"a": 1}) == set()
    assert index.candidates({"a": {"c": 1}}) == set()
    assert index.candidates({"a": {"b": {"x": 1}}}) == set()
    assert index.candidates({"a": {"b": None}}) == set()


def test_replace_and_remove() -> None:
    index = index_of(s="/a = 1")
    index.add("s", parse_filter("/b = 2"))
    assert len(index) == 1
    assert index.candidates({"a": 1}) == set()
    assert index.candidates({"b": 2}) == {"s"}
    index.add("s", parse_filter("/b > 2"))
    assert index.unindexed == {"s"}
    index.add("s", parse_filter("/b = 2"))
    assert index.unindexed == set()
    index.remove("s")
    index.remove("s")
    index.remove("unknown")
    assert len(index) == 0
    assert "s" not in index
    assert index.candidates({"b": 2}) == set()


def test_shared_keys_survive_one_removal() -> None:
    index = index_of(x="/a = 1", y="/a = 1.0", z="/a = '1'")
    index.remove("x")
    assert index.candidates({"a": 1}) == {"y", "z"}
    index.remove("z")
    assert index.candidates({"a": "1"}) == {"y"}


# ----------------------------------------------------------------------------- property

PATHS = ["/a", "/b", "/c/d", "/e"]
LITERALS = [
    "5", "5.0", "'5'", "'5.0'", "' 5'", "'x'", "''", "NULL", "TRUE", "false", "'true'", "0",
    "-1", "2.5", "1e3", "'1e3'", "'1000'", "'abc'", "1",
]  # fmt: skip
VALUES: list[Any] = [
    5, 5.0, "5", "5.0", " 5", "x", "", None, True, False, "true", 0, -1, 2.5, float("inf"),
    "1e999", "abc", 1, "1.0", 0.0, "-1", 1000, 1000.0, "1e3", "1000",
]  # fmt: skip

paths = st.sampled_from(PATHS)
literals = st.sampled_from(LITERALS)


@st.composite
def predicates(draw: st.DrawFn) -> str:
    p, lit = draw(paths), draw(literals)
    kind = draw(st.integers(0, 11))
    if kind <= 2:
        op = draw(st.sampled_from(["=", "==", "=", "!=", "<", ">=", "<>"]))
        return f"{lit} {op} {p}" if draw(st.booleans()) else f"{p} {op} {lit}"
    if kind <= 4:
        options = draw(st.lists(literals, min_size=1, max_size=4))
        neg = "NOT " if kind == 4 else ""
        return f"{p} {neg}IN ({', '.join(options)})"
    return draw(
        st.sampled_from(
            [
                p,
                f"{p} IS NULL",
                f"{p} IS NOT NULL",
                f"{p} LIKE '5'",
                f"{p} BETWEEN 0 AND {lit}",
                f"{p} = {draw(paths)}",
                f"{p} IN ({draw(paths)}, {lit})",
                "1 = 1",
                "1 = 0",
            ]
        )
    )


filters = st.recursive(
    predicates(),
    lambda inner: st.one_of(
        st.lists(inner, min_size=2, max_size=3).map(lambda xs: "(" + " AND ".join(xs) + ")"),
        st.lists(inner, min_size=2, max_size=3).map(lambda xs: "(" + " OR ".join(xs) + ")"),
        inner.map(lambda x: f"NOT ({x})"),
    ),
    max_leaves=6,
)

# Conjunctions of plain predicates are what the index files; the rest checks the fallback.
conjunctions = st.lists(st.one_of(predicates(), filters), min_size=1, max_size=3).map(" AND ".join)
any_filter = st.one_of(conjunctions, filters)

scalars = st.sampled_from(VALUES)
field_values = st.one_of(scalars, st.lists(scalars, max_size=3))
records = st.fixed_dictionaries(
    {},
    optional={
        "a": field_values,
        "b": field_values,
        "c": st.one_of(
            st.fixed_dictionaries({}, optional={"d": field_values}),
            st.lists(st.fixed_dictionaries({"d": field_values}), max_size=2),
            scalars,
        ),
        "e": st.lists(scalars, max_size=3),
    },
)


@FAST
@given(
    texts=st.lists(st.one_of(any_filter, st.none()), min_size=1, max_size=8),
    sample=st.lists(records, min_size=1, max_size=6),
    removed=st.sets(st.integers(0, 7), max_size=3),
)
def test_candidates_are_a_superset_of_matches(
    texts: list[str | None], sample: list[dict[str, Any]], removed: set[int]
) -> None:
    index = FilterIndex()
    for i, text in enumerate(texts):
        index.add(str(i), parse_filter(text) if text is not None else None)
    for i in removed:
        index.remove(str(i))
    live = {str(i): text for i, text in enumerate(texts) if i not in removed}
    assert len(index) == len(live)
    for record in sample:
        found = index.candidates(record)
        assert found <= live.keys()
        for sub_id, text in live.items():
            if text is None or compile_filter(text).matches(record):
                assert sub_id in found, (text, record)


@st.composite
def equalities(draw: st.DrawFn) -> str:
    p = draw(paths)
    if draw(st.booleans()):
        return f"{p} IN ({', '.join(draw(st.lists(literals, min_size=1, max_size=4)))})"
    lit = draw(literals)
    return f"{lit} = {p}" if draw(st.booleans()) else f"{p} = {lit}"


@FAST
@given(
    texts=st.lists(
        st.lists(equalities(), min_size=1, max_size=2).map(" AND ".join), min_size=1, max_size=8
    ),
    sample=st.lists(records, min_size=1, max_size=6),
)
def test_indexed_equalities_find_every_match(
    texts: list[str], sample: list[dict[str, Any]]
) -> None:
    """Only indexable filters, so that matches are frequent and each goes through a lookup."""
    index = FilterIndex()
    for i, text in enumerate(texts):
        index.add(str(i), parse_filter(text))
    assert index.unindexed == set()
    for record in sample:
        found = index.candidates(record)
        for i, text in enumerate(texts):
            if compile_filter(text).matches(record):
                assert str(i) in found, (text, record)


@FAST
@given(p=paths, lit=literals, rest=st.lists(predicates(), max_size=3))
def test_a_conjunct_equality_is_always_indexed(p: str, lit: str, rest: list[str]) -> None:
    index = FilterIndex()
    index.add("s", parse_filter(" AND ".join([f"{p} = {lit}", *rest])))
    assert index.unindexed == set()


def test_candidates_from_values_read_at_the_indexed_paths_until_the_paths_change() -> None:
    """The compiled fold reads a record's values at ``paths``; they stand in for the record
    only while the index still has exactly those paths."""
    index = index_of(a="/sym = 'IBM'", b="/qty = 5", c="/desk = 'x' OR /qty > 1")
    paths = index.paths
    assert set(paths) == {"/sym", "/qty"}
    values = tuple({"/sym": "IBM", "/qty": 5.0}[p] for p in paths)
    assert index.candidates_at(paths, values) == {"a", "b", "c"}
    assert index.candidates_at(paths, (None, None)) == {"c"}
    index.add("d", parse_filter("/px = 1"))
    assert index.paths is not paths
    assert index.candidates_at(paths, values) is None  # read at paths the index no longer has
    index.remove("d")
    assert index.candidates_at(paths, values) is None  # the same paths, but a new tuple
    assert index.candidates_at(index.paths, values) == {"a", "b", "c"}
