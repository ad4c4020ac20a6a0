"""A queue subscription: leased messages, and the acknowledgements that remove them.

Each message delivered on a queue is leased to this subscription until it is acknowledged,
returned (``cancel``), forced to expire (``expire``), or its lease ends. Acknowledgements go to
the engine in batches: one command per log partition for every ``ack_batch_size`` messages, or
``ack_interval`` seconds after the first one batched, and whatever is left when the subscription
is flushed or closed. With ``auto_ack`` the client
acknowledges a message once the application is done with it: when it asks for the next one, or
when ``on_message`` returns (a handler that raises returns the message to the queue instead).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from sowstream.client.messages import Message
from sowstream.client.subscription import MessageHandler, _Live, next_message
from sowstream.errors import CorruptReplyError, InvalidCommandError, SowstreamError
from sowstream.messagetypes import MessageType
from sowstream.queues.credits import CreditGrant, CreditLedger, CreditNotice, Where
from sowstream.subscriptions.model import SubscriptionSpec
from sowstream.subscriptions.options import parse_options
from sowstream.wire.leases import LeaseBatch

# Sends one batch of acknowledgements: (the queue, its bookmarks, action "" | "cancel" |
# "expire", and whether to wait until the engine has applied them).
AckSender = Callable[[str, list[str], str, bool], None]
_ACTIONS = ("", "cancel", "expire")
# Sends credit grants to the partitions' owners (queue_credit commands; no answer).
CreditSender = Callable[[list[CreditGrant]], None]
# How long the first grant waits to have heard from every partition of the queues (a partition
# whose owner is away must not hold the others up for longer).
CREDIT_WAIT = 1.0
# How many of the last damaged lease batches a subscription keeps (QueueSubscription.damaged).
KEEP_DAMAGED = 100

log = logging.getLogger("sowstream.client")


class QueueSubscription:
    """Messages leased from a queue: ``for message in sub: ...; sub.ack(message)``."""

    def __init__(
        self,
        sub_id: str,
        specs: list[SubscriptionSpec],
        send_acks: AckSender,
        *,
        auto_ack: bool = False,
        ack_batch_size: int = 1,
        ack_interval: float = 1.0,
        on_message: MessageHandler | None = None,
        unsubscribe: Callable[[QueueSubscription], None] | None = None,
        codec: MessageType | None = None,
        partitions: Iterable[Where] = (),
        send_credits: CreditSender | None = None,
    ) -> None:
        if ack_batch_size < 1:
            raise ValueError(f"ack_batch_size must be at least 1, got {ack_batch_size}")
        self.sub_id = sub_id
        self.specs = specs
        self.auto_ack = auto_ack
        self.ack_batch_size = ack_batch_size
        self.ack_interval = ack_interval
        self._timer: threading.Timer | None = None
        self._send_acks = send_acks
        self._handler = on_message
        self._unsubscribe = unsubscribe
        self._codec = codec  # the queue's message type; None for json
        self._queue: queue.Queue[Message | BaseException | None] = queue.Queue()
        self._lock = threading.Lock()
        # Batched bookmarks per (action, queue): one subscription may cover several queues.
        self._batch: dict[tuple[str, str], list[str]] = {}
        self._queues = tuple(spec.topic for spec in specs)
        self._current: Message | None = None  # auto_ack: handed out, acknowledged on the next
        self._closed = False
        # Why the engine ended this subscription each time the client registered it again.
        self.interruptions: list[str] = []
        # Lease batches (or leases in one) that could not be read, each naming the problem;
        # their leases return when they end, or when the subscription closes.
        self.damaged: deque[CorruptReplyError] = deque(maxlen=KEEP_DAMAGED)
        # The fields every message of a lease batch shares, as Message() would set them.
        self._shared: dict[str, Any] = dict(Message("publish", sub_id=sub_id, codec=codec).__dict__)
        # The effective backlog the engine reported in its processed ack (None: not yet).
        self._max_backlog: int | None = None
        self._acked = threading.Event()
        # Over several workers the backlog is shared out as credit (sowstream.queues.credits):
        # the ledger follows the workers' reports and decides the grants.
        self._ledger = CreditLedger(partitions, time.monotonic() + CREDIT_WAIT)
        self._credit_lock = threading.Lock()
        self._send_credits = send_credits
        if send_credits is not None:
            timer = threading.Timer(CREDIT_WAIT + 0.05, self._grant)
            timer.daemon = True
            timer.start()

    last_bookmark = ""  # a queue subscription never resumes from a bookmark

    @property
    def closed(self) -> bool:
        """Whether the application closed it (or it failed)."""
        return self._closed

    # -- reader-thread side ------------------------------------------------------------------------

    def backlog(self) -> int:
        """Messages waiting for the application."""
        return self._queue.qsize()

    def on_live(self, live: _Live) -> None:
        """A leased message arrived."""
        self._deliver(
            Message(
                "publish",
                topic=live.topic,
                data=live.data,
                timestamp=live.timestamp,
                sub_id=self.sub_id,
                bookmark=live.bookmark,
                deliveries=live.deliveries,
                lease_expires=live.lease_expires,
                codec=self._codec,
            )
        )

    def on_packed(self, topic: str, data: bytes) -> None:
        """A lease batch (``sowstream.wire.leases``) for queue ``topic`` arrived: each lease is
        delivered as :meth:`on_live` delivers one. A batch that cannot be read, or a lease in
        it that cannot, is logged and kept in :attr:`damaged`; the other leases go on."""
        try:
            batch = LeaseBatch(data)
        except CorruptReplyError as exc:
            self._damaged(topic, exc)
            return
        # Read at once rather than on first use: every message is acknowledged by its
        # bookmark, so each would be read moments later anyway, and a damaged lease is then
        # dropped here alone instead of failing the application when a field is read.
        new = object.__new__
        shared = self._shared
        for index in range(batch.count):
            try:
                lease = batch.lease(index)
            except CorruptReplyError as exc:
                self._damaged(topic, exc)
                continue
            # Made as Message() would make it, without a frozen dataclass's field-by-field init.
            msg = new(Message)
            fields = msg.__dict__
            fields.update(shared)
            fields["topic"] = topic
            fields["data"] = lease.data
            fields["timestamp"] = lease.timestamp
            fields["bookmark"] = lease.bookmark
            fields["deliveries"] = lease.deliveries
            fields["lease_expires"] = lease.lease_expires
            self._deliver(msg)

    def _damaged(self, topic: str, exc: CorruptReplyError) -> None:
        error = CorruptReplyError(f"queue subscription {self.sub_id} on {topic!r}: {exc}")
        log.error("%s; its leases return when they end or the subscription closes", error)
        self.damaged.append(error)

    def _deliver(self, msg: Message) -> None:
        if self._handler is None:
            self._queue.put(msg)
            return
        try:
            self._handler(msg)
        except Exception:
            if self.auto_ack:
                self._add(msg, "cancel")
            raise
        if self.auto_ack:
            self._add(msg, "")

    def on_processed(self, options: str) -> None:
        """The engine's processed ack arrived: it leases, with ``max_backlog=<n>`` in
        ``options`` (each worker acknowledges; every one reports the same value)."""
        try:
            found = parse_options(options).max_backlog
        except InvalidCommandError:
            return  # not options this client reads: nothing to learn from it
        if found is not None and self._max_backlog is None:
            self._max_backlog = found
            with self._credit_lock:
                self._ledger.backlog = found
            self._acked.set()
            self._grant()

    def on_credit(self, data: bytes) -> None:
        """A worker's credit report arrived: grant what it makes possible."""
        try:
            notice = CreditNotice.from_bytes(data)
        except ValueError as exc:
            log.warning("queue subscription %s: %s", self.sub_id, exc)
            return
        with self._credit_lock:
            self._ledger.notice(notice)
        self._grant()

    def _grant(self) -> None:
        send = self._send_credits
        if send is None or self._closed:
            return
        # Planned and sent under the lock: grants to one partition leave in sequence order.
        with self._credit_lock:
            grants = self._ledger.plan(time.monotonic())
            if grants:
                try:
                    send(grants)
                except SowstreamError as exc:
                    log.warning("queue subscription %s: credit not sent: %s", self.sub_id, exc)

    @property
    def max_backlog(self) -> int | None:
        """The effective backlog the engine reported (AMPS's ``max_backlog`` in the subscribe
        ack): the smaller of what was asked and the queues' MaxPerSubscriptionBacklog. None
        until the engine's acknowledgement has arrived (see :meth:`wait_processed`)."""
        return self._max_backlog

    def wait_processed(self, timeout: float | None = None) -> int | None:
        """Wait for the engine's acknowledgement; the effective backlog, or None if it did not
        come within ``timeout`` seconds."""
        self._acked.wait(timeout)
        return self._max_backlog

    def fail(self, error: BaseException) -> None:
        """End the subscription with ``error`` (raised to the iterating application)."""
        with self._lock:
            self._closed = True
        self._queue.put(error)

    # -- acknowledgements --------------------------------------------------------------------------

    def ack(self, message: Message) -> None:
        """Done with ``message``: remove it from the queue."""
        self._add(message, "")

    def cancel(self, message: Message) -> None:
        """Give ``message`` back to the queue now, for another delivery (counts as a cancel)."""
        self._add(message, "cancel")

    def expire(self, message: Message) -> None:
        """Expire ``message`` now (reason ``forced_expire``): it is not delivered again."""
        self._add(message, "expire")

    @property
    def queues(self) -> tuple[str, ...]:
        """The queues this subscription leases from (several for a regular expression)."""
        return self._queues

    def _queue_of(self, message: Message) -> str:
        # A delivery names its queue in its topic; with one queue, that is the one.
        if len(self._queues) == 1 or message.topic not in self._queues:
            return self._queues[0]
        return message.topic

    def _add(self, message: Message, action: str) -> None:
        where = (action, self._queue_of(message))
        with self._lock:
            batch = self._batch.setdefault(where, [])
            batch.append(message.bookmark)
            if len(batch) < self.ack_batch_size:
                if self._timer is None:
                    # The first one batched: a partial batch goes out after ack_interval anyway.
                    self._timer = threading.Timer(self.ack_interval, self.flush_acks)
                    self._timer.daemon = True
                    self._timer.start()
                return
            del self._batch[where]
        self._send_acks(where[1], batch, action, False)

    def flush_acks(self, wait: bool = False) -> None:
        """Send the acknowledgements still batched; with ``wait``, return once the engine has
        applied them."""
        with self._lock:
            batches, self._batch = self._batch, {}
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        # Acknowledgements before cancels before expiries, as they were always sent.
        for (action, queue_name), bookmarks in sorted(
            batches.items(), key=lambda item: (_ACTIONS.index(item[0][0]), item[0][1])
        ):
            if bookmarks:
                self._send_acks(queue_name, bookmarks, action, wait)

    # -- application side --------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        msg = self.next()
        while msg is None:
            msg = self.next(timeout=1.0)
            if msg is None and self._closed:
                raise StopIteration
        return msg

    def next(self, timeout: float | None = None) -> Message | None:
        """The next leased message, or None if none arrives within ``timeout`` seconds."""
        self._done_with_current()
        item = next_message(self._queue, timeout)
        if item is not None and self.auto_ack:
            self._current = item
        return item

    def _done_with_current(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            self._add(current, "")

    def close(self) -> None:
        """Unsubscribe: acknowledgements batched so far are applied first, then the leases still
        held return."""
        with self._lock:
            if self._closed and self._unsubscribe is None:
                return
            self._closed = True
        self._done_with_current()
        # Applied before the leases return: acks and the unsubscribe travel on different
        # topics, and a lease returned first would put an acknowledged message back in the
        # queue, for another subscriber to process again.
        try:
            self.flush_acks(wait=True)
        except SowstreamError as exc:
            log.warning(
                "queue subscription %s: last acknowledgements not confirmed: %s", self.sub_id, exc
            )
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe(self)
        self._queue.put(None)

    unsubscribe = close

    def __enter__(self) -> QueueSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
