"""Projection fields parsed by the filter grammar: aggregate calls, AS and their errors."""

from __future__ import annotations

import pytest

from sowstream.filters import FilterError, parse_filter
from sowstream.filters import ast as A
from sowstream.filters.parser import MAX_DEPTH, parse_projection_field

QUERY = ("AVG", "COUNT", "COUNT_DISTINCT", "MAX", "MIN", "SUM")


def field(text: str, **kw: object) -> A.ProjectionField:
    return parse_projection_field(text, **kw)  # type: ignore[arg-type]


def problem(text: str, **kw: object) -> FilterError:
    with pytest.raises(FilterError) as info:
        field(text, **kw)
    return info.value


@pytest.mark.parametrize("name", A.AGGREGATES)
def test_every_aggregate_of_the_grammar_parses_as_a_call(name: str) -> None:
    parsed = field(f"{name.lower()}(/x) AS /y", aggregates=(name,))
    assert parsed.expr == A.Aggregate(name, A.Path("/x"))
    assert parsed.output == "/y"


def test_a_field_keeps_its_calls_their_positions_and_spelling() -> None:
    parsed = field("SUM(/q)/count ( /q ) + /a AS /mean", aggregates=QUERY)
    assert parsed.expr == A.Arith(
        "+",
        A.Arith("/", A.Aggregate("SUM", A.Path("/q")), A.Aggregate("COUNT", A.Path("/q"))),
        A.Path("/a"),
    )
    assert list(parsed.calls) == [0, 8]
    assert [parsed.call_text(c) for c in parsed.calls.values()] == ["SUM(/q)", "count ( /q )"]
    assert (parsed.output, parsed.output_at) == ("/mean", 29)


def test_a_lone_path_is_its_own_output() -> None:
    parsed = field("  /a/b ")
    assert (parsed.expr, parsed.output, parsed.output_at) == (A.Path("/a/b"), "/a/b", 2)


def test_names_that_only_start_like_aggregates_are_functions_or_paths() -> None:
    assert problem("summary(/x) AS /y").reason.startswith("unknown function 'summary'")
    parsed = field("/a/count + 1 AS /y")
    assert parsed.calls == {}


def test_aggregates_in_a_filter_are_unknown_functions() -> None:
    with pytest.raises(FilterError) as info:
        parse_filter("/a = 1 AND SUM(/b) > 2")
    assert (info.value.reason, info.value.position) == ("unknown function 'SUM'", 11)


def test_an_aggregate_the_caller_does_not_take_is_an_unknown_function() -> None:
    exc = problem("ANY(/x) AS /y", aggregates=QUERY)
    assert exc.position == 0
    assert exc.reason.startswith(
        "unknown function 'ANY': the aggregate functions are AVG, COUNT, COUNT_DISTINCT, MAX, "
        "MIN, SUM and the other functions "
    )


@pytest.mark.parametrize(
    ("text", "position", "reason"),
    [
        ("SUM(MAX(/x)) AS /s", 4, "aggregate MAX is nested inside SUM (at position 0)"),
        ("SUM(/x, MAX(/y)) AS /s", 8, "aggregate MAX is nested inside SUM (at position 0)"),
        ("SUM(/x, /y, /z) AS /s", 6, "SUM takes exactly one argument"),
        ("SUM ( ) AS /s", 4, "SUM needs an argument, like SUM(/field)"),
        ("/a AS", 3, "AS needs an output path, like AS /total"),
        ("/a AS (/b) + 1", 6, "AS must be followed by a field path such as /total"),
        ("/a AS /b as /c", 9, "a projection entry takes one AS"),
        ("SUM(/x)", 0, "'SUM(/x)' is computed and needs an output path: add AS /name"),
        ("/a + AS /b", 4, "but found end of input"),
        ("'x AS /b", 0, "unterminated string literal"),
        ("   ", 0, "the projection field is empty"),
    ],
)
def test_field_errors(text: str, position: int, reason: str) -> None:
    exc = problem(text, aggregates=QUERY)
    assert exc.position == position, exc
    assert reason in exc.reason


def test_the_output_may_be_parenthesised() -> None:
    parsed = field("/a AS (/b)")
    assert (parsed.output, parsed.output_at) == ("/b", 7)


def test_stage_only_parts_are_refused_inside_and_outside_calls() -> None:
    exc = problem("SUM(/x OF PREVIOUS) AS /y", aggregates=QUERY)
    assert exc.position == 4
    assert exc.reason.endswith("Enrichment fields of a SOW topic (in the argument of SUM)")
    exc = problem("SUM(/x) + UNIX_TIMESTAMP() AS /y", aggregates=QUERY)
    assert (exc.position, exc.reason.split(" ")[0]) == (10, "UNIX_TIMESTAMP")
    assert field("IF(/a, 1, 2) AS /y", functions=("IF",)).calls == {}
    assert field("/x OF PREVIOUS AS /y", stage=True).expr == A.Previous(A.Path("/x"))


def test_depth_counts_a_call_as_one_level_and_its_argument_from_one() -> None:
    deep = "(" * (MAX_DEPTH - 1) + "/x" + ")" * (MAX_DEPTH - 1)
    assert field(f"SUM({deep}) AS /y", aggregates=QUERY).calls
    too_deep = "-" * MAX_DEPTH + "/x"
    exc = problem(f"SUM({too_deep}) AS /y", aggregates=QUERY)
    assert exc.reason.endswith("levels) (in the argument of SUM)")


def test_aggregate_calls_print_back_as_text() -> None:
    assert A.to_text(field("sum(/a + 1) AS /s", aggregates=QUERY).expr) == "SUM((/a + 1))"


def test_unknown_aggregate_names_are_refused_by_the_caller_contract() -> None:
    with pytest.raises(ValueError, match="MEDIAN"):
        parse_projection_field("/a", aggregates=("MEDIAN",))
