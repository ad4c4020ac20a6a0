"""Paginated subscription windows over a shared, sorted result set."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sowstream.filters.order_by import parse_order_by
from sowstream.sow.query import result_order
from sowstream.subscriptions.window import PageWindow, ResultSet, WindowEvent

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def by_id(*ids: int) -> ResultSet:
    results = ResultSet(parse_order_by("/id"))
    for i in ids:
        results.upsert(f"k{i}", {"id": i})
    return results


def summary(events: list[WindowEvent]) -> list[tuple[str, str]]:
    return [(e.kind, e.sow_key) for e in events]


def test_spec_example_insert_pushes_the_last_member_out() -> None:
    results = by_id(1, 2, 5, 6)
    window = PageWindow(results, top_n=2, skip_n=1)
    assert window.members() == ["k2", "k5"]
    events = window.change("k4", {"id": 4})
    # Chosen order: enter/update first, then leave.
    assert summary(events) == [("enter", "k4"), ("leave", "k5")]
    assert events[0].record == {"id": 4}
    assert events[1].record == {"id": 5}
    assert window.members() == ["k2", "k4"]


def test_result_set_basics() -> None:
    results = by_id(5, 1, 3)
    assert len(results) == 3
    assert results.keys_between(0, 10) == ["k1", "k3", "k5"]
    assert results.keys_between(1, 2) == ["k3"]
    assert results.keys_between(2, 1) == []
    assert results.rank("k5") == 2
    assert results.rank("nope") is None
    assert results.get("k3") == {"id": 3}
    results.upsert("k3", {"id": 9})
    assert results.keys_between(0, 10) == ["k1", "k5", "k3"]
    results.remove("k1")
    results.remove("k1")
    assert len(results) == 2
    assert "k1" not in results
    assert results.get("k1") is None


def test_apply_reports_ranks_and_states() -> None:
    results = by_id(1, 2, 3)
    change = results.apply("k1", {"id": 9})
    assert (change.before, change.after) == ({"id": 1}, {"id": 9})
    assert (change.old_rank, change.new_rank) == (0, 2)
    gone = results.apply("k2", None)
    assert (gone.old_rank, gone.new_rank, gone.after) == (0, None, None)
    assert gone.version == change.version + 1
    nothing = results.apply("absent", None)
    assert nothing.version == gone.version


def test_default_order_is_the_sow_key() -> None:
    results = ResultSet(())
    for key in ("c", "a", "b"):
        results.upsert(key, {"id": 0})
    assert results.keys_between(0, 3) == ["a", "b", "c"]


def test_descending_order_with_sow_key_tiebreak() -> None:
    results = ResultSet(parse_order_by("/px DESC"))
    results.upsert("b", {"px": 1})
    results.upsert("a", {"px": 1})
    results.upsert("c", {"px": 2})
    assert results.keys_between(0, 3) == ["c", "a", "b"]


def test_deleting_a_member_pulls_the_next_record_in() -> None:
    results = by_id(1, 2, 5, 6)
    window = PageWindow(results, top_n=2, skip_n=1)
    events = window.change("k2", None)
    assert summary(events) == [("enter", "k6"), ("leave", "k2")]
    assert events[1].record == {"id": 2}  # its last state: the record is gone
    assert window.members() == ["k5", "k6"]


def test_update_that_stays_in_the_window() -> None:
    results = by_id(1, 2, 5, 6)
    window = PageWindow(results, top_n=2, skip_n=1)
    events = window.change("k5", {"id": 5, "px": 7})
    assert events == [WindowEvent("update", "k5", {"id": 5, "px": 7})]


def test_update_that_moves_a_member_out_by_sort_order() -> None:
    results = by_id(1, 2, 5, 6)
    window = PageWindow(results, top_n=2, skip_n=1)
    events = window.change("k2", {"id": 10})
    assert summary(events) == [("enter", "k6"), ("leave", "k2")]
    assert events[1].record == {"id": 10}  # the record as it is now
    assert window.members() == ["k5", "k6"]


def test_update_that_reorders_within_the_window_is_an_update() -> None:
    results = by_id(1, 2, 5, 6)
    window = PageWindow(results, top_n=3, skip_n=1)
    assert summary(window.change("k2", {"id": 5.5})) == [("update", "k2")]
    assert window.members() == ["k5", "k2", "k6"]


def test_records_before_the_window_shift_it() -> None:
    results = by_id(1, 2, 5, 6)
    window = PageWindow(results, top_n=2, skip_n=1)
    assert summary(window.change("k0", {"id": 0})) == [("enter", "k1"), ("leave", "k5")]
    assert window.members() == ["k1", "k2"]
    assert summary(window.change("k0", None)) == [("enter", "k5"), ("leave", "k1")]
    # Moving a record around before the window leaves the window as it was.
    assert window.change("k1", {"id": -3}) == []
    assert window.members() == ["k2", "k5"]


def test_changes_after_the_window_are_invisible() -> None:
    results = by_id(1, 2, 5, 6)
    window = PageWindow(results, top_n=2, skip_n=1)
    assert window.change("k9", {"id": 9}) == []
    assert window.change("k6", {"id": 7}) == []
    assert window.change("k6", None) == []
    assert window.change("absent", None) == []


def test_two_windows_on_one_result_set() -> None:
    results = by_id(1, 2, 3, 4, 5)
    first = PageWindow(results, top_n=2)
    second = PageWindow(results, top_n=2, skip_n=2)
    assert (first.members(), second.members()) == (["k1", "k2"], ["k3", "k4"])
    change = results.apply("k0", {"id": 0})
    assert summary(first.events(change)) == [("enter", "k0"), ("leave", "k2")]
    assert summary(second.events(change)) == [("enter", "k2"), ("leave", "k4")]
    change = results.apply("k3", {"id": 3, "x": 1})
    assert first.events(change) == []
    assert summary(second.events(change)) == [("update", "k3")]


def test_a_window_that_missed_changes_catches_up() -> None:
    results = by_id(1, 2, 3)
    window = PageWindow(results, top_n=2)
    results.upsert("k0", {"id": 0})  # another owner changed the set without telling the window
    results.upsert("k1", {"id": 1, "x": 1})
    change = results.apply("k9", {"id": 9})
    assert summary(window.events(change)) == [("enter", "k0"), ("update", "k1"), ("leave", "k2")]
    assert window.sync() == []
    results.upsert("k1", {"id": 1, "x": 2})  # unseen, then deleted: leave gives the latest state
    assert window.events(results.apply("k1", None)) == [
        WindowEvent("enter", "k2", {"id": 2}),
        WindowEvent("leave", "k1", {"id": 1, "x": 2}),
    ]


def test_top_n_zero_shows_nothing() -> None:
    results = by_id(1, 2)
    window = PageWindow(results, top_n=0)
    assert window.members() == []
    assert window.change("k0", {"id": 0}) == []
    assert window.change("k1", None) == []


def test_fewer_records_than_top_n() -> None:
    results = by_id(1)
    window = PageWindow(results, top_n=3, skip_n=0)
    assert window.members() == ["k1"]
    assert summary(window.change("k2", {"id": 2})) == [("enter", "k2")]
    assert summary(window.change("k1", None)) == [("leave", "k1")]
    assert window.members() == ["k2"]
    empty = PageWindow(by_id(1), top_n=2, skip_n=5)
    assert empty.members() == []
    assert empty.change("k0", {"id": 0}) == []


def test_reset_adopts_the_loaded_page_without_events() -> None:
    results = ResultSet(parse_order_by("/id"))
    window = PageWindow(results, top_n=2)
    for i in (3, 1, 2):
        results.upsert(f"k{i}", {"id": i})
    window.reset()
    assert window.members() == ["k1", "k2"]
    assert window.records() == [("k1", {"id": 1}), ("k2", {"id": 2})]


def test_republishing_an_identical_record_is_an_update() -> None:
    results = by_id(1)
    window = PageWindow(results, top_n=1)
    assert summary(window.change("k1", {"id": 1})) == [("update", "k1")]
    same = results.get("k1")
    assert same is not None
    assert summary(window.change("k1", same)) == [("update", "k1")]


def test_negative_sizes_are_rejected() -> None:
    with pytest.raises(ValueError):
        PageWindow(by_id(), top_n=-1)
    with pytest.raises(ValueError):
        PageWindow(by_id(), top_n=1, skip_n=-1)


# ----------------------------------------------------------------------------- property

KEYS = [f"k{i}" for i in range(8)]
ORDERS = ["", "/id", "/id DESC", "/grp, /id DESC", "/tag"]

records = st.fixed_dictionaries(
    {"id": st.integers(0, 5)},
    optional={
        "grp": st.sampled_from(["a", "b", "10", 2, None, True]),
        "tag": st.sampled_from(["x", "", 1.5, "1.5", [3, 1], None]),
    },
)
operations = st.lists(st.tuples(st.sampled_from(KEYS), st.none() | records), max_size=30)


def replay(view: dict[str, dict[str, Any]], events: list[WindowEvent]) -> None:
    for event in events:
        if event.kind == "leave":
            assert event.sow_key in view
            del view[event.sow_key]
        else:
            assert (event.sow_key in view) == (event.kind == "update")
            view[event.sow_key] = event.record


@FAST
@given(
    order=st.sampled_from(ORDERS),
    pages=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=1, max_size=3),
    ops=operations,
)
def test_windows_match_the_sorted_slice_and_their_events(
    order: str, pages: list[tuple[int, int]], ops: list[tuple[str, dict[str, Any] | None]]
) -> None:
    order_by = parse_order_by(order) if order else ()
    results = ResultSet(order_by)
    windows = [PageWindow(results, top_n, skip_n) for top_n, skip_n in pages]
    views: list[dict[str, dict[str, Any]]] = [{} for _ in windows]
    truth: dict[str, dict[str, Any]] = {}
    sort = result_order(order_by)
    for key, record in ops:
        previous = truth.get(key)
        if record is None:
            truth.pop(key, None)
        else:
            truth[key] = record
        change = results.apply(key, record)
        expected_all = [k for k, _ in sorted(truth.items(), key=sort)]
        assert results.keys_between(0, len(truth)) == expected_all
        assert len(results) == len(truth)
        for window, view, (top_n, skip_n) in zip(windows, views, pages, strict=True):
            was_member = key in view
            events = window.events(change)
            replay(view, events)
            expected = expected_all[skip_n : skip_n + top_n]
            assert window.members() == expected
            assert view == {k: truth[k] for k in expected}
            kinds = [e.kind for e in events]
            assert kinds == sorted(kinds, key=lambda kind: kind == "leave")
            for event in events:
                if event.kind == "leave" and event.sow_key == key and record is None:
                    assert event.record == previous
            if was_member and key in view and record is not None:
                assert ("update", key) in summary(events)
        for k in truth:
            assert results.rank(k) == expected_all.index(k)
