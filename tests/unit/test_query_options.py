"""Validation of sow query options and the result order."""

from __future__ import annotations

import pytest

from sowstream.errors import InvalidCommandError
from sowstream.filters import FilterError
from sowstream.sow.query import MAX_BATCH_SIZE, result_order, validate_query


def test_defaults() -> None:
    opts = validate_query()
    assert opts.filter is None and opts.batch_size == 1 and not opts.ordered


@pytest.mark.parametrize("size", [0, -1, MAX_BATCH_SIZE + 1])
def test_batch_size_limits(size: int) -> None:
    with pytest.raises(InvalidCommandError, match="BatchSize"):
        validate_query(batch_size=size)
    validate_query(batch_size=MAX_BATCH_SIZE)


def test_skip_n_needs_top_n() -> None:
    with pytest.raises(InvalidCommandError, match="skip_n requires top_n"):
        validate_query(skip_n=1)
    opts = validate_query(top_n=2, skip_n=3)
    assert opts.keep == 5 and opts.ordered


def test_negative_window_is_rejected() -> None:
    with pytest.raises(InvalidCommandError):
        validate_query(top_n=-1)


def test_bad_filter_and_order_by_raise_filter_error() -> None:
    with pytest.raises(FilterError):
        validate_query(filter="/a >")
    with pytest.raises(FilterError):
        validate_query(order_by="/a SIDEWAYS")


def test_order_falls_back_to_sow_key() -> None:
    items = [("b", {"x": 1}), ("a", {"x": 1}), ("c", {"x": 0})]
    by_key = sorted(items, key=result_order(()))
    assert [k for k, _ in by_key] == ["a", "b", "c"]
    by_x = sorted(items, key=result_order(validate_query(order_by="/x DESC").order_by))
    assert [k for k, _ in by_x] == ["a", "b", "c"]
    by_x_asc = sorted(items, key=result_order(validate_query(order_by="/x").order_by))
    assert [k for k, _ in by_x_asc] == ["c", "a", "b"]
