"""Parsing filter text into the AST, and every way parsing can fail."""

from __future__ import annotations

import pytest

from sowstream.errors import SowstreamError
from sowstream.filters import FilterError, parse_filter
from sowstream.filters import ast as A
from sowstream.filters.parser import MAX_DEPTH, decode_string


def P(text: str) -> A.Path:
    return A.Path(text)


def L(value: A.Scalar) -> A.Literal:
    return A.Literal(value)


# ----------------------------------------------------------------------------- shapes


@pytest.mark.parametrize(
    ("text", "op"),
    [
        ("/a = 1", "="),
        ("/a == 1", "="),
        ("/a != 1", "!="),
        ("/a <> 1", "!="),
        ("/a < 1", "<"),
        ("/a <= 1", "<="),
        ("/a > 1", ">"),
        ("/a >= 1", ">="),
    ],
)
def test_comparison_operators_are_normalised(text: str, op: str) -> None:
    assert parse_filter(text) == A.Compare(op, P("/a"), L(1))  # type: ignore[arg-type]


def test_not_binds_tighter_than_and_which_binds_tighter_than_or() -> None:
    tree = parse_filter("NOT /a = 1 AND /b = 2 OR /c = 3")
    assert tree == A.Or(
        (
            A.And(
                (
                    A.Not(A.Compare("=", P("/a"), L(1))),
                    A.Compare("=", P("/b"), L(2)),
                )
            ),
            A.Compare("=", P("/c"), L(3)),
        )
    )


def test_parentheses_override_precedence() -> None:
    tree = parse_filter("/a = 1 AND (/b = 2 OR /c = 3)")
    assert tree == A.And(
        (
            A.Compare("=", P("/a"), L(1)),
            A.Or((A.Compare("=", P("/b"), L(2)), A.Compare("=", P("/c"), L(3)))),
        )
    )


def test_and_and_or_chains_are_flattened() -> None:
    a, b, c, d = (A.Compare("=", P(f"/{x}"), L(1)) for x in "abcd")
    assert parse_filter("/a=1 AND (/b=1 AND /c=1) AND /d=1") == A.And((a, b, c, d))
    assert parse_filter("(/a=1 OR /b=1) OR /c=1 OR /d=1") == A.Or((a, b, c, d))


def test_keywords_and_functions_are_case_insensitive() -> None:
    upper = parse_filter("NOT /a IN (1) AND /b BETWEEN 1 AND 2 OR UPPER(/c) IS NULL")
    lower = parse_filter("not /a in (1) and /b between 1 and 2 or upper(/c) is null")
    mixed = parse_filter("nOt /a In (1) AnD /b BeTwEeN 1 aNd 2 oR UpPeR(/c) iS nUlL")
    assert upper == lower == mixed
    assert parse_filter("/x = TrUe") == A.Compare("=", P("/x"), L(True))
    assert parse_filter("/x = False") == A.Compare("=", P("/x"), L(False))
    assert parse_filter("/x = Null") == A.Compare("=", P("/x"), L(None))


def test_negated_forms_wrap_the_positive_node_in_not() -> None:
    v = P("/a")
    items = (L("x"), L("y"))
    assert parse_filter("/a NOT IN ('x', 'y')") == A.Not(A.In(v, items))
    assert parse_filter("/a NOT BETWEEN 1 AND 2") == A.Not(A.Between(v, L(1), L(2)))
    assert parse_filter("/a NOT LIKE 'x'") == A.Not(A.Like(v, "x"))
    assert parse_filter("/a IS NOT NULL") == A.Not(A.IsNull(v))
    assert parse_filter("/a NOT BEGINS WITH ('x', 'y')") == A.Not(A.BeginsWith(v, items))
    assert parse_filter("/a NOT ENDS WITH ('x', 'y')") == A.Not(A.EndsWith(v, items))


def test_positive_set_and_string_predicates() -> None:
    v = P("/a")
    assert parse_filter("/a IN (1, 'b', NULL)") == A.In(v, (L(1), L("b"), L(None)))
    assert parse_filter("/a BETWEEN -1 AND 2.5") == A.Between(v, L(-1), L(2.5))
    assert parse_filter("/a LIKE '^ab?c$'") == A.Like(v, "^ab?c$")
    assert parse_filter("/a IS NULL") == A.IsNull(v)
    assert parse_filter("/a BEGINS WITH ('x')") == A.BeginsWith(v, (L("x"),))
    assert parse_filter("/a ENDS WITH ('x', 'y')") == A.EndsWith(v, (L("x"), L("y")))


def test_between_and_binds_inside_between() -> None:
    tree = parse_filter("/a BETWEEN 1 AND 2 AND /b = 3")
    assert tree == A.And((A.Between(P("/a"), L(1), L(2)), A.Compare("=", P("/b"), L(3))))


def test_arithmetic_precedence_and_associativity() -> None:
    tree = parse_filter("/a + 2 * /b - 4 % 3 > 0")
    expected_left = A.Arith(
        "-",
        A.Arith("+", P("/a"), A.Arith("*", L(2), P("/b"))),
        A.Arith("%", L(4), L(3)),
    )
    assert tree == A.Compare(">", expected_left, L(0))
    assert parse_filter("(/a + 2) * 3 = 1") == A.Compare(
        "=", A.Arith("*", A.Arith("+", P("/a"), L(2)), L(3)), L(1)
    )


def test_unary_minus() -> None:
    assert parse_filter("/a = -5") == A.Compare("=", P("/a"), L(-5))
    assert parse_filter("/a = -2.5") == A.Compare("=", P("/a"), L(-2.5))
    assert parse_filter("/a = - -5") == A.Compare("=", P("/a"), L(5))
    assert parse_filter("-/a = 1") == A.Compare("=", A.Neg(P("/a")), L(1))
    assert parse_filter("/a - -1 = 0") == A.Compare("=", A.Arith("-", P("/a"), L(-1)), L(0))


def test_slash_is_division_only_where_an_operator_can_stand() -> None:
    assert parse_filter("10/2 = 5") == A.Compare("=", A.Arith("/", L(10), L(2)), L(5))
    assert parse_filter("/a/2 = 5") == A.Compare("=", P("/a/2"), L(5))
    assert parse_filter("/a / 2 = 5") == A.Compare("=", A.Arith("/", P("/a"), L(2)), L(5))
    assert parse_filter("/a / /b = 5") == A.Compare("=", A.Arith("/", P("/a"), P("/b")), L(5))


@pytest.mark.parametrize(
    "path",
    ["/55", "/a/b/c", "/a-b", "/a.b", "/$type", "/@id", "/_x9", "/Größe", "/a/0/b", "/x-1.5"],
)
def test_generous_path_segments(path: str) -> None:
    tree = parse_filter(f"{path} = 1")
    assert tree == A.Compare("=", P(path), L(1))
    assert isinstance(tree, A.Compare) and isinstance(tree.left, A.Path)
    assert tree.left.steps == tuple(path[1:].split("/"))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", 1),
        ("0", 0),
        ("12345678901234567890", 12345678901234567890),
        ("1.5", 1.5),
        (".5", 0.5),
        ("2.", 2.0),
        ("1e3", 1000.0),
        ("1.5E-2", 0.015),
        ("-7", -7),
        ("-0.25", -0.25),
    ],
)
def test_number_literals(text: str, value: float) -> None:
    tree = parse_filter(f"/a = {text}")
    assert isinstance(tree, A.Compare) and isinstance(tree.right, A.Literal)
    assert tree.right.value == value
    assert type(tree.right.value) is type(value)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("'abc'", "abc"),
        ('"abc"', "abc"),
        ("''", ""),
        ("'O''Brien'", "O'Brien"),
        ("'O\\'Brien'", "O'Brien"),
        ('"say ""hi"""', 'say "hi"'),
        ('"say \\"hi\\""', 'say "hi"'),
        ("'a \"b\" c'", 'a "b" c'),
        ('"it\'s"', "it's"),
        ("'back\\\\slash'", "back\\slash"),
        ("'\\d+\\.\\w'", "\\d+\\.\\w"),
        ("'ends with backslash\\\\'", "ends with backslash\\"),
        ("'multi\nline'", "multi\nline"),
        ("'AND OR NOT'", "AND OR NOT"),
    ],
)
def test_string_literals_quotes_and_escapes(text: str, value: str) -> None:
    assert parse_filter(f"/a = {text}") == A.Compare("=", P("/a"), L(value))


def test_decode_string_directly() -> None:
    assert decode_string("'plain'") == "plain"
    assert decode_string("'a''b\\'c\\\\d\\n'") == "a'b'c\\d\\n"


def test_functions_parse_with_arguments() -> None:
    tree = parse_filter("CONCAT(/a, 'x', 1) = 'y' AND COALESCE(/b, /c > 1) = 1")
    assert tree == A.And(
        (
            A.Compare("=", A.Func("CONCAT", (P("/a"), L("x"), L(1))), L("y")),
            A.Compare("=", A.Func("COALESCE", (P("/b"), A.Compare(">", P("/c"), L(1)))), L(1)),
        )
    )
    assert parse_filter("instr_i(/a, 'b') > 0") == A.Compare(
        ">", A.Func("INSTR_I", (P("/a"), L("b"))), L(0)
    )


def test_bare_values_and_constants_are_valid_filters() -> None:
    assert parse_filter("/active") == P("/active")
    assert parse_filter("true") == L(True)
    assert parse_filter("1=1") == A.Compare("=", L(1), L(1))
    assert parse_filter("NOT /active") == A.Not(P("/active"))


def test_whitespace_is_free_form() -> None:
    assert parse_filter("  /a=1\tAND\n/b>2  ") == parse_filter("/a = 1 AND /b > 2")
    assert parse_filter("/a IN(1,2)") == parse_filter("/a IN ( 1 , 2 )")


def test_nodes_record_positions_but_equality_ignores_them() -> None:
    tree = parse_filter("/x = 1 AND NOT UPPER(/s) LIKE 'A'")
    assert isinstance(tree, A.And)
    first, second = tree.operands
    assert first.pos == 0
    assert isinstance(second, A.Not) and second.pos == 11
    assert isinstance(second.operand, A.Like)
    assert isinstance(second.operand.value, A.Func) and second.operand.value.pos == 15
    assert parse_filter("/x=1") == parse_filter("  /x   =   1")


def test_paths_walk_and_depth() -> None:
    tree = parse_filter("/a = 1 AND (/b/c IN (/d, 2) OR UPPER(/a) LIKE 'x')")
    assert A.paths(tree) == frozenset({"/a", "/b/c", "/d"})
    assert A.depth(parse_filter("1")) == 1
    assert A.depth(tree) == 5
    assert sum(1 for _ in A.walk(tree)) == 12


def test_is_predicate() -> None:
    assert A.is_predicate(parse_filter("/a = 1"))
    assert A.is_predicate(parse_filter("/a BEGINS WITH ('x')"))
    assert A.is_predicate(parse_filter("STREQUAL_I(/a, 'x')"))
    assert A.is_predicate(parse_filter("true"))
    assert not A.is_predicate(parse_filter("/a"))
    assert not A.is_predicate(parse_filter("UPPER(/a)"))
    assert not A.is_predicate(parse_filter("/a + 1"))


@pytest.mark.parametrize(
    "text",
    [
        "/a = 1 AND /b != 'x' OR NOT /c < 2.5",
        "/a IN (1, 'two', NULL, TRUE) AND /b NOT IN (-3)",
        "/a BETWEEN /lo AND /hi + 1",
        "/a NOT LIKE '(?i)^x\\d+''s$' AND /b IS NOT NULL",
        "/a BEGINS WITH ('x', 'y') OR /a NOT ENDS WITH ('z')",
        "-/a * (2 + /b) % 3 / 4 - 1 >= 0",
        "CONCAT(/a, 'b\\\\c') = COALESCE(/x, '') AND LENGTH(/s) > 2",
        "/active",
        "1=1",
        "/x = 1e+20 AND /y = -0.0",
    ],
)
def test_to_text_round_trips(text: str) -> None:
    tree = parse_filter(text)
    assert parse_filter(A.to_text(tree)) == tree


def test_quote_string_round_trips_awkward_values() -> None:
    for value in ["", "'", "\\", "\\'", "''", "a\\nb", 'x"y']:
        assert parse_filter(f"/a = {A.quote_string(value)}") == A.Compare("=", P("/a"), L(value))


# ----------------------------------------------------------------------------- errors


def error_of(text: str) -> FilterError:
    with pytest.raises(FilterError) as info:
        parse_filter(text)
    return info.value


OPERAND = ["'('", "'-'", "'FALSE'", "'NULL'", "'TRUE'", "function name", "number", "path"]


def test_unclosed_parenthesis() -> None:
    err = error_of("(/a = 1 AND /b = 2")
    assert err.position == 18
    assert "')'" in err.expected and "'AND'" in err.expected and "'OR'" in err.expected
    assert "end of input" not in err.expected
    assert "found end of input" in str(err)


def test_missing_operand() -> None:
    err = error_of("/a = AND /b = 1")
    assert err.position == 5
    assert set(OPERAND) <= set(err.expected)
    assert "'NOT'" not in err.expected  # NOT cannot stand where a value is needed
    assert "found 'AND'" in str(err)


def test_missing_operand_at_end() -> None:
    err = error_of("/a >")
    assert err.position == 4
    assert {*OPERAND, "string"} <= set(err.expected)


def test_trailing_junk_lists_exactly_what_could_follow() -> None:
    err = error_of("/a = 1 xyz")
    assert (err.position, err.line, err.column) == (7, 1, 8)
    assert err.expected == [
        "'%'",
        "'*'",
        "'+'",
        "'-'",
        "'/'",
        "'AND'",
        "'OR'",
        "end of input",
    ]
    assert str(err).startswith(
        "filter error at position 7 (line 1, column 8): expected one of '%', '*', '+', '-', "
        "'/', 'AND', 'OR', end of input but found 'xyz'"
    )


def test_trailing_close_paren() -> None:
    err = error_of("/a = 1)")
    assert err.position == 6
    assert "end of input" in err.expected and "')'" not in err.expected


def test_unterminated_string_is_a_bad_literal() -> None:
    err = error_of("/a = 'abc")
    assert err.position == 5
    assert "unterminated string" in str(err)
    assert "string" in err.expected


def test_bad_number_literal() -> None:
    err = error_of("/a = 12abc")
    assert err.position == 7
    assert "found 'abc'" in str(err)
    err = error_of("/a = 1.2.3")
    assert err.position == 8


def test_number_literal_limits() -> None:
    assert "too many digits" in str(error_of("/a = " + "9" * 5000))
    err = error_of("/a = 1e999")
    assert err.position == 5 and "out of range" in str(err)


def test_unknown_function() -> None:
    err = error_of("/a = 1 AND FOO(/b) = 2")
    assert err.position == 11
    assert "unknown function 'FOO'" in str(err)
    assert err.expected == sorted(A.FUNCTIONS)


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        ("UPPER() = 'A'", "UPPER takes 1 argument but was given 0"),
        ("LOWER(/a, /b) = 'a'", "LOWER takes 1 argument but was given 2"),
        ("INSTR(/a) = 1", "INSTR takes 2 arguments but was given 1"),
        ("CONCAT() = 'a'", "CONCAT takes at least 1 argument but was given 0"),
    ],
)
def test_function_arity(text: str, wanted: str) -> None:
    err = error_of(text)
    assert err.position == 0
    assert wanted in str(err)


def test_name_without_slash_hints_at_paths() -> None:
    err = error_of("price > 100")
    assert err.position == 6
    assert err.expected == ["'('"]
    assert "field paths start with '/'" in str(err)


def test_bad_regex_points_at_the_literal() -> None:
    err = error_of("/a = 1 AND /b LIKE 'ab(c'")
    assert err.position == 19
    assert "invalid regular expression" in str(err)
    assert error_of("/b NOT LIKE '*x'").position == 12


def test_like_needs_a_string_literal() -> None:
    err = error_of("/a LIKE /b")
    assert err.position == 8
    assert err.expected == ["string"]


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty_filter(text: str) -> None:
    err = error_of(text)
    assert err.position == len(text)
    assert "path" in err.expected and "'NOT'" in err.expected
    assert "the filter is empty" in str(err)


def test_keyword_needs_a_word_boundary() -> None:
    err = error_of("/a NOTIN (1)")
    assert err.position == 3
    assert "found 'NOTIN'" in str(err)


def test_unexpected_character() -> None:
    err = error_of("/a = 1 AND # = 2")
    assert err.position == 11
    assert "found '#'" in str(err)
    assert "path" in err.expected


def test_incomplete_predicates() -> None:
    assert error_of("/a IS 5").expected == ["'NOT'", "'NULL'"]
    between = error_of("/a BETWEEN 1 OR 2")
    assert between.position == 13 and "'AND'" in between.expected
    assert error_of("/a IN 1").expected == ["'('"]
    assert error_of("/a IN ()").position == 7
    assert error_of("/a BEGINS ('x')").expected == ["'WITH'"]


def test_comparisons_do_not_chain() -> None:
    assert error_of("/a = 1 = 2").position == 7


def test_line_and_column_on_multiline_text_with_caret() -> None:
    err = error_of("/a = 1\nAND /b = )")
    assert (err.position, err.line, err.column) == (16, 2, 10)
    lines = str(err).splitlines()
    assert lines[1] == "  AND /b = )"
    assert lines[2] == "           ^"


def test_caret_excerpt_is_clipped_on_long_lines() -> None:
    text = "/a = 1 AND " * 30 + "/b = )"
    err = error_of(text)
    excerpt, caret = str(err).splitlines()[1:3]
    assert excerpt.startswith("  ...") and len(excerpt) < 100
    assert excerpt[caret.index("^")] == ")"


def test_too_deep_nesting_is_a_filter_error() -> None:
    text = "NOT " * (MAX_DEPTH + 5) + "/a = 1"
    err = error_of(text)
    assert "nested too deeply" in str(err)
    # Deep but legal input still parses.
    assert parse_filter("NOT " * (MAX_DEPTH - 3) + "/a = 1")
    # Redundant parentheses do not count as depth.
    assert parse_filter("(" * 3000 + "/a = 1" + ")" * 3000) == A.Compare("=", P("/a"), L(1))


def test_absurd_input_still_gives_filter_errors() -> None:
    assert error_of("(" * 50_000)
    assert error_of("/a + " * 5000 + "1 = 1")
    assert error_of("-" * 20_000)


def test_filter_error_is_a_value_error_with_keyword_constructor() -> None:
    err = FilterError("boom", text="abc\ndef", position=5, expected=["x"])
    assert isinstance(err, ValueError)
    assert (err.text, err.position, err.line, err.column) == ("abc\ndef", 5, 2, 2)
    assert err.expected == ["x"] and err.reason == "boom"
    assert str(err).startswith("filter error at position 5 (line 2, column 2): boom")
    with pytest.raises(TypeError):
        FilterError("boom", "abc", 1)  # type: ignore[misc]


def test_non_string_input_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        parse_filter(None)  # type: ignore[arg-type]


def test_filter_error_is_a_sowstream_error_and_a_value_error() -> None:
    with pytest.raises(SowstreamError) as caught:
        parse_filter("/a = ")
    assert isinstance(caught.value, FilterError)
    assert isinstance(caught.value, ValueError)
    assert caught.value.position == 5
