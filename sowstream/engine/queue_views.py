"""A queue as views see it: a SOW topic of the queue's available messages, kept by the engine.

A view over a queue sees the messages that are available now: one leaves it when it is leased
(or acknowledged, expired, removed), and comes back when its lease ends without an
acknowledgement. Leases live in the worker's memory and are lost with it, so the changes cannot
be replayed from a log the way a topic's can. Instead the worker that owns a log partition's
queue messages *states* their availability on a SOW topic of their own
(``<queue>.available``, ``config.queues.available_topic_name``): a publish of the message under
a SowKey made from its bookmark while it is available, a ``sow_delete`` of that SowKey when it
is not. A statement repeated, or made again by the next owner, leaves that topic as it is, so
writing it at least once is enough. Its processor applies that log like any SOW topic's, and
the views read it in the queue's place through the ordinary change events, whose source
positions (its log offsets) make every replay exact.

What keeps the statements true across crashes and takeovers:

* the machine records every bookmark whose availability may have changed
  (``QueueMachine.touched``); a flush states the current availability of each, so several
  changes between two flushes cost one record, and a failed send is stated again later;
* a removal (acknowledgement, expiry) is stored only once Kafka has its ``sow_delete``: a crash
  in between leaves the message stored, and so available again, which is what the next owner
  states;
* a worker that takes a log partition over makes every stored message available again and
  states each of them (they pass through the machine's ``append``); a publish that a deferred
  acknowledgement swallows while the log is replayed is stated unavailable.
"""

from __future__ import annotations

import asyncio
import base64
import functools
from collections.abc import Iterable
from typing import Any

from sowstream.engine.derived import ACK_WAIT_SECONDS, delivered
from sowstream.engine.ports import Sender
from sowstream.queues.machine import Bookmark, QueueMachine
from sowstream.wire import headers as h

__all__ = ["QueueViewFeed", "available_records", "available_sow_key"]

_SOW_DELETE = h.SOW_DELETE.encode()


def available_sow_key(bookmark: Bookmark) -> str:
    """The SowKey of a message on the available-messages topic: its bookmark in URL-safe Base64
    (SowKeys allow Base64 characters only; ``|`` is not one)."""
    return base64.urlsafe_b64encode(bookmark.text().encode()).decode()


def available_records(
    machine: QueueMachine, bookmarks: Iterable[Bookmark]
) -> list[tuple[Bookmark, bytes | None]]:
    """Each bookmark with the message's data when it is available now (in the queue and not
    leased: what ``sow`` on the queue browses), else None."""
    out: list[tuple[Bookmark, bytes | None]] = []
    for bookmark in bookmarks:
        message = machine.message(bookmark)
        available = message is not None and message.leased_to is None
        out.append((bookmark, message.data if available and message is not None else None))
    return out


class QueueViewFeed:
    """States the availability of one queue's messages on its available-messages topic."""

    def __init__(self, machine: QueueMachine, queue: str, log_topic: str, sender: Sender) -> None:
        """``log_topic``: the Kafka log of the available-messages topic."""
        self.machine = machine
        self.queue = queue
        self.log_topic = log_topic
        self._sender = sender
        self._lock = asyncio.Lock()
        self._view = (h.VIEW, queue.encode())  # only the engine writes the topic
        self._outstanding: set[asyncio.Future[Any]] = set()  # sent, not acknowledged yet
        self._latest: dict[Bookmark, asyncio.Future[Any]] = {}  # per message, of those
        # What this worker last stated per message still in the queue (True: available), so
        # a change that changes nothing (an acknowledgement of a leased message) costs nothing.
        self._stated: dict[Bookmark, bool] = {}
        machine.touched = set()

    async def flush(self, wait_for: Iterable[Bookmark] = ()) -> int:
        """State the availability of every bookmark touched since the last flush, unless this
        worker already stated it; returns how many records went out. Returns only once Kafka has
        the statements about ``wait_for`` (messages whose removal is about to be stored), and
        raises RuntimeError when one is missing (it is stated again on the next flush)."""
        sent = 0
        async with self._lock:  # one flush sends at a time: a bookmark's records stay in order
            touched = self.machine.touched or set()
            self.machine.touched = set()
            held = [b for b in touched if self.machine.holds(b.topic, b.partition)]
            records = available_records(self.machine, sorted(held, key=_order))
            for n, (bookmark, data) in enumerate(records):
                available = data is not None
                if self.machine.message(bookmark) is None:
                    gone = self._stated.pop(bookmark, None)  # nothing more to say about it
                    if gone is False:
                        continue
                elif self._stated.get(bookmark) is available:
                    continue
                else:
                    self._stated[bookmark] = available
                headers = [self._view]
                if not available:
                    headers.append((h.COMMAND, _SOW_DELETE))
                try:
                    fut = await self._sender.send(
                        self.log_topic,
                        data,
                        key=available_sow_key(bookmark).encode(),
                        headers=headers,
                    )
                except BaseException:
                    self._retouch(b for b, _ in records[n:])  # stated on the next flush
                    raise
                sent += 1
                if fut is not None:
                    fut.add_done_callback(functools.partial(self._sent, bookmark))
                    self._outstanding.add(fut)
                    self._latest[bookmark] = fut
            pending = [f for b in wait_for if (f := self._latest.get(b)) is not None]
        await delivered(pending, f"availability records of queue {self.queue!r}")
        return sent

    def _sent(self, bookmark: Bookmark, fut: asyncio.Future[Any]) -> None:
        """A record Kafka refused is stated again on the next flush (with the state then)."""
        self._outstanding.discard(fut)
        if self._latest.get(bookmark) is fut:
            del self._latest[bookmark]
        if fut.cancelled() or fut.exception() is not None:
            self._retouch([bookmark])

    def _retouch(self, bookmarks: Iterable[Bookmark]) -> None:
        for bookmark in bookmarks:
            self._stated.pop(bookmark, None)  # unknown again: state it whatever it is
            if self.machine.touched is not None:
                self.machine.touched.add(bookmark)

    async def settle(self) -> None:
        """Wait until every statement sent so far is in Kafka (or failed): a worker giving a
        log partition away calls it, so its statements land before the next owner's."""
        async with self._lock:
            pending = list(self._outstanding)
        if pending:
            await asyncio.wait(pending, timeout=ACK_WAIT_SECONDS)

    def drop(self, topic: str, partition: int) -> None:
        """A log partition moved away: its next owner states its messages, this worker no
        longer does (a late statement of ours could undo one of its)."""
        here = [b for b in self._stated if (b.topic, b.partition) == (topic, partition)]
        for bookmark in here:
            del self._stated[bookmark]
        touched = self.machine.touched
        if touched:
            self.machine.touched = {
                b for b in touched if (b.topic, b.partition) != (topic, partition)
            }


def _order(bookmark: Bookmark) -> tuple[str, int, int]:
    return bookmark.topic, bookmark.partition, bookmark.offset
