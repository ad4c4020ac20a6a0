"""Bookmarks: where in the transaction log a replay starts, in AMPS's vocabulary.

A bookmark is a point in time (``20261123T080000``, ISO-8601), one of the words ``EPOCH``
(the beginning of the log), ``NOW`` (no replay) and ``MOST_RECENT`` (the client resumes after the
last message it delivered, or from EPOCH), or the opaque bookmark every delivered message carries:
``<log time ms>|<partition>|<offset>``, which resumes right after that message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sowstream.errors import InvalidCommandError
from sowstream.sow.timestamps import parse_timestamp

EPOCH = "EPOCH"
NOW = "NOW"
MOST_RECENT = "MOST_RECENT"
_OPAQUE = re.compile(r"^(\d+)\|(\d+)\|(\d+)$")


@dataclass(frozen=True, slots=True)
class Bookmark:
    """A parsed bookmark: replay log records after ``at_ms`` (None: nothing to replay).

    For a message's own bookmark, ``partition``/``offset`` say where that message was, so its
    partition resumes exactly after it; other partitions resume by time.
    """

    at_ms: int | None
    partition: int | None = None
    offset: int | None = None

    def start_offset(self, partition: int, offset_for_time: int) -> int:
        """The first offset of ``partition`` to replay, given the first offset after the time."""
        if self.partition == partition and self.offset is not None:
            return self.offset + 1
        return offset_for_time


def message_bookmark(timestamp_ms: int, partition: int, offset: int) -> str:
    """The opaque bookmark of the message at ``partition``/``offset``."""
    return f"{timestamp_ms}|{partition}|{offset}"


def parse_bookmark(text: str) -> Bookmark:
    """Read a bookmark as users and messages write it (InvalidCommandError if it is none)."""
    raw = text.strip()
    word = raw.upper()
    if word in (EPOCH, "0"):
        return Bookmark(-1)
    if word == NOW:
        return Bookmark(None)
    if word == MOST_RECENT:
        raise InvalidCommandError(
            "bookmark MOST_RECENT is resolved by the client (it knows what it delivered)"
        )
    match = _OPAQUE.match(raw)
    if match:
        at, partition, offset = (int(g) for g in match.groups())
        # same-millisecond records of other partitions may come after it: replay them too
        return Bookmark(at - 1, partition, offset)
    try:
        return Bookmark(parse_timestamp(raw, "bookmark"))
    except InvalidCommandError:
        raise InvalidCommandError(
            f"bookmark {text!r} is not a timestamp (20261123T080000), EPOCH, NOW, MOST_RECENT "
            "or a message's bookmark (time|partition|offset)"
        ) from None
