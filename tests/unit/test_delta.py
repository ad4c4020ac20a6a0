"""Delta subscription bodies: changed fields, key fields, select lists and conflation."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from sowstream.messagetypes.changes import changed_fields, merge_delta, merge_deltas, same_value
from sowstream.subscriptions.delta import has_changes, project, with_fields

ORDER_3 = {"order": 3, "customer": "Patrick", "status": "active", "qty": 1000, "ticker": "MSFT"}
ORDER_3_UPDATE = {
    "order": 3,
    "customer": "Patrick",
    "status": "pending",
    "qty": 1000,
    "ticker": "MSFT",
}


def test_order_3_status_change() -> None:
    delta = changed_fields(ORDER_3, ORDER_3_UPDATE)
    assert delta == {"status": "pending"}
    assert with_fields(delta, ORDER_3_UPDATE, ["/order"]) == {"order": 3, "status": "pending"}


def test_identical_records_have_no_changes() -> None:
    assert changed_fields(ORDER_3, dict(ORDER_3)) == {}


def test_added_and_removed_fields() -> None:
    old = {"id": 1, "gone": "x", "kept": 2}
    new = {"id": 1, "kept": 2, "added": [1, 2]}
    assert changed_fields(old, new) == {"gone": None, "added": [1, 2]}


def test_field_set_to_null_is_a_change() -> None:
    assert changed_fields({"a": 1}, {"a": None}) == {"a": None}
    assert changed_fields({"a": None}, {"a": None}) == {}


def test_nested_objects_compare_field_by_field() -> None:
    old = {"id": 1, "px": {"bid": 10, "ask": 11, "venue": {"name": "X", "rank": 1}}}
    new = {"id": 1, "px": {"bid": 10, "ask": 12, "venue": {"name": "X", "rank": 1}}}
    assert changed_fields(old, new) == {"px": {"ask": 12}}
    new2 = {"id": 1, "px": {"bid": 10, "ask": 11, "venue": {"name": "Y", "rank": 1}}}
    assert changed_fields(old, new2) == {"px": {"venue": {"name": "Y"}}}


def test_nested_removal_and_unchanged_object() -> None:
    old = {"a": {"x": 1, "y": 2}, "b": {"z": 3}}
    new = {"a": {"x": 1}, "b": {"z": 3}}
    assert changed_fields(old, new) == {"a": {"y": None}}


def test_object_replacing_scalar_and_back_is_whole() -> None:
    assert changed_fields({"a": 1}, {"a": {"x": 1}}) == {"a": {"x": 1}}
    assert changed_fields({"a": {"x": 1}}, {"a": 1}) == {"a": 1}
    assert changed_fields({"a": 1}, {"a": {}}) == {"a": {}}


def test_arrays_compare_whole() -> None:
    old = {"tags": [1, 2, 3], "rows": [{"k": 1}, {"k": 2}]}
    new = {"tags": [1, 2, 4], "rows": [{"k": 1}, {"k": 2}]}
    assert changed_fields(old, new) == {"tags": [1, 2, 4]}
    new2 = {"tags": [1, 2, 3], "rows": [{"k": 1}, {"k": 3}]}
    assert changed_fields(old, new2) == {"rows": [{"k": 1}, {"k": 3}]}


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (1, True, False),
        (0, False, False),
        (True, True, True),
        (1, 1.0, True),
        (0, -0.0, True),
        ("1", 1, False),
        (None, 0, False),
        (None, None, True),
        ("", None, False),
        ([1], [True], False),
        ([1, [0]], [1.0, [False]], False),
        ([1, [0]], [1.0, [0.0]], True),
        ({"a": 1}, {"a": True}, False),
        ({"a": 1}, {"a": 1.0}, True),
        ({"a": 1}, {"a": 1, "b": None}, False),
        ([1, 2], [1, 2, 3], False),
        ([], {}, False),
        ([1], 1, False),
        ({"a": 1}, "a", False),
    ],
)
def test_same_value_is_json_strict(a: Any, b: Any, same: bool) -> None:
    assert same_value(a, b) is same
    assert same_value(b, a) is same


def test_changed_fields_uses_strict_equality() -> None:
    old = {"a": 1, "b": 1, "c": "1", "d": [1], "e": 0}
    new = {"a": True, "b": 1.0, "c": 1, "d": [True], "e": False}
    assert changed_fields(old, new) == {"a": True, "c": 1, "d": [True], "e": False}


def test_inputs_are_not_modified() -> None:
    old = {"a": {"x": 1, "y": [1]}, "k": {"id": 7}}
    new = {"a": {"x": 2, "y": [1]}, "k": {"id": 7}, "n": {"m": 1}}
    old_copy, new_copy = copy.deepcopy(old), copy.deepcopy(new)
    delta = changed_fields(old, new)
    delta_copy = copy.deepcopy(delta)
    with_fields(delta, new, ["/k/id", "/a/y"])
    project(new, ["/a", "/a/x", "/n/m"])
    merge_deltas(delta, {"a": {"z": 1}})
    has_changes(delta, ["/k/id"])
    assert (old, new, delta) == (old_copy, new_copy, delta_copy)


def test_with_fields_nested_merges_into_delta() -> None:
    record = {"key": {"region": "EU", "id": 7}, "px": {"bid": 1, "ask": 2}, "qty": 5}
    delta = {"key": {"region": "EU"}, "px": {"ask": 2}}
    out = with_fields(delta, record, ["/key/id", "/key/region", "/px/bid"])
    assert out == {"key": {"region": "EU", "id": 7}, "px": {"ask": 2, "bid": 1}}
    assert delta == {"key": {"region": "EU"}, "px": {"ask": 2}}


def test_with_fields_creates_nesting_and_skips_missing() -> None:
    record = {"a": {"b": {"c": 1}}, "arr": [{"x": 1}], "s": "text"}
    out = with_fields({"z": 0}, record, ["/a/b/c", "/missing", "/a/nope", "/arr/x", "/s/x"])
    assert out == {"z": 0, "a": {"b": {"c": 1}}}


def test_project_keeps_only_selected_paths() -> None:
    record = {"a": 1, "b": {"c": 2, "d": {"e": 3, "f": 4}}, "g": [1, 2]}
    assert project(record, ["/a"]) == {"a": 1}
    assert project(record, ["/b/d/e", "/g"]) == {"b": {"d": {"e": 3}}, "g": [1, 2]}
    assert project(record, ["/b/d"]) == {"b": {"d": {"e": 3, "f": 4}}}
    assert project(record, ["/nope", "/b/nope", "/a/deeper"]) == {}
    assert project(record, []) == {}


def test_project_whole_object_and_nested_path_in_either_order() -> None:
    record = {"b": {"c": 2, "d": 3}}
    assert project(record, ["/b", "/b/c"]) == record
    assert project(record, ["/b/c", "/b"]) == record


def test_project_keeps_explicit_nulls() -> None:
    assert project({"a": None, "b": 1}, ["/a"]) == {"a": None}


def test_merge_deltas_later_wins_and_nested_objects_merge() -> None:
    first = {"id": 1, "a": 1, "n": {"x": 1, "y": 1}, "arr": [1]}
    later = {"id": 1, "b": 2, "n": {"y": 2}, "arr": [2, 3]}
    assert merge_deltas(first, later) == {
        "id": 1,
        "a": 1,
        "b": 2,
        "n": {"x": 1, "y": 2},
        "arr": [2, 3],
    }


def test_merge_deltas_from_empty_is_a_new_dict() -> None:
    later = {"a": 1}
    merged = merge_deltas({}, later)
    assert merged == later and merged is not later
    assert merge_deltas({"a": 1}, {}) == {"a": 1}


def test_record_99_conflation() -> None:
    state = {"id": 99, "status": "open", "notes": "none", "xref": 82}
    publishes = [
        {"id": 99, "status": "questioned", "notes": "none", "xref": 82},
        {"id": 99, "status": "questioned", "notes": "jcarlo hold", "xref": 82},
        {"id": 99, "status": "cleared", "notes": "none", "xref": 82},
        {"id": 99, "status": "open", "notes": "none", "xref": 82},
    ]
    conflated: dict[str, Any] = {}
    for update in publishes:
        delta = with_fields(changed_fields(state, update), update, ["/id"])
        assert has_changes(delta, ["/id"])
        conflated = merge_deltas(conflated, delta)
        state = update
    assert conflated == {"id": 99, "status": "open", "notes": "none"}


def test_has_changes_ignores_key_fields() -> None:
    assert not has_changes({}, [])
    assert has_changes({"a": 1}, [])
    assert not has_changes({"id": 1}, ["/id"])
    assert has_changes({"id": 1, "a": 1}, ["/id"])
    assert not has_changes({"k": {"region": "EU", "id": 7}}, ["/k/region", "/k/id"])
    assert has_changes({"k": {"region": "EU", "id": 7, "x": 1}}, ["/k/region", "/k/id"])
    assert has_changes({"k": {"region": "EU"}, "x": None}, ["/k/region"])
    # a scalar where the key path expects an object is a change of its own
    assert has_changes({"k": 5}, ["/k/id"])
    # a key path below another key path changes nothing
    assert not has_changes({"k": {"id": 1, "x": 2}}, ["/k", "/k/id"])
    assert not has_changes({"k": {"id": 1, "x": 2}}, ["/k/id", "/k"])
    assert has_changes({"k": {"id": 1}}, iter(["/other"]))


def test_has_changes_after_select() -> None:
    old = {"id": 1, "a": 1, "b": 1}
    new = {"id": 1, "a": 1, "b": 2}
    delta = project(changed_fields(old, new), ["/a"])
    assert not has_changes(delta, ["/id"])


# Random JSON: scalars where 1/True/1.0 collisions are likely, nested arrays and objects.
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-2, 2)
    | st.sampled_from([0.0, 1.0, 2.5])
    | st.sampled_from(["", "a", "1"])
)
_KEYS = st.sampled_from(["a", "b", "c", "d"])
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=12,
)
_OBJECTS = st.dictionaries(_KEYS, _JSON, max_size=4)


def _removed_as_null(old: Any, new: Any) -> Any:
    """``new``, except that a field ``old`` has and ``new`` lacks is there with null, wherever
    both sides hold an object at the same path (the only places a delta can say "removed")."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return new
    out = {k: _removed_as_null(old[k], v) if k in old else v for k, v in new.items()}
    out.update({k: None for k in old if k not in new})
    return out


@given(_OBJECTS, _OBJECTS)
def test_merging_the_delta_rebuilds_the_new_state(old: dict[str, Any], new: dict[str, Any]) -> None:
    delta = changed_fields(old, new)
    rebuilt = merge_delta(old, delta)
    assert same_value(rebuilt, _removed_as_null(old, new))
    assert (delta == {}) == same_value(old, new)


def _object_gone_and_back(a: Any, b: Any, c: Any) -> bool:
    """Whether some field is an object in ``a``, not one in ``b`` and an object again in ``c``.

    Only then does folding two deltas differ from applying them in turn: the folded delta holds
    ``c``'s object, which merges into ``a``'s object instead of replacing it, so fields only
    ``a`` had survive. Undoing that needs the state before the interval, not just the deltas.
    """
    if not (isinstance(a, dict) and isinstance(c, dict)):
        return False
    if not isinstance(b, dict):
        return True
    return any(_object_gone_and_back(a[k], b.get(k), c[k]) for k in a if k in c)


@given(_OBJECTS, _OBJECTS, _OBJECTS)
def test_merged_deltas_rebuild_the_final_state(
    a: dict[str, Any], b: dict[str, Any], c: dict[str, Any]
) -> None:
    # Conflation: applying the folded delta equals applying both deltas in turn.
    assume(not _object_gone_and_back(a, b, c))
    first, later = changed_fields(a, b), changed_fields(b, c)
    stepwise = merge_delta(merge_delta(a, first), later)
    assert same_value(merge_delta(a, merge_deltas(first, later)), stepwise)
