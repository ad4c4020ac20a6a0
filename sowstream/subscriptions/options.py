"""Subscription options: the AMPS-style option string and the value it stands for.

Clients write options as one comma-separated string (``"oof,conflation=250ms,select=[/a,/b]"``)
and the engine receives that same text on the wire, so the string is parsed here once, into a
frozen :class:`SubscriptionOptions`, and written back by :meth:`SubscriptionOptions.to_text` in a
canonical form that parses to an equal value. Mistakes raise
:class:`~sowstream.errors.InvalidCommandError` naming the option and the 0-based character
position where it starts, because option strings are typed by hand and often long.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from sowstream.errors import InvalidCommandError
from sowstream.sow.aggregate import parse_aggregation
from sowstream.units import parse_interval

__all__ = [
    "MIN_CONFLATION_MS",
    "SUPPORTED_OPTIONS",
    "SubscriptionOptions",
    "parse_options",
    "with_aggregation",
]

MIN_CONFLATION_MS = 100

_FLAGS = ("oof", "no_empties", "no_sowkey", "send_keys", "replace", "timestamp")
_VALUED = (
    "conflation",
    "conflation_key",
    "select",
    "top_n",
    "skip_n",
    "max_backlog",
    "grouping",
    "projection",
)
SUPPORTED_OPTIONS: tuple[str, ...] = tuple(sorted(_FLAGS + _VALUED))

# What each valued option looks like, quoted when a value is missing.
_EXAMPLES = {
    "conflation": "conflation=250ms",
    "conflation_key": "conflation_key=/id",
    "select": "select=[/a,/b/c]",
    "top_n": "top_n=10",
    "skip_n": "skip_n=10",
    "max_backlog": "max_backlog=10",
    "grouping": "grouping=[/region]",
    "projection": "projection=[/region, SUM(/qty) AS /qty]",
}
# What an aggregated subscription cannot be combined with (AMPS: no select list; no bookmark,
# which the client checks), and why.
_NOT_AGGREGATED = {
    "select": "an aggregated subscription delivers its projection, so it takes no select list",
    "top_n": "an aggregated subscription delivers every group: no top_n window",
    "skip_n": "an aggregated subscription delivers every group: no skip_n",
    "conflation": "an aggregated subscription is not conflated",
    "replace": "an aggregated subscription cannot be replaced: place a new one",
}

# A segment may not hold the characters that delimit the option string itself, so any valid path
# can be written back into an option string unquoted.
_SEGMENT = r"[^/\s\[\],=\"']+"
_PATH = re.compile(rf"(?:/{_SEGMENT})+")
_BAD_SEGMENT_CHAR = re.compile(r"[\s\[\],=\"']")
_BARE_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")
_INTEGER = re.compile(r"[+-]?[0-9]+")


@dataclass(frozen=True)
class SubscriptionOptions:
    """The options of one subscription, as parsed from its option string.

    ``conflation_ms`` is None without conflation; ``conflation_key`` is a field path, None meaning
    the SowKey; ``select`` is None to deliver whole records. ``send_keys`` is on by default, as in
    AMPS 4.0 and later, and the flag is only accepted for compatibility. The constructor does not
    re-check what :func:`parse_options` checks, so values built directly round-trip through
    :meth:`to_text` only if they are ones :func:`parse_options` could have produced.
    """

    oof: bool = False
    no_empties: bool = False
    no_sowkey: bool = False
    send_keys: bool = True
    replace: bool = False
    # AMPS adds the processing time on request; every sowstream message carries its log time
    # (Message.timestamp), so the flag is accepted and changes nothing.
    timestamp: bool = False
    conflation_ms: int | None = None
    conflation_key: str | None = None
    select: tuple[str, ...] | None = None
    top_n: int | None = None
    skip_n: int | None = None
    max_backlog: int | None = None  # queues: messages the subscriber may hold unacknowledged
    # An aggregated subscription: the grouping and projection lists, as written (``[/a, ...]``)
    grouping: str | None = None
    projection: str | None = None

    @property
    def aggregated(self) -> bool:
        """Whether the subscription delivers groups (grouping and projection) instead of records."""
        return self.grouping is not None

    def to_text(self) -> str:
        """The canonical option string: ``parse_options(self.to_text()) == self``.

        Options at their defaults are left out, so default options give ``""``. ``send_keys=False``
        has no textual form (AMPS cannot switch the key fields off), so it raises rather than
        silently turning back into True on the other side of the wire.
        """
        if not self.send_keys:
            raise InvalidCommandError(
                "send_keys=False cannot be written as an option string: key fields are always "
                "sent on delta subscriptions"
            )
        items = [
            name
            for name in ("oof", "no_empties", "no_sowkey", "replace", "timestamp")
            if getattr(self, name)
        ]
        if self.conflation_ms is not None:
            items.append(f"conflation={self.conflation_ms}ms")
        if self.conflation_key is not None:
            items.append(f"conflation_key={self.conflation_key}")
        if self.select is not None:
            items.append(f"select=[{','.join(self.select)}]")
        if self.top_n is not None:
            items.append(f"top_n={self.top_n}")
        if self.skip_n is not None:
            items.append(f"skip_n={self.skip_n}")
        if self.max_backlog is not None:
            items.append(f"max_backlog={self.max_backlog}")
        if self.grouping is not None:
            items.append(f"grouping={self.grouping}")
        if self.projection is not None:
            items.append(f"projection={self.projection}")
        return ",".join(items)

    def with_(self, **changes: Any) -> SubscriptionOptions:
        """A copy with ``changes`` applied (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)


def parse_options(text: str | None) -> SubscriptionOptions:
    """Parse an option string such as ``"oof,conflation=250ms,select=[/a,/b]"``.

    Items are separated by commas, except inside ``[...]``; whitespace around items and around
    ``=`` is ignored, and so are empty items. A conflation interval takes the units of
    :func:`~sowstream.units.parse_interval`, but a bare number means milliseconds here,
    as for the AMPS conflation option; a fraction of a millisecond rounds up before the
    minimum is checked. Any mistake raises InvalidCommandError.
    """
    values: dict[str, Any] = {}
    at: dict[str, int] = {}  # where each option given starts, for errors that involve two options
    for start, item in _items(text or ""):
        name, sep, raw_value = item.partition("=")
        name = name.strip()
        if not name:
            raise InvalidCommandError(
                f"subscription option at position {start} has no name before '=': {item!r}"
            )
        if name not in SUPPORTED_OPTIONS:
            raise InvalidCommandError(
                f"unknown subscription option {name!r} at position {start}: supported are "
                f"{', '.join(SUPPORTED_OPTIONS)}"
            )
        if name in at:
            raise InvalidCommandError(
                f"subscription option {name!r} is repeated at position {start} (first given at "
                f"position {at[name]}): give each option once"
            )
        at[name] = start
        if name in _FLAGS:
            if sep:
                raise InvalidCommandError(
                    f"subscription option {name!r} at position {start} is a flag and takes no "
                    f"value: write {name} alone, not {item!r}"
                )
            values[name] = True
            continue
        value = raw_value.strip()
        if not value:
            raise InvalidCommandError(
                f"subscription option {name!r} at position {start} needs a value, like "
                f"{_EXAMPLES[name]}"
            )
        # Position of the value itself, for errors that are about the value.
        value_at = start + len(item) - len(raw_value) + (len(raw_value) - len(raw_value.lstrip()))
        if name == "conflation":
            values["conflation_ms"] = _conflation(value, value_at)
        elif name == "conflation_key":
            values["conflation_key"] = _path("conflation_key", value, value_at)
        elif name == "select":
            values["select"] = _select(value, value_at)
        elif name in ("grouping", "projection"):
            values[name] = value
            at[f"{name}_value"] = value_at
        else:
            values[name] = _count(name, value, value_at)

    if "conflation_key" in values and values.get("conflation_ms") is None:
        raise InvalidCommandError(
            f"conflation_key at position {at['conflation_key']} needs conflation: add "
            f"conflation=<interval> of at least {MIN_CONFLATION_MS}ms"
        )
    if values.get("max_backlog") == 0:
        raise InvalidCommandError(
            f"max_backlog at position {at['max_backlog']} must be at least 1: a subscriber "
            "holding no message would never get one"
        )
    if "grouping" in values or "projection" in values:
        _check_aggregation(values, at)
    if "skip_n" in values and "top_n" not in values:
        raise InvalidCommandError(
            f"skip_n requires top_n: skip_n at position {at['skip_n']} has no top_n window to "
            "skip into"
        )
    return SubscriptionOptions(**values)


def with_aggregation(
    options: str | SubscriptionOptions | None, grouping: str | None, projection: str | None
) -> str | SubscriptionOptions | None:
    """``options`` with an aggregated subscription's ``grouping`` and ``projection`` added (as
    the client API takes them beside the option string); unchanged when neither is given."""
    if grouping is None and projection is None:
        return options
    text = options.to_text() if isinstance(options, SubscriptionOptions) else (options or "")
    items = [text] if text.strip() else []
    if grouping is not None:
        items.append(f"grouping={grouping}")
    if projection is not None:
        items.append(f"projection={projection}")
    return ",".join(items)


def _check_aggregation(values: dict[str, Any], at: dict[str, int]) -> None:
    """grouping and projection come together, parse, and leave out what aggregation excludes."""
    for name, why in _NOT_AGGREGATED.items():
        key = "conflation_ms" if name == "conflation" else name
        if values.get(key) is not None and values.get(key) is not False:
            raise InvalidCommandError(f"option {name!r} at position {at[name]}: {why}")
    parse_aggregation(
        values.get("grouping"),
        values.get("projection"),
        grouping_at=at.get("grouping_value", at.get("projection", 0)),
        projection_at=at.get("projection_value", at.get("grouping", 0)),
    )


def _items(text: str) -> list[tuple[int, str]]:
    """Split ``text`` at commas outside brackets (and quoted text, which a projection may
    hold) into (start position, stripped item) pairs."""
    items: list[tuple[int, str]] = []
    depth = 0
    start = 0
    quote = ""
    for i, char in enumerate(text):
        if quote:
            if char == quote:
                quote = ""
            continue
        if char in "'\"" and depth:
            quote = char
        elif char == "[":
            depth += 1
        elif char == "]" and depth:
            depth -= 1
        elif char == "," and not depth:
            items.append((start, text[start:i]))
            start = i + 1
    items.append((start, text[start:]))
    # An unclosed bracket swallows the rest of the string into one item; _select reports it.
    return [
        (start + len(raw) - len(raw.lstrip()), raw.strip()) for start, raw in items if raw.strip()
    ]


def _conflation(value: str, at: int) -> int | None:
    if value.lower() == "none":
        return None
    # parse_interval reads a bare number as seconds; the conflation option means milliseconds.
    interval = f"{value}ms" if _BARE_NUMBER.fullmatch(value) else value
    try:
        millis = parse_interval(interval)
    except ValueError as exc:
        raise InvalidCommandError(
            f"conflation value {value!r} at position {at} is not an interval like 250ms, 1s or "
            f"none: {exc}"
        ) from None
    if millis < MIN_CONFLATION_MS:
        raise InvalidCommandError(
            f"conflation interval {value!r} at position {at} is below the {MIN_CONFLATION_MS}ms "
            "minimum"
        )
    return millis


def _path(option: str, path: str, at: int) -> str:
    """``path`` if it is a field path, else an error naming it and its position."""
    if _PATH.fullmatch(path):
        return path
    if not path.startswith("/"):
        why = "it must start with '/'"
    elif _BAD_SEGMENT_CHAR.search(path):
        why = "field names cannot contain whitespace, brackets, commas, '=' or quotes"
    else:
        why = "every '/' must be followed by a field name"
    raise InvalidCommandError(f"{option} path {path!r} at position {at} is not a field path: {why}")


def _select(value: str, at: int) -> tuple[str, ...]:
    if not value.startswith("["):
        raise InvalidCommandError(
            f"select value {value!r} at position {at} must be a bracketed list of field paths, "
            f"like {_EXAMPLES['select']}"
        )
    if value.count("[") > value.count("]"):
        raise InvalidCommandError(
            f"select list at position {at} is missing its closing ']': {value!r}"
        )
    if not value.endswith("]"):
        raise InvalidCommandError(
            f"select list at position {at} has text after its closing ']': {value!r}"
        )
    inner = value[1:-1]
    if not inner.strip():
        raise InvalidCommandError(
            f"select list at position {at} is empty: name at least one field path, like "
            f"{_EXAMPLES['select']}"
        )
    paths: list[str] = []
    offset = at + 1
    for raw in inner.split(","):
        path = raw.strip()
        path_at = offset + len(raw) - len(raw.lstrip())
        offset += len(raw) + 1
        if not path:
            raise InvalidCommandError(f"select list has an empty entry at position {path_at}")
        _path("select", path, path_at)
        if path in paths:
            raise InvalidCommandError(
                f"select path {path!r} at position {path_at} is listed twice: name each field once"
            )
        paths.append(path)
    return tuple(paths)


def _count(option: str, value: str, at: int) -> int:
    if not _INTEGER.fullmatch(value):
        raise InvalidCommandError(
            f"{option} value {value!r} at position {at} is not a whole number: give 0 or more"
        )
    count = int(value)
    if count < 0:
        raise InvalidCommandError(
            f"{option} value {value!r} at position {at} is negative: give 0 or more"
        )
    return count
