"""A live subscription as the application sees it: an iterator of messages or a callback.

The engine answers a subscription on every partition separately. This class stitches the answers
into what AMPS promises: the SOW part first, then live messages, each record's updates in log
order and none twice. Live messages that arrive while the SOW part is still coming are held back;
when a partition's part ends, its watermark says which of them the snapshot already covers.
Replayed messages (after a worker failover) are dropped by their (partition, log offset) sequence.
Paginated subscriptions (top_n) keep their window here, over their own sorted result set.
Aggregated subscriptions (grouping and projection) combine here the groups each partition
sends (``sowstream.sow.aggregate.live.CombinedGroups``) and show each group's changes.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import orjson

from sowstream.client.messages import Message
from sowstream.errors import SubscriptionDroppedError
from sowstream.messagetypes import MessageType, registry
from sowstream.sow.aggregate import Aggregation
from sowstream.sow.aggregate.live import CombinedGroups, group_sow_key
from sowstream.sow.bookmarks import EPOCH, message_bookmark
from sowstream.subscriptions.delta import (
    has_changes,
    project,
    project_delta,
    with_fields,
)
from sowstream.subscriptions.model import OOF, OOF_DELETED, OOF_MATCH, PUBLISH, SubscriptionSpec
from sowstream.subscriptions.options import SubscriptionOptions
from sowstream.subscriptions.window import PageWindow, ResultSet
from sowstream.wire import headers as h

# Messages the client holds for an application that does not read: beyond this the client stops
# reading its reply topic, so the backlog stays in Kafka where the engine's slow-consumer policy
# sees it.
MAX_BUFFERED = 10_000

MessageHandler = Callable[[Message], None]

# The snapshot covers every operation up to its watermark, including all records one delete by
# filter removed there (seq 1..n).
CUT_SEQ = 10**9

# Reasons to hold live messages back (Subscription.hold): a SOW part or a placement being read,
# and a placement again after the engine ended the subscription.
PLACEMENT = "placement"
RESUME = "resume"


log = logging.getLogger("sowstream.client.subscription")


@dataclass
class _Live:
    """A live message as read from the reply topic."""

    command: str
    topic: str
    partition: int
    offset: int
    sow_key: str
    data: bytes
    timestamp: int
    reason: str
    delta: bool
    seq: int = 0
    bookmark: str = ""  # queue deliveries: what to acknowledge
    deliveries: int = 0
    lease_expires: int | None = None

    @property
    def position(self) -> str:
        """Where it is in its log, for debug logs: ``command p<partition>@<offset>#<seq> key``."""
        return f"{self.command} p{self.partition}@{self.offset}#{self.seq} {self.sow_key}"

    @classmethod
    def from_headers(cls, value: bytes | None, headers: dict[str, str]) -> _Live:
        """The live message carried by a reply-topic record's value and ``sow.*`` headers."""
        return cls(
            headers.get(h.COMMAND, ""),
            headers.get(h.TOPIC, ""),
            int(headers.get(h.PARTITION, "-1")),
            int(headers.get(h.OFFSET, "-1")),
            headers.get(h.SOW_KEY, ""),
            value or b"",
            int(headers.get(h.TIMESTAMP, "0")),
            headers.get(h.REASON, ""),
            headers.get(h.DELTA) == "1",
            int(headers.get(h.SEQ, "0")),
            headers.get(h.BOOKMARK, ""),
            int(headers.get(h.DELIVERIES, "0")),
            int(headers[h.LEASE]) if headers.get(h.LEASE) else None,
        )


class Subscription:
    """Messages of one subscription, in order: ``for message in subscription: ...``.

    With an ``on_message`` handler the messages go to it instead (called on the client's reply
    reader thread, so it must not block for long).
    """

    def __init__(
        self,
        sub_id: str,
        specs: list[SubscriptionSpec],
        user_options: SubscriptionOptions,
        *,
        key_fields: dict[str, tuple[str, ...]],
        patterns: dict[str, str] | None = None,
        codec: MessageType | None = None,
        window: PageWindow | None = None,
        on_message: MessageHandler | None = None,
        unsubscribe: Callable[[Subscription], None] | None = None,
        aggregation: Aggregation | None = None,
    ) -> None:
        self.sub_id = sub_id
        self.specs = specs
        self.options = user_options
        self._keys = key_fields
        # Pattern topics: live messages carry the name a record was published under; order and
        # cuts are kept per topic (one log), so each name is mapped back to its Pattern topic.
        self._own = {spec.topic for spec in specs}
        self._patterns = [(re.compile(p), topic) for topic, p in (patterns or {}).items()]
        # The topics' message type when not json: messages carry it (Message.fields), and a
        # window reads and writes records with it.
        self._codec = codec
        self._type = codec or registry.get(registry.JSON)
        self._window = window
        self._handler = on_message
        self._unsubscribe = unsubscribe
        self._queue: queue.Queue[Message | BaseException | None] = queue.Queue()
        self._lock = threading.Lock()
        # Why live messages are held back (released when none is left): the SOW part or the
        # placement being read, a replace, a placement again after the engine ended it. Each
        # reason is released by its own step, so one finishing does not let go what another
        # still holds (the first placement ending while the engine already ended it).
        self._holds: set[str] = {PLACEMENT}
        self._held: list[_Live] = []
        self._last: dict[tuple[str, int], tuple[int, int]] = {}
        self._times: dict[tuple[str, int], int] = {}  # log time of the last message let through
        self._closed = False
        # Why the engine ended this subscription each time the client placed it again.
        self.interruptions: list[str] = []
        self._delivered: _Live | None = None  # the last live message let through
        # Aggregated: every partition's groups, and each group's record as the application
        # last saw it (by group key).
        self._groups = CombinedGroups(aggregation) if aggregation is not None else None
        self._shown: dict[str, dict[str, Any]] = {}

    @property
    def last_bookmark(self) -> str:
        """Bookmark of the last live message delivered ("" before any), for MOST_RECENT."""
        live = self._delivered
        return message_bookmark(live.timestamp, live.partition, live.offset) if live else ""

    @property
    def aggregated(self) -> bool:
        """Whether it delivers groups (grouping and projection) rather than records."""
        return self._groups is not None

    @property
    def closed(self) -> bool:
        """Whether the application closed it (or it failed)."""
        return self._closed

    def resume_bookmarks(self) -> dict[tuple[str, int], str]:
        """Per (topic, partition), the bookmark to place this subscription again from: right
        after the last message let through (or the SOW part's cut), so the replay leaves no gap;
        what it repeats is dropped by sequence. A delete by filter or expiry whose messages
        came only in part (several share an offset) is replayed from its offset."""
        with self._lock:
            out: dict[tuple[str, int], str] = {}
            for (topic, partition), (offset, seq) in self._last.items():
                start = offset - 1 if 0 < seq < CUT_SEQ else offset
                if start < 0:
                    out[(topic, partition)] = EPOCH
                else:
                    at = self._times.get((topic, partition), 0)
                    out[(topic, partition)] = message_bookmark(at, partition, start)
            return out

    # -- reader-thread side ------------------------------------------------------------------------

    def backlog(self) -> int:
        """Messages waiting for the application."""
        return self._queue.qsize() + len(self._held)

    def on_live(self, live: _Live) -> None:
        """A live message arrived for this subscription."""
        with self._lock:
            if self._closed:
                return
            if self._holds:
                log.debug("%s: held %s", self.sub_id, live.position)
                self._held.append(live)
                return
            self._accept(live)

    def fail(self, error: BaseException) -> None:
        """End the subscription with ``error`` (raised to the iterating application)."""
        with self._lock:
            self._closed = True
        self._emit(error)

    # -- placement (application thread) ------------------------------------------------------------

    def hold(self, reason: str = PLACEMENT) -> None:
        """Hold live messages back while a SOW part, a replace or a placement again is read."""
        with self._lock:
            self._holds.add(reason)

    def set_cut(self, topic: str, partition: int, watermark: int) -> None:
        """The SOW part of ``partition`` reflects the log up to ``watermark``."""
        with self._lock:
            where = (topic, partition)
            log.debug(
                "%s: cut %s/%d at %d (was %s)",
                self.sub_id,
                topic,
                partition,
                watermark,
                self._last.get(where),
            )
            self._last[where] = max(self._last.get(where, (-1, 0)), (watermark, CUT_SEQ))

    def reset_partition(self, topic: str, partition: int, watermark: int) -> None:
        """The partition's log was recreated: its offsets start over after ``watermark``, so
        later messages are new even where their offsets are below those seen before."""
        with self._lock:
            self._last[(topic, partition)] = (watermark, CUT_SEQ)

    def load_groups(self, topic: str, partition: int, partials: dict[str, Any]) -> None:
        """An aggregated subscription's placement: ``partition`` holds these groups."""
        assert self._groups is not None
        with self._lock:
            self._groups.load((self._stream(topic), partition), partials)

    def deliver_groups(self, messages: Iterator[Message], with_sow: bool) -> None:
        """An aggregated subscription's placement is complete: show its groups (as the SOW part
        when ``with_sow``, else only take note of them)."""
        assert self._groups is not None
        begin = end = None
        for msg in messages:
            if msg.command == "group_begin":
                begin = msg
            elif msg.command == "group_end":
                end = msg
        with self._lock:
            records = self._groups.records()
            self._shown = dict(records)
        if not with_sow:
            return
        topic = self.specs[0].topic
        self._emit(Message("group_begin", query_id=begin.query_id if begin else ""))
        for key, record in records.items():
            self._emit(
                Message(
                    "sow",
                    topic,
                    "" if self.options.no_sowkey else group_sow_key(topic, key),
                    query_id=begin.query_id if begin else "",
                    data=self._type.serialise(record),
                    sub_id=self.sub_id,
                    codec=self._codec,
                )
            )
        self._emit(Message("group_end", query_id=end.query_id if end else "", count=len(records)))

    def reconcile_groups(self) -> None:
        """After an aggregated subscription was placed again: show what changed meanwhile."""
        assert self._groups is not None
        with self._lock:
            held = self._groups.records()
            for key in [*self._shown, *(k for k in held if k not in self._shown)]:
                self._show_group(key, None)

    def release_through(self, cuts: dict[tuple[str, int], int]) -> None:
        """Deliver the held messages a replace's answer does not cover yet: those at or before
        each partition's replace point were sent under the old filter and go first."""
        with self._lock:
            keep: list[_Live] = []
            for live in self._held:
                if live.offset <= cuts.get((self._stream(live.topic), live.partition), -1):
                    self._accept(live)
                else:
                    keep.append(live)
            self._held = keep

    def replace_window(self, results: ResultSet, group: Iterator[Message]) -> None:
        """A paginated subscription's replace: move the window to the new filter's result set
        (the old one updated by the replace's answer) and show what changed on the page."""
        assert self._window is not None
        begin = end = None
        for msg in group:
            if msg.command == "group_begin":
                begin = msg
            elif msg.command == "group_end":
                end = msg
            elif msg.command == "sow":
                results.apply(msg.sow_key, self._type.parse(msg.data))
            elif msg.command == "oof":
                results.apply(msg.sow_key, None)
        entered: list[Message] = []
        left: list[Message] = []
        topic, codec = self.specs[0].topic, self._codec
        for event in self._window.move_to(results):
            data = self._shape(event.record)
            if event.kind == "leave":
                if self.options.oof:
                    left.append(
                        Message(
                            "oof", topic, event.sow_key, data=data, reason=OOF_MATCH, codec=codec
                        )
                    )
            elif event.kind == "enter":
                entered.append(
                    Message("sow", topic, event.sow_key, data=data, sub_id=self.sub_id, codec=codec)
                )
        query_id = begin.query_id if begin is not None else ""
        for msg in [Message("group_begin", query_id=query_id), *entered]:
            self._emit(msg)
        self._emit(Message("group_end", query_id=end.query_id if end else "", count=len(entered)))
        for msg in left:
            self._emit(msg)

    @property
    def window(self) -> PageWindow | None:
        """The page window of a paginated subscription."""
        return self._window

    def release(self, reason: str = PLACEMENT) -> None:
        """What ``reason`` held for is complete: once nothing else holds, let the held live
        messages through, each partition's in log order. A partition's owner sends live
        messages as soon as it reads the registration, and its replay from a bookmark only
        when it runs the placement, so a replayed message can arrive after a later live one: in
        arrival order the replayed one would look like a repeat and be dropped. Of two messages
        at one position the later is kept: a placement's replay comes after what the owner sent
        on reading the registration, and only the replay knows what the subscriber held at its
        bookmark (a conflated oof built before it may carry a state the subscriber never had)."""
        with self._lock:
            self._holds.discard(reason)
            if self._holds:
                log.debug("%s: %s done, still holding for %s", self.sub_id, reason, self._holds)
                return
            held, self._held = self._held, []
            log.debug("%s: released %d held", self.sub_id, len(held))
            held.reverse()  # a stable sort then puts the later of equal positions first
            held.sort(
                key=lambda live: (self._stream(live.topic), live.partition, live.offset, live.seq)
            )
            for live in held:
                self._accept(live)

    def deliver_group(self, messages: Iterator[Message]) -> None:
        """Pass the SOW part's messages (group_begin … group_end) to the application."""
        if self._window is not None:
            messages = self._windowed_group(messages)
        for msg in messages:
            if self.options.no_sowkey and msg.sow_key:
                msg = replace(msg, sow_key="")  # the SOW part as live messages: no SowKey
            self._emit(msg)

    # -- rules -------------------------------------------------------------------------------------

    def _stream(self, topic: str) -> str:
        """The topic whose log a message with topic name ``topic`` came from."""
        if topic in self._own or not self._patterns:
            return topic
        for regex, owner in self._patterns:
            if regex.fullmatch(topic):
                return owner
        return topic

    def _accept(self, live: _Live) -> None:
        where = (self._stream(live.topic), live.partition)
        seq = (live.offset, live.seq)
        if seq <= self._last.get(where, (-1, 0)):
            log.debug("%s: dropped %s (at %s)", self.sub_id, live.position, self._last.get(where))
            return  # already covered by the snapshot, or a replay after a failover
        self._last[where] = seq
        self._times[where] = live.timestamp
        self._delivered = live
        if self._groups is not None:
            entries = orjson.loads(live.data)
            for key in self._groups.update(where, entries):
                self._show_group(key, live)
            return
        if self._window is not None:
            for msg in self._windowed(live):
                self._emit(msg)
            return
        self._emit(self._message(live))

    def _show_group(self, key: str, live: _Live | None) -> None:
        """Tell the application how group ``key`` changed, if it did (caller holds the lock)."""
        assert self._groups is not None
        record = self._groups.record(key)
        old = self._shown.get(key)
        if record == old:
            return  # a change inside the group that its record does not show
        topic = self.specs[0].topic
        fields: dict[str, Any] = {
            "topic": topic,
            "sow_key": "" if self.options.no_sowkey else group_sow_key(topic, key),
            "sub_id": self.sub_id,
            "codec": self._codec,
        }
        if live is not None:
            fields["timestamp"] = live.timestamp
            fields["bookmark"] = message_bookmark(live.timestamp, live.partition, live.offset)
        if record is None:
            del self._shown[key]
            if self.options.oof and old is not None:
                data = self._type.serialise(old)
                self._emit(Message(OOF, data=data, reason=OOF_DELETED, **fields))
            return
        self._shown[key] = record
        codec = self._type
        if old is not None and self.specs[0].delta and codec.supports_delta:
            keys = self._groups.aggregation.grouping_outputs
            delta = codec.changed(old, record)
            if self.options.no_empties and not has_changes(delta, keys):
                return
            data = codec.serialise_delta(with_fields(delta, record, keys))
            self._emit(Message(PUBLISH, data=data, delta=True, **fields))
            return
        self._emit(Message(PUBLISH, data=codec.serialise(record), **fields))

    def _message(self, live: _Live, **changes: Any) -> Message:
        fields: dict[str, Any] = {
            "command": live.command,
            "topic": live.topic,
            "sow_key": "" if self.options.no_sowkey else live.sow_key,
            "data": live.data,
            "timestamp": live.timestamp,
            "reason": live.reason,
            "sub_id": self.sub_id,
            "delta": live.delta,
            "bookmark": message_bookmark(live.timestamp, live.partition, live.offset),
            "codec": self._codec,
        }
        fields.update(changes)
        return Message(**fields)

    def _windowed_group(self, messages: Iterator[Message]) -> Iterator[Message]:
        """Load the SOW part into the shared result set; show only the window."""
        assert self._window is not None
        results = self._window.results
        end: Message | None = None
        for msg in messages:
            if msg.command == "sow":
                results.upsert(msg.sow_key, self._type.parse(msg.data))
            elif msg.command == "group_begin":
                yield msg
            elif msg.command == "group_end":
                end = msg
        self._window.reset()
        members = self._window.members()
        for key in members:
            record = results.get(key)
            assert record is not None
            yield Message(
                "sow",
                topic=self.specs[0].topic,
                sow_key=key,
                data=self._shape(record),
                sub_id=self.sub_id,
                codec=self._codec,
            )
        if end is not None:
            yield Message("group_end", query_id=end.query_id, count=len(members))

    def _shape(self, record: dict[str, Any]) -> bytes:
        select = self.options.select
        return self._type.serialise(record if select is None else project(record, select))

    def _windowed(self, live: _Live) -> Iterator[Message]:
        """Turn a change of the whole filtered set into what the page window shows."""
        assert self._window is not None
        results = self._window.results
        previous = results.get(live.sow_key)
        record = self._type.parse(live.data) if live.command == PUBLISH else None
        change = results.apply(live.sow_key, record)
        for event in self._window.events(change):
            if event.kind == "leave":
                if not self.options.oof:
                    continue
                reason = live.reason if event.sow_key == live.sow_key and record is None else ""
                yield self._message(
                    live,
                    command=OOF,
                    sow_key=event.sow_key,
                    data=self._shape(event.record),
                    reason=reason or OOF_MATCH,
                    delta=False,
                )
            elif (
                event.kind == "update"
                and self.specs[0].delta
                and self._type.supports_delta
                and previous is not None
            ):
                delta = self._type.changed(previous, event.record)
                if self.options.select is not None:
                    delta = project_delta(delta, self.options.select)
                keys = self._keys.get(self._stream(live.topic), ())
                if self.options.no_empties and not has_changes(delta, keys):
                    continue
                delta = with_fields(delta, event.record, keys)
                yield self._message(
                    live,
                    command=PUBLISH,
                    sow_key=event.sow_key,
                    data=self._type.serialise_delta(delta),
                    delta=True,
                )
            else:
                yield self._message(
                    live,
                    command=PUBLISH,
                    sow_key=event.sow_key,
                    data=self._shape(event.record),
                    reason="",
                    delta=False,
                )

    def _emit(self, item: Message | BaseException) -> None:
        if self._handler is not None and isinstance(item, Message):
            self._handler(item)
        else:
            self._queue.put(item)

    # -- application side --------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        item = self._queue.get()
        if item is None:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def next(self, timeout: float | None = None) -> Message | None:
        """The next message, or None if none arrives within ``timeout`` seconds."""
        return next_message(self._queue, timeout)

    def close(self) -> None:
        """Unsubscribe; iteration ends after the messages already received."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._unsubscribe is not None:
            self._unsubscribe(self)
        self._queue.put(None)

    unsubscribe = close

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def next_message(
    pending: queue.Queue[Message | BaseException | None], timeout: float | None
) -> Message | None:
    """The next message handed to the application: None when none comes within ``timeout`` or
    the subscription has ended (the end mark stays for later calls); a failure is raised."""
    try:
        item = pending.get(timeout=timeout)
    except queue.Empty:
        return None
    if item is None:
        pending.put(None)
        return None
    if isinstance(item, BaseException):
        raise item
    return item


__all__ = ["MAX_BUFFERED", "ResultSet", "Subscription", "SubscriptionDroppedError"]
