"""Queues on a worker: the state machine of each queue, fed by the processors of its topics.

The engine owns the lease state machine over the log (docs/architecture.md says why: priority,
filters, barriers, fairness, sublet leasing, browsing and cancel counts have no counterpart in
Kafka share groups). A queue message is a publish to an underlying topic, read from its log; the
queue's state over each log partition is a ledger of ranges kept in that partition's store
(``sowstream.queues.ledger``), so the worker that owns the partition owns its queue messages
too. This module connects that state to subscribers: it sends leased messages to reply topics,
applies acknowledgements arriving on the control topic, raises expiry events on the queue's
dead-letter topic and runs lease timeouts.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import heapq
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from sowstream.config.queues import QueueConfig
from sowstream.engine import metrics
from sowstream.engine.partition import AppliedPublish
from sowstream.engine.ports import Sender
from sowstream.engine.queue_views import QueueViewFeed
from sowstream.errors import InvalidCommandError
from sowstream.filters import Filter, FilterError, compile_filter
from sowstream.messagetypes import MessageType, registry
from sowstream.queues.barriers import PartitionPosition
from sowstream.queues.credits import CREDIT_NOTICE, CreditDesk, CreditGrant
from sowstream.queues.ledger import (
    AckChunk,
    AckLog,
    LedgerError,
    PartitionLedger,
    Ranges,
    ledger_key,
)
from sowstream.queues.machine import (
    AckOutcome,
    AckResult,
    BacklogShare,
    Bookmark,
    Lease,
    QueueMachine,
    Removed,
    queue_ages,
)
from sowstream.queues.retention import LogRetention
from sowstream.queues.store import (
    ACK_MEMORY_MS,
    StoredMessage,
    entry_key,
    epoch_key,
    offset_of,
    read_ack_marker,
)
from sowstream.subscriptions.model import SubscriptionSpec
from sowstream.wire import headers as h
from sowstream.wire import leases as packing
from sowstream.wire.protocol import Command
from sowstream.wire.topics import TopicNames, topic_ident

log = logging.getLogger("sowstream.engine.queues")

# Removal reasons that are expiries: each raises an event on the queue's dead-letter topic.
EXPIRY_REASONS = frozenset({"time_limit", "forced_expire", "max_cancels", "max_deliveries"})
# options.ack_type of a queue_ack that wants no answer (a client acknowledging as it goes).
NO_ANSWER = "none"
_PUBLISH = h.PUBLISH.encode()
_PUBLISH_PACKED = packing.PUBLISH_PACKED.encode()
_CREDIT_NOTICE = CREDIT_NOTICE.encode()
# The longest the delivery loop sleeps without being woken (lease timeouts are also deadlines).
IDLE_WAIT = 1.0
# How often old ack chunks are deleted (each sweep is one store write per partition).
ACK_SWEEP_MS = 10_000
# How often messages are held against their log's retention (each check walks the queue).
RETENTION_CHECK_MS = 10_000
# Results of an acknowledgement that count as done in its answer.
DONE_RESULTS = ("removed", "returned", "expired", "freed", "acked")


# Store changes, or a function making them when their turn comes (a ledger is written as it
# stands then: the writes of one partition go in order, so each one holds all that came before).
Changes = Mapping[bytes, bytes | None] | Callable[[], Mapping[bytes, bytes | None]]
# Writes queue store changes into a log partition's store, in order with its batches; returns
# once they are stored, True, or False when they are not (the partition is not held here).
StoreChanges = Callable[[str, int, Changes], Awaitable[bool]]


class AckAnswer(NamedTuple):
    """What a ``queue_ack`` did: how many messages it removed or returned, and a count per
    result (its answer's ``count`` and ``message``)."""

    done: int
    results: dict[str, int]


def expired_body(codec: MessageType, data: bytes) -> dict[str, Any]:
    """The message in an expiry event: json as it is, any other type base64-encoded."""
    if codec.name == registry.JSON:
        return {"message": orjson.Fragment(data)}
    return {"message": base64.b64encode(data).decode(), "encoding": "base64"}


@dataclass(slots=True)
class HeldPartition:
    """A queue's state over one log partition held here: what it is done with (bodies are read
    from the log), the offsets of messages kept as stored copies instead, and recent
    acknowledgements."""

    ledger: PartitionLedger
    copies: set[int]
    acks: AckLog


def _now_ms() -> int:
    return int(time.time() * 1000)


class QueueRuntime:
    """One queue on this worker: who is subscribed, what is leased, what is due."""

    def __init__(
        self,
        config: QueueConfig,
        names: TopicNames,
        sender: Sender,
        store: StoreChanges,
        entitlement: Callable[[str], Filter | None] | None = None,
        codec: MessageType | None = None,
    ) -> None:
        self.config = config
        # How the queue's messages are parsed when reloaded from the store (its topics' type).
        self.codec = codec or registry.get(config.message_type)
        self.names = names
        self._entitlement = entitlement or (lambda identity: None)
        self.machine = QueueMachine(config, self.entitled)
        self.machine.on_wake = self.kick  # another queue freed room of a shared backlog
        self._sender = sender
        self._store = store
        self._held: dict[tuple[str, int], HeldPartition] = {}  # per log partition held
        self._next_sweep = self._next_gauge = 0
        self._events: dict[str, Any] = {}  # metric children per event, made on first use
        self._depth_available = metrics.QUEUE_DEPTH.labels(config.name, "available")
        self._depth_leased = metrics.QUEUE_DEPTH.labels(config.name, "leased")
        self._subs: dict[str, SubscriptionSpec] = {}
        # Subscriptions whose client asked for packed deliveries (wire.leases): one reply
        # record per delivery pass instead of one per message.
        self._packed: set[str] = set()
        self._topic_bytes: dict[str, bytes] = {}  # underlying topic names, UTF-8
        self._name_bytes = config.name.encode()
        self._wake = asyncio.Event()
        # Counters per log partition since this worker took it, for `sowstream queue status`.
        self.counts: dict[tuple[str, int], Counter[str]] = {}
        # Set by the engine when a view reads the queue (sowstream.engine.queue_views).
        self.view_feed: QueueViewFeed | None = None
        # Per Pattern topic the queue reads one name of: that name (config.queue_sources).
        self.scopes: dict[str, str] = {}
        # Every log partition of the queue's topics (set by the engine). A worker that holds
        # them all leases within each backlog; one that holds some leases within the credit
        # its subscribers grant (sowstream.queues.credits). Empty: always the first.
        self.partitions: frozenset[tuple[str, int]] = frozenset()
        self.credits = CreditDesk(self.machine, config.name)
        self._noticed: dict[str, bytes] = {}  # per subscription, the last report sent
        # Holding every partition, reports change only with these: no need to build them.
        self._notices_due = True
        # Per underlying topic, how long its log keeps records (set at start-up from the
        # broker; absent: forever). Messages older than most of it raise an alarm.
        self.retention: dict[str, LogRetention] = {}
        self._retention_alarm = metrics.QUEUE_RETENTION_ALARM.labels(config.name)
        self._alarmed = False
        self._next_retention_check = 0

    def entitled(self, identity: str, body: dict[str, Any]) -> bool:
        """Whether ``identity`` may see a message with ``body`` (the queue's entitlement
        filter, as for a SOW topic): it is neither leased to nor browsed by others."""
        flt = self._entitlement(identity)
        return flt is None or flt.matches(body)

    @property
    def name(self) -> str:
        return self.config.name

    # -- partitions (called by the topic's processor, under the partition's lock) ---------------

    def load(
        self,
        topic: str,
        partition: int,
        copies: Iterable[tuple[bytes, bytes]],
        watermark: int,
        *,
        ledger: PartitionLedger | None = None,
        records: Iterable[AppliedPublish] = (),
        chunks: Iterable[tuple[bytes, bytes]] = (),
        after: int = 0,
    ) -> dict[bytes, bytes | None]:
        """Take a partition: its stored copies (and an older layout's ack markers), its
        ``ledger`` (None: a store of the older layout, whose copies are every message up to
        ``watermark``), the log's publishes from the ledger's low-water offset to ``watermark``
        (those it skips already left out) and the stored ack ``chunks``; the log after
        ``watermark`` follows. ``after`` is the credit epoch the partition's last owner stored:
        this one's is later. Returns the store entries to write: the ledger, the epoch and the
        deletion of any ack chunk that could not be read."""
        where = (topic, partition)
        if where not in self.counts:
            # Not held: whatever the machine has of it (an ack applied while it was not held,
            # remembered as deferred) is stale, and would swallow a stored message.
            self.machine.drop_partition(topic, partition)
        ledger = ledger if ledger is not None else PartitionLedger(watermark + 1)
        acks = AckLog(self.name)
        held: set[int] = set()
        stored: list[AppliedPublish] = []
        for key, value in copies:
            offset = offset_of(key)
            marker = read_ack_marker(value)
            if marker is not None:  # the older layout's: remembered like an ack chunk
                acks.restore(AckChunk(key, marker[1], marker[0], Ranges([(offset, offset)])))
                continue
            copy = StoredMessage.from_bytes(value)
            body = self.codec.parse(copy.data)
            stored.append(
                AppliedPublish(offset, copy.timestamp_ms, copy.data, body, copy.expiration_ms)
            )
            held.add(offset)
        damaged: dict[bytes, bytes | None] = {}
        for key, value in chunks:
            try:
                acks.restore(AckChunk.from_bytes(key, value))
            except LedgerError as exc:
                # Only repeats of its acknowledgements would be answered otherwise.
                log.error(
                    "queue %s: %s partition %d: %s; deleted", self.name, topic, partition, exc
                )
                damaged[key] = None
        acks.sort()
        here = self._held[where] = HeldPartition(ledger, held, acks)
        self.counts[where] = Counter()
        epoch = self.credits.take(topic, partition, max(time.time_ns() // 1000, after + 1))
        self._held_changed()
        # Copies and the log's records in log order: the machine takes each offset once.
        logged = (r for r in records if r.offset not in held)
        merged = heapq.merge(stored, logged, key=lambda r: r.offset)
        changes = self._offer(topic, partition, merged, (), here)
        changes.update(damaged)
        ledger.offered(watermark)
        changes[ledger_key(self.name)] = ledger.to_bytes()
        changes[epoch_key(self.name)] = str(epoch).encode()
        self.machine.mark_appended(topic, partition, watermark)
        self.kick()
        return changes

    def log_lost(self, topic: str, partition: int, low: int, first: int) -> None:
        """The log of ``(topic, partition)`` starts at ``first``, past the ledger's low-water
        offset ``low``: records the queue had not finished with were deleted by retention."""
        log.error(
            "queue %s: %s partition %d: the log no longer holds offsets %d to %d, which the "
            "queue had not finished with (deleted by the log's retention); messages among "
            "them are lost. Keep the log longer than the queue's oldest message "
            "(retention.ms=-1 is the engine's default)",
            self.name,
            topic,
            partition,
            low,
            first - 1,
        )
        metrics.QUEUE_LOST.labels(self.name).inc(first - low)

    def check_retention(self, now: int) -> bool:
        """Raise (or clear) the alarm of a message not finished with that is close to its log's
        retention, naming the queue; returns whether it is raised."""
        alarmed = False
        for topic, partition in list(self.counts):
            retention = self.retention.get(topic)
            if retention is None or retention.retention_ms is None:
                continue
            oldest, _ = self.machine.oldest(topic, partition)
            if retention.alarmed(oldest, now):
                alarmed = True
                if not self._alarmed:
                    log.error(
                        "queue %s: a message of %s partition %d is %d s old, and the log %s "
                        "keeps records %d s (retention.ms): acknowledge or expire it before the "
                        "log deletes it",
                        self.name,
                        topic,
                        partition,
                        (now - (oldest or now)) // 1000,
                        retention.topic,
                        retention.retention_ms // 1000,
                    )
        if self._alarmed and not alarmed:
            log.info("queue %s: no message is close to its log's retention any more", self.name)
        self._alarmed = alarmed
        self._retention_alarm.set(1 if alarmed else 0)
        return alarmed

    def drop(self, topic: str, partition: int) -> None:
        """The partition moved away: its messages and leases are its next owner's."""
        self.machine.drop_partition(topic, partition)
        if self.view_feed is not None:
            self.view_feed.drop(topic, partition)
        self.counts.pop((topic, partition), None)
        self._held.pop((topic, partition), None)
        self.credits.drop(topic, partition)
        self._held_changed()

    def _held_changed(self) -> None:
        """The partitions held here changed: lease within backlogs (all of them held here) or
        within credit (some elsewhere)."""
        whole = self.partitions <= self.counts.keys()
        if whole != self.credits.whole:
            log.info(
                "queue %s: %s",
                self.name,
                "every partition held here: leasing within backlogs"
                if whole
                else "partitions held elsewhere too: leasing within credits",
            )
        self.credits.set_whole(whole)
        self._notices_due = True
        gate = self.machine.gate
        if gate is not None:
            gate.hold(self.counts)
            self.machine.reopen()
        self.kick()

    def note_position(self, position: PartitionPosition) -> None:
        """Another worker (or this one) reported how far a partition is: barriers and the
        messages after them may go now."""
        gate = self.machine.gate
        if gate is not None and gate.note(position):
            self.machine.reopen()
            self.kick()

    def append(
        self,
        topic: str,
        partition: int,
        records: Iterable[AppliedPublish],
        refused: Iterable[int] = (),
    ) -> dict[bytes, bytes | None]:
        """Offer applied publishes, and the offsets of records the batch ``refused`` (dead
        letters, which a reload must not offer); returns the store entries to write with
        their batch: copies of messages the log does not hold as queued, and the ledger when
        it gained offsets to skip."""
        return self._offer(topic, partition, records, refused, self._held.get((topic, partition)))

    def _offer(
        self,
        topic: str,
        partition: int,
        records: Iterable[AppliedPublish],
        refused: Iterable[int],
        here: HeldPartition | None,
    ) -> dict[bytes, bytes | None]:
        changes: dict[bytes, bytes | None] = {}
        ledger = here.ledger if here is not None else None
        only = self.scopes.get(topic)
        machine = self.machine
        skipped = appended = False
        for offset, timestamp, data, body, expiration, name, logged in records:
            if ledger is not None:
                ledger.offered(offset)
            if only is not None and name != only:
                continue  # another name of the Pattern topic: not one this queue reads
            bookmark = Bookmark(topic, partition, offset)
            ahead = machine.acked_ahead(bookmark)
            if machine.append(bookmark, data, body, timestamp, expiration_ms=expiration):
                appended = True
                if here is None:
                    continue  # not held here: nothing to store
                if logged and offset not in here.copies:
                    here.ledger.track(offset)
                elif offset not in here.copies:
                    here.copies.add(offset)
                    changes[entry_key(self.name, offset)] = StoredMessage(
                        data, timestamp, expiration
                    ).to_bytes()
            elif ahead and ledger is not None:
                ledger.finish(offset)  # acknowledged before it arrived: never offered again
                skipped = True
        if ledger is not None:
            for offset in refused:
                ledger.offered(offset)
                ledger.finish(offset)
                skipped = True
            if skipped:
                changes[ledger_key(self.name)] = ledger.to_bytes()
        if appended or skipped:
            self.kick()
        return changes

    # -- subscriptions ----------------------------------------------------------------------------

    def subscribe(
        self,
        spec: SubscriptionSpec,
        limit: int | None = None,
        share: BacklogShare | None = None,
        *,
        packed: bool = False,
    ) -> int:
        """Register (or replace) a queue subscription; returns its effective backlog. For one
        covering several queues, ``limit`` is the smallest MaxPerSubscriptionBacklog among them
        and ``share`` the backlog they share; ``packed``: its client reads lease batches."""
        backlog = self.machine.subscribe(
            spec.key,
            client=spec.reply_to,
            identity=spec.identity,
            filter=spec.filter,
            max_backlog=spec.options.max_backlog,
            limit=limit,
            share=share,
        )
        self._subs[spec.key] = spec
        if packed:
            self._packed.add(spec.key)
        else:
            self._packed.discard(spec.key)
        self._notices_due = True
        self._sender.prepare(spec.reply_to)
        self.kick()
        return backlog

    def specs(self, reply_to: str) -> list[SubscriptionSpec]:
        """The subscriptions of the client behind ``reply_to``."""
        return [spec for spec in self._subs.values() if spec.reply_to == reply_to]

    def subscription_count(self) -> int:
        """How many subscriptions lease from this queue."""
        return len(self._subs)

    def clients(self) -> set[str]:
        """Reply topics of the clients subscribed to this queue."""
        return {spec.reply_to for spec in self._subs.values()}

    async def unsubscribe(self, key: str) -> None:
        """The subscription ended: its leases go back to the queue (or expire)."""
        if self._subs.pop(key, None) is not None:
            self._forget(key)
            await self._removed(self.machine.unsubscribe(key, _now_ms()))
            self.kick()

    def _forget(self, key: str) -> None:
        self.credits.forget(key)
        self._packed.discard(key)
        self._noticed.pop(key, None)

    async def disconnect(self, reply_to: str) -> None:
        """The client vanished: every lease it held goes back at once."""
        for key in [k for k, s in self._subs.items() if s.reply_to == reply_to]:
            del self._subs[key]
            self._forget(key)
        await self._removed(self.machine.disconnect(reply_to, _now_ms()))
        self.kick()

    # -- acknowledgements -----------------------------------------------------------------------

    async def acknowledge(self, cmd: Command, topic: str, partition: int) -> AckAnswer | None:
        """Apply a ``queue_ack`` command sent to ``topic``'s control partition ``partition``;
        returns how many messages it removed or returned and a count per result (None when its
        removals could not be stored). Raises InvalidCommandError naming a malformed bookmark or
        action."""
        (outcome,) = await self.acknowledge_all([(cmd, partition)], topic)
        if isinstance(outcome, InvalidCommandError):
            raise outcome
        return outcome

    async def acknowledge_all(
        self, commands: Sequence[tuple[Command, int]], topic: str
    ) -> list[AckAnswer | InvalidCommandError | None]:
        """Apply ``queue_ack`` commands ``(command, control partition)`` of ``topic`` in order,
        and store what they removed in one write per log partition; returns per command what
        :meth:`acknowledge` returns, or the InvalidCommandError refusing it.

        Returns once the removals are stored, so an answer sent after it is never followed by
        another delivery of a message it acknowledged. A command whose removals were not stored
        (its partition was revoked meanwhile) gets None: it must not be answered as done."""
        now = _now_ms()
        removed: list[Removed] = []
        acked_by: dict[Bookmark, str] = {}
        outcomes: list[AckAnswer | InvalidCommandError | None] = []
        touched: list[set[tuple[str, int]]] = []  # per command, the partitions it removed from
        for cmd, partition in commands:
            try:
                outcome = self._ack(cmd, topic, partition, now, acked_by)
            except InvalidCommandError as exc:
                outcomes.append(exc)
                touched.append(set())
                continue
            removed.extend(outcome.removed)
            for item in outcome.removed:
                if item.reason == "":
                    acked_by[item.message.bookmark] = cmd.reply_to
            touched.append(
                {(r.message.bookmark.topic, r.message.bookmark.partition) for r in outcome.removed}
            )
            results = Counter(str(r) for r in outcome.results.values())
            outcomes.append(AckAnswer(sum(results[r] for r in DONE_RESULTS), dict(results)))
        # The backlog the acks freed is leased again while their removals are stored: a crash
        # in between only delivers the acknowledged messages again (they were not answered).
        self.kick()
        unstored = await self._removed(removed, acked_by, now)
        return [
            None if where & unstored else outcome
            for outcome, where in zip(outcomes, touched, strict=True)
        ]

    def _ack(
        self,
        cmd: Command,
        topic: str,
        partition: int,
        now: int,
        acked_by: Mapping[Bookmark, str] | None = None,
    ) -> AckOutcome:
        """One ``queue_ack`` applied to the machine (nothing stored yet); ``acked_by``: who
        acknowledged what earlier in the same batch (not stored yet)."""
        action = (cmd.option("action") or "").strip().lower()
        client = cmd.reply_to
        try:
            if cmd.filter:
                # Every matching message of the partition the command went to, leased or not
                # (the command goes to every partition; each answers for its own).
                matching = compile_filter(cmd.filter)
                bookmarks = [
                    m.bookmark
                    for m in self.machine.browse() + self.machine.leases()
                    if (m.bookmark.topic, m.bookmark.partition) == (topic, partition)
                    and matching.matches(m.body)
                ]
            else:
                bookmarks = [Bookmark.parse(b) for b in _split(cmd.option("bookmarks") or "")]
                if not bookmarks:
                    raise InvalidCommandError(
                        f"queue {self.name!r}: an acknowledgement needs bookmarks or a filter"
                    )
            outcome = self.machine.ack(bookmarks, client=client, action=action, now_ms=now)
        except (ValueError, FilterError) as exc:
            raise InvalidCommandError(f"queue {self.name!r}: {exc}") from exc
        if action == "":
            self._repeats(outcome, client, acked_by or {})
        return outcome

    def _repeats(self, outcome: AckOutcome, client: str, acked_by: Mapping[Bookmark, str]) -> None:
        """Mark GONE bookmarks that this client acknowledged before (a stored ack chunk says
        so, or an ack earlier in the same batch) as ACKED: the answer to the first acknowledgement
        may have been lost with its worker, and a worker taking over reads the first and its
        repeat together."""
        for bookmark, result in outcome.results.items():
            if result is not AckResult.GONE:
                continue
            earlier = acked_by.get(bookmark)
            if earlier is None:
                here = self._held.get((bookmark.topic, bookmark.partition))
                earlier = here.acks.who_acked(bookmark.offset) if here is not None else None
            if earlier is not None and (self.config.leasing != "strict" or earlier == client):
                outcome.results[bookmark] = AckResult.ACKED

    # -- credits ----------------------------------------------------------------------------------

    def credit(self, cmd: Command, topic: str, partition: int) -> None:
        """Apply a ``queue_credit`` command read on ``topic``'s control partition ``partition``
        (no answer: the next report shows it). Raises InvalidCommandError naming a bad option."""
        try:
            grant = CreditGrant.from_options(self.name, topic, partition, cmd.options)
        except ValueError as exc:
            raise InvalidCommandError(f"queue {self.name!r}: {exc}") from None
        key = f"{cmd.reply_to}|{cmd.sub_id}|{topic_ident(cmd.topic, cmd.message_type)}"
        if not self.credits.apply(key, grant):
            self._noticed.pop(key, None)  # report again: the subscriber may be behind
        self._notices_due = True
        self.kick()

    async def send_notices(self) -> int:
        """Send each subscription the report it is owed when it changed; returns how many."""
        if self.credits.whole and not self._notices_due:
            return 0  # leasing within backlogs: the reports stay as they were
        self._notices_due = False
        sent = 0
        for key, spec in list(self._subs.items()):
            body = self.credits.notice(key).to_bytes()
            if self._noticed.get(key) == body:
                continue
            self._noticed[key] = body
            headers = [
                (h.COMMAND, _CREDIT_NOTICE),
                (h.SUB_ID, spec.sub_id.encode()),
                (h.TOPIC, self._name_bytes),
            ]
            await self._sender.send_reply(spec.reply_to, body, headers)
            sent += 1
        return sent

    # -- delivery ---------------------------------------------------------------------------------

    def kick(self) -> None:
        """Something changed: run the delivery loop soon."""
        self._wake.set()

    async def run(self) -> None:
        """The delivery loop: leases, lease timeouts and expiry, for as long as the worker runs."""
        while True:
            deadline = self.machine.next_deadline()
            wait = IDLE_WAIT
            if deadline is not None:
                wait = min(wait, max(0.0, (deadline - _now_ms()) / 1000))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=wait)
            self._wake.clear()
            try:
                await self.deliver_once()
                await self.send_notices()
                now = _now_ms()
                await self.sweep_acks(now)
                self._gauge(now)
                if self.retention and now >= self._next_retention_check:
                    self._next_retention_check = now + RETENTION_CHECK_MS
                    self.check_retention(now)
            except Exception:
                log.exception("queue %s: delivery failed; retrying", self.name)
                await asyncio.sleep(0.5)

    async def deliver_once(self) -> int:
        """Run timeouts and the delivery loop once; returns how many messages were sent."""
        now = _now_ms()
        removed = self.machine.tick(now)
        leases, gone = self.machine.dispatch(now)
        packs: dict[str, list[Lease]] = {}
        for lease in leases:
            spec = self._subs.get(lease.sub_key)
            if spec is None:
                continue
            if lease.sub_key in self._packed:
                packs.setdefault(lease.sub_key, []).append(lease)
                continue
            await self._send_one(spec, lease)
        for key, group in packs.items():
            await self._send_packed(self._subs[key], group)
        await self._removed([*removed, *gone])
        return len(leases)

    async def _send_one(self, spec: SubscriptionSpec, lease: Lease) -> None:
        """One leased message as its own ``publish`` record."""
        message = lease.message
        b = message.bookmark
        # Built as Kafka's pairs straight away: this runs once per message leased.
        headers = [
            (h.COMMAND, _PUBLISH),
            (h.SUB_ID, spec.sub_id.encode()),
            (h.TOPIC, self._name_bytes),
            (h.PARTITION, b"%d" % b.partition),
            (h.OFFSET, b"%d" % b.offset),
            (h.TIMESTAMP, b"%d" % message.timestamp_ms),
            (h.BOOKMARK, b.text().encode()),
            (h.DELIVERIES, b"%d" % lease.deliveries),
        ]
        if lease.lease_expires_ms:
            headers.append((h.LEASE, b"%d" % lease.lease_expires_ms))
        await self._sender.send_reply(spec.reply_to, message.data, headers)
        self._count(b, "delivered")

    async def _send_packed(self, spec: SubscriptionSpec, leases: list[Lease]) -> None:
        """A pass's leases for one subscription as ``publish_packed`` records of at most
        MAX_PACKED_BYTES each (a lease too big for one alone goes as a ``publish`` record)."""
        entries = [self._entry(lease) for lease in leases]
        headers = [
            (h.COMMAND, _PUBLISH_PACKED),
            (h.SUB_ID, spec.sub_id.encode()),
            (h.TOPIC, self._name_bytes),
        ]
        for run in packing.split([len(entry) for entry in entries]):
            if len(run) == 1 and packing.batch_size(len(entries[run[0]]), 1) > (
                packing.MAX_PACKED_BYTES
            ):
                await self._send_one(spec, leases[run[0]])
                continue
            value = packing.pack(entries[run.start : run.stop])
            await self._sender.send_reply(spec.reply_to, value, headers)
            for index in run:
                self._count(leases[index].message.bookmark, "delivered")

    def _entry(self, lease: Lease) -> bytes:
        message = lease.message
        b = message.bookmark
        topic = self._topic_bytes.get(b.topic)
        if topic is None:
            topic = self._topic_bytes[b.topic] = b.topic.encode()
        return packing.lease_entry(
            topic,
            b.partition,
            b.offset,
            message.timestamp_ms,
            lease.deliveries,
            lease.lease_expires_ms,
            message.data,
        )

    async def sweep_acks(self, now: int, *, force: bool = False) -> int:
        """Delete the ack chunks older than ACK_MEMORY_MS (every ACK_SWEEP_MS, or now with
        ``force``); returns how many went."""
        if now < self._next_sweep and not force:
            return 0
        self._next_sweep = now + ACK_SWEEP_MS
        writes = []
        for (topic, partition), here in list(self._held.items()):
            old: dict[bytes, bytes | None] = dict.fromkeys(here.acks.due(now, ACK_MEMORY_MS))
            if old:
                writes.append((topic, partition, old))
        # Each log partition's store commits on its own: wait for them together.
        await asyncio.gather(*(self._store(*write) for write in writes))
        return sum(len(old) for _, _, old in writes)

    async def _removed(
        self, removed: list[Removed], acked_by: Mapping[Bookmark, str] | None = None, now: int = 0
    ) -> set[tuple[str, int]]:
        """Record what left the queue in its partitions' ledgers (a stored copy is deleted; an
        acknowledgement is remembered with its client), raise expiry events, and store it: one
        write per log partition. Returns the log partitions whose store did not take it
        (revoked meanwhile: their next owner still has the messages)."""
        deleted: dict[tuple[str, int], dict[bytes, bytes | None]] = {}
        acked: dict[tuple[str, int], dict[str, list[int]]] = {}
        for item in removed:
            b = item.message.bookmark
            where = (b.topic, b.partition)
            changes = deleted.setdefault(where, {})
            here = self._held.get(where)
            if here is not None:
                here.ledger.finish(b.offset)
                if b.offset in here.copies:
                    here.copies.discard(b.offset)
                    changes[entry_key(self.name, b.offset)] = None
            client = acked_by.get(b) if acked_by else None
            if client is not None:
                acked.setdefault(where, {}).setdefault(client, []).append(b.offset)
            self._count(b, item.reason or "acked")
            if item.reason in EXPIRY_REASONS:
                event = {
                    "queue": self.name,
                    "bookmark": b.text(),
                    "reason": item.reason,
                    "deliveries": item.message.deliveries,
                    "cancels": item.message.cancels,
                    **expired_body(self.codec, item.message.data),
                }
                await self._sender.send(
                    self.names.queue_expired(self.name),
                    orjson.dumps(event),
                    key=b.text().encode(),
                )
        if self.view_feed is not None:
            # Every change of availability passes here (leases, returns, removals, appends via
            # the delivery loop). Views learn of a removal before it is stored: a crash in
            # between leaves the message stored, available again to the next owner.
            await self.view_feed.flush(wait_for=[item.message.bookmark for item in removed])
        # Each log partition's store commits on its own: wait for them together.
        writes = {
            where: self._write(where, changes, acked.get(where, {}), now)
            for where, changes in deleted.items()
        }
        stored = await asyncio.gather(*writes.values())
        return {where for where, ok in zip(writes, stored, strict=True) if not ok}

    async def _write(
        self,
        where: tuple[str, int],
        deleted: dict[bytes, bytes | None],
        acked: Mapping[str, list[int]],
        now: int,
    ) -> bool:
        """Store one partition's removals: its ledger as it stands when the write's turn comes,
        the deleted copies, and an ack chunk per client (remembered once stored: a repeat is
        answered as done only after the first acknowledgement is)."""
        here = self._held.get(where)
        chunks = (
            [here.acks.chunk(client, offsets, now) for client, offsets in acked.items()]
            if here is not None
            else []
        )
        name = self.name

        def changes() -> dict[bytes, bytes | None]:
            made = dict(deleted)
            current = self._held.get(where)  # as held when the write's turn comes
            if current is not None:
                made[ledger_key(name)] = current.ledger.to_bytes()
            for chunk in chunks:
                made[chunk.key] = chunk.to_bytes()
            return made

        ok = await self._store(where[0], where[1], changes)
        if ok and here is not None and self._held.get(where) is here:
            for chunk in chunks:
                here.acks.restore(chunk)
        return ok

    def _count(self, bookmark: Bookmark, what: str) -> None:
        counts = self.counts.get((bookmark.topic, bookmark.partition))
        if counts is not None:
            counts[what] += 1
        child = self._events.get(what)
        if child is None:
            child = self._events[what] = metrics.QUEUE_MESSAGES.labels(self.name, what)
        child.inc()

    def _gauge(self, now: int) -> None:
        """Set the depth gauges, at most once per IDLE_WAIT: the loop wakes for every batch of
        appends and acks, and the machine's stats walk every subscription."""
        if now < self._next_gauge:
            return
        self._next_gauge = now + int(IDLE_WAIT * 1000)
        stats = self.machine.stats()
        self._depth_available.set(stats.available)
        self._depth_leased.set(stats.leased)

    # -- reading ----------------------------------------------------------------------------------

    def status(self, topic: str, partition: int) -> dict[str, Any]:
        """Depth, leased, the ages and priority levels, and the counters of one log partition
        (``schemas/QueueStatus.avsc``)."""
        here = [
            m
            for m in self.machine.browse() + self.machine.leases()
            if m.bookmark.topic == topic and m.bookmark.partition == partition
        ]
        leased = sum(1 for m in here if m.leased_to is not None)
        counts = self.counts.get((topic, partition), Counter())
        ages = queue_ages(here, _now_ms(), prioritised=self.config.priority is not None)
        row: dict[str, Any] = {"depth": len(here), "leased": leased}
        # Left out at zero, as the counters are (the schema's defaults).
        figures = {
            "seconds_behind": ages.seconds_behind,
            "age_of_oldest_lease": ages.age_of_oldest_lease,
            "priority_count": ages.priority_count,
            "priorities": list(ages.priorities or ()),
        }
        row.update((name, value) for name, value in figures.items() if value)
        return {**row, **counts}

    def browse(
        self, topic: str, partition: int, filter: str | None, identity: str = ""
    ) -> list[tuple[str, bytes, int]]:
        """Available messages of one log partition that ``identity`` is entitled to:
        ``(bookmark, data, timestamp)``."""
        return [
            (m.bookmark.text(), m.data, m.timestamp_ms)
            for m in self.machine.browse(filter)
            if m.bookmark.topic == topic
            and m.bookmark.partition == partition
            and self.entitled(identity, m.body)
        ]


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]
