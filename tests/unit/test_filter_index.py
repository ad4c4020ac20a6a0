"""Recognising filters that a hash index (exact field set, = and IN only) can answer."""

from __future__ import annotations

import pytest

from sowstream.filters import compile_filter, parse_filter
from sowstream.filters.index import equality_lookup, usable_hash_index
from sowstream.filters.values import canonical_text, get_path


def lookup(text: str, fields: list[str]) -> list[tuple[str, ...]] | None:
    return equality_lookup(parse_filter(text), fields)


def test_single_equality() -> None:
    assert lookup("/sym = 'IBM'", ["/sym"]) == [("IBM",)]
    assert lookup("/sym == 'IBM'", ["/sym"]) == [("IBM",)]
    assert lookup("'IBM' = /sym", ["/sym"]) == [("IBM",)]


def test_values_use_canonical_text() -> None:
    assert lookup("/id = 7", ["/id"]) == [("7",)]
    assert lookup("/id = 7.0", ["/id"]) == [("7",)]
    assert lookup("/id = 2.5", ["/id"]) == [("2.5",)]
    assert lookup("/id = -3", ["/id"]) == [("-3",)]
    assert lookup("/ok = true", ["/ok"]) == [("true",)]
    assert lookup("/id = '007'", ["/id"]) == [("007",)]


def test_conjunction_in_field_order_whatever_the_filter_order() -> None:
    fields = ["/address/postalCode", "/customerType"]
    expected = [("99705", "retail")]
    assert lookup("/address/postalCode = '99705' AND /customerType = 'retail'", fields) == (
        expected
    )
    assert lookup("/customerType = 'retail' AND /address/postalCode = '99705'", fields) == (
        expected
    )
    assert lookup("('retail' = /customerType) AND (/address/postalCode = '99705')", fields) == (
        expected
    )


def test_nested_conjunctions() -> None:
    text = "(/a = 1 AND (/b = 2)) AND (/c = 3)"
    assert lookup(text, ["/c", "/a", "/b"]) == [("3", "1", "2")]


def test_in_gives_the_cartesian_product() -> None:
    result = lookup("/a IN (1, 2) AND /b IN ('x', 'y', 'z') AND /c = 0", ["/a", "/b", "/c"])
    assert result == [
        ("1", "x", "0"),
        ("1", "y", "0"),
        ("1", "z", "0"),
        ("2", "x", "0"),
        ("2", "y", "0"),
        ("2", "z", "0"),
    ]


def test_in_values_are_deduplicated_and_nulls_dropped() -> None:
    assert lookup("/a IN (1, 1.0, '1', NULL, '', 2)", ["/a"]) == [("1",), ("2",)]


def test_null_equality_matches_nothing() -> None:
    assert lookup("/a = NULL", ["/a"]) == []
    assert lookup("/a = ''", ["/a"]) == []
    assert lookup("/a IN (NULL)", ["/a"]) == []
    assert lookup("/a = 1 AND /b = NULL", ["/a", "/b"]) == []


@pytest.mark.parametrize(
    "text",
    [
        "/a = 1",  # missing field
        "/a = 1 AND /b = 2 AND /c = 3",  # extra field
        "/a = 1 AND /a = 2",  # field twice, other missing
        "/a = 1 AND /b LIKE 'x'",
        "/a = 1 AND /b > 2",
        "/a = 1 AND /b != 2",
        "/a = 1 AND /b BETWEEN 1 AND 2",
        "/a = 1 OR /b = 2",
        "(/a = 1 AND /b = 2) OR (/a = 3 AND /b = 4)",
        "NOT (/a = 1 AND /b = 2)",
        "/a = 1 AND /b NOT IN (1)",
        "/a = 1 AND UPPER(/b) = 'X'",
        "/a = 1 AND /b = /c",
        "/a = 1 AND /b IN (1, /c)",
        "/a = 1 AND /b = 1 + 1",
        "/a = 1 AND /b IS NULL",
        "/a = 1 AND /b = 2 AND 1 = 1",
        "/a = 1 AND /b BEGINS WITH ('x')",
        "/a = 1 AND /b",
    ],
)
def test_anything_else_cannot_use_the_index(text: str) -> None:
    assert lookup(text, ["/a", "/b"]) is None


def test_bad_field_lists() -> None:
    assert lookup("/a = 1", []) is None
    assert lookup("/a = 1 AND /a = 1", ["/a", "/a"]) is None


def test_too_many_combinations_fall_back_to_a_scan() -> None:
    many = ", ".join(str(i) for i in range(200))
    tree = parse_filter(f"/a IN ({many}) AND /b IN ({many})")
    assert equality_lookup(tree, ["/a", "/b"]) is None
    result = equality_lookup(tree, ["/a", "/b"], max_lookups=40_000)
    assert result is not None and len(result) == 40_000


def test_usable_hash_index_picks_the_index_with_exactly_those_fields() -> None:
    indexes = [("/a",), ("/a", "/b"), ("/b", "/c")]
    tree = parse_filter("/b = 'x' AND /a IN (1, 2)")
    assert usable_hash_index(tree, indexes) == (("/a", "/b"), [("1", "x"), ("2", "x")])
    assert usable_hash_index(parse_filter("/c = 1"), indexes) is None
    assert usable_hash_index(parse_filter("/a = 1 OR /a = 2"), indexes) is None


def test_lookups_find_every_record_the_filter_matches_when_values_are_canonical() -> None:
    records = [
        {"sym": "IBM", "qty": 10},
        {"sym": "IBM", "qty": 10.0},
        {"sym": "IBM", "qty": "10"},
        {"sym": "MSFT", "qty": 10},
        {"sym": "IBM", "qty": 11},
    ]
    flt = compile_filter("/qty = 10 AND /sym IN ('IBM', 'ORCL')")
    fields = ["/sym", "/qty"]
    lookups = set(equality_lookup(flt.ast, fields) or [])
    for record in records:
        key = tuple(canonical_text(get_path(record, f)[0]) for f in fields)
        assert (key in lookups) == flt.matches(record)
