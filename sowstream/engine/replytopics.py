"""The clients' reply topics as the worker's producer sees them: tracked, parked or forgotten.

A reply topic is *tracked* while the producer keeps its metadata (so sends to it never wait).
A reply to a topic whose metadata the producer does not have yet is *parked*, in order, until
the topic appears: replies are never dropped because a topic was slow to show up. Parking is
bounded per topic by time (``wait``) and by bytes (``max_bytes``); past either bound the parked
replies are dropped and the topic's client is taken for gone (its subscriptions end). A reply
topic is *forgotten* once its client is gone, so the tracked set does not grow with every
client that ever connected.

This class owns that state and nothing else; the runtime's sender applies it to its producer.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Any

# Headers of one reply, as the sender takes them.
Headers = list[tuple[str, bytes]] | None

REPLY_TOPIC_GONE = "reply_topic_gone"  # the failure reason sent when parking gave up


class Parking(enum.Enum):
    """What :meth:`ReplyTopics.park` did with a reply."""

    STARTED = "started"  # the first one parked for the topic: start waiting for it
    QUEUED = "queued"  # behind others already parked
    OVERFLOW = "overflow"  # past the byte bound: everything parked for the topic was dropped


@dataclass(slots=True)
class ParkedReply:
    """One reply waiting for its topic."""

    value: bytes
    headers: Headers


@dataclass(slots=True)
class _Parked:
    since: float  # monotonic seconds of the first reply parked
    replies: deque[ParkedReply] = field(default_factory=deque)
    size: int = 0
    overflowed: bool = False  # the bound was hit once: the client is being ended


class ReplyTopics:
    """Tracked and parked reply topics, with the bounds that keep them small."""

    def __init__(self, *, wait: float, max_bytes: int) -> None:
        """``wait``: seconds replies stay parked for a topic that does not appear;
        ``max_bytes``: the most parked for one topic (values and headers)."""
        self.wait = wait
        self.max_bytes = max_bytes
        self._tracked: set[str] = set()
        self._parked: dict[str, _Parked] = {}
        self._inflight: dict[str, asyncio.Future[Any]] = {}  # the last send to each topic

    # -- tracking ----------------------------------------------------------------------------------

    def track(self, topic: str) -> bool:
        """Remember ``topic`` as a tracked reply topic; True if it was not tracked before."""
        if topic in self._tracked:
            return False
        self._tracked.add(topic)
        return True

    def tracked(self) -> frozenset[str]:
        """The reply topics tracked now."""
        return frozenset(self._tracked)

    def is_tracked(self, topic: str) -> bool:
        return topic in self._tracked

    def sent(self, topic: str, future: asyncio.Future[Any] | None) -> None:
        """A reply to ``topic`` went to the producer (``future``: its delivery)."""
        if future is not None:
            self._inflight[topic] = future

    def idle(self, topic: str) -> bool:
        """Nothing parked for ``topic`` and its last send acknowledged (or failed)."""
        last = self._inflight.get(topic)
        return topic not in self._parked and (last is None or last.done())

    def forget(self, topic: str) -> bool:
        """Stop tracking ``topic`` (its client is gone); True if it was tracked."""
        self._inflight.pop(topic, None)
        if topic not in self._tracked:
            return False
        self._tracked.discard(topic)
        return True

    # -- parking -----------------------------------------------------------------------------------

    def is_parked(self, topic: str) -> bool:
        """Replies wait for ``topic``: a new reply must queue behind them, to keep order."""
        return topic in self._parked

    def park(self, topic: str, value: bytes, headers: Headers, now: float) -> Parking:
        """Hold a reply until ``topic`` appears (or the wait ends)."""
        size = len(value) + sum(len(k) + len(v) for k, v in headers or ())
        parked = self._parked.get(topic)
        started = parked is None
        if parked is None:
            parked = self._parked[topic] = _Parked(now)
        if parked.size + size > self.max_bytes:
            first = not parked.overflowed
            parked.replies.clear()
            parked.size = 0
            parked.overflowed = True
            if first:
                return Parking.OVERFLOW
            # Already being ended: keep what comes after (the failure messages) if it fits.
            if size > self.max_bytes:
                return Parking.QUEUED
        parked.replies.append(ParkedReply(value, headers))
        parked.size += size
        return Parking.STARTED if started else Parking.QUEUED

    def take(self, topic: str) -> ParkedReply | None:
        """The oldest reply parked for ``topic`` (None once there is none, and the topic is no
        longer parked: the next reply goes straight out)."""
        parked = self._parked.get(topic)
        if parked is None:
            return None
        if not parked.replies:
            del self._parked[topic]
            return None
        reply = parked.replies.popleft()
        parked.size -= len(reply.value) + sum(len(k) + len(v) for k, v in reply.headers or ())
        return reply

    def expired(self, topic: str, now: float) -> bool:
        """Whether ``topic`` has kept replies parked for longer than the wait."""
        parked = self._parked.get(topic)
        return parked is not None and now - parked.since > self.wait

    def drop(self, topic: str) -> int:
        """Give up on ``topic``: drop its parked replies; returns how many there were."""
        parked = self._parked.pop(topic, None)
        return len(parked.replies) if parked is not None else 0

    def parked_bytes(self) -> int:
        """Bytes parked over every topic (each topic holds at most ``max_bytes``)."""
        return sum(p.size for p in self._parked.values())

    def parked_topics(self) -> list[str]:
        return list(self._parked)
