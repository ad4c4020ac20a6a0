"""One queue's delivery state on one worker: leases, acknowledgements, expiry, fairness.

The machine is pure bookkeeping. It never reads a clock (every call that depends on time takes
``now_ms``), never talks to Kafka and never blocks; the engine feeds it log records and client
commands and acts on what it returns: :class:`Lease` (send this message to this subscription)
and :class:`Removed` (the message has left the queue; delete it, raise its expiry event).

A worker owns some partitions of the underlying topics; the machine holds the queue messages of
those partitions only. Messages are identified by the position of their publish in the log
(:class:`Bookmark`) and offered in one order across partitions: oldest first by (log time,
topic, partition, offset), or with ``Priority`` highest value first and oldest first among equals.

Delivery (``dispatch``) keeps a cursor per subscription: the position up to which every
available message has already been offered to it. A message that becomes available behind a
cursor (returned, or appended out of order) is remembered as "fresh" for that subscription, so a
dispatch only looks at messages some subscription with room has not seen yet, and stops as soon
as no subscription has room. Filters and entitlements are assumed not to change for a
subscription; a replace starts it from the beginning again.

Replays: per partition, an offset at or below the highest one appended is taken as a replay of
something already seen (kept, acknowledged or filtered out) and ignored. The engine must
therefore append each partition in offset order, and call :meth:`QueueMachine.drop_partition`
before rebuilding a partition from an earlier point.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sortedcontainers import SortedList

from sowstream.filters import Filter, compile_filter, compile_value, parse_filter
from sowstream.filters.values import to_number
from sowstream.queues.barriers import BarrierGate
from sowstream.queues.ports import QueueRules

__all__ = [
    "AckOutcome",
    "AckResult",
    "BacklogShare",
    "Bookmark",
    "CreditView",
    "Lease",
    "QueueAges",
    "QueueMachine",
    "QueueMessage",
    "QueueStats",
    "Removed",
    "message_lifetime",
    "queue_ages",
]

U64_MAX = 2**64 - 1
ACK_ACTIONS = ("", "cancel", "expire")

# Where a message sits in delivery order: (-priority or 1 for none, log time, topic, partition,
# offset). Unique per message, so it doubles as the message's identity in the sorted sets.
Key = tuple[int, int, str, int, int]

# Deadline kinds; at equal times a message's own expiry is handled before its lease timeout, so a
# message whose time is up is removed rather than returned.
_EXPIRY, _LEASE, _SENT, _DEFERRED = 0, 1, 2, 3
_FRESH_SLACK = 64


@dataclass(frozen=True, slots=True)
class Bookmark:
    """Identity of a queue message: the log position of the publish that created it."""

    topic: str
    partition: int
    offset: int

    def text(self) -> str:
        """``topic|partition|offset``, the form clients acknowledge with."""
        return f"{self.topic}|{self.partition}|{self.offset}"

    @classmethod
    def parse(cls, text: str) -> Bookmark:
        """The bookmark ``text`` spells; ValueError quoting it when it is not one."""
        parts = text.strip().rsplit("|", 2)
        numbers = parts[1:]
        if len(parts) != 3 or not parts[0] or not all(p.isascii() and p.isdigit() for p in numbers):
            raise ValueError(f"queue bookmark {text!r} is not of the form topic|partition|offset")
        return cls(parts[0], int(parts[1]), int(parts[2]))

    def __str__(self) -> str:
        return self.text()


@dataclass(slots=True)
class QueueMessage:
    """A message in the queue; the mutable fields are the machine's own bookkeeping."""

    bookmark: Bookmark
    data: bytes
    body: dict[str, Any]
    timestamp_ms: int
    priority: int | None
    barrier: bool
    expires_at_ms: int | None
    deliveries: int = 0
    cancels: int = 0
    leased_to: str | None = None
    lease_expires_ms: int | None = None  # None while leased: the lease never times out
    leased_at_ms: int | None = None  # when the current lease was granted (None: not leased)

    @property
    def key(self) -> Key:
        """The message's place in delivery order."""
        b = self.bookmark
        rank = 1 if self.priority is None else -self.priority
        return (rank, self.timestamp_ms, b.topic, b.partition, b.offset)


@dataclass(frozen=True, slots=True)
class Lease:
    """Send ``message`` to subscription ``sub_key`` now (a barrier is sent, not leased)."""

    sub_key: str
    message: QueueMessage
    lease_expires_ms: int | None
    deliveries: int
    barrier: bool


@dataclass(frozen=True, slots=True)
class Removed:
    """``message`` left the queue: ``reason`` is "" for an acknowledgement, else why it went.

    Reasons: ``time_limit``, ``forced_expire``, ``max_cancels``, ``max_deliveries`` (expiries),
    ``sent`` (at-most-once delivery) and ``barrier`` (a barrier was broadcast).
    """

    message: QueueMessage
    reason: str


EXPIRY_REASONS = ("time_limit", "forced_expire", "max_cancels", "max_deliveries")


class AckResult(StrEnum):
    """What one acknowledged bookmark did."""

    REMOVED = "removed"  # acknowledged: the message left the queue
    RETURNED = "returned"  # cancelled: the message is available again
    EXPIRED = "expired"  # forced expiry, or a cancel that reached MaxCancels / MaxDeliveries
    FREED = "freed"  # at-most-once: the message was already gone; its backlog unit is free now
    # Not allowed (strict leasing, barrier) or nothing to do (cancel of a never-leased message).
    IGNORED = "ignored"
    DEFERRED = "deferred"  # not in the queue yet: remembered for DeferredAckExpiration
    GONE = "gone"  # already removed (acknowledged, expired, filtered out): no effect
    # Set by the engine, from the store's ack marker, for a GONE bookmark this client (or,
    # with sublet leasing, anyone) acknowledged before: a repeat, so nothing left to do.
    ACKED = "acked"


@dataclass(slots=True)
class AckOutcome:
    """Per bookmark what an acknowledgement did, and the messages it removed."""

    results: dict[Bookmark, AckResult] = field(default_factory=dict)
    removed: list[Removed] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Counters of one queue on one worker (totals since the machine was created)."""

    depth: int  # messages in the queue: available (barriers included) and leased
    available: int
    leased: int
    outstanding: int  # units counted against MaxBacklog: leases plus unacknowledged sends
    delivered: int
    acked: int
    expired: dict[str, int]
    returned: int
    expired_leases: int
    deferred_acks: int
    backlog: dict[str, int]  # per subscription: units it holds
    inactive: int = 0  # beyond TargetQueueDepth: stored, not yet deliverable or browsable


class BacklogShare:
    """One subscription's backlog, shared by the queues it covers (a regular expression over
    several queues): what it holds from all of them counts against it, and a unit one queue
    frees lets the others deliver again."""

    def __init__(self) -> None:
        self._members: dict[int, tuple[QueueMachine, _Subscription]] = {}

    def join(self, machine: QueueMachine, sub: _Subscription) -> None:
        self._members[id(machine)] = (machine, sub)

    def leave(self, machine: QueueMachine) -> None:
        self._members.pop(id(machine), None)

    @property
    def empty(self) -> bool:
        """Whether no queue counts this subscription any more."""
        return not self._members

    def held(self) -> int:
        """Units the subscription holds over every queue it covers."""
        return sum(sub.own for _, sub in self._members.values())

    def freed(self, by: QueueMachine) -> None:
        """``by`` freed a unit: the other queues may deliver to the subscription again."""
        for machine, _ in list(self._members.values()):
            if machine is not by:
                machine.wake_up()


@dataclass(slots=True)
class _Subscription:
    key: str
    client: str
    identity: str
    filter: Filter | None
    backlog: int
    order: int
    leased: set[Bookmark] = field(default_factory=set)
    sent: set[Bookmark] = field(default_factory=set)  # at-most-once, awaiting an ack
    cursor: Key | None = None  # every available message up to here was offered to it
    fresh: set[Key] = field(default_factory=set)  # became available behind the cursor
    share: BacklogShare | None = None  # over several queues: the backlog they share
    # Credit mode: units it may still be leased per log partition (granted by the subscriber).
    credits: dict[tuple[str, int], int] = field(default_factory=dict)

    @property
    def own(self) -> int:
        """Units held from this queue."""
        return len(self.leased) + len(self.sent)

    @property
    def held(self) -> int:
        """Units counted against the backlog (from every queue it covers, with a share)."""
        return self.own if self.share is None else self.share.held()


@dataclass(frozen=True, slots=True)
class CreditView:
    """One subscription on one log partition in credit mode (what its owner reports)."""

    credit: int  # units it may still be leased there
    leased: int  # units it holds there (leases, and unacknowledged at-most-once sends)
    best: tuple[Key, ...]  # the best available messages it matches there, in delivery order
    more: bool  # more than ``best`` lists


@dataclass(slots=True)
class _Sent:
    sub_key: str
    key: Key
    free_at_ms: int | None


# Distinct priority values a status answer lists at most (beyond, only their count).
PRIORITIES_LISTED = 1000


@dataclass(frozen=True, slots=True)
class QueueAges:
    """Monitoring figures of some queue messages (AMPS's queue statistics): ages in seconds."""

    seconds_behind: float  # age of the oldest message not yet acknowledged (0: none)
    age_of_oldest_lease: float  # how long the oldest current lease has been held (0: none)
    priority_count: int  # distinct priority values (0 without Priority)
    priorities: tuple[int, ...] | None  # those values, or None when more than PRIORITIES_LISTED


def queue_ages(messages: Iterable[QueueMessage], now_ms: int, *, prioritised: bool) -> QueueAges:
    """The figures of ``messages`` (available and leased) at ``now_ms``. A message without a
    priority value ranks lowest, as the value 0 would: it counts as that value."""
    oldest: int | None = None
    lease: int | None = None
    values: set[int] = set()
    for message in messages:
        if oldest is None or message.timestamp_ms < oldest:
            oldest = message.timestamp_ms
        at = message.leased_at_ms
        if at is not None and (lease is None or at < lease):
            lease = at
        if prioritised:
            values.add(message.priority or 0)
    listed = tuple(sorted(values)) if len(values) <= PRIORITIES_LISTED else None
    return QueueAges(
        seconds_behind=_seconds(now_ms, oldest),
        age_of_oldest_lease=_seconds(now_ms, lease),
        priority_count=len(values),
        priorities=listed,
    )


def _seconds(now_ms: int, since_ms: int | None) -> float:
    return 0.0 if since_ms is None else max(0, now_ms - since_ms) / 1000


def message_lifetime(model: str, own_ms: int | None, queue_ms: int | None) -> int | None:
    """How long a message stays in the queue (None: for ever), by the queue's ExpirationModel.

    ``own_ms`` is the message's own expiration (None: the publish set none; 0: never), and
    ``queue_ms`` the queue's Expiration (None: none). ``default``: the message's own if set, else
    the queue's; ``queue``: always the queue's; ``latest``/``earliest``: the later/earlier of
    the two, where "never" is later than any time. A message without its own expiration has
    nothing to compare, so it gets the queue's under every model.
    """
    if model == "queue" or own_ms is None:
        return queue_ms
    if model == "default":
        return own_ms or None
    own = own_ms or math.inf
    queue = queue_ms or math.inf
    chosen = max(own, queue) if model == "latest" else min(own, queue)
    return None if chosen == math.inf else int(chosen)


def _bookmark_of(key: Key) -> Bookmark:
    return Bookmark(key[2], key[3], key[4])


class QueueMachine:
    """The delivery state of one queue over the partitions one worker owns."""

    def __init__(
        self, config: QueueRules, entitled: Callable[[str, dict[str, Any]], bool] | None = None
    ) -> None:
        self.config = config
        self._entitled = entitled
        self._filter = compile_filter(config.filter) if config.filter else None
        self._barrier = (
            compile_filter(config.barrier_expression) if config.barrier_expression else None
        )
        self._priority = compile_value(parse_filter(config.priority)) if config.priority else None
        self._at_most_once = config.semantics == "at-most-once"

        self._messages: dict[Bookmark, QueueMessage] = {}  # available, held barriers, leased
        self._live: SortedList = SortedList()  # keys of all of them
        self._available: SortedList = SortedList()  # not leased, not barriers
        self._barriers: SortedList = SortedList()  # barriers waiting for older messages
        self._sent: dict[Bookmark, _Sent] = {}
        self._sent_keys: SortedList = SortedList()
        self._subs: dict[str, _Subscription] = {}  # registration order
        self._next_order = 0
        self._last_served: int | None = None  # round-robin position (a subscription's order)
        self._outstanding = 0
        self._max_cursor: Key | None = None
        self._deferred: dict[Bookmark, int] = {}  # bookmark -> when to forget the ack
        # TargetQueueDepth: messages beyond it wait here, in arrival order, not yet deliverable.
        self._inactive: dict[Bookmark, QueueMessage] = {}
        self._high: dict[tuple[str, int], int] = {}  # highest offset appended per partition
        self._deadlines: list[tuple[int, int, int, Bookmark, int]] = []
        self._deadline_seq = 0
        self._now = 0
        self._dirty = False
        # Credit mode (several workers serve the queue): a subscription is leased only within
        # the credit granted for each partition (sowstream.queues.credits); off, its backlog.
        self._credited = False
        # Over several workers, a queue with barriers: what the other workers' partitions let
        # through (sowstream.queues.barriers); None: this worker's partitions are all there is.
        self.gate: BarrierGate | None = None
        # Bookmarks whose availability may have changed since the engine last took them; None
        # when nothing follows it (a view over the queue does: sowstream.engine.queue_views).
        self.touched: set[Bookmark] | None = None
        # Called when another queue frees room for a subscription shared with it (the engine
        # runs the delivery loop then).
        self.on_wake: Callable[[], None] | None = None

        self._delivered = 0
        self._acked = 0
        self._expired: Counter[str] = Counter()
        self._returned = 0
        self._expired_leases = 0

    # ------------------------------------------------------------------ subscriptions

    def subscribe(
        self,
        sub_key: str,
        *,
        client: str,
        identity: str = "",
        filter: str | None = None,
        max_backlog: int | None = None,
        limit: int | None = None,
        share: BacklogShare | None = None,
    ) -> int:
        """Register (or replace) a subscription; returns its effective backlog: the smallest of
        ``max_backlog`` (1 if None), the queue's MaxPerSubscriptionBacklog and ``limit`` (the
        other queues' limits, for a subscription covering several; ``share`` then counts what
        it holds from all of them against that backlog).

        A replace keeps the leases already held and the subscription's place in the fairness
        order; the new filter and backlog apply to what is delivered from now on. A bad filter
        raises FilterError and changes nothing.
        """
        if max_backlog is not None and max_backlog < 1:
            raise ValueError(f"max_backlog must be at least 1, got {max_backlog}")
        compiled = compile_filter(filter) if filter else None
        backlog = min(max_backlog or 1, self.config.max_per_subscription_backlog)
        if limit is not None:
            backlog = min(backlog, limit)
        old = self._subs.get(sub_key)
        if old is None:
            sub = self._subs[sub_key] = _Subscription(
                sub_key, client, identity, compiled, backlog, self._next_order
            )
            self._next_order += 1
        else:
            sub = old
            sub.client, sub.identity, sub.filter, sub.backlog = client, identity, compiled, backlog
            sub.cursor = None
            sub.fresh.clear()
            if sub.share is not None and sub.share is not share:
                sub.share.leave(self)
        sub.share = share
        if share is not None:
            share.join(self, sub)
        self._dirty = True
        return backlog

    def unsubscribe(self, sub_key: str, now_ms: int) -> list[Removed]:
        """Drop a subscription: its leases return at once (or expire by MaxDeliveries)."""
        self._advance(now_ms)
        sub = self._subs.pop(sub_key, None)
        if sub is None:
            return []
        removed: list[Removed] = []
        share, sub.share = sub.share, None  # the other queues are told once, below
        for bookmark in sorted(sub.leased, key=lambda b: self._messages[b].key):
            self._end_lease(self._messages[bookmark], sub, removed, cancel=False)
        for bookmark in list(sub.sent):
            self._free_sent(bookmark)
        if share is not None:
            share.leave(self)
            share.freed(self)
        self._dirty = True
        return removed

    def wake_up(self) -> None:
        """Something outside the machine gave a subscription room (a unit of a backlog shared
        with another queue was freed): the next dispatch looks again, and ``on_wake`` runs."""
        self._dirty = True
        if self.on_wake is not None:
            self.on_wake()

    def disconnect(self, client: str, now_ms: int) -> list[Removed]:
        """Drop every subscription of ``client`` (its connection closed)."""
        removed: list[Removed] = []
        for key in [k for k, s in self._subs.items() if s.client == client]:
            removed.extend(self.unsubscribe(key, now_ms))
        return removed

    # ------------------------------------------------------------------ messages in

    def append(
        self,
        bookmark: Bookmark,
        data: bytes,
        body: dict[str, Any],
        timestamp_ms: int,
        *,
        expiration_ms: int | None = None,
    ) -> bool:
        """Offer a log record to the queue; True if it became a queue message.

        False when the queue Filter rejects it, when it was acknowledged before it arrived
        (deferred ack), or when it is a replay (see the module notes). ``expiration_ms`` is the
        publish's own expiration (0 = never) and overrides the queue's ``Expiration``.
        """
        partition = (bookmark.topic, bookmark.partition)
        high = self._high.get(partition)
        if high is not None and bookmark.offset <= high:
            return False
        self._high[partition] = bookmark.offset
        if self._filter is not None and not self._filter.matches(body):
            return False
        forget_at = self._deferred.pop(bookmark, None)
        if forget_at is not None and forget_at > self._now:
            self._acked += 1
            self._touch(bookmark)  # never available: a view must not keep an older owner's row
            return False
        lifetime = message_lifetime(
            self.config.expiration_model, expiration_ms, self.config.expiration_ms
        )
        message = QueueMessage(
            bookmark=bookmark,
            data=data,
            body=body,
            timestamp_ms=timestamp_ms,
            priority=self._priority_of(body),
            barrier=self._barrier is not None and self._barrier.matches(body),
            expires_at_ms=timestamp_ms + lifetime if lifetime else None,
        )
        target = self.config.target_queue_depth
        if target is not None and (self._inactive or len(self._messages) >= target):
            self._inactive[bookmark] = message
            self._touch(bookmark)
            return True
        self._admit(message)
        return True

    def acked_ahead(self, bookmark: Bookmark) -> bool:
        """Whether an acknowledgement of ``bookmark`` waits for it (DeferredAckExpiration):
        :meth:`append` then takes it as acknowledged, not as a queue message."""
        forget_at = self._deferred.get(bookmark)
        return forget_at is not None and forget_at > self._now

    def _admit(self, message: QueueMessage) -> None:
        """Make ``message`` part of the active queue."""
        bookmark = message.bookmark
        self._messages[bookmark] = message
        self._touch(bookmark)
        key = message.key
        self._live.add(key)
        if message.barrier:
            self._barriers.add(key)
        else:
            self._make_available(message)
        if message.expires_at_ms is not None:
            self._push(message.expires_at_ms, _EXPIRY, bookmark, 0)
        self._dirty = True

    def _priority_of(self, body: dict[str, Any]) -> int | None:
        if self._priority is None:
            return None
        value = self._priority(body)
        if isinstance(value, tuple):  # a path that read several values: no single priority
            return None
        number = to_number(value)
        if number is None:
            return None
        if isinstance(number, float):
            if not math.isfinite(number):
                return None
            number = int(number)
        return min(max(number, 0), U64_MAX)

    def mark_appended(self, topic: str, partition: int, offset: int) -> None:
        """Everything of ``(topic, partition)`` up to ``offset`` has been offered already (its
        state was loaded from a store): a replay of those records is ignored."""
        key = (topic, partition)
        self._high[key] = max(self._high.get(key, -1), offset)

    # ------------------------------------------------------------------ acknowledgements

    def ack(
        self, bookmarks: Iterable[Bookmark], *, client: str, action: str = "", now_ms: int
    ) -> AckOutcome:
        """Acknowledge (``""``), return (``"cancel"``) or expire (``"expire"``) messages.

        ``Leasing=strict`` ignores a bookmark leased to another client. A bookmark the queue has
        not seen yet is remembered for DeferredAckExpiration.
        """
        action = action.strip().lower()
        if action not in ACK_ACTIONS:
            raise ValueError(f"unknown acknowledgement action {action!r}: use cancel or expire")
        self._advance(now_ms)
        outcome = AckOutcome()
        for bookmark in bookmarks:
            outcome.results[bookmark] = self._ack_one(bookmark, client, action, outcome.removed)
        return outcome

    def ack_filter(self, filter: str, *, client: str, now_ms: int) -> AckOutcome:
        """Acknowledge every message (available or leased) that matches ``filter``."""
        compiled = compile_filter(filter)
        self._advance(now_ms)
        outcome = AckOutcome()
        in_order = [self._messages[_bookmark_of(key)] for key in self._live]
        for message in in_order:
            if not message.barrier and compiled.matches(message.body):
                result = self._ack_one(message.bookmark, client, "", outcome.removed)
                outcome.results[message.bookmark] = result
        return outcome

    def _ack_one(
        self, bookmark: Bookmark, client: str, action: str, out: list[Removed]
    ) -> AckResult:
        message = self._messages.get(bookmark)
        if message is None and bookmark in self._inactive:
            # Beyond TargetQueueDepth: acknowledged before it ever became deliverable.
            self._acked += 1
            self._touch(bookmark)
            out.append(Removed(self._inactive.pop(bookmark), ""))
            return AckResult.REMOVED
        if message is None:
            sent = self._sent.get(bookmark)
            if sent is not None:
                sub = self._subs.get(sent.sub_key)
                if self.config.leasing == "strict" and sub is not None and sub.client != client:
                    return AckResult.IGNORED
                self._free_sent(bookmark)
                return AckResult.FREED
            if self._seen(bookmark):
                return AckResult.GONE
            if self.config.deferred_ack_expiration_ms <= 0:
                return AckResult.IGNORED
            forget_at = self._now + self.config.deferred_ack_expiration_ms
            self._deferred[bookmark] = forget_at
            self._push(forget_at, _DEFERRED, bookmark, 0)
            return AckResult.DEFERRED
        if message.barrier:
            return AckResult.IGNORED
        holder = self._subs.get(message.leased_to) if message.leased_to is not None else None
        if self.config.leasing == "strict" and holder is not None and holder.client != client:
            return AckResult.IGNORED
        if action == "":
            self._acked += 1
            self._remove(message, "", out)
            return AckResult.REMOVED
        if self._at_most_once:
            return AckResult.IGNORED  # cancel and expire mean nothing without leases
        if action == "expire":
            self._remove(message, "forced_expire", out)
            return AckResult.EXPIRED
        if holder is None:
            if message.deliveries == 0:
                return AckResult.IGNORED  # never leased: no lease to cancel
            return self._late_cancel(message, out)
        return self._end_lease(message, holder, out, cancel=True)

    def _late_cancel(self, message: QueueMessage, out: list[Removed]) -> AckResult:
        """A cancel that arrives after its lease lapsed, the message waiting to be leased again.

        It counts as if it had come in time (the lapse already returned the message), so that
        MaxCancels does not depend on whether the message was leased again before the cancel
        arrived: a cancel arriving after the new lease is granted ends that lease and counts.
        """
        message.cancels += 1
        if self.config.max_cancels and message.cancels >= self.config.max_cancels:
            self._remove(message, "max_cancels", out)
            return AckResult.EXPIRED
        return AckResult.RETURNED

    def _seen(self, bookmark: Bookmark) -> bool:
        high = self._high.get((bookmark.topic, bookmark.partition))
        return high is not None and bookmark.offset <= high

    # ------------------------------------------------------------------ time

    def tick(self, now_ms: int) -> list[Removed]:
        """Apply everything due by ``now_ms``: expiries, lease timeouts, forgotten acks."""
        self._advance(now_ms)
        removed: list[Removed] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now_ms:
            at, kind, _, bookmark, token = heapq.heappop(heap)
            if kind == _EXPIRY:
                message = self._messages.get(bookmark)
                if message is not None and message.expires_at_ms == at:
                    self._remove(message, "time_limit", removed)
            elif kind == _LEASE:
                message = self._messages.get(bookmark)
                if message is not None and self._lease_is(message, at, token):
                    assert message.leased_to is not None
                    holder = self._subs[message.leased_to]
                    self._expired_leases += 1
                    self._end_lease(message, holder, removed, cancel=False)
            elif kind == _SENT:
                sent = self._sent.get(bookmark)
                if sent is not None and sent.free_at_ms == at:
                    self._free_sent(bookmark)
            elif self._deferred.get(bookmark) == at:
                del self._deferred[bookmark]
        return removed

    def next_deadline(self) -> int | None:
        """The earliest time at which :meth:`tick` has something to do, or None."""
        heap = self._deadlines
        while heap and not self._deadline_valid(heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def _deadline_valid(self, entry: tuple[int, int, int, Bookmark, int]) -> bool:
        at, kind, _, bookmark, token = entry
        if kind == _EXPIRY:
            message = self._messages.get(bookmark)
            return message is not None and message.expires_at_ms == at
        if kind == _LEASE:
            message = self._messages.get(bookmark)
            return message is not None and self._lease_is(message, at, token)
        if kind == _SENT:
            sent = self._sent.get(bookmark)
            return sent is not None and sent.free_at_ms == at
        return self._deferred.get(bookmark) == at

    @staticmethod
    def _lease_is(message: QueueMessage, at: int, deliveries: int) -> bool:
        return (
            message.leased_to is not None
            and message.lease_expires_ms == at
            and message.deliveries == deliveries
        )

    # ------------------------------------------------------------------ delivery

    def dispatch(self, now_ms: int) -> tuple[list[Lease], list[Removed]]:
        """Deliver what can be delivered now: leases to send, and messages that left the queue.

        Whatever is due by ``now_ms`` is applied first, as :meth:`tick` would; Removed holds
        what that removed, then barriers that were broadcast and at-most-once messages that were
        sent.
        """
        leases: list[Lease] = []
        removed = self.tick(now_ms) if self._deadlines and self._deadlines[0][0] <= now_ms else []
        self._advance(now_ms)
        if not self._dirty:
            return leases, removed
        while True:
            self._release_barriers(leases, removed)
            self._scan(now_ms, leases, removed)
            if not self._barrier_due():
                break
        self._dirty = False
        return leases, removed

    def _barrier_due(self) -> bool:
        if not self._barriers:
            return False
        first = self._barriers[0]
        if self._live[0] != first or (self._sent_keys and self._sent_keys[0] < first):
            return False
        return self.gate is None or self.gate.may_release(first[1])

    def _release_barriers(self, leases: list[Lease], removed: list[Removed]) -> None:
        # A barrier goes out once nothing older is left (nor, at-most-once, unacknowledged), to
        # every subscription it matches, whatever their backlog; then it is gone.
        while self._barrier_due():
            message = self._messages[_bookmark_of(self._barriers[0])]
            message.deliveries = 1
            for sub in self._subs.values():
                if self._matches(sub, message):
                    leases.append(Lease(sub.key, message, None, 1, True))
                    self._delivered += 1
            self._remove(message, "barrier", removed)

    def _scan(self, now_ms: int, leases: list[Lease], removed: list[Removed]) -> None:
        limit = self.config.max_backlog
        room = [s for s in self._subs.values() if self._has_room(s)]
        if not room or (limit is not None and self._outstanding >= limit):
            return
        stop_after = self._barriers[0] if self._barriers else None
        cursors = [s.cursor for s in room]
        lower = None if None in cursors else min(c for c in cursors if c is not None)
        # Messages that came back behind the lowest cursor: only the fresh sets know them.
        behind = sorted(
            {k for s in room for k in s.fresh if lower is not None and k <= lower}, reverse=True
        )
        after = lower
        available = self._available
        while room:
            index = 0 if after is None else available.bisect_right(after)
            ahead = available[index] if index < len(available) else None
            while behind and not self._is_available(behind[-1]):
                behind.pop()
            if behind and (ahead is None or behind[-1] < ahead):
                key = behind.pop()
            elif ahead is not None:
                key = after = ahead
            else:
                break
            if stop_after is not None and key > stop_after:
                break
            if self.gate is not None and not self.gate.may_lease(key[1]):
                continue  # held by another worker's partition (reopen() looks again)
            message = self._messages[_bookmark_of(key)]
            if message.expires_at_ms is not None and message.expires_at_ms <= now_ms:
                self._remove(message, "time_limit", removed)
                continue
            candidates = []
            for sub in room:
                if self._credited and sub.credits.get((key[2], key[3]), 0) <= 0:
                    continue  # no credit here: not offered (its cursor resets on a grant)
                if sub.cursor is None or key > sub.cursor:
                    sub.cursor = key
                elif key in sub.fresh:
                    sub.fresh.discard(key)
                else:
                    continue  # offered before, and it did not match
                if self._matches(sub, message):
                    candidates.append(sub)
            if self._max_cursor is None or key > self._max_cursor:
                self._max_cursor = key
            if not candidates:
                continue
            chosen = self._choose(candidates)
            leases.append(self._lease(message, chosen, now_ms, removed))
            if not self._has_room(chosen):
                room.remove(chosen)
            if limit is not None and self._outstanding >= limit:
                break

    def _has_room(self, sub: _Subscription) -> bool:
        if sub.held >= sub.backlog:
            return False
        return not self._credited or any(n > 0 for n in sub.credits.values())

    def _matches(self, sub: _Subscription, message: QueueMessage) -> bool:
        if sub.filter is not None and not sub.filter.matches(message.body):
            return False
        return self._entitled is None or self._entitled(sub.identity, message.body)

    def _choose(self, candidates: list[_Subscription]) -> _Subscription:
        model = self.config.fairness_model
        if model == "fast":
            return candidates[0]
        if model == "round-robin":
            last = self._last_served
            chosen = next((s for s in candidates if last is None or s.order > last), candidates[0])
            self._last_served = chosen.order
            return chosen
        best = candidates[0]
        for sub in candidates[1:]:  # smallest held/backlog; first registered among equals
            if sub.held * best.backlog < best.held * sub.backlog:
                best = sub
        return best

    def _lease(
        self, message: QueueMessage, sub: _Subscription, now_ms: int, removed: list[Removed]
    ) -> Lease:
        key = message.key
        self._available.remove(key)
        self._touch(message.bookmark)
        message.deliveries += 1
        self._delivered += 1
        self._outstanding += 1
        if self._credited:
            where = (message.bookmark.topic, message.bookmark.partition)
            sub.credits[where] = sub.credits.get(where, 0) - 1
        period = self.config.lease_period_ms
        expires = now_ms + period if period is not None else None
        if self._at_most_once:
            # Gone from the queue as it is sent; the unit stays used until the client acks
            # (or LeasePeriod passes, so a client that never acks cannot stall for ever).
            self._sent[message.bookmark] = _Sent(sub.key, key, expires)
            self._sent_keys.add(key)
            sub.sent.add(message.bookmark)
            if expires is not None:
                self._push(expires, _SENT, message.bookmark, 0)
            self._forget(message)
            removed.append(Removed(message, "sent"))
            return Lease(sub.key, message, None, message.deliveries, False)
        message.leased_to = sub.key
        message.lease_expires_ms = expires
        message.leased_at_ms = now_ms
        sub.leased.add(message.bookmark)
        if expires is not None:
            self._push(expires, _LEASE, message.bookmark, message.deliveries)
        return Lease(sub.key, message, expires, message.deliveries, False)

    # ------------------------------------------------------------------ state changes

    def _end_lease(
        self, message: QueueMessage, holder: _Subscription, out: list[Removed], *, cancel: bool
    ) -> AckResult:
        """A lease ended without an ack: return the message, or expire it at a limit."""
        limits = self.config
        if cancel:
            message.cancels += 1
        if cancel and limits.max_cancels and message.cancels >= limits.max_cancels:
            self._remove(message, "max_cancels", out, holder)
            return AckResult.EXPIRED
        if limits.max_deliveries and message.deliveries >= limits.max_deliveries:
            self._remove(message, "max_deliveries", out, holder)
            return AckResult.EXPIRED
        self._unlease(message, holder)
        self._returned += 1
        self._make_available(message)
        self._dirty = True
        return AckResult.RETURNED

    def _unlease(self, message: QueueMessage, holder: _Subscription | None) -> None:
        if holder is not None:
            holder.leased.discard(message.bookmark)
            if holder.share is not None:
                holder.share.freed(self)
        message.leased_to = None
        message.lease_expires_ms = None
        message.leased_at_ms = None
        self._outstanding -= 1

    def _remove(
        self,
        message: QueueMessage,
        reason: str,
        out: list[Removed],
        holder: _Subscription | None = None,
    ) -> None:
        if message.leased_to is not None:
            self._unlease(message, holder or self._subs.get(message.leased_to))
        elif not message.barrier:
            self._available.remove(message.key)
        else:
            self._barriers.remove(message.key)
        self._forget(message)
        if reason in EXPIRY_REASONS:
            self._expired[reason] += 1
        out.append(Removed(message, reason))
        self._dirty = True

    def _forget(self, message: QueueMessage) -> None:
        del self._messages[message.bookmark]
        self._touch(message.bookmark)
        self._live.remove(message.key)
        target = self.config.target_queue_depth
        while self._inactive and target is not None and len(self._messages) < target:
            waiting = next(iter(self._inactive))
            self._admit(self._inactive.pop(waiting))

    def _free_sent(self, bookmark: Bookmark) -> None:
        sent = self._sent.pop(bookmark)
        sub = self._subs.get(sent.sub_key)
        if sub is not None:
            sub.sent.discard(bookmark)
            if sub.share is not None:
                sub.share.freed(self)
        self._sent_keys.remove(sent.key)
        self._outstanding -= 1
        self._dirty = True

    def _make_available(self, message: QueueMessage) -> None:
        key = message.key
        self._available.add(key)
        self._touch(message.bookmark)
        if self._max_cursor is None or key > self._max_cursor:
            return  # ahead of every cursor: the next scan reaches it anyway
        live = len(self._messages)
        for sub in self._subs.values():
            if sub.cursor is not None and key <= sub.cursor:
                sub.fresh.add(key)
                if len(sub.fresh) > 2 * live + _FRESH_SLACK:
                    sub.fresh = {k for k in sub.fresh if self._is_available(k)}

    def _is_available(self, key: Key) -> bool:
        message = self._messages.get(_bookmark_of(key))
        return (
            message is not None
            and message.leased_to is None
            and not message.barrier
            and message.key == key
        )

    def _touch(self, bookmark: Bookmark) -> None:
        if self.touched is not None:
            self.touched.add(bookmark)

    def _push(self, at: int, kind: int, bookmark: Bookmark, token: int) -> None:
        self._deadline_seq += 1
        heapq.heappush(self._deadlines, (at, kind, self._deadline_seq, bookmark, token))

    def _advance(self, now_ms: int) -> None:
        if now_ms > self._now:
            self._now = now_ms

    # ------------------------------------------------------------------ credits

    @property
    def credited(self) -> bool:
        """Whether subscriptions are leased only within granted credit (credit mode)."""
        return self._credited

    def set_credited(self, on: bool) -> None:
        """Enter or leave credit mode; either way every credit is cleared (credit is granted
        for a mode, and a worker entering it starts with none)."""
        if on == self._credited:
            return
        self._credited = on
        for sub in self._subs.values():
            sub.credits.clear()
            sub.cursor = None
            sub.fresh.clear()
        self._dirty = True

    def grant(self, sub_key: str, topic: str, partition: int, credits: int) -> bool:
        """Add ``credits`` (negative: take back, never below zero) to what the subscription may
        be leased from ``(topic, partition)``; False when not in credit mode or not
        subscribed."""
        sub = self._subs.get(sub_key)
        if not self._credited or sub is None:
            return False
        where = (topic, partition)
        sub.credits[where] = max(0, sub.credits.get(where, 0) + credits)
        if credits > 0:
            # Messages skipped for want of credit lie behind its cursor: look at all again.
            sub.cursor = None
            sub.fresh.clear()
            self._dirty = True
        return True

    def credit_view(
        self, sub_key: str, partitions: Iterable[tuple[str, int]], limit: int
    ) -> dict[tuple[str, int], CreditView]:
        """Per partition, the subscription's credit, what it holds, and up to ``limit`` of the
        best available messages it matches (leasable now: none behind a held barrier)."""
        sub = self._subs.get(sub_key)
        wanted = set(partitions)
        found: dict[tuple[str, int], list[Key]] = {where: [] for where in wanted}
        more: set[tuple[str, int]] = set()
        if sub is not None:
            stop_after = self._barriers[0] if self._barriers else None
            full = 0
            for key in self._available:
                if stop_after is not None and key > stop_after:
                    break
                where = (key[2], key[3])
                if where not in wanted or where in more:
                    continue
                if self.gate is not None and not self.gate.may_lease(key[1]):
                    continue
                message = self._messages[_bookmark_of(key)]
                if message.expires_at_ms is not None and message.expires_at_ms <= self._now:
                    continue
                if not self._matches(sub, message):
                    continue
                keys = found[where]
                if len(keys) < limit:
                    keys.append(key)
                    continue
                more.add(where)
                full += 1
                if full == len(wanted):
                    break
        held: Counter[tuple[str, int]] = Counter()
        if sub is not None:
            for b in (*sub.leased, *sub.sent):
                held[(b.topic, b.partition)] += 1
        return {
            where: CreditView(
                credit=sub.credits.get(where, 0) if sub is not None else 0,
                leased=held[where],
                best=tuple(found[where]),
                more=where in more,
            )
            for where in wanted
        }

    # ------------------------------------------------------------------ barriers

    def reopen(self) -> None:
        """What ``gate`` lets through changed: the next dispatch looks at every message again
        (one it held back lies behind the subscriptions' cursors)."""
        for sub in self._subs.values():
            sub.cursor = None
            sub.fresh.clear()
        self._dirty = True

    def oldest(self, topic: str, partition: int) -> tuple[int | None, int | None]:
        """Log times of the partition's oldest message not yet acknowledged (available,
        leased, a barrier, sent at-most-once, beyond TargetQueueDepth) and of its oldest
        barrier waiting; None where there is none."""
        oldest: int | None = None
        barrier: int | None = None
        times = [
            (m.timestamp_ms, m.barrier)
            for m in [*self._messages.values(), *self._inactive.values()]
            if m.bookmark.topic == topic and m.bookmark.partition == partition
        ]
        times += [
            (sent.key[1], False)
            for b, sent in self._sent.items()
            if b.topic == topic and b.partition == partition
        ]
        for at, is_barrier in times:
            if oldest is None or at < oldest:
                oldest = at
            if is_barrier and (barrier is None or at < barrier):
                barrier = at
        return oldest, barrier

    # ------------------------------------------------------------------ ownership

    def drop_partition(self, topic: str, partition: int) -> None:
        """Forget a partition this worker no longer owns: its messages, leases and acks."""

        def here(bookmark: Bookmark) -> bool:
            return bookmark.topic == topic and bookmark.partition == partition

        for message in [m for b, m in self._messages.items() if here(b)]:
            if message.leased_to is not None:
                self._unlease(message, self._subs.get(message.leased_to))
            elif message.barrier:
                self._barriers.remove(message.key)
            else:
                self._available.remove(message.key)
            self._forget(message)
        for bookmark in [b for b in self._sent if here(b)]:
            self._free_sent(bookmark)
        for bookmark in [b for b in self._deferred if here(b)]:
            del self._deferred[bookmark]
        for bookmark in [b for b in self._inactive if here(b)]:
            del self._inactive[bookmark]
        self._high.pop((topic, partition), None)
        for sub in self._subs.values():
            sub.credits.pop((topic, partition), None)  # a next owner starts without any
        self._dirty = True

    # ------------------------------------------------------------------ reading

    def browse(self, filter: str | None = None) -> list[QueueMessage]:
        """Available messages (not leased; held barriers included), in delivery order."""
        compiled = compile_filter(filter) if filter else None
        out = []
        for key in self._live:
            message = self._messages[_bookmark_of(key)]
            if message.leased_to is not None:
                continue
            if message.expires_at_ms is not None and message.expires_at_ms <= self._now:
                continue
            if compiled is None or compiled.matches(message.body):
                out.append(message)
        return out

    def leases(self, sub_key: str | None = None) -> list[QueueMessage]:
        """Leased messages (of one subscription, or all), in delivery order."""
        if sub_key is not None:
            sub = self._subs.get(sub_key)
            held = [self._messages[b] for b in sub.leased] if sub is not None else []
            return sorted(held, key=lambda m: m.key)
        return [
            m
            for m in (self._messages[_bookmark_of(k)] for k in self._live)
            if m.leased_to is not None
        ]

    def message(self, bookmark: Bookmark) -> QueueMessage | None:
        """The message in the queue (available or leased) with this bookmark, if any."""
        return self._messages.get(bookmark)

    def holds(self, topic: str, partition: int) -> bool:
        """Whether the machine has the partition's messages (taken, and not dropped since)."""
        return (topic, partition) in self._high

    def effective_backlog(self, sub_key: str) -> int | None:
        """The subscription's effective backlog, or None if it is not registered."""
        sub = self._subs.get(sub_key)
        return None if sub is None else sub.backlog

    def stats(self) -> QueueStats:
        """Current sizes and totals since the machine was created."""
        leased = sum(len(s.leased) for s in self._subs.values())
        depth = len(self._messages)
        return QueueStats(
            depth=depth,
            available=depth - leased,
            leased=leased,
            outstanding=self._outstanding,
            delivered=self._delivered,
            acked=self._acked,
            expired=dict(self._expired),
            returned=self._returned,
            expired_leases=self._expired_leases,
            deferred_acks=len(self._deferred),
            backlog={key: sub.own for key, sub in self._subs.items()},
            inactive=len(self._inactive),
        )
