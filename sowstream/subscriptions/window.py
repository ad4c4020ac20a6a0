"""Live pagination windows: what a paginated sow_and_subscribe (top_n, skip_n, OrderBy) shows.

AMPS keeps the whole sorted result set of a paginated subscription and shows each subscriber only
the records at sorted positions ``[skip_n, skip_n + top_n)``; to that subscriber the topic looks
as if it held just those records, so a record pushed out of the page by an insert or a delete is
out of focus. :class:`ResultSet` is the sorted set of one subscription (topic, filter, OrderBy);
:class:`PageWindow` is its subscriber's page of it.

A change is applied to the set (:meth:`ResultSet.apply`) and the window turns the returned
:class:`Change` into its :class:`WindowEvent` list (:meth:`PageWindow.events`).

Sorting uses :func:`sowstream.sow.query.result_order`, the order the engine's ``sow`` query uses,
so a window's initial page and its live updates agree with a plain paginated query: the OrderBy
fields, then the SowKey (the SowKey alone without an OrderBy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sortedcontainers import SortedList

from sowstream.filters.order_by import SortField
from sowstream.sow.query import result_order

__all__ = ["Change", "PageWindow", "ResultSet", "WindowEvent"]

Record = dict[str, Any]
EventKind = Literal["enter", "update", "leave"]


@dataclass(frozen=True, slots=True)
class Change:
    """One record's change to a :class:`ResultSet`, as windows over it need to see it.

    ``old_rank`` is the record's position before the change and ``new_rank`` its position after
    (None when absent then); ``version`` is the result set's version after the change.
    """

    sow_key: str
    before: Record | None
    after: Record | None
    old_rank: int | None
    new_rank: int | None
    version: int


class ResultSet:
    """The sorted, full result set of one (topic, filter, OrderBy) that a window pages.

    Records are kept by reference: callers hand over a fresh dict per change and must not mutate
    it afterwards (windows remember the last record they showed to report what left).
    """

    def __init__(self, order_by: Sequence[SortField]) -> None:
        self.order_by: tuple[SortField, ...] = tuple(order_by)
        self._order = result_order(self.order_by)
        # Each entry is (sort key, sow key); the sort key already ends with the SowKey, so it is
        # unique and the SowKey part only serves to read the key back from a position.
        self._sorted: SortedList = SortedList()
        self._entries: dict[str, tuple[Any, Record]] = {}
        self._version = 0

    @property
    def version(self) -> int:
        """Counts the changes so far; lets a window tell whether it has seen every one."""
        return self._version

    def apply(self, sow_key: str, record: Record | None) -> Change:
        """Insert, replace (``record``) or delete (None) one record; returns what changed."""
        old = self._entries.get(sow_key)
        old_rank: int | None = None
        if old is not None:
            old_rank = int(self._sorted.index((old[0], sow_key)))
            del self._sorted[old_rank]
            del self._entries[sow_key]
        new_rank: int | None = None
        if record is not None:
            key = self._order((sow_key, record))
            new_rank = int(self._sorted.bisect_left((key, sow_key)))
            self._sorted.add((key, sow_key))
            self._entries[sow_key] = (key, record)
        if old is not None or record is not None:
            self._version += 1  # deleting an absent key changes nothing: windows stay in step
        return Change(
            sow_key=sow_key,
            before=old[1] if old is not None else None,
            after=record,
            old_rank=old_rank,
            new_rank=new_rank,
            version=self._version,
        )

    def upsert(self, sow_key: str, record: Record) -> None:
        """Insert or replace a record (no window events: windows catch up on their next look)."""
        self.apply(sow_key, record)

    def remove(self, sow_key: str) -> None:
        """Delete a record if present (no window events, as for :meth:`upsert`)."""
        self.apply(sow_key, None)

    def get(self, sow_key: str) -> Record | None:
        """The current record under ``sow_key``, or None."""
        entry = self._entries.get(sow_key)
        return entry[1] if entry is not None else None

    def rank(self, sow_key: str) -> int | None:
        """The record's 0-based position in sort order, or None when absent; O(log n)."""
        entry = self._entries.get(sow_key)
        if entry is None:
            return None
        return int(self._sorted.index((entry[0], sow_key)))

    def keys_between(self, start: int, stop: int) -> list[str]:
        """The sow keys at positions ``[start, stop)`` in sort order (clipped to the set)."""
        if stop <= start:
            return []
        return [sow_key for _, sow_key in self._sorted.islice(start, stop)]

    def copy(self) -> ResultSet:
        """A new result set with the same order and records (the record objects are shared)."""
        twin = ResultSet(self.order_by)
        for key in self.keys_between(0, len(self)):
            record = self.get(key)
            assert record is not None
            twin.upsert(key, record)
        return twin

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, sow_key: object) -> bool:
        return sow_key in self._entries


@dataclass(frozen=True, slots=True)
class WindowEvent:
    """What a window's subscriber must be told about one record.

    ``enter``: the record is now in the window (deliver it whole); ``update``: a member's record
    changed and it stays; ``leave``: it left the window (out of focus). ``record`` is the current
    record, or for a ``leave`` of a deleted record its last state before the delete.
    """

    kind: EventKind
    sow_key: str
    record: Record


class PageWindow:
    """One subscriber's page ``[skip_n, skip_n + top_n)`` of a shared :class:`ResultSet`.

    Events of one change come in this order: ``enter`` and ``update`` first, in window order,
    then ``leave``, in the order the leavers had in the window. With rows 1, 2, 5, 6 ordered by
    ``/id``, top_n 2 and skip_n 1 the window is [2, 5]; publishing 4 yields
    ``[enter 4, leave 5]``: the subscriber has the new record before it hears what dropped out.
    """

    def __init__(self, results: ResultSet, top_n: int, skip_n: int = 0) -> None:
        if top_n < 0 or skip_n < 0:
            raise ValueError(f"top_n and skip_n must be zero or more, got {top_n} and {skip_n}")
        self.results = results
        self.top_n = top_n
        self.skip_n = skip_n
        self._members: list[str] = []
        # The record each member had when last shown: what a leave reports once it is deleted.
        self._shown: dict[str, Record] = {}
        self._version = -1  # never in step until the first reset or events call
        self.reset()

    @property
    def _stop(self) -> int:
        return self.skip_n + self.top_n

    def members(self) -> list[str]:
        """The sow keys currently in the window, in sort order."""
        return list(self._members)

    def records(self) -> list[tuple[str, Record]]:
        """The members with the records last shown for them, in sort order."""
        return [(key, self._shown[key]) for key in self._members]

    def reset(self) -> None:
        """Adopt the result set's current page silently (after loading the initial SOW part)."""
        self._members = self.results.keys_between(self.skip_n, self._stop)
        self._shown = {key: self._record(key) for key in self._members}
        self._version = self.results.version

    def events(self, change: Change) -> list[WindowEvent]:
        """This window's events for ``change``, just returned by ``results.apply``.

        Call it for every change, in order. A window that missed some (another owner used
        ``upsert``/``remove``, or skipped this window) still ends up right: it compares the page
        it last showed with the current one.
        """
        current = self.results.version
        if change.version == self._version == current:
            return []  # a change that changed nothing (deleting an absent key)
        in_step = change.version == self._version + 1 == current
        if in_step and not self._touches_page(change):
            self._version = change.version
            return []
        return self._diff(change)

    def move_to(self, results: ResultSet) -> list[WindowEvent]:
        """Follow another result set (the subscription's filter was replaced): events for what
        differs on the page. Records present in both sets should be the same objects."""
        self.results = results
        return self._diff(None)

    def sync(self) -> list[WindowEvent]:
        """Events that bring the window up to date with the result set, whatever it missed."""
        return self._diff(None)

    def change(self, sow_key: str, record: Record | None) -> list[WindowEvent]:
        """Apply one change to the result set and return this window's events.

        Shorthand for a window that owns its result set; with shared sets, call
        ``results.apply`` once and :meth:`events` on each window.
        """
        return self.events(self.results.apply(sow_key, record))

    # -- internals ------------------------------------------------------------------------------

    def _touches_page(self, change: Change) -> bool:
        """Whether the page's membership or records can differ after ``change``.

        Only positions below ``stop`` matter. A record moving within the rows before the page
        (or replaced in place there) leaves the number of rows before it unchanged, so the page
        holds the same records.
        """
        stop = self._stop
        if stop == self.skip_n:
            return False  # top_n 0: nothing ever shows
        old, new = change.old_rank, change.new_rank
        if (old is None or old >= stop) and (new is None or new >= stop):
            return False
        before_page = (
            old is not None and new is not None and old < self.skip_n and new < self.skip_n
        )
        return not before_page

    def _record(self, key: str) -> Record:
        record = self.results.get(key)
        assert record is not None, f"window member {key!r} is not in its result set"
        return record

    def _diff(self, change: Change | None) -> list[WindowEvent]:
        members = self.results.keys_between(self.skip_n, self._stop)
        shown = self._shown
        changed = change.sow_key if change is not None and change.after is not None else None
        out: list[WindowEvent] = []
        now: dict[str, Record] = {}
        for key in members:
            record = self._record(key)
            now[key] = record
            if key not in shown:
                out.append(WindowEvent("enter", key, record))
            elif key == changed or record is not shown[key]:
                # Identity, not equality: a republished record is news even if equal, and a
                # member updated while this window was not looking is caught too.
                out.append(WindowEvent("update", key, record))
        for key in self._members:
            if key not in now:
                current_record = self.results.get(key)
                if current_record is None:
                    current_record = self._last_state(key, change)
                out.append(WindowEvent("leave", key, current_record))
        self._members = members
        self._shown = now
        self._version = self.results.version
        return out

    def _last_state(self, key: str, change: Change | None) -> Record:
        if change is not None and change.sow_key == key and change.before is not None:
            return change.before
        return self._shown[key]
