"""A queue's state over one log partition, kept as ranges of log offsets.

Most queue messages are exactly the publish the log holds, so the store keeps no copy of them:
a reload reads the log again from the partition's *low-water* offset (below it the queue is
done with every record) and skips the offsets the queue is done with above it (acknowledged,
expired, refused when applied, acknowledged before they arrived). That is one small store value
per partition, rewritten per batch of acknowledgements, instead of a stored copy and an ack
marker per message; AMPS keeps the same per-queue point in its ``queues.ack`` file, and Kafka's
share groups keep state batches of the same shape.

Acknowledgements are also remembered for a while with the client that sent them, so a repeat
(a retry after a lost answer) is answered as done: one *ack chunk* per write, holding the ranges
one client acknowledged then (:class:`AckLog`).

Delivery and cancel counts are not kept, as in AMPS: after a restart they start again.
"""

from __future__ import annotations

import bisect
import struct
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

LEDGER_PREFIX = b"\x00L/"
ACK_CHUNK_PREFIX = b"\x00A/"
LEDGER_VERSION = 1

_LENGTH = struct.Struct(">I")
_CHUNK_ID = struct.Struct(">qI")  # when written, a sequence number among the same millisecond


class LedgerError(ValueError):
    """A stored ledger or ack chunk that cannot be read (names what is wrong)."""


def _named(prefix: bytes, queue: str) -> bytes:
    raw = queue.encode()
    return prefix + _LENGTH.pack(len(raw)) + raw


def ledger_key(queue: str) -> bytes:
    """Store key of a queue's ledger in a log partition's store."""
    return _named(LEDGER_PREFIX, queue)


def ack_chunk_prefix(queue: str) -> bytes:
    """Key prefix of a queue's ack chunks in a log partition's store (in time order)."""
    return _named(ACK_CHUNK_PREFIX, queue)


def _json_object(value: bytes, what: str) -> dict[str, Any]:
    """``value`` read as a JSON object; LedgerError naming ``what`` when it is not one."""
    try:
        raw = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise LedgerError(f"{what} is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise LedgerError(f"{what} is not a JSON object: {value[:60]!r}")
    return raw


class Ranges:
    """A set of log offsets as sorted, disjoint, inclusive ranges; cheap when offsets come
    mostly in order, as acknowledgements do."""

    __slots__ = ("_ends", "_starts")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        for start, end in ranges:
            for offset in (start, end):
                if not isinstance(offset, int) or isinstance(offset, bool):
                    raise LedgerError(f"range bound {offset!r} is not an integer")
            if end < start:
                raise LedgerError(f"range [{start}, {end}] ends before it starts")
            self.add_range(start, end)

    def __len__(self) -> int:
        """How many ranges (not offsets)."""
        return len(self._starts)

    def __contains__(self, offset: object) -> bool:
        if not isinstance(offset, int):
            return False
        at = bisect.bisect_right(self._starts, offset) - 1
        return at >= 0 and offset <= self._ends[at]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return zip(self._starts, self._ends, strict=True)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ranges) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"Ranges({list(self)!r})"

    def add(self, offset: int) -> None:
        """Add one offset."""
        ends = self._ends
        if ends and offset == ends[-1] + 1:
            ends[-1] = offset  # the usual case: the next offset in order
            return
        self.add_range(offset, offset)

    def add_range(self, start: int, end: int) -> None:
        """Add ``start`` to ``end`` inclusive, merging with touching ranges."""
        starts, ends = self._starts, self._ends
        lo = bisect.bisect_left(ends, start - 1)  # first range that ends at or after start - 1
        hi = bisect.bisect_right(starts, end + 1)  # ranges from here start after end + 1
        if lo < hi:
            start = min(start, starts[lo])
            end = max(end, ends[hi - 1])
        starts[lo:hi] = [start]
        ends[lo:hi] = [end]

    def drop_below(self, low: int) -> None:
        """Forget every offset below ``low``."""
        starts, ends = self._starts, self._ends
        cut = bisect.bisect_left(ends, low)
        del starts[:cut], ends[:cut]
        if starts and starts[0] < low:
            starts[0] = low

    def first_from(self, offset: int) -> int:
        """The first offset at or after ``offset`` that is *not* in the set."""
        at = bisect.bisect_right(self._starts, offset) - 1
        if at >= 0 and offset <= self._ends[at]:
            return self._ends[at] + 1
        return offset

    def to_list(self) -> list[list[int]]:
        return [[start, end] for start, end in self]

    @classmethod
    def from_list(cls, value: object, what: str) -> Ranges:
        if not isinstance(value, list) or not all(
            isinstance(item, list) and len(item) == 2 for item in value
        ):
            raise LedgerError(f"{what}: ranges must be a list of [start, end] pairs")
        return cls((item[0], item[1]) for item in value)


class PartitionLedger:
    """What a queue is done with in one log partition, and where a reload reads from.

    The runtime tells it which offsets hold queue messages read from the log (:meth:`track`),
    how far the partition was offered (:meth:`offered`) and which offsets the queue is done
    with (:meth:`finish`); :meth:`to_bytes` gives the value to store. Messages whose queued
    form the log does not hold (a merged delta_publish, an enriched record) are stored as
    copies and are not tracked here.
    """

    __slots__ = ("_high", "_left", "_live", "done", "low")

    def __init__(self, low: int, done: Ranges | None = None) -> None:
        self.low = low
        self.done = done if done is not None else Ranges()
        self.done.drop_below(low)
        self._live: deque[int] = deque()  # tracked offsets, in log order
        self._left: set[int] = set()  # tracked offsets finished while not at the front
        self._high = low - 1

    @property
    def high(self) -> int:
        """The last offset offered to the queue."""
        return self._high

    def skips(self, offset: int) -> bool:
        """Whether a reload must not offer the record at ``offset`` again."""
        return offset < self.low or offset in self.done

    def offered(self, offset: int) -> None:
        """Records up to ``offset`` were offered to the queue."""
        if offset > self._high:
            self._high = offset

    def track(self, offset: int) -> None:
        """The record at ``offset`` is a queue message the log holds as queued."""
        self._live.append(offset)
        self.offered(offset)

    def finish(self, offset: int) -> None:
        """The queue is done with the record at ``offset`` (removed, refused, acknowledged
        before it arrived): a reload skips it."""
        if offset >= self.low:
            self.done.add(offset)
        live = self._live
        if live and live[0] == offset:
            live.popleft()
        else:
            self._left.add(offset)
        while live and live[0] in self._left:
            self._left.discard(live.popleft())

    def advance(self) -> int:
        """Move the low-water offset up to the first tracked message still in the queue (past
        everything offered when none is) and forget what lies below; returns it."""
        live = self._live
        low = live[0] if live else self._high + 1
        if low > self.low:
            self.low = low
            self.done.drop_below(low)
            if self._left:
                self._left = {offset for offset in self._left if offset >= low}
        return self.low

    def to_bytes(self) -> bytes:
        """The stored form (advance first, so it is as small as it can be)."""
        self.advance()
        return orjson.dumps({"v": LEDGER_VERSION, "low": self.low, "done": self.done.to_list()})

    @classmethod
    def from_bytes(cls, value: bytes) -> PartitionLedger:
        """A stored ledger; LedgerError naming what is wrong when it is not one."""
        raw = _json_object(value, "queue ledger")
        if raw.get("v") != LEDGER_VERSION:
            raise LedgerError(f"queue ledger of an unknown version: {value[:60]!r}")
        low = raw.get("low")
        if not isinstance(low, int) or isinstance(low, bool) or low < 0:
            raise LedgerError(f"queue ledger: low-water offset {low!r} is not an offset")
        return cls(low, Ranges.from_list(raw.get("done", []), "queue ledger"))


@dataclass(slots=True)
class AckChunk:
    """What one client acknowledged in one store write."""

    key: bytes
    at_ms: int
    client: str
    offsets: Ranges = field(default_factory=Ranges)

    def to_bytes(self) -> bytes:
        return orjson.dumps({"c": self.client, "t": self.at_ms, "r": self.offsets.to_list()})

    @classmethod
    def from_bytes(cls, key: bytes, value: bytes) -> AckChunk:
        raw = _json_object(value, "queue ack chunk")
        if not isinstance(raw.get("c"), str):
            raise LedgerError("queue ack chunk names no client")
        at = raw.get("t")
        if not isinstance(at, int) or isinstance(at, bool):
            raise LedgerError(f"queue ack chunk: time {at!r} is not milliseconds")
        return cls(key, at, raw["c"], Ranges.from_list(raw.get("r"), "queue ack chunk"))


class AckLog:
    """Recent acknowledgements of one queue in one log partition, oldest first: who
    acknowledged an offset, for :data:`memory_ms` after it was written."""

    def __init__(self, queue: str) -> None:
        self._prefix = ack_chunk_prefix(queue)
        self._chunks: deque[AckChunk] = deque()
        self._last_id = (0, 0)

    def __len__(self) -> int:
        return len(self._chunks)

    def restore(self, chunk: AckChunk) -> None:
        """Remember ``chunk``: one read from the store (or converted from an older layout's
        ack marker), or one :meth:`chunk` made, once it is stored."""
        self._chunks.append(chunk)
        key = chunk.key
        if key.startswith(self._prefix) and len(key) == len(self._prefix) + _CHUNK_ID.size:
            self._last_id = max(self._last_id, _CHUNK_ID.unpack_from(key, len(self._prefix)))

    def sort(self) -> None:
        """Put restored chunks in time order."""
        self._chunks = deque(sorted(self._chunks, key=lambda chunk: chunk.at_ms))

    def chunk(self, client: str, offsets: Iterable[int], at_ms: int) -> AckChunk:
        """A new chunk, not remembered yet: ``client`` acknowledged ``offsets`` at ``at_ms``.
        Its key is unique among this log's (a later one sorts after it)."""
        at, seq = self._last_id
        if at_ms <= at:
            at_ms, seq = at, seq + 1
        else:
            seq = 0
        self._last_id = (at_ms, seq)
        chunk = AckChunk(self._prefix + _CHUNK_ID.pack(at_ms, seq), at_ms, client)
        for offset in sorted(offsets):
            chunk.offsets.add(offset)
        return chunk

    def who_acked(self, offset: int) -> str | None:
        """The client whose acknowledgement of ``offset`` is remembered (newest first)."""
        for chunk in reversed(self._chunks):
            if offset in chunk.offsets:
                return chunk.client
        return None

    def due(self, now_ms: int, memory_ms: int) -> list[bytes]:
        """Keys of the chunks older than ``memory_ms``, forgotten here (delete them)."""
        keys: list[bytes] = []
        chunks = self._chunks
        while chunks and chunks[0].at_ms <= now_ms - memory_ms:
            keys.append(chunks.popleft().key)
        return keys
