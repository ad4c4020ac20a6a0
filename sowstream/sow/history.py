"""Historical versions of SOW records (AMPS ``History``): what to keep and how to read it back.

A topic with History keeps, next to each record's current state, dated copies of its past
states in the same partition store: key ``HISTORY_PREFIX + SowKey + 0x00 + time + offset``
(big-endian, so one record's versions sort by time), value the record as stored, or ``DELETED``
where the record stopped existing. With a Granularity G > 0 at most one version per record
and per interval ``[kG, (k+1)G)`` survives, the last one, which is exactly the record's state
at the interval's end; so a query at time T is answered as of ``T`` rounded down to G (AMPS's
"next oldest granularity"), and exactly as of T when G is 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import groupby

from sowstream.errors import InvalidCommandError
from sowstream.sow.ports import HistoryWindow
from sowstream.sow.record import SowRecord

HISTORY_PREFIX = b"\x00h/"  # under the reserved prefix: never a record or index key
DELETED = b""  # a version where the record did not exist (a SowRecord is never empty)
_SUFFIX = 17  # 0x00 + 8-byte time + 8-byte offset


@dataclass(frozen=True, slots=True)
class Version:
    """One change to a record, as the engine applied it (``after`` None: deleted)."""

    sow_key: str
    before: SowRecord | None
    after: SowRecord | None
    offset: int
    at_ms: int


def version_key(sow_key: str, at_ms: int, offset: int) -> bytes:
    """The store key of a record's version at ``at_ms`` written by log ``offset``."""
    return (
        HISTORY_PREFIX
        + sow_key.encode()
        + b"\x00"
        + max(at_ms, 0).to_bytes(8, "big")
        + max(offset, 0).to_bytes(8, "big")
    )


def parse_version_key(key: bytes) -> tuple[str, int, int]:
    """(SowKey, time in ms, log offset) of a version key."""
    body = key[len(HISTORY_PREFIX) :]
    return (
        body[:-_SUFFIX].decode(),
        int.from_bytes(body[-16:-8], "big"),
        int.from_bytes(body[-8:], "big"),
    )


def version_changes(
    history: HistoryWindow, versions: Iterable[Version]
) -> dict[bytes, bytes | None]:
    """Store changes that record ``versions`` (in log order), at the topic's Granularity.

    A version in the same interval as the record's previous one replaces it. The previous one
    is found without reading the store: it was written when the record took its ``before``
    state, at that state's log time and offset.
    """
    grain = history.granularity_ms
    changes: dict[bytes, bytes | None] = {}
    latest: dict[str, tuple[int, int]] = {}
    for v in versions:
        prev = latest.get(v.sow_key)
        if prev is None and v.before is not None:
            prev = (v.before.log_timestamp, v.before.log_offset)
        if grain > 0 and prev is not None and prev[0] // grain == v.at_ms // grain:
            changes[version_key(v.sow_key, *prev)] = None
        changes[version_key(v.sow_key, v.at_ms, v.offset)] = (
            v.after.to_bytes() if v.after is not None else DELETED
        )
        latest[v.sow_key] = (v.at_ms, v.offset)
    return changes


def as_of_bound(history: HistoryWindow, at_ms: int) -> int:
    """The latest version time a query at ``at_ms`` may use (see the module docstring)."""
    grain = history.granularity_ms
    if grain <= 0:
        return at_ms
    return (at_ms // grain) * grain - 1


def covers(history: HistoryWindow, at_ms: int, now_ms: int) -> bool:
    """Whether ``at_ms`` lies within the History Window that ends at ``now_ms``."""
    return history.window_ms is None or at_ms >= now_ms - history.window_ms


def check_window(topic: str, history: HistoryWindow | None, at_ms: int, now_ms: int) -> None:
    """Refuse a point in time the topic's History cannot answer."""
    if history is None:
        raise InvalidCommandError(
            f"topic {topic!r} keeps no History: a query at a point in time needs "
            "History (Window, Granularity) in its configuration, or 'sowstream pipeline asof'"
        )
    if not covers(history, at_ms, now_ms):
        raise InvalidCommandError(
            f"topic {topic!r}: that point in time is older than the History Window "
            f"({history.window_ms} ms); 'sowstream pipeline asof' answers from the log instead"
        )


def _by_record(
    entries: Iterable[tuple[bytes, bytes]],
) -> Iterator[list[tuple[int, int, bytes, bytes]]]:
    rows = ((*parse_version_key(k), k, v) for k, v in entries)
    for _, group in groupby(rows, key=lambda r: r[0]):
        yield [(at, off, key, value) for _, at, off, key, value in group]


def states_as_of(entries: Iterable[tuple[bytes, bytes]], bound_ms: int) -> Iterator[SowRecord]:
    """Each record's state at ``bound_ms`` from version entries in store order."""
    for versions in _by_record(entries):
        chosen: bytes | None = None
        for at, _, _, value in versions:
            if at > bound_ms:
                break
            chosen = value
        if chosen:  # None: not yet created; DELETED: gone by then
            yield SowRecord.from_bytes(chosen)


def expired_versions(entries: Iterable[tuple[bytes, bytes]], cutoff_ms: int) -> list[bytes]:
    """Version keys outside the Window ending at ``cutoff_ms``.

    A record's last version before the cutoff is kept (it is the record's state at every moment
    from the cutoff up to its next version) unless it marks a deletion.
    """
    drop: list[bytes] = []
    for versions in _by_record(entries):
        old = [(key, value) for at, _, key, value in versions if at < cutoff_ms]
        if not old:
            continue
        drop.extend(key for key, _ in old[:-1])
        last_key, last_value = old[-1]
        if last_value == DELETED:
            drop.append(last_key)
    return drop
