"""One held partition's state, and what the processor's stages hand each other about it.

:class:`PartitionState` is one partition's store, lock, watermarks, expiry schedule and the
batches in flight; :class:`~sowstream.engine.table.PartitionTable` holds them. An
:class:`Outcome` is what folding a batch produced, carried from the fold to the committer; its
parts are named tuples so every stage reads them by name.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sowstream.engine.metrics import BatchLife
from sowstream.engine.store import PartitionStore
from sowstream.errors import InvalidMessageError
from sowstream.sow.history import Version
from sowstream.sow.ops import RawRecord
from sowstream.sow.record import SowRecord
from sowstream.subscriptions.model import Change

SCAN_YIELD_EVERY = 5_000
APPLIED_WAIT_SECONDS = 30.0
DELIVERY_WAIT_SECONDS = 10.0
HISTORY_PRUNE_SECONDS = 60.0
# Batches of a partition whose subscription messages may be in flight at once (see process()).
MAX_IN_FLIGHT = 4
# Entries counted at most per memo lookup when choosing the most selective conjunct of an AND.
ESTIMATE_CAP = 10_000


class AppliedPublish(NamedTuple):
    """An applied publish as a queue takes it (a delta_publish as the merged record)."""

    offset: int
    timestamp: int
    data: bytes
    body: dict[str, Any]
    expiration_ms: int | None
    name: str | None = None  # on a Pattern topic: the topic name it was published under
    logged: bool = True  # ``data`` is the log record's value (not merged or enriched)


class Ack(NamedTuple):
    """The answer a publisher asked for (``sow.reply_to``): how many records its message
    changed, or why it was refused."""

    record: RawRecord
    changed: int  # records the message changed (the reply's count)
    status: str
    reason: str = ""
    message: str = ""


class Rejected(NamedTuple):
    """A log record that could not be applied: it goes to the dead-letter topic."""

    record: RawRecord
    error: InvalidMessageError


class Rekey(NamedTuple):
    """A record published without the right Kafka key: a keyed copy goes to the log again."""

    sow_key: str
    record: RawRecord


@dataclass
class Outcome:
    """What applying a batch produced: store changes to replicate, then messages to send."""

    changes: dict[bytes, bytes | None] = field(default_factory=dict)
    overlay: dict[bytes, SowRecord | None] = field(default_factory=dict)
    before: dict[bytes, SowRecord | None] = field(default_factory=dict)
    # The parsed body of an overlay record where the fold had it (a publish stored as sent),
    # so writing the batch's index entries does not parse it again.
    bodies: dict[bytes, dict[str, Any]] = field(default_factory=dict)
    # The stored form of every overlay record, when the compiled fold made them all (the
    # store writes, which are also the changelog records); None: encode the overlay.
    encoded: dict[bytes, bytes | None] | None = None
    # Keys whose hash and memo indexed values the compiled fold found unchanged, valid while
    # the partition's memo indexes are ``index_memo`` (the index entries stay as they are).
    index_same: set[bytes] = field(default_factory=set)
    index_memo: frozenset[str] = frozenset()
    last: int = -1
    last_record: RawRecord | None = None  # the record at ``last``: its fingerprint is stored
    events: list[Change] = field(default_factory=list)
    rekeys: list[Rekey] = field(default_factory=list)
    dead: list[Rejected] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    versions: list[Version] = field(default_factory=list)
    journal: dict[bytes, bytes | None] = field(default_factory=dict)  # conflation journal, queues
    enqueued: list[AppliedPublish] = field(default_factory=list)  # for the topic's queues
    stored: bool = False  # set once the batch is stored and its changelog records are in Kafka


@dataclass
class InFlight:
    """A folded batch whose messages are sent but not yet acknowledged by Kafka.

    ``sent``: subscribers' messages, waited for a bounded time (a client may be gone);
    ``required``: the change events of views and conflated topics, which must all be in Kafka
    before the batch is stored, or a view would miss the change for good.
    """

    outcome: Outcome
    sent: list[asyncio.Future[Any]]
    required: list[asyncio.Future[Any]] = field(default_factory=list)
    life: BatchLife | None = None  # times the batch's stages (log batches only)


@dataclass
class PartitionState:
    """State of one assigned partition: its store, applied offset and expiry schedule.

    ``watermark`` is the last log offset stored; ``folded`` the last one folded, which runs ahead
    while batches wait in ``in_flight`` for their messages' acknowledgements.
    """

    store: PartitionStore
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    watermark: int = -1
    folded: int = -1
    applied: asyncio.Condition = field(default_factory=asyncio.Condition)
    expiry: list[tuple[int, bytes]] = field(default_factory=list)
    ready: bool = False
    in_flight: deque[InFlight] = field(default_factory=deque)
    committer: asyncio.Task[None] | None = None
    failure: Exception | None = None  # why storing a batch failed; the partition is unusable
    memo: set[str] = field(default_factory=set)  # fields whose memo index is complete and kept

    async def wake(self) -> None:
        """Wake everyone waiting on this partition's progress (they re-check what they need)."""
        async with self.applied:
            self.applied.notify_all()


class PartitionMoved(Exception):
    """The partition was revoked while a command waited for it."""
