"""The memo-index key encoding: bytes sort as the filter language compares, prefixes stay."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sowstream.filters import compile_filter
from sowstream.sow.memo import (
    NUMBER,
    TEXT,
    decode_entry,
    encode_number,
    encode_text,
    index_prefix,
    memo_entries,
    number_range,
    successor,
    text_prefix_range,
    text_range,
    value_keys,
)

numbers = st.one_of(
    st.integers(),
    st.integers(min_value=2**53 - 5, max_value=2**53 + 5),  # where floats lose integers
    st.integers(min_value=10**308, max_value=10**320),  # beyond a float's range
    st.floats(allow_nan=False),
    st.sampled_from([0.0, -0.0, 1e-308, -1e-308, 5e-324, math.inf, -math.inf]),
)
# Code points across the UTF-8 length classes, NUL and lone surrogates (JSON can carry them).
texts = st.text(
    alphabet=st.sampled_from(
        ["\x00", "\x01", "a", "b", "~", "\x7f", "é", "\ud800", "\uffff", "😀"]
    ),
    max_size=6,
)


def sign(x: int) -> int:
    return (x > 0) - (x < 0)


@settings(max_examples=500)
@given(numbers, numbers)
def test_number_order_is_numeric_order(a: int | float, b: int | float) -> None:
    ea, eb = encode_number(a), encode_number(b)
    assert ea is not None and eb is not None and len(ea) == 8
    # Rounding to a float may merge neighbours, never swap them.
    if a < b:
        assert ea <= eb
    elif a > b:
        assert ea >= eb
    else:
        assert ea == eb
    if ea < eb:
        assert a < b


def test_nan_has_no_encoding_and_zero_one() -> None:
    assert encode_number(math.nan) is None
    assert encode_number(-0.0) == encode_number(0.0) == encode_number(0)
    assert number_range("/x", math.nan, None) is None


@settings(max_examples=500)
@given(texts, texts)
def test_text_order_is_string_order_and_prefixes_stay_prefixes(a: str, b: str) -> None:
    ea, eb = encode_text(a), encode_text(b)
    assert sign((ea > eb) - (ea < eb)) == sign((a > b) - (a < b))
    rng = text_prefix_range("/p", a)
    key = index_prefix("/p") + TEXT + eb + b"KEY"
    inside = rng.start <= key and (rng.stop is None or key < rng.stop)
    assert inside == b.startswith(a)


@given(texts, st.binary(max_size=20))
def test_entries_decode_back(text: str, key: bytes) -> None:
    prefix = index_prefix("/a/b")
    assert decode_entry(len(prefix), prefix + TEXT + encode_text(text) + key) == (text, key)
    numeric = encode_number(12.5)
    assert numeric is not None
    assert decode_entry(len(prefix), prefix + NUMBER + numeric + key) == (None, key)


def test_values_are_filed_under_the_readings_the_filter_language_uses() -> None:
    def number(x: float) -> bytes:
        encoded = encode_number(x)
        assert encoded is not None
        return encoded

    assert value_keys(42) == [TEXT + encode_text("42"), NUMBER + number(42)]
    assert value_keys(2.0) == value_keys(2)
    assert value_keys(" 7 ") == [TEXT + encode_text(" 7 "), NUMBER + number(7)]
    assert value_keys("abc") == [TEXT + encode_text("abc")]
    assert value_keys(True) == [TEXT + encode_text("true")]  # booleans are never numbers
    nothings: list[object] = [None, "", {"a": 1}, []]
    for nothing in nothings:
        assert value_keys(nothing) == []


def test_entries_cover_array_elements_and_nested_paths() -> None:
    body = {"a": [1, {"b": "x"}, [2]], "n": {"m": "y"}, "e": ""}
    entries = memo_entries(["/a", "/a/b", "/n/m", "/e", "/missing"], b"K", body)
    by_path = {
        p: {e for e in entries if e.startswith(index_prefix(p))} for p in ["/a", "/a/b", "/n/m"]
    }
    assert len(by_path["/a"]) == 4  # 1 and 2, each as text and as number; the object has none
    assert len(by_path["/a/b"]) == 1 and len(by_path["/n/m"]) == 1
    assert len(entries) == 6


def test_index_prefixes_of_different_paths_never_nest() -> None:
    # "/a" must not be a prefix of "/ab" or "/a/b": an index's range holds only its own entries.
    paths = ["/a", "/ab", "/a/b", "/a\x00", "/"]
    for p in paths:
        for q in paths:
            if p != q:
                assert not index_prefix(q).startswith(index_prefix(p))


def test_successor() -> None:
    assert successor(b"ab") == b"ac"
    assert successor(b"a\xff\xff") == b"b"
    assert successor(b"\xff") is None


@pytest.mark.parametrize(
    ("flt", "lo", "hi"),
    [("/x >= 5", 5, None), ("/x <= 5", None, 5), ("/x BETWEEN -1.5 AND 2", -1.5, 2)],
)
def test_numeric_ranges_hold_exactly_the_matching_numbers(
    flt: str, lo: float | None, hi: float | None
) -> None:
    rng = number_range("/x", lo, hi)
    assert rng is not None
    base = index_prefix("/x") + NUMBER
    f = compile_filter(flt)
    for value in [-1e300, -2, -1.5, 0, 1, 2, 4.999, 5, 5.0, 6, 1e300]:
        encoded = encode_number(value)
        assert encoded is not None
        key = base + encoded + b"K"
        inside = rng.start <= key and (rng.stop is None or key < rng.stop)
        assert inside == f.matches({"x": value}), value


def test_text_range_bounds_are_inclusive() -> None:
    rng = text_range("/s", "b", "d")
    base = index_prefix("/s") + TEXT
    inside = [
        s
        for s in ["a", "b", "b\x00", "c", "d", "d\x00", "e"]
        if rng.start <= base + encode_text(s) + b"K" < (rng.stop or b"\xff" * 99)
    ]
    assert inside == ["b", "b\x00", "c", "d"]
