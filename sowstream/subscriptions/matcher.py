"""Turns SOW changes into subscriber messages: full, delta, out-of-focus, conflated.

One :class:`TopicSubscriptions` per SOW topic and worker holds every subscription on that topic.
For each change it finds candidate subscriptions through a filter index, decides for each whether
the record was and is *in focus* (entitled and matching), and renders what the subscriber gets.
It is pure: no Kafka, no clock of its own, so the rules can be tested exhaustively.

Focus is decided from the record's previous and new state, so the engine keeps no per-subscriber
copy of what was sent: a record is "previously received" when its previous state was in focus.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from sowstream.errors import InvalidCommandError
from sowstream.filters import Filter, compile_filter
from sowstream.filters.values import canonical_text, get_path
from sowstream.messagetypes.changes import merge_deltas
from sowstream.sow.aggregate import Aggregation, StateError, parse_aggregation
from sowstream.sow.aggregate.live import LiveGroups
from sowstream.sow.compiled import CompiledTopic
from sowstream.sow.patterns import NameScope, split_key
from sowstream.sow.ports import TopicDefinition
from sowstream.sow.record import SowRecord
from sowstream.subscriptions.delta import (
    has_changes,
    project,
    project_delta,
    with_fields,
)
from sowstream.subscriptions.index import FilterIndex
from sowstream.subscriptions.journal import JournalEntry
from sowstream.subscriptions.model import (
    OOF,
    OOF_DELETED,
    OOF_ENTITLEMENT,
    OOF_MATCH,
    PUBLISH,
    Change,
    Delivery,
    SubscriptionSpec,
)

log = logging.getLogger("sowstream.subscriptions")

# Resolves an identity to its row-level entitlement filter on this topic (None: sees everything).
EntitlementLookup = Callable[[str], Filter | None]
# The record a partition holds now under a SowKey (None when there is none).
CurrentRecord = Callable[[int, str], SowRecord | None]


@dataclass(slots=True)
class _Pending:
    """A conflation interval's net effect on one conflation key."""

    sow_key: str
    partition: int
    offset: int
    timestamp: int
    seq: int
    base: SowRecord | None  # what the subscriber holds: in-focus state at the interval's start
    latest: SowRecord | None  # in-focus state now, None when out of focus
    reason: str = ""
    went_out: bool = False
    delta: dict[str, Any] = field(default_factory=dict)
    conflation_key: str = ""
    journal: bytes | None = None  # its conflation journal entry's store key
    restored: bool = False  # read back from the journal: ``latest`` is looked up when it settles
    # Read back from the journal: the subscriber holds ``base``, or the flush that was on its way
    # at the crash (positioned at ``offset``, so a repeat of it is dropped by the client). Its
    # message is therefore positioned at ``offset`` too and built against ``base``, whole.
    uncertain: bool = False


@dataclass(slots=True)
class _View:
    """A subscription as seen on one partition: its spec and compiled filters."""

    spec: SubscriptionSpec
    filter: Filter | None
    entitled: Filter | None
    scope: NameScope | None = None  # on a Pattern topic: the names and SowKeys it takes

    def covers(self, sow_key: str) -> bool:
        """Whether the record under ``sow_key`` (a record key on a Pattern topic) is its."""
        if self.scope is not None:
            return self.scope.admits(sow_key)
        return self.spec.covers(sow_key)

    def in_focus(self, body: dict[str, Any] | None) -> bool:
        if body is None:
            return False
        if self.entitled is not None and not self.entitled.matches(body):
            return False
        return self.filter is None or self.filter.matches(body)


@dataclass(slots=True)
class _Active:
    view: _View
    pinned: dict[int, _View] = field(default_factory=dict)
    pending: dict[str, _Pending] = field(default_factory=dict)  # by SowKey
    owners: dict[str, str] = field(default_factory=dict)  # conflation key -> SowKey pending
    due_at: int | None = None
    # An aggregated subscription: its aggregation and, per partition it runs on here, the
    # groups of the partition's matching records (made by its placement or a partition load).
    aggregation: Aggregation | None = None
    live: dict[int, LiveGroups] = field(default_factory=dict)

    def take(self, partition: int) -> list[_Pending]:
        """Remove and return the buffered changes of ``partition``."""
        items = [p for p in self.pending.values() if p.partition == partition]
        for item in items:
            del self.pending[item.sow_key]
            if self.owners.get(item.conflation_key) == item.sow_key:
                del self.owners[item.conflation_key]
        return items

    def on(self, partition: int) -> _View:
        return self.pinned.get(partition, self.view)


class TopicSubscriptions:
    """Every subscription on one SOW topic, and the rules that decide what each receives."""

    def __init__(
        self,
        topic: CompiledTopic[TopicDefinition],
        entitlement: EntitlementLookup | None = None,
        *,
        current: CurrentRecord | None = None,
    ) -> None:
        """``topic``: compiled, as its bodies are parsed and written by its message type;
        ``current`` reads the partition's state; given it, conflation intervals are journaled
        (see :mod:`sowstream.subscriptions.journal`) so a takeover can finish them."""
        self.topic = topic.definition
        self._codec = topic.codec
        self._entitlement = entitlement or (lambda identity: None)
        self._current = current
        # Journal changes per partition: entries of intervals' first changes, stored with the batch
        # that made them; and removals of entries whose records a flush has sent, stored once
        # Kafka has the flush's messages.
        self._journal: dict[int, dict[bytes, bytes | None]] = {}
        self._cleared: dict[int, dict[bytes, bytes | None]] = {}
        self._orphans: dict[str, list[tuple[int, JournalEntry]]] = {}
        self._subs: dict[str, _Active] = {}
        self._index = FilterIndex()
        self._always: set[str] = set()  # subscriptions with pinned views: not in the index
        self._forced: dict[str, int] = {}  # reply topic -> conflation imposed on a slow client
        self._waiting: set[str] = set()  # subscriptions with a conflation interval running
        self._restored: set[int] = set()  # partitions with intervals read back from the journal
        self._aggregated: set[str] = set()  # aggregated subscriptions

    def __len__(self) -> int:
        return len(self._subs)

    def __bool__(self) -> bool:
        return bool(self._subs)

    def __contains__(self, key: str) -> bool:
        return key in self._subs

    def specs(self) -> list[SubscriptionSpec]:
        """The registered subscriptions."""
        return [a.view.spec for a in self._subs.values()]

    def get(self, key: str) -> SubscriptionSpec | None:
        """The registered spec under ``key``."""
        active = self._subs.get(key)
        return active.view.spec if active is not None else None

    def view(self, spec: SubscriptionSpec) -> _View:
        """Compile ``spec`` (FilterError on a bad filter; InvalidCommandError for a filter or
        select list on a topic whose messages have no fields)."""
        has_filter = bool(spec.filter and spec.filter.strip())
        if not self._codec.has_fields and (has_filter or spec.options.select is not None):
            raise InvalidCommandError(
                f"{self.topic.message_type} topic {self.topic.name!r}: its messages are not "
                "parsed, so a subscription takes no content filter or select list"
            )
        flt = compile_filter(spec.filter) if spec.filter and has_filter else None
        scope = None
        if self.topic.pattern is not None:
            try:
                scope = spec.scope()
            except re.error as exc:
                raise InvalidCommandError(
                    f"topic pattern {spec.topic_regex!r} is not a valid regular expression: {exc}"
                ) from None
        return _View(spec, flt, self._entitlement(spec.identity), scope)

    def visible(self, identity: str) -> Filter | None:
        """The entitlement filter queries by ``identity`` must apply (None: no restriction)."""
        return self._entitlement(identity)

    def upsert(self, spec: SubscriptionSpec, *, held: Iterable[int] = ()) -> None:
        """Register or update a subscription.

        An update (a replace) must not change what a partition sends until that partition has
        run the replace under its lock, so partitions in ``held`` keep the old view pinned.
        """
        view = self.view(spec)
        current = self._subs.get(spec.key)
        if current is None:
            active = self._subs[spec.key] = _Active(view, aggregation=_aggregation(spec))
            if active.aggregation is not None:
                self._aggregated.add(spec.key)
            for partition, entry in self._orphans.pop(spec.key, []):
                self._adopt(active, partition, entry, 0)  # flushed at the next tick
        else:
            if current.view.spec == spec:
                return
            for p in held:
                current.pinned.setdefault(p, current.view)
            old = current.view.spec.options
            if (old.grouping, old.projection, current.view.spec.filter) != (
                spec.options.grouping,
                spec.options.projection,
                spec.filter,
            ):
                current.aggregation, current.live = _aggregation(spec), {}
                if current.aggregation is not None:
                    self._aggregated.add(spec.key)
                else:
                    self._aggregated.discard(spec.key)
            current.view = view
            self._reindex(spec.key, current)
            return
        self._index.add(spec.key, view.filter.ast if view.filter is not None else None)

    def pin(self, spec: SubscriptionSpec, partition: int) -> None:
        """Make ``partition`` use ``spec`` from now on (the partition just ran a replace)."""
        current = self._subs.get(spec.key)
        if current is None or current.view.spec != spec:
            self.upsert(spec)
            current = self._subs[spec.key]
        current.pinned.pop(partition, None)
        self._reindex(spec.key, current)

    def _reindex(self, key: str, active: _Active) -> None:
        self._index.add(key, active.view.filter.ast if active.view.filter is not None else None)
        if active.pinned:
            self._always.add(key)
        else:
            self._always.discard(key)

    def watched_paths(self) -> tuple[str, ...]:
        """The paths subscriptions are indexed by: what the compiled fold reads of each change
        for ``dispatch`` (the tuple is replaced whenever they change)."""
        return self._index.paths

    def passes_by(
        self, partition: int, at: tuple[str, ...], states: Sequence[tuple[Any, ...] | None]
    ) -> bool:
        """True when no subscription can take a change to ``partition`` whose record states
        (those that exist) read ``states`` at ``at``: its event need not be built at all.
        False when unsure (a state not read, paths the index no longer has)."""
        if self._always or partition in self._restored:
            return False
        index = self._index
        for values in states:
            if values is None:
                return False
            found = index.candidates_at(at, values)
            if found is None or found:
                return False
        return True

    def may_take(self, change: Change) -> bool:
        """Whether any subscription may take ``change`` (:meth:`passes_by` from its bodies)."""
        return bool(self._always or change.partition in self._restored or self._candidates(change))

    def remove(self, key: str) -> SubscriptionSpec | None:
        """Unregister; returns the removed spec."""
        active = self._subs.pop(key, None)
        self._aggregated.discard(key)
        self._index.remove(key)
        self._always.discard(key)
        self._forget_orphans(key)
        if active is None:
            return None
        for item in active.pending.values():
            self._unjournal(item, self._journal)
        return active.view.spec

    def remove_client(self, reply_to: str) -> list[SubscriptionSpec]:
        """Unregister every subscription of the client behind ``reply_to``."""
        gone = [a.view.spec for a in self._subs.values() if a.view.spec.reply_to == reply_to]
        for spec in gone:
            self.remove(spec.key)
        return gone

    # -- matching ---------------------------------------------------------------------------------

    def dispatch(self, changes: Sequence[Change], now_ms: int) -> list[Delivery]:
        """Messages for ``changes`` (in log order); conflated subscriptions buffer theirs."""
        if not self._subs:
            return []
        out: list[Delivery] = []
        for partition in self._restored & {change.partition for change in changes}:
            out.extend(self._settle_restored(partition, changes))
        codec = self._codec
        for change in changes:
            keys = self._always | self._candidates(change)
            if not keys:
                continue
            before = change.before_body(codec)
            after = change.after_body(codec)
            for key in keys:
                active = self._subs.get(key)
                if active is not None:
                    self._match(active, change, before, after, now_ms, out)
        return out

    def _candidates(self, change: Change) -> set[str]:
        """The indexed subscriptions that may take ``change``: from the values the compiled
        fold read at the indexed paths where it did, else from the parsed bodies."""
        index = self._index
        watched, at = change.watched, change.watched_at
        out: set[str] = set()
        for i, state in enumerate((change.before, change.after)):
            if state is None:
                continue
            values = watched[i] if watched is not None else None
            # None: not read, or read at paths the index no longer has.
            found = index.candidates_at(at, values) if values is not None and at else None
            if found is None:
                body = change.before_body(self._codec) if i == 0 else change.after_body(self._codec)
                found = index.candidates(body) if body is not None else set()
            out |= found
        return out

    def _match(
        self,
        active: _Active,
        change: Change,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        now_ms: int,
        out: list[Delivery],
    ) -> None:
        view = active.on(change.partition)
        if not view.covers(change.sow_key):
            return
        was = view.in_focus(before)
        now = view.in_focus(after)
        if not was and not now:
            return
        if active.aggregation is not None:
            self._aggregate(
                active, view, change, before if was else None, after if now else None, out
            )
            return
        reason = ""
        if was and not now:
            reason = self._oof_reason(view, change, after)
        interval = view.spec.options.conflation_ms or self._forced.get(view.spec.reply_to)
        # Pending messages go first, or a newer immediate one would overtake them.
        if interval is not None or active.pending:
            self._offer(active, view, change, was, now, reason, now_ms, interval or 0)
            return
        self._immediate(view, change, before if was else None, now, reason, out)

    def _immediate(
        self,
        view: _View,
        change: Change,
        held: dict[str, Any] | None,
        now: bool,
        reason: str,
        out: list[Delivery],
    ) -> None:
        """The message for a change to a record the subscriber holds as ``held`` (or not)."""
        if now:
            delivery = self._publish(view.spec, change, held, change.after)
            if delivery is not None:
                out.append(delivery)
        elif view.spec.options.oof:
            # Reached by a conflated subscription only in a replay, which sends every change:
            # what it last received is then the change's previous state (chapter 04).
            conflated = self._conflated(view.spec)
            out.append(self._oof(view.spec, change, reason, last_received=conflated))

    def _conflated(self, spec: SubscriptionSpec) -> bool:
        """Whether ``spec`` is conflated: by its options, or as a slow client's."""
        return spec.options.conflation_ms is not None or spec.reply_to in self._forced

    def replay(self, key: str, changes: Sequence[Change]) -> list[Delivery]:
        """What one subscription receives for past ``changes`` (a bookmark replay).

        The same focus and out-of-focus rules as live traffic, so a replay shows what a
        subscriber placed at that moment saw; never conflated (it is history, sent at once).
        """
        active = self._subs.get(key)
        if active is None:
            return []
        out: list[Delivery] = []
        for change in changes:
            view = active.on(change.partition)
            if not view.covers(change.sow_key):
                continue
            before = change.before_body(self._codec)
            after = change.after_body(self._codec)
            was = view.in_focus(before)
            now = view.in_focus(after)
            if was or now:
                reason = self._oof_reason(view, change, after) if was and not now else ""
                self._immediate(view, change, before if was else None, now, reason, out)
        return out

    # -- aggregated subscriptions ------------------------------------------------------------------

    def aggregated(self) -> list[tuple[str, _View, Aggregation]]:
        """The aggregated subscriptions: (key, view, aggregation)."""
        return [
            (key, a.view, a.aggregation)
            for key, a in self._subs.items()
            if a.aggregation is not None
        ]

    def missing_groups(self, partition: int) -> list[str]:
        """Aggregated subscriptions with no groups on ``partition`` (registered since it was
        loaded): their groups must be read before the partition's next changes."""
        if not self._aggregated:
            return []
        return [
            key
            for key in self._aggregated
            if (a := self._subs.get(key)) is not None and partition not in a.live
        ]

    def aggregation_of(self, key: str) -> Aggregation | None:
        """The aggregation of subscription ``key`` (None: not aggregated, or unknown)."""
        active = self._subs.get(key)
        return active.aggregation if active is not None else None

    def set_live(self, key: str, partition: int, groups: LiveGroups) -> None:
        """Subscription ``key``'s groups on ``partition`` (read under the partition lock: every
        later change of the partition is applied to them)."""
        active = self._subs.get(key)
        if active is not None and active.aggregation is groups.aggregation:
            active.live[partition] = groups

    def _aggregate(
        self,
        active: _Active,
        view: _View,
        change: Change,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        out: list[Delivery],
    ) -> None:
        """One message per change: the new partial entry (null: emptied) of each group the
        change touched on its partition. The engine reads a partition's groups before its
        changes are dispatched (``engine.aggregates``); without them nothing is sent."""
        groups = active.live.get(change.partition)
        if groups is None:
            return
        try:
            touched = groups.change(before, after)
        except StateError:
            # The groups lost track of the partition's records: stop rather than send wrong
            # aggregates (the partition's next load rebuilds them).
            del active.live[change.partition]
            log.exception(
                "aggregated subscription %s: groups of partition %d dropped",
                view.spec.key,
                change.partition,
            )
            return
        data = orjson.dumps({key: groups.entry(key) for key in touched})
        record = change.after or change.before
        assert record is not None
        out.append(self._delivery(view.spec, PUBLISH, record, change, data=data))

    def _oof_reason(self, view: _View, change: Change, after: dict[str, Any] | None) -> str:
        if after is None:
            return change.reason
        if view.entitled is not None and not view.entitled.matches(after):
            return OOF_ENTITLEMENT
        return OOF_MATCH

    def _oof(
        self, spec: SubscriptionSpec, change: Change, reason: str, *, last_received: bool = False
    ) -> Delivery:
        # "match" shows the new state; the others, and any oof of a conflated subscription
        # (``last_received``), the last state the subscriber may see.
        record = change.after if reason == OOF_MATCH and not last_received else change.before
        assert record is not None
        return self._delivery(spec, OOF, record, change, reason=reason)

    def _delivery(
        self,
        spec: SubscriptionSpec,
        command: str,
        record: SowRecord,
        change: Change | _Pending,
        *,
        reason: str = "",
        data: bytes | None = None,
        is_delta: bool = False,
    ) -> Delivery:
        if data is None:
            select = spec.options.select
            if select is not None:
                data = self._codec.serialise(project(record.parsed(self._codec), select))
            else:
                data = record.data
        name, sow_key = "", change.sow_key
        if self.topic.pattern is not None:
            name, sow_key = split_key(sow_key)
        return Delivery(
            spec,
            command,
            sow_key,
            data,
            change.partition,
            change.offset,
            change.timestamp,
            reason=reason,
            is_delta=is_delta,
            seq=change.seq,
            topic=name,
        )

    def _publish(
        self,
        spec: SubscriptionSpec,
        change: Change | _Pending,
        before: dict[str, Any] | None,
        after: SowRecord | None,
        delta: dict[str, Any] | None = None,
    ) -> Delivery | None:
        """A publish of ``after``: whole, or only what changed since ``before`` for deltas."""
        assert after is not None
        codec = self._codec
        if not spec.delta or before is None or spec.paginated or not codec.supports_delta:
            return self._delivery(spec, PUBLISH, after, change)
        body = after.parsed(codec)
        if delta is None:
            delta = codec.changed(before, body)
        options = spec.options
        if options.select is not None:
            delta = project_delta(delta, options.select)
        if options.no_empties and not has_changes(delta, self.topic.delta_keys):
            return None
        if options.send_keys:
            delta = with_fields(delta, body, self.topic.delta_keys)
        data = codec.serialise_delta(delta)
        return self._delivery(spec, PUBLISH, after, change, data=data, is_delta=True)

    # -- conflation -------------------------------------------------------------------------------

    def _conflation_key(self, spec: SubscriptionSpec, change: Change) -> str:
        path = spec.options.conflation_key
        if path is None:
            return change.sow_key
        body = change.after_body(self._codec) or change.before_body(self._codec) or {}
        values = get_path(body, path)
        return canonical_text(values[0]) if values else change.sow_key

    def _offer(
        self,
        active: _Active,
        view: _View,
        change: Change,
        was: bool,
        now: bool,
        reason: str,
        now_ms: int,
        interval: int,
    ) -> None:
        # One buffer per record; a conflation key shared by several records keeps the latest
        # record's change only (AMPS: one message per conflation key value and interval).
        ckey = self._conflation_key(view.spec, change)
        owner = active.owners.get(ckey)
        if owner is not None and owner != change.sow_key and owner in active.pending:
            self._unjournal(active.pending.pop(owner), self._journal)
        pending = active.pending.get(change.sow_key)
        if pending is None:
            pending = _Pending(
                change.sow_key,
                change.partition,
                change.offset,
                change.timestamp,
                change.seq,
                base=change.before if was else None,
                latest=None,
            )
            active.pending[change.sow_key] = pending
        if pending.conflation_key != ckey:
            if active.owners.get(pending.conflation_key) == change.sow_key:
                del active.owners[pending.conflation_key]
            pending.conflation_key = ckey
        active.owners[ckey] = change.sow_key
        pending.restored = False
        pending.partition, pending.offset = change.partition, change.offset
        pending.timestamp, pending.seq = change.timestamp, change.seq
        if now:
            if not was and pending.base is not None:
                pending.went_out = True  # out and back in within the interval
            if was and not pending.went_out and view.spec.delta:
                before, after = change.before_body(self._codec), change.after_body(self._codec)
                assert before is not None and after is not None
                pending.delta = merge_deltas(pending.delta, self._codec.changed(before, after))
            pending.latest = change.after
        else:
            pending.latest = None
            pending.reason = reason
            if pending.base is not None:
                pending.went_out = True
        if self._current is not None:
            self._journal_entry(view.spec.key, pending)
        if active.due_at is None:
            active.due_at = now_ms + interval
            self._waiting.add(active.view.spec.key)

    def force_conflation(self, reply_to: str, interval_ms: int | None) -> None:
        """Conflate every subscription of one client (a slow consumer), or stop doing so."""
        if interval_ms is None:
            self._forced.pop(reply_to, None)
        else:
            self._forced[reply_to] = interval_ms

    def clients(self) -> set[str]:
        """Reply topics of the subscribed clients."""
        return {a.view.spec.reply_to for a in self._subs.values()}

    def flush(self, now_ms: int) -> list[Delivery]:
        """Messages of every conflation interval that has ended by ``now_ms``."""
        keys = self.due(now_ms)
        return [d for p in self.partitions_of(keys) for d in self.flush_due(keys, p)]

    def due(self, now_ms: int) -> list[str]:
        """Subscriptions whose conflation interval has ended by ``now_ms`` (a new one starts
        with their next change); :meth:`flush_due` then sends them partition by partition."""
        keys: list[str] = []
        for key in list(self._waiting):
            active = self._subs.get(key)
            if active is None or active.due_at is None:
                self._waiting.discard(key)
            elif active.due_at <= now_ms:
                self._waiting.discard(key)
                active.due_at = None
                keys.append(key)
        return keys

    def partitions_of(self, keys: Iterable[str]) -> set[int]:
        """Partitions with buffered changes for the subscriptions ``keys``."""
        return {
            item.partition
            for key in keys
            if (active := self._subs.get(key)) is not None
            for item in active.pending.values()
        }

    def flush_due(self, keys: Iterable[str], partition: int) -> list[Delivery]:
        """Messages of subscriptions ``keys`` for their records of ``partition``."""
        out: list[Delivery] = []
        for key in keys:
            out.extend(self.flush_partition(key, partition))
        return out

    def flush_partition(self, key: str, partition: int) -> list[Delivery]:
        """Send subscription ``key``'s buffered changes of ``partition`` now.

        At the end of an interval, and early at a placement or replace: a placement's watermark
        covers every change buffered so far on the partition, so they go out before the
        placement's answer (the client drops what its snapshot has, and a client that kept an
        earlier placement's answer after a failover still gets them); changes after it then start
        from what the subscriber holds.
        """
        active = self._subs.get(key)
        if active is None or not active.pending:
            return []
        return self._settle_all(active, active.take(partition))

    def discard_partition(self, key: str, partition: int) -> None:
        """Drop subscription ``key``'s buffered changes of ``partition`` unsent: a placement
        from a bookmark replays every one of them, whole or as the oof the subscriber needs,
        and their bases may be ahead of what the subscriber holds (it was away)."""
        active = self._subs.get(key)
        if active is None:
            return
        for item in active.take(partition):
            self._unjournal(item, self._cleared)

    def _settle_all(self, active: _Active, pending: Iterable[_Pending]) -> list[Delivery]:
        items = list(pending)
        for item in items:
            self._unjournal(item, self._cleared)
            if item.restored:
                current = self._current(item.partition, item.sow_key) if self._current else None
                self._resolve(active.on(item.partition), item, current)
        # Log order per partition: the client drops a message that is not newer than the last one
        # it delivered from that partition (its failover de-duplication).
        ordered = sorted(items, key=lambda p: (p.partition, p.offset, p.seq))
        settled = (self._settle(active.on(item.partition).spec, item) for item in ordered)
        return [d for d in settled if d is not None]

    # -- the conflation journal -------------------------------------------------------------------

    def _journal_entry(self, sub_key: str, item: _Pending) -> None:
        entry = JournalEntry(
            sub_key,
            item.sow_key,
            item.conflation_key,
            item.offset,
            item.seq,
            item.timestamp,
            item.base,
        )
        item.journal = entry.key
        self._journal.setdefault(item.partition, {})[entry.key] = entry.to_bytes()

    def _unjournal(self, item: _Pending, into: dict[int, dict[bytes, bytes | None]]) -> None:
        if item.journal is not None:
            into.setdefault(item.partition, {})[item.journal] = None
            item.journal = None

    def take_journal(self, partition: int) -> dict[bytes, bytes | None]:
        """Journal entries written or dropped by the changes dispatched since the last call: to
        be stored with the batch of those changes."""
        return self._journal.pop(partition, {})

    def take_cleared(self, partition: int) -> dict[bytes, bytes | None]:
        """Journal entries of ``partition``'s records that flushes sent since the last call: to
        be removed once Kafka has acknowledged those messages."""
        return self._cleared.pop(partition, {})

    def restore(self, partition: int, entries: Iterable[tuple[bytes, bytes]], now_ms: int) -> None:
        """Take over ``partition``'s unfinished conflation intervals from its stored journal.

        Each record is sent at its subscription's next flush, as it is by then; entries of
        subscriptions that no longer exist are dropped (with the next batch).
        """
        for key, value in entries:
            entry = JournalEntry.from_store(key, value)
            active = self._subs.get(entry.sub_key)
            if active is None:
                # The registry may not be read yet: kept until the subscription shows up, or
                # until sweep_orphans says it never will.
                self._orphans.setdefault(entry.sub_key, []).append((partition, entry))
            else:
                self._adopt(active, partition, entry, now_ms)

    def _adopt(self, active: _Active, partition: int, entry: JournalEntry, now_ms: int) -> None:
        active.pending[entry.sow_key] = _Pending(
            entry.sow_key,
            partition,
            entry.offset,
            entry.timestamp,
            entry.seq,
            base=entry.base,
            latest=None,
            conflation_key=entry.conflation_key,
            journal=entry.key,
            restored=True,
            uncertain=True,
        )
        active.owners[entry.conflation_key] = entry.sow_key
        self._restored.add(partition)
        spec = active.view.spec
        interval = spec.options.conflation_ms or self._forced.get(spec.reply_to) or 0
        if active.due_at is None:
            active.due_at = now_ms + interval
            self._waiting.add(spec.key)

    def sweep_orphans(self) -> None:
        """The registry is read: journal entries of subscriptions it does not hold are dropped."""
        for key in list(self._orphans):
            self._forget_orphans(key)

    def _forget_orphans(self, sub_key: str) -> None:
        for partition, entry in self._orphans.pop(sub_key, []):
            self._journal.setdefault(partition, {})[entry.key] = None

    def _settle_restored(self, partition: int, changes: Sequence[Change]) -> list[Delivery]:
        """Send ``partition``'s intervals read back from the journal, as of before ``changes``.

        Each message stands where the flush lost in the crash stood (the client drops it if that
        flush did arrive), built against what the subscriber held before the interval. Either
        way the subscriber then holds each record as it was before ``changes``, so the intervals
        they start have a certain base.
        """
        self._restored.discard(partition)
        before: dict[str, SowRecord | None] = {}
        for change in changes:
            if change.partition == partition:
                before.setdefault(change.sow_key, change.before)
        out: list[Delivery] = []
        for active in self._subs.values():
            items = [
                item
                for item in active.pending.values()
                if item.partition == partition and item.restored
            ]
            for item in items:
                del active.pending[item.sow_key]
                if active.owners.get(item.conflation_key) == item.sow_key:
                    del active.owners[item.conflation_key]
                self._unjournal(item, self._journal)  # stored with these changes' batch
                if item.sow_key in before:
                    state = before[item.sow_key]
                elif self._current is not None:
                    state = self._current(partition, item.sow_key)
                else:
                    state = None
                self._resolve(active.on(partition), item, state)
            for item in sorted(items, key=lambda p: (p.offset, p.seq)):
                delivery = self._settle(active.on(partition).spec, item)
                if delivery is not None:
                    out.append(delivery)
        return out

    def _resolve(self, view: _View, item: _Pending, record: SowRecord | None) -> None:
        """A restored record's state ``record``: what its message sends (or why it left focus)."""
        body = record.parsed(self._codec) if record is not None else None
        if view.in_focus(body):
            item.latest = record
            if record is not None and record.log_offset > item.offset:
                # Changed since without a journal entry: impossible while in focus, but a newer
                # state is newer wherever it came from.
                item.offset, item.timestamp, item.seq = record.log_offset, record.log_timestamp, 0
        else:
            item.latest = None
            if body is None:
                item.reason = OOF_DELETED
            elif view.entitled is not None and not view.entitled.matches(body):
                item.reason = OOF_ENTITLEMENT
            else:
                item.reason = OOF_MATCH
        item.restored = False

    def drop_partition(self, partition: int) -> None:
        """Forget a partition taken away by a rebalance: its next owner finishes its intervals
        (and rebuilds the groups of aggregated subscriptions)."""
        for active in self._subs.values():
            active.take(partition)
            active.live.pop(partition, None)
        self._journal.pop(partition, None)
        self._cleared.pop(partition, None)
        self._restored.discard(partition)
        for key, orphans in list(self._orphans.items()):
            self._orphans[key] = [(p, e) for p, e in orphans if p != partition]

    def _settle(self, spec: SubscriptionSpec, item: _Pending) -> Delivery | None:
        if item.latest is None:
            if not spec.options.oof or item.base is None:
                return None  # the subscriber holds nothing of it (or the lost flush's oof)
            # The subscriber never saw the interval's updates: show what it last received.
            return self._delivery(spec, OOF, item.base, item, reason=item.reason)
        if item.base is None or item.went_out or item.uncertain or not spec.delta:
            return self._delivery(spec, PUBLISH, item.latest, item)
        base, latest = item.base.parsed(self._codec), item.latest.parsed(self._codec)
        # The interval's deltas merged; plus the net change, which also catches fields that an
        # intermediate whole-value replacement dropped from a nested object.
        delta = merge_deltas(item.delta, self._codec.changed(base, latest))
        return self._publish(spec, item, base, item.latest, delta=delta)


def _aggregation(spec: SubscriptionSpec) -> Aggregation | None:
    """The aggregation an aggregated subscription asks for (None for any other)."""
    options = spec.options
    if not options.aggregated:
        return None
    return parse_aggregation(options.grouping, options.projection)
