"""The Spark backend of the filter language gives the Python evaluator's answers, and the Spark
plumbing (connector jars, session, Kafka source) works.

Each check evaluates a batch of filters on a batch of records in one Spark job and compares
every three-valued result with ``compile_filter(text).evaluate(record)``, the record being the
same JSON text parsed by orjson, as the engine parses it.
"""

from __future__ import annotations

import math
import random
import re
import shutil
import struct
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from sowstream.errors import PipelineError
from sowstream.filters import FilterError, compile_filter
from sowstream.filters.ast import quote_string
from sowstream.filters.values import canonical_text
from sowstream.pipeline import connector
from sowstream.pipeline.columns import (
    filter_column,
    filter_sql,
    java_regex,
    truth_array,
    truth_column,
    value_column,
)
from sowstream.pipeline.session import SESSION_CONF, spark_submit_args

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# ----------------------------------------------------------------------------- the oracle


def bodies_of(records: list[Any]) -> list[str]:
    """JSON texts: strings are taken as written (to control number spelling), others dumped."""
    return [r if isinstance(r, str) else orjson.dumps(r).decode() for r in records]


def frame(spark: SparkSession, bodies: list[str]) -> DataFrame:
    return spark.createDataFrame(list(enumerate(bodies)), "rid int, body string")


def disagreements(
    spark: SparkSession, filters: list[str], records: list[Any], *, varied: bool = True
) -> list[str]:
    """Every (filter, record) on which Spark and the evaluator differ, from one Spark job.

    ``varied`` demands that the evaluator answered both TRUE and FALSE somewhere: a batch whose
    answers are all alike would prove little.
    """
    bodies = bodies_of(records)
    rows = frame(spark, bodies).select("rid", truth_array(filters, "body").alias("t")).collect()
    assert sorted(row.rid for row in rows) == list(range(len(bodies)))
    out: list[str] = []
    answers: set[bool | None] = set()
    for row in rows:
        record = orjson.loads(bodies[row.rid])
        for text, got in zip(filters, row.t, strict=True):
            want = compile_filter(text).evaluate(record)
            answers.add(want)
            if got is not want:
                out.append(f"{text!r} on {bodies[row.rid]}: evaluator {want}, Spark {got}")
    assert not varied or {True, False} <= answers, answers
    return out


def check(spark: SparkSession, filters: list[str], records: list[Any] | None = None) -> None:
    bad = disagreements(spark, filters, RECORDS if records is None else records)
    assert not bad, f"{len(bad)} disagreement(s):\n" + "\n".join(bad[:40])


# Values as JSON text, so that e.g. 1.0 stays a float and 2**64-1 an integer, as orjson reads them.
VALUES = [
    "null", "0", "5", "10", "15", "-7", "3", "2.5", "10.0", "1.0", "-0.0", "1e1", "1e-7",
    "123456789.125", "1e20", "1e23", "9007199254740993", "9007199254740992.0",
    "12345678901234567890", "18446744073709551615", "-9223372036854775808",
    '""', '" "', '"10"', '" 10 "', '"1e1"', '"-0.5"', '"ten"', '"m"', '"B"', '"abc"', '"ABC"',
    '"Hello World"', '"sowstream"', '"stra\\u00dfe"', '"Infinity"', '"0x10"', '"1_000"',
    '"1e999"', "true", "false", "[]", "[5, 15]", "[null, 2]", '["red", "green"]',
    "[[1, [2, [3]]], 4]", '{"k": 1}', '[{"q": 1}, "x", {"q": [5, 50]}]',
]  # fmt: skip


def _record(k: int) -> str:
    def v(j: int) -> str:
        return VALUES[j % len(VALUES)]

    return (
        f'{{"a": {v(k)}, "b": {v(3 * k + 1)}, "c": {v(5 * k + 2)}, '
        f'"o": {{"a": {v(7 * k + 3)}, "l": [{{"q": {v(k + 4)}}}, {{"q": {v(11 * k + 5)}}}]}}}}'
    )


# Every value in /a, others spread over /b, /c and a nested object, plus a few odd shapes.
RECORDS: list[Any] = [_record(k) for k in range(len(VALUES))] + [
    "{}",
    '{"a": 1, "a": 2}',
    '{"o": null, "a": {"b": 1}}',
    '{"o": [], "a": [[], [[]]]}',
    '{"o": [{"a": 1}, {"a": "x"}], "b": [1, 2]}',
]

# ----------------------------------------------------------------------------- (a) by construct

OPS = ["=", "!=", "<", "<=", ">", ">="]

COMPARISONS = [
    *(f"/a {op} {lit}" for op in OPS for lit in ("10", "'10'", "'m'", "2.5", "true", "NULL")),
    *(f"/a {op} /b" for op in OPS),
    "10 < /a", "'m' >= /a", "/a == 10.0", "/a <> 'abc'", "/a = ''", "/a = /a",
    "/a = 9007199254740993", "/a = 9007199254740992.0", "/a > 9007199254740992",
    "/a = 12345678901234567890", "/a > 18446744073709551614", "/a < 1e20", "/a = 1e23",
    "/a = 99999999999999991611392", "/a = -9223372036854775808", "/a = '1e1'", "/a = ' 10 '",
    "/a = 'Infinity'", "/a = '0x10'", "/a = '1_000'", "/o = 1", "/o/a >= /c", "/o/l/q < /a",
    "/b = FALSE", "/b = /c",
]  # fmt: skip

LOGIC = [
    "/a IS NULL", "/a IS NOT NULL", "/zz IS NULL", "/o IS NULL", "/o/a IS NULL",
    "/o/l/q IS NOT NULL", "NOT /a = 5", "NOT /a > 5", "/a = 5 AND /b = 5",
    "/a > 1 AND /b > 1 AND /c > 1", "/a > 1 OR /b > 1", "/a > 1 OR /zz = 1",
    "NOT (/a > 1 OR /zz = 1)", "NOT (/a > 1 AND /zz = 1)", "/zz = 1 AND /a = 5", "/a", "NOT /a",
    "/a AND /b", "/a OR NOT /b", "(/a > 1) = true", "(/a > 1) = false", "(/a > 1) IS NULL",
    "COALESCE(/a > 1, true)", "1=1", "1=2", "TRUE", "NULL", "1", "NULL IS NULL", "'' IS NULL",
    "/a = 5 OR 1=1", "/a = 5 AND 1=2", "NOT NOT /a = 5",
]  # fmt: skip

ARRAYS_AND_SETS = [
    "/a = 5", "/a != 5", "/a NOT IN (5)", "/a IN (5, 15)", "/a IN ('red', 'blue')",
    "/a NOT IN ('red', 'blue')", "/a BETWEEN 4 AND 16", "/a NOT BETWEEN 4 AND 16",
    "/a BETWEEN 'a' AND 'n'", "/a BETWEEN 1 AND NULL", "/a BETWEEN /b AND /c",
    "/a BETWEEN /b AND 100", "/a IN (1, 'x')", "/a IN (1, NULL)", "/a NOT IN (1, NULL)",
    "/a IN (true, false)", "/a IN (true, 1)", "/a IN ('10', 'ten')", "/a IN (10.0, 'm')",
    "/a IN (/b, /c)", "/a IN (/b, 7)", "/a IN (/o/l/q)", "/a IN ('')", "/o/l/q > 40",
    "/o/l/q = 5", "/o/l/q IN (1, 50)", "/o/a/q = 1", "/a = 4", "/a = 3", "/a = 2", "/a/b = 1",
    "/a + /b > 20", "-/a = -5", "UPPER(/a) = 'RED'", "CONCAT(/a, /b) = '515'",
]  # fmt: skip

PATTERNS = [
    r"^1", r"e", r"(?i)^abc$", r"^\d+$", r"\w+\s\w+", r"\bWorld", r"o\B", r"^$", r"^ten$|^m$",
    r"(?i)STRASSE|straße", r"0\Z", r"0$", r"[^\d\s]", r"^-?\d+(\.\d+)?$", r"(?s).", r"^.{3}$",
    r"x{,2}", r"\x41|\u00df", r"(?x) t e n", r"e-07$", r"^1e\+?", r"(.)\1", r"true|false",
    r"\[", r"^[0-9a-f]+$", r"(?<=l)o", r"(?=W)\w+d", r"^\S+$", r"(?m)^r",
]  # fmt: skip

AFFIXES = [
    "/a BEGINS WITH ('1')", "/a BEGINS WITH ('1', 'ab')", "/a ENDS WITH ('0', 'c')",
    "/a NOT BEGINS WITH ('1')", "/a NOT ENDS WITH ('d', 'n')", "/a BEGINS WITH ('x', NULL)",
    "/a BEGINS WITH ('1', NULL)", "/a BEGINS WITH (12)", "/a BEGINS WITH (true)",
    "/a BEGINS WITH (/b)", "/a ENDS WITH (/b, 'zz')", "/a BEGINS WITH (/o/l/q)",
    "/a ENDS WITH ('')", "/a BEGINS WITH (1.0)", "/a ENDS WITH ('-07', 'e+20')",
]  # fmt: skip

ARITHMETIC = [
    "/a + 1 = 11", "/a - 1 = 9", "/a * 2 > 20", "/a / 4 = 2.5", "/a % 3 = 1", "/a % 3 = -1",
    "/a % 2.5 = 0", "/a % -3 = 1", "-/a < 0", "/a / 0 IS NULL", "/a % 0 IS NULL", "/a / /b > 1",
    "/a % /b = 0", "/a - /b = 0", "/a + /b = /c", "(/a + /b) * /c > 100", "/a * 1.0 = /a",
    "/a * /a > 1e40", "/a * 3 = 30", "/a / 3 > 3.33", "/a - 0.1 < 10", "/a + 0.5 = 3",
    "/a * 1e308 > 1e308", "/a * 1e308 - /a * 1e308 = 0", "/a * 1e308 - /a * 1e308 != 0",
    "(/a * 1e308 % 2) IS NULL", "/a % 1e308 = /a", "/a * 9007199254740993 = 9007199254740993",
    "/a + 1 > 12345678901234567890", "/a * 18446744073709551615 > 0", "/a + /a = 2 * /a",
    "(/a + 1) IS NULL", "-/a IS NULL", "/a * 2 = '20'",
    "/a * 9007199254740993 > /a * 9007199254740992",
]  # fmt: skip

FUNCTIONS = [
    "UPPER(/a) = 'ABC'", "LOWER(/a) = 'abc'", "UPPER(/a) = 'STRASSE'", "LENGTH(/a) = 3",
    "LENGTH(/a) > 5", "LENGTH(/a) IS NULL", "INSTR(/a, 'o') = 5", "INSTR(/a, 'z') = 0",
    "INSTR_I(/a, 'WORLD') = 7", "INSTR(/a, /b) > 0", "INSTR(/a, /zz) = 0",
    "STREQUAL_I(/a, 'abc')", "STREQUAL_I(/a, /b)", "NOT STREQUAL_I(/a, 'abc')",
    "STREQUAL_I(/a, /zz)", "CONCAT(/a, '-', /b) = '5-5'", "CONCAT(/a) = '10'",
    "CONCAT(/zz, /a) IS NULL", "CONCAT(/a, /b) LIKE '^1'", "COALESCE(/zz, /a) = 5",
    "CONCAT(/a, /b, /c) BEGINS WITH ('1')", "COALESCE(/a, /b, 0) > 1", "COALESCE(/zz, 'd') = 'd'",
    "COALESCE(/a, /b) IS NULL", "COALESCE(/o/l/q, 1) = 50", "LENGTH(CONCAT(/a, /b)) = 2",
    "UPPER(/a) LIKE '^[A-Z]+$'", "CONCAT(/a * 2) = '20'", "LENGTH(/a / 3) > 5",
    "UPPER(/a > 1) = 'TRUE'", "CONCAT(/a + 0.5) LIKE 'e'",
]  # fmt: skip


def test_comparisons(spark: SparkSession) -> None:
    check(spark, COMPARISONS)


def test_null_and_three_valued_logic(spark: SparkSession) -> None:
    check(spark, LOGIC)


def test_arrays_in_and_between(spark: SparkSession) -> None:
    check(spark, ARRAYS_AND_SETS)


def test_like(spark: SparkSession) -> None:
    extra = ["/a NOT LIKE 'e'", "/b LIKE '5'", "/o/l/q LIKE '^5'", "/a LIKE ''"]
    check(spark, [f"/a LIKE {quote_string(p)}" for p in PATTERNS] + extra)


def test_begins_and_ends_with(spark: SparkSession) -> None:
    check(spark, AFFIXES)


def test_arithmetic(spark: SparkSession) -> None:
    check(spark, ARITHMETIC)


def test_functions(spark: SparkSession) -> None:
    check(spark, FUNCTIONS)


def test_like_patterns_on_tricky_text(spark: SparkSession) -> None:
    # Where Python's and Java's regex engines read the same pattern differently.
    patterns = [
        r"a$", r"a\Z", r"(?m)^b", r"(?s)a.b", r"a.b", r"\s", r"\w", r"\d", r"(?i)k", r"(?i)ß",
        r"\b", r"\B", r"[[]", r"[&&]", r"[\b]", r"\101", r"\0", r"(?a)\w$", r"^\W+$", r"(?i)[a-c]",
        r"(?i:x)Y", r"x{2,}?", r"a++b", r"(?>a+)b", r"(?P<x>a)(?P=x)", r"(?i)(a)\1", r"[^\n]+",
    ]  # fmt: skip
    texts = [
        "a\n", "a\r\n", "b\nb", "a\nb", "a\u2028b", "a\x1cb", "\u00a0", "٣", "²", "\u212a", "K",
        "SS", "ß", "", " ", "[", "&", "\x08", "A", "\x00", "é", "aA", "xY", "XY", "xxx", "aab",
        "é_", "aA", "a b",
    ]  # fmt: skip
    filters = [f"/s LIKE {quote_string(p)}" for p in patterns]
    check(spark, filters, [{"s": t} for t in texts] + [{"s": 12.0}, {"s": True}, {}])


def test_the_text_of_numbers(spark: SparkSession) -> None:
    """Numbers as string functions see them: Python's ``canonical_text``, digit for digit."""
    rng = random.Random(7)
    floats = [0.1, 1e-5, 1.5e-7, 123456789.125, 1e16, 1e22, 1e23, 1.7976931348623157e308]
    floats += [-2.5, 2.0**63, 2.0**64 + 4096, 1e38, 9.999999999999999e37, 1e-4, 1.2e-4]
    floats += [1234567.5, 12345678.5, -1e-300, 3.0, 1e300, 2.0**53 + 2, -0.0]
    for _ in range(150):
        bits = struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
        if math.isfinite(bits) and abs(bits) > 1e-307:  # Java prints 5e-324 as 4.9e-324
            floats.append(bits)
        floats.append(rng.uniform(-1, 1) * 10 ** rng.uniform(-12, 40))
    ints = [0, -1, 12345678901234567890, -9223372036854775808, 9007199254740993, 2**64 - 1]
    bodies = [orjson.dumps({"a": v}).decode() for v in floats + ints]
    rows = (
        frame(spark, bodies)
        .select(
            "rid",
            value_column("/a", "body", as_type="string").alias("text"),
            value_column("LENGTH(/a)", "body").alias("length"),
        )
        .collect()
    )
    wrong = []
    for row in rows:
        value = orjson.loads(bodies[row.rid])["a"]
        want = canonical_text(value)
        if (row.text, row.length) != (want, len(want)):
            wrong.append(f"{value!r}: {row.text!r} (length {row.length}), expected {want!r}")
    assert not wrong, "\n".join(wrong[:20])


def test_value_column(spark: SparkSession) -> None:
    records = [{"q": 3, "p": 2.5, "s": "abc", "l": [4, 5]}, {"q": "7", "s": True}, {}]
    rows = (
        frame(spark, bodies_of(records))
        .select(
            "rid",
            value_column("/q * /p", "body").alias("product"),
            value_column("/q", "body", as_type="long").alias("q"),
            value_column("UPPER(/s)", "body").alias("upper"),
            value_column("/s", "body", as_type="boolean").alias("flag"),
            value_column("/l", "body", as_type="double").alias("first"),
        )
        .orderBy("rid")
        .collect()
    )
    assert [(r.product, r.q, r.upper, r.flag, r.first) for r in rows] == [
        (7.5, 3, "ABC", None, 4.0),
        (None, 7, "TRUE", True, None),
        (None, None, None, None, None),
    ]


def test_single_filter_columns_agree_with_the_batch(spark: SparkSession) -> None:
    filters = ["/a > 5", "/zz = 1", "1=1"]
    bodies = bodies_of(RECORDS)
    df = frame(spark, bodies)
    columns = [truth_column(f, "body").alias(f"t{k}") for k, f in enumerate(filters)]
    columns += [filter_column(f, "body").alias(f"m{k}") for k, f in enumerate(filters)]
    rows = df.select("rid", truth_array(filters, "body").alias("batch"), *columns).collect()
    for row in rows:
        record = orjson.loads(bodies[row.rid])
        for k, text in enumerate(filters):
            assert row[f"t{k}"] is row.batch[k] is compile_filter(text).evaluate(record)
            assert row[f"m{k}"] is compile_filter(text).matches(record)  # never NULL
    # The SQL form works in a WHERE clause.
    df.createOrReplaceTempView("records")
    where = filter_sql("/a > 5 AND /a < 20")
    ids = {r.rid for r in spark.sql(f"SELECT rid FROM records WHERE {where}").collect()}
    expected = {
        k
        for k, b in enumerate(bodies)
        if compile_filter("/a > 5 AND /a < 20").matches(orjson.loads(b))
    }
    assert ids == expected and ids


def test_compiled_code_path(spark: SparkSession) -> None:
    """The other tests interpret expressions; Spark's default compiles them to Java."""
    filters = ["/a > 5", "UPPER(/a) = 'ABC'", "/o/l/q IN (1, 50)"]
    saved = spark.conf.get("spark.sql.codegen.factoryMode") or "FALLBACK"
    spark.conf.set("spark.sql.codegen.factoryMode", "FALLBACK")
    try:
        check(spark, filters)
        bodies = bodies_of(RECORDS)
        count = frame(spark, bodies).where(filter_column("/a >= 10", "body")).count()
        assert count == sum(compile_filter("/a >= 10").matches(orjson.loads(b)) for b in bodies)
    finally:
        spark.conf.set("spark.sql.codegen.factoryMode", saved)


def test_records_that_are_not_objects_have_no_fields(spark: SparkSession) -> None:
    bodies = ["not json", "[1, 2]", "5", "null", '{"a": 5}']
    rows = frame(spark, bodies).select(
        "rid", truth_array(["/a = 5", "/a IS NULL"], "body").alias("t")
    )
    assert sorted((r.rid, *r.t) for r in rows.collect()) == [
        (0, None, True),
        (1, None, True),
        (2, None, True),
        (3, None, True),
        (4, True, False),
    ]


# ----------------------------------------------------------------------------- compile errors


def test_constructs_java_lacks_are_rejected_at_compile_time() -> None:
    text = "/a = 1 AND /s LIKE '(a)?(?(1)b|c)'"
    with pytest.raises(FilterError) as err:
        filter_sql(text)
    assert "conditional groups" in str(err.value)
    assert err.value.position == text.index("/s")
    with pytest.raises(FilterError):
        filter_sql("/a = ")  # an ordinary syntax error
    assert java_regex("a{2,}") == r"(?:\x{61}){2,}"


# ----------------------------------------------------------------------------- (b) random filters

PATHS = ["/a", "/b", "/c/x", "/c"]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.5, -1.5, 2.0, 1e-7, 1e20, 10, 1234567890123456789]),
    st.sampled_from(["", "a", "b", "B", "1", "2.0", "-1", " 3 ", "x1", "1e0", "ab", "1e999"]),
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
LITERALS = [
    "NULL", "TRUE", "false", "0", "1", "-2", "3", "0.5", "-1.5", "2.0", "1e20", "''", "'a'", "'b'",
    "'1'", "'2.0'", "'x1'", "'it''s'", "' 3 '", "'1e999'",
]  # fmt: skip
literal_texts = st.sampled_from(LITERALS)
paths = st.sampled_from(PATHS)
operands = st.one_of(paths, literal_texts)
values = st.one_of(
    operands,
    st.builds("{} {} {}".format, paths, st.sampled_from(["+", "-", "*", "/", "%"]), operands),
    st.builds("-{}".format, paths),
    st.builds("{}({})".format, st.sampled_from(["UPPER", "LOWER", "LENGTH", "CONCAT"]), paths),
    st.builds(
        "{}({}, {})".format, st.sampled_from(["INSTR", "COALESCE", "CONCAT"]), paths, operands
    ),
)
leaves = st.one_of(
    st.builds("{} {} {}".format, values, st.sampled_from(OPS), operands),
    st.builds(
        "{} IN ({})".format, values, st.lists(operands, min_size=1, max_size=3).map(", ".join)
    ),
    st.builds("{} IS NULL".format, values),
    st.builds("{} BETWEEN {} AND {}".format, values, operands, operands),
    st.builds(
        "{} LIKE {}".format, paths, st.sampled_from(["'^a'", "'1'", "'(?i)B'", "'^$'", "'e'"])
    ),
    st.builds(
        "{} BEGINS WITH ({})".format,
        values,
        st.lists(operands, min_size=1, max_size=2).map(", ".join),
    ),
    st.builds(
        "{} ENDS WITH ({})".format,
        paths,
        st.lists(literal_texts, min_size=1, max_size=2).map(", ".join),
    ),
    st.builds("STREQUAL_I({}, {})".format, paths, operands),
    paths,
)
filters = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.builds("({}) AND ({})".format, inner, inner),
        st.builds("({}) OR ({})".format, inner, inner),
        st.builds("NOT ({})".format, inner),
    ),
    max_leaves=4,
)


@settings(
    max_examples=2,
    deadline=None,
    phases=[Phase.generate],  # shrinking would rerun Spark jobs; the report lists every case
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)
@given(
    st.lists(filters, min_size=40, max_size=40, unique=True),
    st.lists(records, min_size=25, max_size=25, unique_by=lambda r: orjson.dumps(r)),
)
def test_random_filters_agree_with_the_evaluator(
    spark: SparkSession, texts: list[str], recs: list[dict[str, Any]]
) -> None:
    bad = disagreements(spark, texts, recs, varied=False)
    assert not bad, f"{len(bad)} disagreement(s):\n" + "\n".join(bad[:40])


# ----------------------------------------------------------------------------- (c) Kafka, jars


def test_connector_jars_complement_spark() -> None:
    jars = connector.connector_jars()
    names = [p.name for p in jars]
    assert all(p.is_file() for p in jars)
    assert any(n.startswith("spark-sql-kafka-0-10_") for n in names)
    assert any(n.startswith("kafka-clients-") for n in names)
    shipped = {p.name for p in connector.spark_jars_dir().glob("*.jar")}
    assert not set(names) & shipped
    assert not any(
        n.startswith(("scala-library", "slf4j", "jackson", "hadoop-client")) for n in names
    )
    assert connector.provision_connector() == jars  # provisioned once, then read from the cache
    args = spark_submit_args()
    assert args[0] == "--jars" and args[1].split(",") == [str(p) for p in jars]
    assert f"spark.sql.session.timeZone={SESSION_CONF['spark.sql.session.timeZone']}" in args


def test_provisioning_reports_a_missing_maven(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SOWSTREAM_CACHE", str(tmp_path))
    real = shutil.which
    monkeypatch.setattr(connector.shutil, "which", lambda n: None if n == "mvn" else real(n))
    with pytest.raises(PipelineError, match="`mvn` is not on PATH"):
        connector.connector_jars()
    assert not (connector.connector_jars_dir() / ".complete").exists()


def test_connector_version_fallbacks() -> None:
    assert connector._candidates("4.3.0") == ["4.3.0", "4.2.0", "4.1.0", "4.0.0"]
    assert connector._candidates("4.0.1") == ["4.0.1"]
    assert connector._ships("kafka-clients", {"kafka-clients-3.9.2.jar"})
    assert not connector._ships("commons-pool2", {"commons-pool-1.5.4.jar"})
    assert connector._ships("log4j-1.2-api", {"log4j-1.2-api-2.25.4.jar"})


def test_session_settings(spark: SparkSession) -> None:
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.sql.session.timeZone") == "UTC"
    assert "spark-sql-kafka-0-10_" in (conf.get("spark.jars") or "")
    assert spark.conf.get("spark.sql.variant.allowDuplicateKeys") == "true"


@pytest.mark.integration
def test_kafka_source_reads_a_topic(spark: SparkSession, kafka_bootstrap: str) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"sowstream-spark-test-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)
    records: list[dict[str, Any]] = [
        {"order": 1, "qty": 3},
        {"order": 2, "qty": 9},
        {"order": 3, "qty": "12"},
    ]
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
    for rec in records:
        producer.produce(topic, key=str(rec["order"]).encode(), value=orjson.dumps(rec))
    assert producer.flush(30) == 0
    try:
        log = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", kafka_bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("CAST(value AS STRING) AS body")
        )
        assert log.count() == 3
        matching = log.where(filter_column("/qty > 5", "body")).count()
        assert matching == sum(compile_filter("/qty > 5").matches(r) for r in records) == 2
    finally:
        admin.delete_topics([topic])


def test_error_positions_point_at_the_filter_text() -> None:
    with pytest.raises(FilterError) as err:
        filter_sql("/x = 1 OR /y LIKE '(a)?(?(1)b|c)'")
    assert re.search(r"position 10 \(line 1, column 11\)", str(err.value))
