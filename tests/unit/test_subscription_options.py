"""Parsing and writing back subscription option strings."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sowstream.errors import InvalidCommandError
from sowstream.subscriptions.options import (
    MIN_CONFLATION_MS,
    SUPPORTED_OPTIONS,
    SubscriptionOptions,
    parse_options,
)


def _fails(text: str, *fragments: str) -> str:
    """Parse ``text``, expecting an error whose message holds every fragment."""
    with pytest.raises(InvalidCommandError) as info:
        parse_options(text)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


@pytest.mark.parametrize("text", [None, "", "   ", ",", " , ,"])
def test_nothing_gives_defaults(text: str | None) -> None:
    options = parse_options(text)
    assert options == SubscriptionOptions()
    assert options.send_keys and not options.oof and options.conflation_ms is None
    assert options.to_text() == ""


def test_every_option() -> None:
    text = (
        "oof,no_empties,conflation=250ms,conflation_key=/id,select=[/a,/b/c],top_n=2,skip_n=1,"
        "replace,send_keys,no_sowkey"
    )
    assert parse_options(text) == SubscriptionOptions(
        oof=True,
        no_empties=True,
        no_sowkey=True,
        send_keys=True,
        replace=True,
        conflation_ms=250,
        conflation_key="/id",
        select=("/a", "/b/c"),
        top_n=2,
        skip_n=1,
    )


@pytest.mark.parametrize("flag", ["oof", "no_empties", "no_sowkey", "replace", "timestamp"])
def test_each_flag(flag: str) -> None:
    options = parse_options(flag)
    assert getattr(options, flag) is True
    assert options == SubscriptionOptions().with_(**{flag: True})


def test_send_keys_is_on_with_or_without_the_flag() -> None:
    assert parse_options("send_keys") == parse_options("") == SubscriptionOptions()


def test_whitespace_around_items_and_equals_is_ignored() -> None:
    options = parse_options("  oof ,\tconflation = 1s , select = [ /a , /b ] ,top_n= 3 ")
    assert options == SubscriptionOptions(
        oof=True, conflation_ms=1000, select=("/a", "/b"), top_n=3
    )


def test_commas_inside_select_brackets_do_not_split_items() -> None:
    options = parse_options("select=[/a,/b/c,/d],oof")
    assert options.select == ("/a", "/b/c", "/d")
    assert options.oof


@pytest.mark.parametrize(
    ("value", "millis"),
    [
        ("100ms", 100),
        ("250ms", 250),
        ("1s", 1000),
        ("1.5s", 1500),
        ("2m", 120_000),
        ("100", 100),  # a bare number is milliseconds
        ("2500", 2500),
        ("0.1s", 100),
    ],
)
def test_conflation_intervals(value: str, millis: int) -> None:
    assert parse_options(f"conflation={value}").conflation_ms == millis


def test_conflation_none_means_no_conflation() -> None:
    assert parse_options("conflation=none") == SubscriptionOptions()
    assert parse_options("conflation=NONE").conflation_ms is None


def test_conflation_minimum() -> None:
    assert parse_options(f"conflation={MIN_CONFLATION_MS}ms").conflation_ms == MIN_CONFLATION_MS
    _fails("oof,conflation=99ms", "'99ms' at position 15", "100ms minimum")
    _fails("conflation=99", "'99'", "100ms minimum")
    _fails("conflation=0", "100ms minimum")


@pytest.mark.parametrize("value", ["fast", "10 parsecs", "-5ms", "1x"])
def test_conflation_bad_interval(value: str) -> None:
    _fails(f"conflation={value}", f"conflation value {value!r} at position 11")


def test_conflation_key() -> None:
    options = parse_options("conflation=1s,conflation_key=/order/id")
    assert options.conflation_key == "/order/id"
    _fails("conflation=1s,conflation_key=id", "conflation_key path 'id' at position 29")


def test_conflation_key_needs_conflation() -> None:
    _fails("oof,conflation_key=/id", "conflation_key at position 4 needs conflation")
    _fails("conflation_key=/id,conflation=none", "needs conflation")


def test_top_n_and_skip_n() -> None:
    assert parse_options("top_n=0") == SubscriptionOptions(top_n=0)
    assert parse_options("skip_n=5,top_n=10") == SubscriptionOptions(top_n=10, skip_n=5)


@pytest.mark.parametrize("option", ["top_n", "skip_n"])
def test_top_n_and_skip_n_values(option: str) -> None:
    prefix = "top_n=1," if option == "skip_n" else ""
    at = len(prefix) + len(option) + 1
    _fails(f"{prefix}{option}=-1", f"{option} value '-1' at position {at} is negative")
    _fails(f"{prefix}{option}=ten", f"{option} value 'ten' at position {at} is not a whole number")
    _fails(f"{prefix}{option}=1.5", "not a whole number")
    _fails(f"{prefix}{option}=", f"{option!r} at position {len(prefix)} needs a value")
    _fails(f"{prefix}{option}", "needs a value")


def test_skip_n_requires_top_n() -> None:
    _fails("oof,skip_n=3", "skip_n requires top_n", "position 4")


def test_unknown_option() -> None:
    message = _fails("oof,bogus", "unknown subscription option 'bogus' at position 4")
    assert "supported are " + ", ".join(SUPPORTED_OPTIONS) in message
    _fails("oof, Oof", "unknown subscription option 'Oof' at position 5")
    _fails("=5", "at position 0 has no name")


def test_repeated_option() -> None:
    _fails("oof,top_n=1,oof", "'oof' is repeated at position 12", "first given at position 0")
    _fails("top_n=1,top_n=2", "'top_n' is repeated at position 8")
    _fails("send_keys,send_keys", "repeated")


@pytest.mark.parametrize("flag", ["oof", "no_empties", "no_sowkey", "send_keys", "replace"])
def test_flag_with_value(flag: str) -> None:
    _fails(f"top_n=1,{flag}=1", f"{flag!r} at position 8 is a flag and takes no value")
    _fails(f"{flag}=", "is a flag")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("select=[a]", "select path 'a' at position 8 is not a field path: it must start with '/'"),
        ("select=[/]", "select path '/' at position 8"),
        ("select=[//a]", "select path '//a' at position 8"),
        ("select=[/a//b]", "select path '/a//b' at position 8"),
        ("select=[/a/]", "select path '/a/' at position 8"),
        ("select=[/a b]", "select path '/a b' at position 8"),
        ("select=[/a, /b,  c]", "select path 'c' at position 17"),
        ('oof,select=[/ok,/"q"]', "select path '/\"q\"' at position 16"),
        ("select=[/a=1]", "select path '/a=1'"),
        ("select=[/a,[/b]]", "select path '[/b]' at position 11"),
        ("select=[]", "select list at position 7 is empty"),
        ("select=[  ]", "is empty"),
        ("select=[/a,,/b]", "select list has an empty entry at position 11"),
        ("select=/a", "select value '/a' at position 7 must be a bracketed list"),
        ("select=[/a,/b", "select list at position 7 is missing its closing ']'"),
        ("select=[/a,/b,oof", "missing its closing ']'"),
        ("select=[/a]x", "has text after its closing ']'"),
        ("select=[/a,/b,/a]", "select path '/a' at position 14 is listed twice"),
        ("select", "'select' at position 0 needs a value"),
    ],
)
def test_bad_select(text: str, fragment: str) -> None:
    _fails(text, fragment)


def test_error_positions_count_from_the_item_not_its_whitespace() -> None:
    _fails("oof,   bogus", "position 7")


def test_to_text_is_canonical() -> None:
    options = parse_options(
        " top_n=2, select=[ /a ,/b/c ],no_sowkey,conflation=1.5s,oof,skip_n=1,conflation_key=/k"
    )
    assert options.to_text() == (
        "oof,no_sowkey,conflation=1500ms,conflation_key=/k,select=[/a,/b/c],top_n=2,skip_n=1"
    )


def test_send_keys_off_has_no_text() -> None:
    with pytest.raises(InvalidCommandError, match="send_keys=False"):
        SubscriptionOptions(send_keys=False).to_text()


def test_options_are_frozen_values() -> None:
    options = parse_options("oof")
    with pytest.raises(AttributeError):
        options.oof = False  # type: ignore[misc]
    assert options.with_(oof=False) == SubscriptionOptions()
    assert hash(options) == hash(parse_options("oof"))


_SEGMENT = re.compile(r"[^/\s\[\],=\"']+")
# Filtered again by Python's own regex: Hypothesis's idea of \s may differ at the edges.
_SEGMENTS = st.from_regex(_SEGMENT, fullmatch=True).filter(_SEGMENT.fullmatch)
_PATHS = st.lists(_SEGMENTS, min_size=1, max_size=3).map(lambda parts: "/" + "/".join(parts))


@st.composite
def _options(draw: st.DrawFn) -> SubscriptionOptions:
    conflation_ms = draw(st.none() | st.integers(MIN_CONFLATION_MS, 10**9))
    top_n = draw(st.none() | st.integers(0, 10**12))
    return SubscriptionOptions(
        oof=draw(st.booleans()),
        no_empties=draw(st.booleans()),
        no_sowkey=draw(st.booleans()),
        replace=draw(st.booleans()),
        conflation_ms=conflation_ms,
        conflation_key=None if conflation_ms is None else draw(st.none() | _PATHS),
        select=draw(st.none() | st.lists(_PATHS, min_size=1, max_size=4, unique=True).map(tuple)),
        top_n=top_n,
        skip_n=None if top_n is None else draw(st.none() | st.integers(0, 10**12)),
    )


@given(_options())
def test_round_trip(options: SubscriptionOptions) -> None:
    text = options.to_text()
    assert parse_options(text) == options
    assert parse_options(text).to_text() == text


@given(_options(), st.randoms(use_true_random=False))
def test_round_trip_in_any_order_with_spaces(
    options: SubscriptionOptions, rng: random.Random
) -> None:
    items = options.to_text().split(",") if options.to_text() else []
    # select lists hold commas: rejoin them before shuffling whole items.
    whole: list[str] = []
    for item in items:
        if whole and whole[-1].count("[") > whole[-1].count("]"):
            whole[-1] += "," + item
        else:
            whole.append(item)
    rng.shuffle(whole)
    assert parse_options(" , ".join(whole)) == options


def test_timestamp_is_accepted_and_round_trips() -> None:
    options = parse_options("oof,timestamp")
    assert options.timestamp and parse_options(options.to_text()) == options


def test_subscription_sow_keys_survive_the_registry_encoding() -> None:
    from sowstream.subscriptions.model import SubscriptionSpec
    from sowstream.wire.avro import decode, encode

    spec = SubscriptionSpec("s", "r", "orders", "sow_and_subscribe", sow_keys=frozenset({"b", "a"}))
    back = SubscriptionSpec.from_wire(
        decode("Subscription", encode("Subscription", spec.to_wire()))
    )
    assert back == spec and back.covers("a") and not back.covers("c")
    every = SubscriptionSpec("s", "r", "orders", "subscribe")
    assert SubscriptionSpec.from_wire(
        decode("Subscription", encode("Subscription", every.to_wire()))
    )
    assert every.covers("anything")
