"""Evaluating filters against parsed JSON records: operators, NULLs, types and arrays."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from sowstream.filters import Filter, FilterError, compile_filter, compile_predicate, parse_filter
from sowstream.filters import ast as A
from sowstream.filters.values import canonical_text, get_path, is_null, to_number

T, F, U = True, False, None  # U is UNKNOWN


def ev(text: str, record: dict[str, Any]) -> bool | None:
    return compile_filter(text).evaluate(record)


def m(text: str, record: dict[str, Any]) -> bool:
    return compile_filter(text).matches(record)


# ----------------------------------------------------------------------------- comparisons


@pytest.mark.parametrize(
    ("op", "results"),
    [
        ("=", (F, T, F)),
        ("==", (F, T, F)),
        ("!=", (T, F, T)),
        ("<>", (T, F, T)),
        ("<", (T, F, F)),
        ("<=", (T, T, F)),
        (">", (F, F, T)),
        (">=", (F, T, T)),
    ],
)
def test_every_comparison_operator_on_numbers_and_strings(
    op: str, results: tuple[bool, bool, bool]
) -> None:
    for value, expected in zip((5, 10, 15), results, strict=True):
        assert ev(f"/n {op} 10", {"n": value}) is expected
        assert ev(f"/n {op} 10.0", {"n": float(value)}) is expected
    for value, expected in zip(("b", "m", "x"), results, strict=True):
        assert ev(f"/s {op} 'm'", {"s": value}) is expected


def test_literal_on_the_left_is_flipped() -> None:
    assert m("100 < /price", {"price": 120})
    assert not m("100 > /price", {"price": 120})
    assert m("'IBM' = /sym", {"sym": "IBM"})
    assert m("5 >= /n", {"n": 5})


def test_path_against_path() -> None:
    assert m("/bid < /ask", {"bid": 1.5, "ask": "2"})
    assert not m("/bid = /ask", {"bid": 1, "ask": 2})
    assert ev("/bid = /ask", {"bid": 1}) is U


def test_numeric_strings_compare_as_numbers_against_numbers() -> None:
    assert m("/price > 100", {"price": "120"})
    assert not m("/price > 100", {"price": "99.5"})
    assert m("/id = '7'", {"id": 7})
    assert m("/id = '7.0'", {"id": 7})
    assert m("/id = 7", {"id": "7"})
    assert m("/id = 7", {"id": " 7 "})
    assert m("/x = 1000", {"x": "1e3"})
    assert m("/x < 0", {"x": "-0.5"})


def test_two_strings_compare_as_strings() -> None:
    assert not m("/a = '7'", {"a": "07"})
    assert m("/a > '100'", {"a": "20"})  # text order, not numeric
    assert m("/a < 'b'", {"a": "B"})  # code point order, case-sensitive


def test_number_against_non_numeric_string_is_unknown() -> None:
    assert ev("/price > 100", {"price": "lots"}) is U
    assert ev("/name = 5", {"name": "five"}) is U
    assert ev("/n = 'five'", {"n": 5}) is U
    assert not m("NOT /price > 100", {"price": "lots"})
    assert ev("/n = 'Infinity'", {"n": 5}) is U
    assert ev("/n = '0x10'", {"n": 16}) is U
    assert ev("/n = '1_000'", {"n": 1000}) is U


def test_booleans_compare_only_with_booleans() -> None:
    assert m("/flag = true", {"flag": True})
    assert m("/flag = FALSE", {"flag": False})
    assert m("/flag != true", {"flag": False})
    assert ev("/flag = true", {"flag": "true"}) is U
    assert ev("/flag = true", {"flag": 1}) is U
    assert ev("/n = 1", {"n": True}) is U
    assert ev("/flag = 'true'", {"flag": True}) is U


def test_objects_and_whole_values_compare_as_unknown() -> None:
    record = {"o": {"a": 1}}
    assert ev("/o = 1", record) is U
    assert ev("/o = '{\"a\":1}'", record) is U
    assert ev("/o = /o", record) is U
    assert m("/o/a = 1", record)


def test_large_and_mixed_numbers() -> None:
    assert m("/n = 12345678901234567890", {"n": 12345678901234567890})
    assert m("/n > 1.5", {"n": 2})
    assert m("/n = 2", {"n": 2.0})
    assert m("/n > 0", {"n": "9" * 5000})  # too long for int(), still a (huge) number


# ----------------------------------------------------------------------------- NULL and 3VL


@pytest.mark.parametrize("record", [{}, {"a": None}, {"a": ""}, {"a": []}])
def test_missing_null_empty_string_and_empty_array_are_null(record: dict[str, Any]) -> None:
    assert ev("/a = 1", record) is U
    assert ev("/a != 1", record) is U
    assert ev("/a = ''", record) is U
    assert ev("/a < 'x'", record) is U
    assert m("/a IS NULL", record)
    assert not m("/a IS NOT NULL", record)
    assert ev("/a IN (1, 'x')", record) is U
    assert ev("/a NOT IN (1, 'x')", record) is U
    assert ev("/a LIKE '.*'", record) is U
    assert ev("/a BETWEEN 1 AND 2", record) is U
    assert ev("/a BEGINS WITH ('x')", record) is U


def test_null_literals_are_unknown_in_comparisons() -> None:
    assert ev("/a = NULL", {"a": 1}) is U
    assert ev("/a != NULL", {"a": 1}) is U
    assert ev("/a = ''", {"a": ""}) is U
    assert ev("NULL = NULL", {}) is U
    assert ev("NULL IS NULL", {}) is T
    assert ev("'' IS NULL", {}) is T


def test_is_null_on_present_values() -> None:
    for value in (0, False, "x", {"k": 1}, [None, 1], " "):
        assert not m("/a IS NULL", {"a": value}), value
        assert m("/a IS NOT NULL", {"a": value}), value
    assert m("/a IS NULL", {"a": [None, ""]})


def test_three_valued_logic_truth_tables() -> None:
    rec = {"t": 1, "f": 2}
    true, false, unknown = "/t = 1", "/f = 1", "/missing = 1"
    assert ev(f"NOT {unknown}", rec) is U
    assert ev(f"NOT {true}", rec) is F
    assert ev(f"NOT {false}", rec) is T
    assert ev(f"{unknown} AND {false}", rec) is F
    assert ev(f"{false} AND {unknown}", rec) is F
    assert ev(f"{unknown} AND {true}", rec) is U
    assert ev(f"{true} AND {true} AND {unknown}", rec) is U
    assert ev(f"{unknown} AND {unknown} AND {false}", rec) is F
    assert ev(f"{unknown} OR {true}", rec) is T
    assert ev(f"{true} OR {unknown}", rec) is T
    assert ev(f"{unknown} OR {false}", rec) is U
    assert ev(f"{false} OR {false} OR {unknown}", rec) is U
    assert ev(f"{false} OR {false} OR {false}", rec) is F
    assert ev(f"NOT ({unknown} OR {false})", rec) is U
    assert ev(f"NOT ({unknown} AND {false})", rec) is T
    # UNKNOWN at the top never matches, negated or not.
    assert not m(unknown, rec) and not m(f"NOT {unknown}", rec)


def test_constant_filters() -> None:
    assert m("1=1", {})
    assert m("1 = 1", {"anything": "at all"})
    assert not m("1=2", {})
    assert m("TRUE", {}) and not m("FALSE", {})
    assert ev("NULL", {}) is U
    assert ev("1", {}) is U  # a non-boolean in boolean context is `1 = TRUE`: UNKNOWN
    assert m("2 * 3 = 6 AND 'a' < 'b'", {})


def test_bare_values_in_boolean_context_mean_equals_true() -> None:
    assert m("/active", {"active": True})
    assert ev("/active", {"active": False}) is F
    assert ev("/active", {}) is U
    assert ev("/active", {"active": "true"}) is U
    assert ev("/active", {"active": 1}) is U
    assert m("NOT /active", {"active": False})
    assert not m("NOT /active", {})
    assert m("/flags", {"flags": [False, True]})
    assert m("/a = 1 AND /ok", {"a": 1, "ok": True})


def test_predicates_as_values() -> None:
    assert m("(/a > 1) = true", {"a": 2})
    assert m("(/a > 1) = false", {"a": 0})
    assert ev("(/a > 1) = false", {}) is U
    assert m("COALESCE(/a > 1, true)", {})


# ----------------------------------------------------------------------------- arrays


def test_any_value_of_an_array_satisfies_a_comparison() -> None:
    rec = {"tags": ["red", "green"], "n": [1, 5, 9]}
    assert m("/tags = 'green'", rec)
    assert not m("/tags = 'blue'", rec)
    assert m("/tags != 'red'", rec)  # 'green' differs from 'red'
    assert m("/n > 8", rec) and not m("/n > 9", rec)
    assert m("/n < 2", rec)
    assert m("/tags IN ('blue', 'red')", rec)
    assert not m("/tags NOT IN ('blue', 'red')", rec)  # NOT of the IN above
    assert m("/tags LIKE '^gr'", rec)
    assert m("/tags BEGINS WITH ('gr')", rec)
    assert m("/tags ENDS WITH ('ed')", rec)
    assert m("UPPER(/tags) = 'RED'", rec)


def test_array_comparison_is_unknown_only_if_no_element_decides() -> None:
    assert ev("/a = 1", {"a": [None, 2]}) is U
    assert ev("/a = 1", {"a": [None, 1]}) is T
    assert ev("/a = 1", {"a": [2, 3]}) is F
    assert ev("/a = 1", {"a": ["x", 3]}) is U


def test_between_tests_each_array_element_against_both_bounds() -> None:
    rec = {"n": [1, 20]}
    assert not m("/n BETWEEN 5 AND 10", rec)
    assert m("/n >= 5 AND /n <= 10", rec)  # different elements satisfy each half
    assert m("/n BETWEEN 15 AND 25", rec)


def test_paths_through_arrays_of_objects() -> None:
    rec = {
        "legs": [
            {"sym": "IBM", "qty": 10},
            {"sym": "MSFT", "qty": [5, 50]},
            {"other": 1},
            "not an object",
        ]
    }
    assert m("/legs/sym = 'MSFT'", rec)
    assert m("/legs/qty > 40", rec)
    assert not m("/legs/qty > 60", rec)
    assert ev("/legs/missing = 1", rec) is U
    assert get_path(rec, "/legs/qty") == [10, 5, 50]


def test_nested_arrays_are_flattened() -> None:
    rec = {"m": [[1, 2], [3, [4]]]}
    assert m("/m = 4", rec)
    assert get_path(rec, "/m") == [1, 2, 3, 4]


def test_deep_paths_and_numeric_segments() -> None:
    rec = {"a": {"b": {"c": 3}}, "55": "FIX", "x": {"y": None}}
    assert m("/a/b/c = 3", rec)
    assert m("/55 = 'FIX'", rec)
    assert ev("/a/b/c/d = 3", rec) is U
    assert ev("/a/zz/c = 3", rec) is U
    assert m("/x/y IS NULL", rec)
    assert m("/x/y/z IS NULL", rec)


def test_array_arithmetic_and_functions_cover_every_combination() -> None:
    rec = {"a": [1, 2], "b": [10, 20]}
    assert m("/a + /b = 22", rec)
    assert not m("/a + /b = 23", rec)
    assert m("CONCAT(/a, /b) = '210'", rec)
    assert m("-/a = -2", rec)


# ----------------------------------------------------------------------------- set and range


def test_in_with_mixed_literal_kinds() -> None:
    assert m("/a IN (1, 2, 3)", {"a": 2})
    assert m("/a IN (1, 2, 3)", {"a": "2"})
    assert m("/a IN ('1', '2')", {"a": 2})
    assert m("/a IN ('x', 2.0)", {"a": 2})
    assert ev("/a IN (1, 2)", {"a": 3}) is F
    assert ev("/a IN ('x', 'y')", {"a": "z"}) is F
    assert ev("/a IN (1, 'x')", {"a": 3}) is U  # 3 vs 'x' cannot be compared
    assert ev("/a IN (1, 'x')", {"a": "x"}) is T
    assert ev("/a IN (1, 'x')", {"a": "y"}) is U  # 'y' vs 1 cannot be compared
    assert ev("/a IN (1, NULL)", {"a": 3}) is U
    assert ev("/a IN (1, NULL)", {"a": 1}) is T
    assert ev("/a NOT IN (1, NULL)", {"a": 3}) is U
    assert ev("/a IN (true, false)", {"a": True}) is T
    assert ev("/a IN (true)", {"a": False}) is F
    assert ev("/a IN (true, 1)", {"a": False}) is U
    assert ev("/a IN (1)", {"a": True}) is U
    assert ev("/a IN (1)", {"a": {"k": 1}}) is U


def test_not_in() -> None:
    assert m("/a NOT IN (1, 2)", {"a": 3})
    assert not m("/a NOT IN (1, 2)", {"a": 2})
    assert not m("/a NOT IN (1, 2)", {})


def test_in_with_expressions_in_the_list() -> None:
    assert m("/a IN (/b, /c + 1)", {"a": 5, "b": 1, "c": 4})
    assert ev("/a IN (/b, 7)", {"a": 5}) is U
    assert ev("/a IN (/b, 7)", {"a": 5, "b": 6}) is F
    assert m("/a IN (/list)", {"a": 5, "list": [4, 5]})


def test_between_is_inclusive() -> None:
    for value, expected in [(0, F), (1, T), (5, T), (10, T), (11, F), ("5", T), ("10.5", F)]:
        assert ev("/n BETWEEN 1 AND 10", {"n": value}) is expected
    assert ev("/n BETWEEN 10 AND 1", {"n": 5}) is F
    assert m("/s BETWEEN 'a' AND 'c'", {"s": "b"})
    assert m("/n NOT BETWEEN 1 AND 10", {"n": 11})
    assert not m("/n NOT BETWEEN 1 AND 10", {"n": 10})
    assert ev("/n BETWEEN 1 AND NULL", {"n": 5}) is U
    assert ev("/n BETWEEN 1 AND NULL", {"n": 0}) is F
    assert m("/n BETWEEN /lo AND /hi * 2", {"n": 15, "lo": 10, "hi": 8})
    assert ev("/n BETWEEN /lo AND /hi", {"n": 15, "lo": 10}) is U


# ----------------------------------------------------------------------------- strings


def test_like_is_an_unanchored_case_sensitive_regex_search() -> None:
    assert m("/s LIKE 'ell'", {"s": "Hello"})
    assert not m("/s LIKE '^ell'", {"s": "Hello"})
    assert m("/s LIKE '^He.*o$'", {"s": "Hello"})
    assert not m("/s LIKE 'hello'", {"s": "Hello"})
    assert m("/s LIKE '(?i)hello'", {"s": "Hello"})
    assert m("/s LIKE 'a|b'", {"s": "xbx"})
    assert m("/s LIKE '\\d{3}'", {"s": "ab123"})
    assert m("/s NOT LIKE 'z'", {"s": "Hello"})
    assert not m("/s NOT LIKE 'H'", {"s": "Hello"})
    assert ev("/s NOT LIKE 'z'", {}) is U
    assert m("/n LIKE '^12'", {"n": 123})
    assert ev("/o LIKE '.'", {"o": {"a": 1}}) is U


def test_begins_and_ends_with() -> None:
    rec = {"s": "sowstream"}
    assert m("/s BEGINS WITH ('sow')", rec)
    assert m("/s BEGINS WITH ('x', 'sows')", rec)
    assert not m("/s BEGINS WITH ('stream')", rec)
    assert m("/s ENDS WITH ('x', 'stream')", rec)
    assert not m("/s ENDS WITH ('sow')", rec)
    assert m("/s NOT BEGINS WITH ('x', 'y')", rec)
    assert not m("/s NOT BEGINS WITH ('sow')", rec)
    assert m("/s NOT ENDS WITH ('sow')", rec)
    assert not m("/s NOT ENDS WITH ('am')", rec)
    assert ev("/s BEGINS WITH ('x', NULL)", rec) is U
    assert ev("/s BEGINS WITH ('sow', NULL)", rec) is T
    assert m("/n BEGINS WITH (12)", {"n": 123})
    assert not m("/s BEGINS WITH ('SOW')", rec)  # case-sensitive
    assert m("/s BEGINS WITH (/p)", {"s": "abc", "p": "ab"})
    assert ev("/s BEGINS WITH (/p)", {"s": "abc"}) is U
    assert m("/s ENDS WITH (/p, 'zz')", {"s": "abc", "p": ["x", "bc"]})


# ----------------------------------------------------------------------------- arithmetic


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("10 - 4 - 3", 3),
        ("7 / 2", 3.5),
        ("7 % 3", 1),
        ("-7 % 3", -1),
        ("7 % -3", 1),
        ("7.5 % 2", 1.5),
        ("-7.5 % 2", -1.5),
        ("2 * -3", -6),
        ("- (2 + 3)", -5),
        ("10 / 4 * 2", 5.0),
        ("1 - -1", 2),
    ],
)
def test_arithmetic_values(expr: str, value: float) -> None:
    assert m(f"{expr} = {value}", {})
    assert m(f"/x = {expr}", {"x": value})


def test_arithmetic_on_fields_and_coercion() -> None:
    rec = {"qty": "10", "px": 2.5, "name": "abc", "flag": True}
    assert m("/qty * /px = 25", rec)
    assert m("/qty + 1 = 11", rec)
    assert m("-/qty = -10", rec)
    assert ev("/name + 1 = 1", rec) is U
    assert ev("/flag + 1 = 2", rec) is U
    assert ev("/missing + 1 = 1", rec) is U
    assert m("(/missing + 1) IS NULL", rec)
    assert m("-/name IS NULL", rec)


def test_division_and_modulo_by_zero_are_null() -> None:
    assert m("/a / 0 IS NULL", {"a": 5})
    assert m("/a % 0 IS NULL", {"a": 5})
    assert m("/a / /b IS NULL", {"a": 5, "b": "0"})
    assert m("/a / 0.0 IS NULL", {"a": 5})
    assert ev("/a / 0 = 1", {"a": 5}) is U


# ----------------------------------------------------------------------------- functions


def test_upper_lower_length() -> None:
    rec = {"s": "MiXed", "n": 12.0, "e": ""}
    assert m("UPPER(/s) = 'MIXED'", rec)
    assert m("LOWER(/s) = 'mixed'", rec)
    assert m("LENGTH(/s) = 5", rec)
    assert m("LENGTH(/n) = 2", rec)  # 12.0 reads as "12"
    assert m("upper(/s) = 'MIXED'", rec)
    for fn in ("UPPER", "LOWER", "LENGTH"):
        assert m(f"{fn}(/missing) IS NULL", rec)
        assert m(f"{fn}(/e) IS NULL", rec)
    assert m("UPPER(true) = 'TRUE'", {})


def test_instr_and_instr_i() -> None:
    rec = {"s": "Hello World"}
    assert m("INSTR(/s, 'World') = 7", rec)
    assert m("INSTR(/s, 'H') = 1", rec)
    assert m("INSTR(/s, 'world') = 0", rec)
    assert m("INSTR_I(/s, 'world') = 7", rec)
    assert m("INSTR_I(/s, 'xyz') = 0", rec)
    assert ev("INSTR(/s, /missing) = 0", rec) is U
    assert ev("INSTR(/missing, 'a') = 0", rec) is U


def test_strequal_i_is_a_boolean() -> None:
    rec = {"a": "Hello", "b": "hELLO", "c": "bye"}
    assert m("STREQUAL_I(/a, /b)", rec)
    assert not m("STREQUAL_I(/a, /c)", rec)
    assert m("NOT STREQUAL_I(/a, /c)", rec)
    assert m("STREQUAL_I(/a, 'hello') = true", rec)
    assert ev("STREQUAL_I(/a, /missing)", rec) is U


def test_concat_skips_nulls() -> None:
    rec = {"a": "x", "b": None, "n": 5, "f": 1.5}
    assert m("CONCAT(/a, /b, '-', /n, /f) = 'x-51.5'", rec)
    assert m("CONCAT(/a) = 'x'", rec)
    assert m("CONCAT(/b, /missing) IS NULL", rec)


def test_coalesce_returns_the_first_non_null() -> None:
    rec = {"a": None, "b": "", "c": 0, "d": 7}
    assert m("COALESCE(/a, /b, /c, /d) = 0", rec)
    assert m("COALESCE(/missing, /d) = 7", rec)
    assert m("COALESCE(/a, 'dflt') = 'dflt'", rec)
    assert m("COALESCE(/a, /b) IS NULL", rec)
    assert m("COALESCE(/list, 1) = 3", {"list": [None, 3]})


# ----------------------------------------------------------------------------- API


def test_filter_object() -> None:
    f = Filter("/price > 100 AND /sym = 'IBM'")
    assert f.text == "/price > 100 AND /sym = 'IBM'"
    assert f.ast == parse_filter(f.text)
    assert f.paths == frozenset({"/price", "/sym"})
    assert f.matches({"price": 101, "sym": "IBM"})
    assert not f.matches({"price": 100, "sym": "IBM"})
    assert Filter.parse(f.text) == f
    assert hash(Filter.parse(f.text)) == hash(f)
    assert Filter("/price>100 AND /sym='IBM'") == f
    assert f != Filter("/price > 100")
    assert repr(f) == "Filter(\"/price > 100 AND /sym = 'IBM'\")"
    with pytest.raises(FilterError):
        Filter("/price >")


def test_compile_filter_is_cached() -> None:
    assert compile_filter("/a = 1") is compile_filter("/a = 1")
    with pytest.raises(FilterError):
        compile_filter("/a = ")


def test_matches_accepts_any_mapping() -> None:
    record = MappingProxyType({"a": MappingProxyType({"b": 1}), "c": (1, 2)})
    assert m("/a/b = 1", record)  # type: ignore[arg-type]
    assert m("/c = 2", record)  # type: ignore[arg-type]


def test_compile_predicate_from_a_hand_built_tree() -> None:
    tree = A.And(
        (
            A.Compare(">", A.Path("/qty"), A.Literal(5)),
            A.Not(A.IsNull(A.Path("/sym"))),
        )
    )
    pred = compile_predicate(tree)
    assert pred({"qty": 6, "sym": "x"}) is True
    assert pred({"qty": 6}) is False
    assert pred({"sym": "x"}) is None


# ----------------------------------------------------------------------------- values


def test_get_path() -> None:
    rec = {"a": {"b": [1, {"c": 2}, [3]]}, "n": None}
    assert get_path(rec, "/a/b") == [1, {"c": 2}, 3]
    assert get_path(rec, "/a/b/c") == [2]
    assert get_path(rec, "/n") == [None]
    assert get_path(rec, "/zz") == []
    assert get_path(rec, ("a", "b", "c")) == [2]
    with pytest.raises(ValueError):
        get_path(rec, "a/b")


def test_is_null() -> None:
    assert is_null(None) and is_null("")
    assert not any(is_null(v) for v in (0, False, " ", [], {}, "x"))


@pytest.mark.parametrize(
    ("value", "number"),
    [
        (5, 5),
        (2.5, 2.5),
        ("42", 42),
        (" -3 ", -3),
        ("+4", 4),
        ("1.5", 1.5),
        (".5", 0.5),
        ("1e3", 1000.0),
        ("abc", None),
        ("", None),
        ("1.2.3", None),
        ("NaN", None),
        ("inf", None),
        ("١٢", None),
        ("1_0", None),
        (True, None),
        (None, None),
        ([1], None),
    ],
)
def test_to_number(value: Any, number: float | None) -> None:
    result = to_number(value)
    assert result == number
    if number is not None:
        assert type(result) is type(number)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("abc", "abc"),
        ("", ""),
        (True, "true"),
        (False, "false"),
        (42, "42"),
        (-7, "-7"),
        (1.0, "1"),
        (-0.0, "0"),
        (1e20, "100000000000000000000"),
        (2.5, "2.5"),
        (0.1, "0.1"),
        (None, ""),
        ({"b": 1, "a": [1, "x"]}, '{"a":[1,"x"],"b":1}'),
        ([3, {"z": None, "y": True}], '[3,{"y":true,"z":null}]'),
    ],
)
def test_canonical_text(value: Any, text: str) -> None:
    assert canonical_text(value) == text
