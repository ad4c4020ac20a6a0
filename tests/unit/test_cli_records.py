"""The CLI's record tables (``sowstream sow`` / ``subscribe`` without ``--json``): a column per
field, nested fields as /a/b paths, wide records cut with a caption naming the hidden fields."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from sowstream.cli.records import cell, columns, flatten, record_table


def rendered(records: list[tuple[str, Any]], width: int = 80) -> list[str]:
    """The table as the terminal shows it, one string per line."""
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(record_table("orders", records, width))
    return console.export_text().splitlines()


def cells_of(line: str) -> list[str]:
    """The cells of a table row (│-separated), stripped."""
    return [c.strip() for c in line.strip().strip("│┃").split("│" if "│" in line else "┃")]


def test_nested_fields_become_paths_and_other_values_json() -> None:
    record = {"id": 1, "addr": {"city": "Oslo", "geo": {"lat": 59.9}}, "tags": [1, "a"], "e": {}}
    assert flatten(record) == {
        "/id": 1,
        "/addr/city": "Oslo",
        "/addr/geo/lat": 59.9,
        "/tags": [1, "a"],
        "/e": {},
    }
    assert [cell(v) for v in (1, "Oslo", [1, "a"], {}, None, True, 2.5)] == [
        "1",
        "Oslo",
        '[1,"a"]',
        "{}",
        "null",
        "true",
        "2.5",
    ]
    assert cell("8=FIX.4.2\x0135=D\x01") == "8=FIX.4.2|35=D|"
    assert cell(b"\x00\x1b[2Jraw\xff") == "\\x00\\x1b[2Jraw\\xff"


def test_columns_are_the_union_in_order_of_first_appearance() -> None:
    assert columns([{"/a": 1, "/b": 2}, {"/c": 3, "/a": 4}, {}]) == ["/a", "/b", "/c"]


def test_a_record_per_row_and_a_field_per_column() -> None:
    lines = rendered(
        [
            ("K1", {"order": 1, "customer": "Ann", "addr": {"city": "Oslo"}}),
            ("K2", {"order": 2, "qty": 5}),
        ]
    )
    assert "orders: 2 record(s)" in lines[0]
    header = next(line for line in lines if "SowKey" in line)
    assert cells_of(header) == ["SowKey", "/order", "/customer", "/addr/city", "/qty"]
    rows = [cells_of(line) for line in lines if line.strip().startswith("│ K")]
    assert rows == [["K1", "1", "Ann", "Oslo", ""], ["K2", "2", "", "", "5"]]
    assert not any("not shown" in line for line in lines)


def test_a_wide_record_keeps_the_columns_that_fit_and_names_the_others() -> None:
    record = {f"field{i:02d}": i for i in range(30)}
    lines = rendered([("K1", record)], width=80)
    assert all(len(line) <= 80 for line in lines)
    header = cells_of(next(line for line in lines if "SowKey" in line))
    shown = header[1:]
    assert shown == [f"/field{i:02d}" for i in range(len(shown))] and 3 <= len(shown) < 30
    bottom = next(i for i, line in enumerate(lines) if line.startswith("└"))
    caption = " ".join(line.strip() for line in lines[bottom + 1 :])
    assert f"{30 - len(shown)} more field(s) not shown: /field{len(shown):02d}," in caption
    assert "…" in caption and "--json shows every field" in caption
    wider = rendered([("K1", record)], width=200)
    assert len(cells_of(next(line for line in wider if "SowKey" in line))) > len(header)


def test_one_long_field_still_gets_a_column_folded_not_cut() -> None:
    lines = rendered([("K1", {"text": "z" * 150})], width=60)
    assert "".join(lines).count("z") == 150
    assert not any("not shown" in line for line in lines)


def test_values_and_titles_are_not_markup() -> None:
    lines = rendered([("K1", {"note": "[red]x[/]", "[b]": 1})])
    text = "\n".join(lines)
    assert "[red]x[/]" in text and "/[b]" in text


def test_a_body_without_fields_is_one_data_column() -> None:
    lines = rendered([("K1", "raw bytes"), ("K2", {"a": 1})])
    header = cells_of(next(line for line in lines if "SowKey" in line))
    assert header == ["SowKey", "data", "/a"]
    assert ["K1", "raw bytes", ""] in [cells_of(line) for line in lines]


def test_records_without_sow_keys_get_no_sow_key_column() -> None:
    """An aggregated sow's records have no SowKey."""
    lines = rendered([("", {"region": "EU", "qty": 12}), ("", {"region": "US", "qty": 3})])
    header = next(line for line in lines if "/region" in line)
    assert cells_of(header) == ["/region", "/qty"]
    assert ["EU", "12"] in [cells_of(line) for line in lines]
