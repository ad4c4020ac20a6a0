"""Delta subscriptions: what changed between two states of a record, and shaping that delta.

A delta subscriber receives only the fields an update changed (plus the key fields), so these
pure functions compute that difference, add or keep chosen fields, fold successive deltas for
conflation and tell whether a delta is empty. Records are parsed JSON objects; no function
modifies its arguments, though results may share nested values with them, so treat results as
read-only or copy them before changing them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import Any

from sowstream.filters.values import path_steps
from sowstream.sow.merge import merge_delta

__all__ = ["changed_fields", "has_changes", "merge_deltas", "project", "same_value", "with_fields"]


def same_value(a: Any, b: Any) -> bool:
    """Whether two parsed JSON values are the same JSON value.

    Stricter than ``==``: Python treats ``True == 1`` but JSON ``true`` and ``1`` differ, while
    ``1`` and ``1.0`` are the same JSON number. Arrays compare element by element and objects key
    by key, with the same rule all the way down.
    """
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    if a is None or b is None:
        return a is b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping | list | tuple) or isinstance(b, Mapping | list | tuple):
        return False  # an object against an array, or a container against a scalar
    return bool(a == b)


def changed_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``new`` that differ from ``old``: the body of a delta message.

    Objects present on both sides are compared field by field and contribute a nested dict of
    just their changed fields (nothing if none changed); arrays and scalars are compared whole
    with :func:`same_value`. A field that ``old`` has and ``new`` lacks is reported as ``None``
    (JSON null): that is how a delta says a field was removed, and merging the delta into ``old``
    with the delta_publish rule leaves that field null. A field set to null therefore looks the
    same in a delta as a removed one.
    """
    delta: dict[str, Any] = {}
    for field, value in new.items():
        if field not in old:
            delta[field] = value
            continue
        before = old[field]
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            inner = changed_fields(before, value)
            if inner:
                delta[field] = inner
        elif not same_value(before, value):
            delta[field] = value
    for field in old:
        if field not in new:
            delta[field] = None
    return delta


@cache
def _steps(path: str) -> tuple[str, ...]:
    # Key and select paths come from a few configurations and repeat on every update.
    return path_steps(path)


def with_fields(
    delta: Mapping[str, Any], record: Mapping[str, Any], paths: Iterable[str]
) -> dict[str, Any]:
    """``delta`` plus the value ``record`` holds at each of ``paths`` (``/a`` or ``/a/b``).

    Nested paths create or extend nested objects in the result, merging with what ``delta``
    already holds there. A path missing from ``record``, or reaching into a non-object (an
    array, say), is skipped. This is how the SOW key fields are added to a delta (send_keys).
    """
    out = dict(delta)
    for path in paths:
        steps = _steps(path)
        node: Any = record
        for step in steps:
            if not isinstance(node, Mapping) or step not in node:
                break
            node = node[step]
        else:
            _put(out, steps, node)
    return out


def _put(out: dict[str, Any], steps: tuple[str, ...], value: Any) -> None:
    """Set ``value`` at ``steps`` in ``out``, copying the nested dicts on the way (not mutating)."""
    target = out
    for step in steps[:-1]:
        child = target.get(step)
        # Copy rather than write into an object that may belong to the caller's delta or record.
        fresh: dict[str, Any] = dict(child) if isinstance(child, Mapping) else {}
        target[step] = fresh
        target = fresh
    target[steps[-1]] = value


def project(record: Mapping[str, Any], paths: Sequence[str]) -> dict[str, Any]:
    """Only the fields of ``record`` at ``paths``: what a ``select`` list delivers.

    Nested paths keep their nesting, a path to an object keeps the whole object, and paths
    missing from ``record`` are skipped.
    """
    return with_fields({}, record, paths)


def project_delta(delta: Mapping[str, Any], paths: Sequence[str]) -> dict[str, Any]:
    """:func:`project` for a delta: a selected field whose parent the delta removed (``null``) or
    turned into a non-object is gone too, so the parent comes through as ``null``."""
    out: dict[str, Any] = {}
    for path in paths:
        steps = _steps(path)
        node: Any = delta
        for depth, step in enumerate(steps):
            if not isinstance(node, Mapping):
                _put(out, steps[:depth], None)
                break
            if step not in node:
                break
            node = node[step]
        else:
            _put(out, steps, node)
    return out


def merge_deltas(first: Mapping[str, Any], later: Mapping[str, Any]) -> dict[str, Any]:
    """One delta with the effect of ``first`` followed by ``later`` (conflation).

    This is the delta_publish merge rule: ``later``'s fields win, objects on both sides merge
    field by field, and fields only ``first`` has are kept, so a field that changed and then
    changed back is still reported, with its final value.
    """
    # merge_delta returns its update unchanged when there is no stored side; a dict copy of
    # ``first`` always gives it one, so the result is always a new dict.
    return merge_delta(dict(first), dict(later))


@cache
def _key_tree(paths: tuple[str, ...]) -> dict[str, Any]:
    """The key paths as a tree of steps; None marks a whole key field. Cached per topic's keys."""
    tree: dict[str, Any] = {}
    for path in paths:
        node = tree
        *parents, last = _steps(path)
        for step in parents:
            child = node.setdefault(step, {})
            if child is None:
                break  # an ancestor is itself a key field, which covers this path
            node = child
        else:
            node[last] = None
    return tree


def has_changes(delta: Mapping[str, Any], key_paths: Iterable[str]) -> bool:
    """Whether ``delta`` holds anything besides the key fields at ``key_paths``.

    Key fields cannot change for one SowKey, so their presence alone is not a change
    (no_empties). A nested object holding only key fields counts as empty too.
    """
    keys = tuple(key_paths)
    if not keys:
        return bool(delta)
    return _beyond_keys(delta, _key_tree(keys))


def _beyond_keys(delta: Mapping[str, Any], tree: Mapping[str, Any]) -> bool:
    for field, value in delta.items():
        if field not in tree:
            return True
        below = tree[field]
        if below is None:
            continue
        if not isinstance(value, Mapping) or _beyond_keys(value, below):
            return True
    return False
