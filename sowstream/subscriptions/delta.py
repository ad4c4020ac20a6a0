"""Delta subscriptions: shaping a delta for its subscriber.

A delta subscriber receives only the fields an update changed (plus the key fields); the
difference itself and the fold of successive deltas are body operations
(:mod:`sowstream.messagetypes.changes`). These pure functions add or keep chosen fields and tell
whether a delta is empty. Records are parsed JSON objects; no function modifies its arguments,
though results may share nested values with them, so treat results as read-only or copy them
before changing them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import Any

from sowstream.filters.values import path_steps

__all__ = ["has_changes", "project", "project_delta", "with_fields"]


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
