"""One queue served by several workers: a subscription's backlog shared out as credits.

A worker leases to a subscription only within the credit the subscription granted it for a log
partition (``QueueMachine`` in credit mode). Each worker reports, per subscription and per log
partition it owns, a :class:`PartitionCredit`: the credit it holds, the leases the subscription
holds there, the last grant it applied, and the best available messages matching the
subscription. The subscriber's :class:`CreditLedger` keeps the latest report per partition and
grants (:class:`CreditGrant`) so that reported credit + leases + grants in flight never exceed
the backlog, giving each free unit to the partition holding the best available message (highest
priority, then oldest), across every worker. Nothing here does I/O.

Why it is exact: between two reports a worker can only turn credit into leases, end leases,
or apply a grant the ledger still counts as in flight; so what a worker really holds for a
partition is never more than the ledger's view of it. A partition taken by a new owner starts a
new ``epoch`` with no credit and no leases (leases live in memory): grants for an older epoch are
ignored by the worker and forgotten by the ledger.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from sowstream.queues.machine import QueueMachine

__all__ = [
    "CREDIT_COMMAND",
    "CREDIT_NOTICE",
    "BestKey",
    "CreditDesk",
    "CreditGrant",
    "CreditLedger",
    "CreditNotice",
    "PartitionCredit",
]

CREDIT_COMMAND = "queue_credit"  # Command.command of a grant, on the partition's control topic
CREDIT_NOTICE = "queue_credit"  # sow.cmd of a worker's report, on the subscriber's reply topic
BEST_LISTED = 32  # best messages a report lists per partition at most

# A message's place in delivery order as a report carries it: (rank, log time, offset), where
# rank is -priority, or 1 for a message without one (QueueMachine's Key without the partition).
BestKey = tuple[int, int, int]
# Where credit lives: (queue, underlying topic, log partition).
Where = tuple[str, str, int]
# A best message anywhere: (rank, log time, topic, partition, offset): comparable across
# partitions exactly as QueueMachine orders messages.
_Key = tuple[int, int, str, int, int]


@dataclass(frozen=True, slots=True)
class PartitionCredit:
    """One log partition's state for one subscription, as its owner reports it."""

    topic: str
    partition: int
    epoch: int  # when the owner took the partition (µs): a new owner reports a later one
    whole: bool  # the owner holds every partition of the queue: it leases without credits
    credit: int  # credit held for the subscription, not used yet
    leased: int  # units the subscription holds here (leases; at-most-once: unacknowledged sends)
    applied: int  # highest grant sequence number applied (0: none)
    best: tuple[BestKey, ...] = ()  # best available messages matching it, in delivery order
    more: bool = False  # more are available than ``best`` lists

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "epoch": self.epoch,
            "whole": self.whole,
            "credit": self.credit,
            "leased": self.leased,
            "applied": self.applied,
            "best": [list(key) for key in self.best],
            "more": self.more,
        }

    @classmethod
    def from_json(cls, raw: Any) -> PartitionCredit:
        """The entry ``raw`` spells; ValueError naming what is wrong."""
        if not isinstance(raw, dict):
            raise ValueError(f"a credit entry must be an object, got {raw!r}")
        try:
            best = tuple((int(k[0]), int(k[1]), int(k[2])) for k in raw.get("best", ()))
            return cls(
                topic=str(raw["topic"]),
                partition=int(raw["partition"]),
                epoch=int(raw["epoch"]),
                whole=bool(raw.get("whole", False)),
                credit=int(raw.get("credit", 0)),
                leased=int(raw.get("leased", 0)),
                applied=int(raw.get("applied", 0)),
                best=best,
                more=bool(raw.get("more", False)),
            )
        except (KeyError, TypeError, IndexError, ValueError) as exc:
            raise ValueError(f"malformed credit entry {raw!r}: {exc!r}") from None


@dataclass(frozen=True, slots=True)
class CreditNotice:
    """A worker's report to one subscription about one queue: an entry per partition it owns.

    Sent on the subscriber's reply topic (``sow.cmd`` = ``queue_credit``, ``sow.sub_id``,
    ``sow.topic`` = the queue), JSON in the value, whenever an entry changes."""

    queue: str
    entries: tuple[PartitionCredit, ...]

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {"queue": self.queue, "entries": [entry.to_json() for entry in self.entries]}
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> CreditNotice:
        """The notice ``data`` holds; ValueError when it is not one."""
        try:
            raw = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"a credit notice is not JSON: {exc}") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("entries"), list):
            raise ValueError("a credit notice needs a queue and a list of entries")
        return cls(str(raw.get("queue", "")), tuple(map(PartitionCredit.from_json, raw["entries"])))


@dataclass(frozen=True, slots=True)
class CreditGrant:
    """The subscriber gives (``credits`` > 0) or takes back (< 0) credit for one partition.

    A ``queue_credit`` command on the partition's control topic, with these in its options;
    ``sub_id``, ``reply_to`` and ``topic`` (the queue) name the subscription. The owner applies
    it only for its current ``epoch`` and only once (``seq`` above the last one applied); taking
    back never leaves less than zero."""

    queue: str
    topic: str
    partition: int
    epoch: int
    seq: int
    credits: int

    def options(self) -> dict[str, str]:
        return {"epoch": str(self.epoch), "seq": str(self.seq), "credits": str(self.credits)}

    @classmethod
    def from_options(
        cls, queue: str, topic: str, partition: int, options: Mapping[str, str]
    ) -> CreditGrant:
        """The grant a command's options spell; ValueError naming a missing or bad one."""
        values = {}
        for name in ("epoch", "seq", "credits"):
            text = options.get(name)
            try:
                values[name] = int(text or "")
            except ValueError:
                raise ValueError(f"queue_credit needs an integer {name}, got {text!r}") from None
        return cls(queue, topic, partition, values["epoch"], values["seq"], values["credits"])


@dataclass(slots=True)
class _Slot:
    """The ledger's view of one partition."""

    report: PartitionCredit
    pending: list[tuple[int, int]] = field(default_factory=list)  # (seq, credits) in flight

    def given(self) -> int:
        """Credit there or on its way (a take-back counts only once the owner reports it)."""
        return self.report.credit + sum(n for _, n in self.pending if n > 0)

    def used(self) -> int:
        return self.given() + self.report.leased

    def revoking(self) -> bool:
        return any(n < 0 for _, n in self.pending)


class CreditLedger:
    """A subscriber's account of its backlog over every partition of its queues.

    ``expected`` names the partitions to hear from before the first grant (so the first
    message leased is the best of them all); after ``wait_until`` (a monotonic time) the ledger
    grants with what it has heard, so a partition whose owner is away holds nothing up."""

    def __init__(self, expected: Iterable[Where], wait_until: float) -> None:
        self.backlog: int | None = None
        self._expected = set(expected)
        self._wait_until = wait_until
        self._slots: dict[Where, _Slot] = {}
        self._seq = 0

    def notice(self, notice: CreditNotice) -> None:
        """Take a worker's report: a later epoch replaces a partition's state (grants to the
        older one are void), an older one is stale and ignored."""
        for entry in notice.entries:
            where = (notice.queue, entry.topic, entry.partition)
            slot = self._slots.get(where)
            if slot is None or entry.epoch > slot.report.epoch:
                self._slots[where] = _Slot(entry)
            elif entry.epoch == slot.report.epoch:
                slot.report = entry
                slot.pending = [(s, n) for s, n in slot.pending if s > entry.applied]

    def _credited(self) -> dict[Where, _Slot]:
        """The partitions of the queues served by several workers (a queue one worker holds
        whole leases within the backlog there by itself)."""
        whole = {where[0] for where, slot in self._slots.items() if slot.report.whole}
        return {where: slot for where, slot in self._slots.items() if where[0] not in whole}

    def used(self) -> int:
        """Units counted against the backlog: credit given or on its way, and leases."""
        return sum(slot.used() for slot in self._credited().values())

    def whole(self) -> bool:
        """Whether every queue heard of is held whole by one worker: nothing to grant."""
        return bool(self._slots) and not self._credited()

    def plan(self, now: float) -> list[CreditGrant]:
        """The grants (and take-backs) to send now; they count as in flight from here on.

        Free units go to the best available messages not yet covered by credit, across all
        partitions; units left over wait as credit on the partitions holding least (so a
        message arriving there is leased at once). When messages wait uncovered and no unit is
        free, idle credit (beyond what a partition's listed messages need) is taken back."""
        slots = self._credited()
        if self.backlog is None or not slots:
            return []
        if not self._expected <= self._slots.keys() and now < self._wait_until:
            return []
        free = self.backlog - self.used()
        wanted: list[tuple[_Key, Where]] = []
        for where, slot in slots.items():
            covered = slot.given()
            for rank, ts, offset in slot.report.best[covered:]:
                wanted.append(((rank, ts, where[1], where[2], offset), where))
        wanted.sort()
        grants: dict[Where, int] = {}
        for _, where in wanted[: max(free, 0)]:
            grants[where] = grants.get(where, 0) + 1
        free -= sum(grants.values())
        if free > 0 and slots:
            # Nothing better to do with them: spread them where least is given.
            while free > 0:
                where = min(slots, key=lambda w: (slots[w].given() + grants.get(w, 0), w))
                grants[where] = grants.get(where, 0) + 1
                free -= 1
        elif len(wanted) > max(free, 0):
            uncovered = len(wanted) - max(free, 0)
            for where, slot in sorted(slots.items()):
                idle = self._idle(slot)
                if idle > 0 and uncovered > 0:
                    take = min(idle, uncovered)
                    grants[where] = grants.get(where, 0) - take
                    uncovered -= take
        elif free == 0 and not wanted and slots:
            # Waiting credit spread unevenly (a partition heard late, leases ended in one
            # place): move one unit from the partition with most to the one with least.
            least = min(slots.values(), key=_Slot.given)
            richest = max(slots.items(), key=lambda item: self._idle(item[1]))
            if self._idle(richest[1]) > 0 and richest[1].given() - least.given() >= 2:
                grants[richest[0]] = -1
        return [self._grant(where, n) for where, n in sorted(grants.items()) if n]

    @staticmethod
    def _idle(slot: _Slot) -> int:
        """Credit reported there beyond what its listed messages need (0 while taking back)."""
        report = slot.report
        if report.more or slot.revoking() or slot.pending:
            return 0
        return max(0, report.credit - len(report.best))

    def _grant(self, where: Where, credits: int) -> CreditGrant:
        self._seq += 1
        slot = self._slots[where]
        slot.pending.append((self._seq, credits))
        return CreditGrant(*where, slot.report.epoch, self._seq, credits)


class CreditDesk:
    """The worker's side of credits for one queue: which epoch each partition it owns is in,
    which grants it applied, and the reports it owes each subscription.

    ``whole`` (this worker owns every partition of the queue) turns credits off: the machine
    leases within each backlog as a single worker does, and reports say so once."""

    def __init__(self, machine: QueueMachine, queue: str, best_limit: int = BEST_LISTED) -> None:
        self._machine = machine
        self._queue = queue
        self._best_limit = best_limit
        self._epochs: dict[tuple[str, int], int] = {}
        self._applied: dict[tuple[str, tuple[str, int]], int] = {}
        self._whole = True
        self._last_epoch = 0

    @property
    def whole(self) -> bool:
        return self._whole

    def set_whole(self, whole: bool) -> None:
        """Whether this worker owns every partition of the queue now."""
        self._whole = whole
        self._machine.set_credited(not whole)

    def take(self, topic: str, partition: int, now_us: int) -> int:
        """The worker took ``(topic, partition)``: a new epoch (later than any before here)."""
        epoch = self._last_epoch = max(now_us, self._last_epoch + 1)
        self._epochs[(topic, partition)] = epoch
        for key in [k for k in self._applied if k[1] == (topic, partition)]:
            del self._applied[key]
        return epoch

    def epoch(self, topic: str, partition: int) -> int | None:
        """The epoch of a partition held here (None: not held)."""
        return self._epochs.get((topic, partition))

    def drop(self, topic: str, partition: int) -> None:
        self._epochs.pop((topic, partition), None)
        for key in [k for k in self._applied if k[1] == (topic, partition)]:
            del self._applied[key]

    def forget(self, sub_key: str) -> None:
        """The subscription ended here."""
        for key in [k for k in self._applied if k[0] == sub_key]:
            del self._applied[key]

    def apply(self, sub_key: str, grant: CreditGrant) -> bool:
        """Apply a grant once, for the current epoch only; True if it changed anything."""
        where = (grant.topic, grant.partition)
        if self._epochs.get(where) != grant.epoch:
            return False  # meant for an earlier owner: the subscriber forgets it too
        applied = self._applied.get((sub_key, where), 0)
        if grant.seq <= applied:
            return False  # read again (a rebalance, a retry)
        self._applied[(sub_key, where)] = grant.seq
        self._machine.grant(sub_key, grant.topic, grant.partition, grant.credits)
        return True

    def notice(self, sub_key: str) -> CreditNotice:
        """The report owed to a subscription now: an entry per partition owned here."""
        partitions = sorted(self._epochs)
        if self._whole:
            return CreditNotice(
                self._queue,
                tuple(
                    PartitionCredit(
                        t, p, self._epochs[(t, p)], True, 0, 0, self._seen(sub_key, t, p)
                    )
                    for t, p in partitions
                ),
            )
        backlog = self._machine.effective_backlog(sub_key) or 1
        views = self._machine.credit_view(sub_key, partitions, min(backlog, self._best_limit))
        entries = []
        for t, p in partitions:
            view = views[(t, p)]
            entries.append(
                PartitionCredit(
                    t,
                    p,
                    self._epochs[(t, p)],
                    False,
                    view.credit,
                    view.leased,
                    self._seen(sub_key, t, p),
                    tuple((k[0], k[1], k[4]) for k in view.best),
                    view.more,
                )
            )
        return CreditNotice(self._queue, tuple(entries))

    def _seen(self, sub_key: str, topic: str, partition: int) -> int:
        return self._applied.get((sub_key, (topic, partition)), 0)
