"""Pattern (regular expression) topics: many topic names sharing one definition and one store.

A SOW topic with a ``Pattern`` holds the records of every topic name its pattern matches whole.
They share its log, control topic and partition stores; each record is kept under its *record
key*, the topic name and the SowKey joined by :data:`SEPARATOR` (a control character, which no
topic name may hold), so two names' records never collide even when their SowKeys are equal, and
the records of one name lie together in key order (a query on one name reads only its range).

Commands and subscriptions on a Pattern topic say which names they read with a regular
expression (a literal name is sent escaped, ``re.escape``); :class:`NameScope` is that choice
on the engine side. Everything here is pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SEPARATOR = "\x1f"
_SEPARATOR_BYTES = SEPARATOR.encode()
# Characters that make a regular expression more than a literal when not escaped.
_SPECIAL = frozenset(".^$*+?{}[]|()")


def record_key(name: str, sow_key: str) -> str:
    """The key a Pattern topic stores the record ``sow_key`` of topic ``name`` under."""
    return f"{name}{SEPARATOR}{sow_key}"


def split_key(key: str) -> tuple[str, str]:
    """``(topic name, SowKey)`` of a Pattern topic's record key (the name is empty if the key
    has no name part)."""
    name, found, sow_key = key.partition(SEPARATOR)
    return (name, sow_key) if found else ("", key)


def name_regex(name: str) -> str:
    """The regular expression that matches exactly the topic name ``name``."""
    return re.escape(name)


def literal_name(regex: str) -> str | None:
    """The one name ``regex`` matches when it is a plain (possibly escaped) name, else None.

    ``orders\\.us`` (what :func:`name_regex` writes) gives ``orders.us``; ``orders\\..*`` and
    ``\\d+`` give None.
    """
    out: list[str] = []
    chars = iter(regex)
    for char in chars:
        if char == "\\":
            escaped = next(chars, None)
            if escaped is None or escaped.isalnum() or escaped == "_":
                return None  # a trailing backslash, or a class such as \d or \w
            out.append(escaped)
        elif char in _SPECIAL:
            return None
        else:
            out.append(char)
    return "".join(out)


def compile_pattern(regex: str) -> re.Pattern[str]:
    """``regex`` compiled; ``re.error`` (with its position) when it is not valid."""
    return re.compile(regex)


@dataclass(frozen=True)
class NameScope:
    """Which records of a Pattern topic a command or subscription reads.

    ``regex`` is what the names must match whole (None: every name); ``sow_keys`` limits them to
    those SowKeys (None: every record). A regex that is one literal name makes ``prefix`` the
    range of that name's records in the store.
    """

    regex: str | None = None
    sow_keys: frozenset[str] | None = None
    literal: str | None = field(init=False, default=None)
    _compiled: re.Pattern[str] | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        if self.regex is None:
            return
        literal = literal_name(self.regex)
        object.__setattr__(self, "literal", literal)
        if literal is None:
            object.__setattr__(self, "_compiled", compile_pattern(self.regex))

    def admits_name(self, name: str) -> bool:
        """Whether records of topic ``name`` are in scope."""
        if self.literal is not None:
            return name == self.literal
        return self._compiled is None or self._compiled.fullmatch(name) is not None

    def admits(self, key: str) -> bool:
        """Whether the record stored under record key ``key`` is in scope."""
        name, sow_key = split_key(key)
        if self.sow_keys is not None and sow_key not in self.sow_keys:
            return False
        return self.admits_name(name)

    def admits_stored(self, key: bytes) -> bool:
        """:meth:`admits` for a store key (bytes)."""
        if self.literal is not None and self.sow_keys is None:
            return key.startswith(self.prefix)
        return self.admits(key.decode("utf-8", "replace"))

    @property
    def prefix(self) -> bytes:
        """The store-key prefix of every record in scope (empty unless one name is read)."""
        if self.literal is None:
            return b""
        return self.literal.encode() + _SEPARATOR_BYTES
