"""SowKey generation and the delta_publish merge rule (pure functions)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sowstream.errors import InvalidMessageError
from sowstream.messagetypes.changes import merge_delta
from sowstream.sow.keys import (
    generated_sow_key,
    sow_key_from_values,
    validate_user_sow_key,
)


def test_key_is_stable_opaque_and_base64() -> None:
    key = generated_sow_key("orders", "orders", ["/orderId"], {"orderId": 2, "px": 120})
    assert key == generated_sow_key("orders", "orders", ["/orderId"], {"orderId": 2, "px": 95})
    assert len(key) == 16
    assert validate_user_sow_key("t", key) == key


def test_key_is_identical_in_another_process() -> None:
    code = (
        "from sowstream.sow.keys import sow_key_from_values as k;print(k('orders', ['2', 'IBM']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == sow_key_from_values("orders", ["2", "IBM"])


def test_separator_is_unambiguous_and_domain_matters() -> None:
    assert sow_key_from_values("d", ["ab", "c"]) != sow_key_from_values("d", ["a", "bc"])
    assert sow_key_from_values("d", ["a|b"]) != sow_key_from_values("d", ["a", "b"])
    assert sow_key_from_values("orders", ["1"]) != sow_key_from_values("trades", ["1"])


def test_key_domain_unifies_topics() -> None:
    a = generated_sow_key("shipping", "customers", ["/customerId"], {"customerId": 9})
    b = generated_sow_key("credit", "customers", ["/customerId"], {"customerId": 9})
    assert a == b


def test_numeric_and_string_key_values_use_canonical_text() -> None:
    assert generated_sow_key("t", "t", ["/id"], {"id": 7}) == generated_sow_key(
        "t", "t", ["/id"], {"id": "7"}
    )
    assert generated_sow_key("t", "t", ["/id"], {"id": 7.0}) == generated_sow_key(
        "t", "t", ["/id"], {"id": 7}
    )


def test_nested_and_composite_keys() -> None:
    one = generated_sow_key("t", "t", ["/a/b", "/c"], {"a": {"b": 1}, "c": "x"})
    two = generated_sow_key("t", "t", ["/a/b", "/c"], {"a": {"b": 1}, "c": "y"})
    assert one != two


@pytest.mark.parametrize("record", [{}, {"id": None}, {"id": ""}, {"other": 1}])
def test_missing_key_field_is_rejected(record: dict[str, object]) -> None:
    with pytest.raises(InvalidMessageError) as err:
        generated_sow_key("orders", "orders", ["/id"], record)
    assert err.value.reason == "missing_key_field"
    assert "/id" in str(err.value) and "orders" in str(err.value)


@pytest.mark.parametrize("record", [{"id": [1, 2]}, {"id": {"x": 1}}])
def test_non_scalar_key_field_is_rejected(record: dict[str, object]) -> None:
    with pytest.raises(InvalidMessageError, match="single scalar"):
        generated_sow_key("orders", "orders", ["/id"], record)


@pytest.mark.parametrize("bad", ["", None, "has space", "semi;colon", "x" * 1025])
def test_bad_user_keys_are_rejected(bad: str | None) -> None:
    with pytest.raises(InvalidMessageError) as err:
        validate_user_sow_key("blobs", bad)
    assert err.value.reason in {"missing_sow_key", "bad_sow_key"}


@given(
    st.lists(st.text(max_size=8), min_size=1, max_size=4),
    st.lists(st.text(max_size=8), min_size=1, max_size=4),
)
def test_distinct_value_lists_give_distinct_keys(a: list[str], b: list[str]) -> None:
    if a != b:
        assert sow_key_from_values("d", a) != sow_key_from_values("d", b)


def test_merge_packages_example_replaces_arrays_whole() -> None:
    stored = {"id": 42, "contents": {"packages": [{"box": "chocolates"}, {"bowl": "noodles"}]}}
    update = {"id": 42, "contents": {"packages": [{"basket": "eggs"}]}}
    assert merge_delta(stored, update) == {"id": 42, "contents": {"packages": [{"basket": "eggs"}]}}


def test_merge_missing_field_is_unchanged_and_nested_objects_merge() -> None:
    stored = {"id": 42, "flowers": "roses", "a": {"x": 1, "y": 2}}
    assert merge_delta(stored, {"id": 42}) == stored
    assert merge_delta(stored, {"a": {"y": 3, "z": 4}}) == {
        "id": 42,
        "flowers": "roses",
        "a": {"x": 1, "y": 3, "z": 4},
    }
    assert stored == {"id": 42, "flowers": "roses", "a": {"x": 1, "y": 2}}  # not modified


def test_merge_type_changes_and_nulls_replace() -> None:
    assert merge_delta({"a": {"x": 1}}, {"a": 5}) == {"a": 5}
    assert merge_delta({"a": 5}, {"a": {"x": 1}}) == {"a": {"x": 1}}
    assert merge_delta({"a": 5}, {"a": None}) == {"a": None}
    assert merge_delta(None, {"a": 1}) == {"a": 1}


def test_merge_of_the_order_735_example() -> None:
    order = {"id": 735, "customer": "Patrick", "item": 90123, "qty": 1000, "state": "new"}
    merged = merge_delta(
        merge_delta(order, {"id": 735, "inventory": "available"}), {"id": 735, "credit": "approved"}
    )
    assert merged == {**order, "inventory": "available", "credit": "approved"}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=10,
)
objects = st.dictionaries(st.text(max_size=3), json_values, max_size=5)


@given(objects, objects, objects)
def test_merge_is_idempotent_for_replay(
    stored: dict[str, object], d1: dict[str, object], d2: dict[str, object]
) -> None:
    """Replaying deltas onto a state that already has them changes nothing (crash recovery)."""
    once = merge_delta(merge_delta(stored, d1), d2)
    assert merge_delta(merge_delta(once, d1), d2) == once
