"""An aggregated query, an aggregated subscription's live groups and a view agree.

Random records and random definitions over every aggregate function (IF, STDDEV_POP/SAMP, ANY
and DISTINCT_LIST included): the aggregated ``sow`` (partials merged over a random partitioning,
then finished) gives the records a view of the same Projection, Grouping and Filter holds; and
the retractable groups an aggregated subscription keeps per partition give, after every change,
the very partials a query computes from scratch.
"""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sowstream.config.views import ViewConfig
from sowstream.errors import InvalidCommandError
from sowstream.filters import compile_filter
from sowstream.sow.aggregate import merge_partials, parse_aggregation
from sowstream.sow.aggregate.live import LiveGroups
from sowstream.views.maintainer import ViewMaintainer

VALUES = st.sampled_from([None, "", 0, 1, 7, 7.0, "7", 2.5, -3, "a", "b", True, 10, 25])
NUMBERS = st.one_of(st.integers(-50, 50), st.floats(-100, 100, allow_nan=False), st.none())
records = st.fixed_dictionaries(
    {
        "g": st.sampled_from([None, "", 1, "1", "x", "y"]),
        "x": st.one_of(NUMBERS, VALUES),
        "y": VALUES,
    }
)

# Projection entries (an output name is added per use); /g is the grouping field.
ENTRIES = [
    "SUM(/x)",
    "COUNT(/x)",
    "AVG(/x * 2)",
    "MIN(/y)",
    "MAX(/x)",
    "COUNT_DISTINCT(/y)",
    "DISTINCT_LIST(/y)",
    "DISTINCT_LIST(/x, ' | ')",
    "ANY(/y)",
    "ANY(/x)",
    "STDDEV_POP(/x)",
    "STDDEV_SAMP(/x)",
    "SUM(IF((/x % 10) == 0, 1, 0))",
    "SUM(IF(/y = 'a', /x, 0))",
    "SUM(/x) / COUNT(/x)",
    "COUNT(/y) + 1",
    "IF(COUNT(/x) > 1, 'many', 'few')",
    "CRC32(/g)",
]
FILTERS = [None, "/x > 0", "/y IS NOT NULL", "/g = 'x' OR /x < 5"]
definitions = st.tuples(
    st.lists(st.sampled_from(ENTRIES), min_size=1, max_size=6, unique=True),
    st.booleans(),
    st.sampled_from(FILTERS),
)


def projection_of(entries: list[str], show_group: bool) -> list[str]:
    fields = [f"{e} AS /f{i}" for i, e in enumerate(entries)]
    return ["/g", *fields] if show_group else fields


def canonical(rows: list[dict[str, Any]]) -> list[bytes]:
    return sorted(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) for r in rows)


def query(
    projection: list[str], flt: str | None, rows: list[dict[str, Any]], parts: int
) -> list[dict[str, Any]]:
    """The aggregated sow: each partition's partials (through JSON), merged, finished."""
    agg = parse_aggregation("[/g]", "[" + ", ".join(projection) + "]")
    matcher = compile_filter(flt) if flt else None
    matching = [r for r in rows if matcher is None or matcher.matches(r)]
    shares: list[list[dict[str, Any]]] = [[] for _ in range(parts)]
    for i, r in enumerate(matching):
        shares[i % parts].append(r)
    partials = [orjson.loads(orjson.dumps(agg.partial(s))) for s in shares]
    return agg.finish(merge_partials(agg, partials))


def view(projection: list[str], flt: str | None, ops: list[tuple[int, Any]]) -> list[Any]:
    config = ViewConfig(
        name="V", underlying_topic="t", projection=projection, grouping=["/g"], filter=flt
    )
    m = ViewMaintainer(config)
    state: dict[str, Any] = {}
    for seq, (key, record) in enumerate(ops, 1):
        before = state.get(str(key))
        if record is None:
            state.pop(str(key), None)
        else:
            state[str(key)] = record
        m.apply("t", str(key), before, record, seq=seq)
    return list(m.records().values())


ops_strategy = st.lists(
    st.tuples(st.integers(0, 8), st.one_of(st.none(), records)), min_size=1, max_size=30
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops_strategy, definitions, st.integers(1, 4))
def test_aggregated_sow_equals_a_view_of_the_same_definition(
    ops: list[tuple[int, Any]], definition: tuple[list[str], bool, str | None], parts: int
) -> None:
    entries, show_group, flt = definition
    projection = projection_of(entries, show_group)
    state: dict[int, Any] = {}
    for key, record in ops:
        if record is None:
            state.pop(key, None)
        else:
            state[key] = record
    assert canonical(query(projection, flt, list(state.values()), parts)) == canonical(
        view(projection, flt, ops)
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops_strategy, definitions)
def test_live_groups_equal_the_partials_of_a_query_after_every_change(
    ops: list[tuple[int, Any]], definition: tuple[list[str], bool, str | None]
) -> None:
    entries, show_group, flt = definition
    # Loose fields too: the live groups follow the query's rule for them.
    projection = [*projection_of(entries, show_group), "/y AS /someY"]
    agg = parse_aggregation("[/g]", "[" + ", ".join(projection) + "]")
    matcher = compile_filter(flt) if flt else None
    live = LiveGroups(agg)
    state: dict[int, Any] = {}
    for key, record in ops:
        before = state.get(key)
        if record is None:
            state.pop(key, None)
        else:
            state[key] = record
        was = (
            before if before is not None and (matcher is None or matcher.matches(before)) else None
        )
        now = (
            record if record is not None and (matcher is None or matcher.matches(record)) else None
        )
        touched = live.change(was, now)
        matching = [r for r in state.values() if matcher is None or matcher.matches(r)]
        expected = agg.partial(matching)
        assert live.partials() == expected
        for group in touched:
            assert live.entry(group) == expected.get(group)


def test_chapter_07_sum_of_if_example_as_a_query() -> None:
    agg = parse_aggregation(
        "[/oid]",
        "[/oid, SUM(/qty) AS /totalOrderQty, SUM(IF((/qty % 10) == 0,1,0)) AS /evenTensOrderCount]",
    )
    rows = [{"qty": 10, "oid": 1}, {"qty": 10, "oid": 1}, {"qty": 25, "oid": 1}]
    assert agg.aggregate(rows) == [{"oid": 1, "totalOrderQty": 45, "evenTensOrderCount": 2}]


def test_every_view_function_is_accepted_by_a_query() -> None:
    agg = parse_aggregation(
        "[/g]",
        "[ANY(/x) AS /a, STDDEV_POP(/x) AS /p, STDDEV_SAMP(/x) AS /s, CRC32(/g) AS /c, "
        "DISTINCT_LIST(/x) AS /d, DISTINCT_LIST(/x, '; ') AS /e, COUNT_DISTINCT(/x) AS /n]",
    )
    rows = [{"g": "k", "x": 2}, {"g": "k", "x": 4}, {"g": "k", "x": "4"}, {"g": "k", "x": "b"}]
    (row,) = agg.aggregate(rows)
    assert row["a"] == "4"  # the value whose JSON text sorts first ('"4"' < '2')
    assert row["p"] == pytest.approx(0.9428090415820634)
    assert row["s"] == pytest.approx(1.1547005383792515)
    assert row["d"] == "2,4,b" and row["e"] == "2; 4; b" and row["n"] == 3
    assert isinstance(row["c"], int)


@pytest.mark.parametrize(
    ("projection", "words"),
    [
        ("[DISTINCT_LIST(/x, /y) AS /d]", "second argument is its delimiter, a string literal"),
        ("[DISTINCT_LIST(/x, ',', ';') AS /d]", "takes one or two arguments"),
        ("[ANY(/x, ',') AS /d]", "ANY takes exactly one argument"),
        ("[UNIX_TIMESTAMP() AS /t]", "UNIX_TIMESTAMP"),
    ],
)
def test_refused_calls_say_why(projection: str, words: str) -> None:
    with pytest.raises(InvalidCommandError, match="projection error") as info:
        parse_aggregation("[/g]", projection)
    assert words in str(info.value)
    assert "limited to Enrichment" not in str(info.value) or "UNIX" in projection


def test_if_is_not_said_to_be_limited_to_enrichment() -> None:
    agg = parse_aggregation("[/g]", "[SUM(IF(/x > 1, 1, 0)) AS /n]")
    assert agg.aggregate([{"g": 1, "x": 2}, {"g": 1, "x": 0}]) == [{"n": 1}]


def test_distinct_list_is_the_same_whatever_the_arrival_order() -> None:
    agg = parse_aggregation("[/g]", "[DISTINCT_LIST(/x) AS /d]")
    rows = [{"g": 1, "x": v} for v in (10, "b", 2.5, "a", 10, 7, "7", 7.0)]
    random.Random(4).shuffle(rows)
    assert agg.aggregate(rows) == [{"d": "2.5,7,10,a,b"}]
