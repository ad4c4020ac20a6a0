"""The query planner: Key and hash lookups first, then memo indexes, then a scan."""

from __future__ import annotations

import pytest

from sowstream.config import load_config_text
from sowstream.filters import compile_filter
from sowstream.sow.memo import index_prefix
from sowstream.sow.planner import (
    FullScan,
    IndexLookup,
    KeyLookup,
    MemoLookup,
    Plan,
    UnionLookup,
    describe,
    like_prefix,
    memo_paths,
    plan,
    plan_name,
)

TOPIC = load_config_text(
    "sow:\n  - Name: t\n    Key: /id\n    HashIndex: [[/customer], [/a, /b]]\n"
).topics[0]


def planned(text: str, ready: tuple[str, ...] = (), auto: bool = True, **kw: object) -> Plan:
    return plan(TOPIC, compile_filter(text), memo_ready=ready, memo_auto=auto, **kw)  # type: ignore[arg-type]


def test_whole_filter_equalities_use_the_key_and_hash_indexes_as_before() -> None:
    assert isinstance(planned("/id = 5"), KeyLookup)
    assert isinstance(planned("/id IN (1, 2)"), KeyLookup)
    assert isinstance(planned("/customer = 'c1'"), IndexLookup)
    assert isinstance(planned("/a = 1 AND /b = 2"), IndexLookup)
    # explicit SowKeys win over everything
    assert planned("/qty > 1", sow_keys=["k"]) == KeyLookup(("k",))


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("/qty > 900", "range"),
        ("900 < /qty", "range"),
        ("/qty <= 5", "range"),
        ("/qty BETWEEN 1 AND 5", "between"),
        ("/name BEGINS WITH ('ab', 'cd')", "prefix"),
        ("/name LIKE '^ab'", "prefix"),
        ("/name LIKE 'ab'", "text scan"),
        ("/name ENDS WITH ('z')", "text scan"),
    ],
)
def test_ranges_and_string_tests_plan_a_memo_index(text: str, kind: str) -> None:
    how = planned(text)
    assert isinstance(how, MemoLookup) and how.kind == kind
    assert plan_name(how) == "memo" and memo_paths(how) == {how.path}
    assert "memo index" in describe(how)


def test_without_automatic_indexes_only_ready_ones_are_used() -> None:
    assert planned("/qty > 900", auto=False) == FullScan()
    assert isinstance(planned("/qty > 900", ready=("/qty",), auto=False), MemoLookup)


def test_equality_uses_a_memo_index_only_when_one_exists() -> None:
    assert planned("/region = 'r1'") == FullScan()
    how = planned("/region IN ('r1', 'r2')", ready=("/region",))
    assert isinstance(how, MemoLookup) and how.kind == "equality" and len(how.ranges) == 2


@pytest.mark.parametrize(
    "text",
    [
        "/qty != 5",
        "NOT (/qty > 5)",
        "/qty IS NULL",
        "/qty + 1 > 5",
        "/qty > /other",
        "UPPER(/name) LIKE 'A'",
        "/qty > 5 OR /name = 'x'",  # one branch has no index
        "/name BEGINS WITH (/other)",
    ],
)
def test_what_no_index_serves_scans(text: str) -> None:
    assert planned(text) == FullScan()


def test_and_takes_the_hash_lookup_on_strings_before_any_memo_index() -> None:
    how = planned("/qty > 900 AND /customer = 'c1'")
    assert isinstance(how, IndexLookup)
    how = planned("/id = 'abc' AND /qty > 1")
    assert isinstance(how, KeyLookup)


def test_and_never_uses_a_text_lookup_for_a_number() -> None:
    # /customer = 5 also matches "5.0", which the hash index files under "5.0": not a superset.
    how = planned("/qty > 900 AND /customer = 5")
    assert isinstance(how, MemoLookup) and how.path == "/qty"


def test_and_picks_by_static_rank_without_counts() -> None:
    how = planned("/name LIKE 'x' AND /qty > 5 AND /sym BEGINS WITH ('A')")
    assert isinstance(how, MemoLookup) and how.path == "/sym"


def test_and_picks_the_smallest_measured_lookup_and_prefers_existing_indexes() -> None:
    counts = {"/qty": 500, "/px": 20}
    how = planned(
        "/qty > 5 AND /px > 1 AND /name BEGINS WITH ('A')",
        ready=("/qty", "/px"),
        estimate=lambda lookup: counts[lookup.path],
    )
    assert isinstance(how, MemoLookup) and how.path == "/px"


def test_two_bounds_on_a_field_become_one_between() -> None:
    how = planned("/qty >= 10 AND /qty < 20")
    assert isinstance(how, MemoLookup) and how.kind == "between" and len(how.ranges) == 1
    # bounds that compare by different rules stay separate one-sided ranges
    how = planned("/qty >= 10 AND /qty < 'z'")
    assert isinstance(how, MemoLookup) and how.kind == "range"


def test_or_is_a_union_when_every_branch_has_a_lookup() -> None:
    how = planned("/qty > 900 OR /name BEGINS WITH ('a') OR /id = 'k1'")
    assert isinstance(how, UnionLookup) and plan_name(how) == "union"
    assert [type(p) for p in how.parts] == [MemoLookup, MemoLookup, KeyLookup]
    assert memo_paths(how) == {"/qty", "/name"}
    nested = planned("(/qty > 1 AND /z = 1) OR (/px < 2 OR /name LIKE '^q')")
    assert isinstance(nested, UnionLookup) and len(nested.parts) == 3


def test_numeric_strings_read_both_the_text_and_the_number_entries() -> None:
    how = planned("/qty > '900'")
    assert isinstance(how, MemoLookup) and len(how.ranges) == 2
    how = planned("/qty > 'abc'")
    assert isinstance(how, MemoLookup) and len(how.ranges) == 1


def test_null_literals_match_nothing() -> None:
    for text in ["/qty > NULL", "/qty BETWEEN NULL AND 5", "/name BEGINS WITH (NULL)"]:
        how = planned(text)
        assert isinstance(how, MemoLookup) and how.ranges == ()


def test_ranges_stay_inside_their_index() -> None:
    how = planned("/qty > 5 OR /qty < 1 OR /qty BEGINS WITH ('x')")
    assert isinstance(how, UnionLookup)
    prefix = index_prefix("/qty")
    for part in how.parts:
        assert isinstance(part, MemoLookup)
        for rng in part.ranges:
            assert rng.start.startswith(prefix)
            assert rng.stop is not None and rng.stop <= prefix[:-1] + b"\x02"


@pytest.mark.parametrize(
    ("pattern", "prefix"),
    [
        ("^abc", "abc"),
        ("^abc.*", "abc"),
        ("^abc?", "ab"),
        ("^ab*", "a"),
        ("^ab{2}", "a"),
        ("^ab+", "ab"),
        ("^a\\.b", "a"),
        ("^abc$", "abc"),
        ("^abc|^x", ""),
        ("abc", ""),
        ("(?i)^abc", ""),
        ("^[ab]", ""),
    ],
)
def test_like_prefix(pattern: str, prefix: str) -> None:
    assert like_prefix(pattern) == prefix
