"""The OrderBy header: parsing, errors, and the total order over mixed JSON values."""

from __future__ import annotations

import random
from typing import Any

import pytest

from sowstream.filters import FilterError
from sowstream.filters.order_by import SortField, parse_order_by, sort_key


def test_parse_directions_default_and_case() -> None:
    assert parse_order_by("/orderDate DESC, /customerName ASC") == (
        SortField("/orderDate", descending=True),
        SortField("/customerName", descending=False),
    )
    assert parse_order_by("/a") == (SortField("/a"),)
    assert parse_order_by("/a desc,/b,/c Asc") == (
        SortField("/a", True),
        SortField("/b", False),
        SortField("/c", False),
    )
    assert parse_order_by("  /x/y/55  dEsC  ") == (SortField("/x/y/55", True),)


@pytest.mark.parametrize(
    ("text", "position", "expected"),
    [
        ("", 0, ["path"]),
        ("/a,", 3, ["path"]),
        ("/a DESC /b", 8, ["','", "end of input"]),
        ("/a UP", 3, ["','", "'ASC'", "'DESC'", "end of input"]),
        ("a DESC", 0, ["path"]),
        ("/a, , /b", 4, ["path"]),
        ("/a ASC DESC", 7, ["','", "end of input"]),
        ("/a; /b", 2, ["','", "'ASC'", "'DESC'", "end of input"]),
    ],
)
def test_parse_errors_have_positions(text: str, position: int, expected: list[str]) -> None:
    with pytest.raises(FilterError) as info:
        parse_order_by(text)
    assert info.value.position == position
    assert info.value.expected == expected


def ordered(records: list[dict[str, Any]], spec: str) -> list[Any]:
    return sorted(records, key=sort_key(parse_order_by(spec)))


def test_mixed_types_ascending() -> None:
    values: list[Any] = ["b", 10, None, "9", True, "a", 2.5, {"k": 1}, "", False, -1, "10.5"]
    records = [{"v": v} for v in values]
    random.Random(7).shuffle(records)
    result = [r["v"] for r in ordered(records, "/v")]
    numbers, rest = result[:5], result[5:]
    # numbers and numeric strings first, numerically
    assert numbers == [-1, 2.5, "9", 10, "10.5"]
    assert rest[:2] == ["a", "b"]
    assert rest[2:4] == [False, True]
    assert rest[4] == {"k": 1}
    # NULL last: "" and None (stable among themselves)
    assert set(map(repr, rest[5:])) == {"''", "None"}
    assert len(result) == len(values)


def test_missing_fields_sort_last_ascending_and_first_descending() -> None:
    records = [{"v": 2}, {}, {"v": 1}, {"v": None}, {"v": 3}]
    assert [r.get("v") for r in ordered(records, "/v ASC")][:3] == [1, 2, 3]
    assert [r.get("v") for r in ordered(records, "/v ASC")][3:] == [None, None]
    assert [r.get("v") for r in ordered(records, "/v DESC")][:2] == [None, None]
    assert [r.get("v") for r in ordered(records, "/v DESC")][2:] == [3, 2, 1]


def test_descending_reverses_mixed_types() -> None:
    values: list[Any] = [3, "x", True, None, "1"]
    result = [r["v"] for r in ordered([{"v": v} for v in values], "/v DESC")]
    assert result == [None, True, "x", 3, "1"]


def test_mixed_asc_and_desc_fields() -> None:
    records = [
        {"date": "2024-01-02", "name": "b"},
        {"date": "2024-01-01", "name": "a"},
        {"date": "2024-01-02", "name": "a"},
        {"date": "2024-01-01", "name": "c"},
        {"name": "z"},
        {"date": "2024-01-02"},
    ]
    result = [(r.get("date"), r.get("name")) for r in ordered(records, "/date DESC, /name ASC")]
    assert result == [
        (None, "z"),
        ("2024-01-02", "a"),
        ("2024-01-02", "b"),
        ("2024-01-02", None),
        ("2024-01-01", "a"),
        ("2024-01-01", "c"),
    ]


def test_desc_on_strings_and_numbers_inside_a_composite_key() -> None:
    records = [{"a": a, "b": b} for a in ("x", "y") for b in (1, 2, "3")]
    result = [(r["a"], r["b"]) for r in ordered(records, "/a ASC, /b DESC")]
    assert result == [("x", "3"), ("x", 2), ("x", 1), ("y", "3"), ("y", 2), ("y", 1)]


def test_multi_valued_paths_use_the_first_value() -> None:
    records = [{"t": [5, 1]}, {"t": [3, 9]}, {"t": []}, {"t": [[0]]}]
    result = [r["t"] for r in ordered(records, "/t")]
    assert result == [[[0]], [3, 9], [5, 1], []]
    nested = [{"l": [{"p": 2}, {"p": 0}]}, {"l": [{"p": 1}]}]
    assert [r["l"][0]["p"] for r in ordered(nested, "/l/p")] == [1, 2]


def test_keys_form_a_total_order_usable_with_other_components() -> None:
    key = sort_key(parse_order_by("/a DESC, /b"))
    records: list[dict[str, Any]] = [{"a": v, "b": w} for v in (1, "s", None) for w in (2, None)]
    keys = [key(r) for r in records]
    for k1 in keys:
        assert k1 == k1 and not k1 < k1
        for k2 in keys:
            assert (k1 < k2) + (k2 < k1) + (k1 == k2) == 1
    # Callers append a tie-breaker (the SowKey) to the tuple; that must still compare.
    assert sorted((k, str(i)) for i, k in enumerate(keys))
