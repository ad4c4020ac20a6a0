"""Credits: one queue served by several workers keeps each subscription within its backlog in
total and leases the best available message first, across workers (sowstream.queues.credits).

The simulations run one QueueMachine per worker, each owning one partition of ``work``, with a
CreditDesk each and a CreditLedger per subscriber, and carry reports, grants and
acknowledgements between them through FIFO channels delivered in random order, as Kafka would.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sowstream.config.queues import QueueConfig
from sowstream.queues.credits import (
    CreditDesk,
    CreditGrant,
    CreditLedger,
    CreditNotice,
    PartitionCredit,
)
from sowstream.queues.machine import Bookmark, QueueMachine


def entry(
    partition: int,
    *,
    epoch: int = 1,
    credit: int = 0,
    leased: int = 0,
    applied: int = 0,
    best: tuple[tuple[int, int, int], ...] = (),
    whole: bool = False,
) -> PartitionCredit:
    return PartitionCredit("work", partition, epoch, whole, credit, leased, applied, best)


def notice(*entries: PartitionCredit) -> CreditNotice:
    return CreditNotice("WQ", entries)


ALL3 = [("WQ", "work", p) for p in range(3)]


# --- the wire forms ---


def test_notice_and_grant_round_trip() -> None:
    n = notice(entry(0, credit=2, leased=1, applied=7, best=((-5, 10, 3),)), entry(1, whole=True))
    assert CreditNotice.from_bytes(n.to_bytes()) == n
    g = CreditGrant("WQ", "work", 2, 99, 4, -1)
    assert CreditGrant.from_options("WQ", "work", 2, g.options()) == g


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"{", "not JSON"),
        (b"[]", "list of entries"),
        (b'{"queue": "WQ", "entries": [3]}', "must be an object"),
        (b'{"queue": "WQ", "entries": [{"topic": "work"}]}', "malformed credit entry"),
    ],
)
def test_a_malformed_notice_is_refused_naming_the_problem(data: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        CreditNotice.from_bytes(data)


def test_a_grant_without_integers_is_refused_naming_the_option() -> None:
    with pytest.raises(ValueError, match="integer seq"):
        CreditGrant.from_options("WQ", "work", 0, {"epoch": "1", "seq": "x", "credits": "1"})


# --- the ledger ---


def test_the_first_grant_waits_for_every_partition_then_goes_to_the_best_message() -> None:
    ledger = CreditLedger(ALL3, wait_until=100.0)
    ledger.backlog = 1
    ledger.notice(notice(entry(0, best=((1, 5, 0),))))  # no priority, old
    assert ledger.plan(0.0) == []  # partitions 1 and 2 not heard yet
    ledger.notice(notice(entry(1, best=((-9, 50, 0),))))  # priority 9, newer
    ledger.notice(notice(entry(2)))
    assert ledger.plan(0.0) == [CreditGrant("WQ", "work", 1, 1, 1, 1)]
    assert ledger.used() == 1 and ledger.plan(0.0) == []  # in flight: nothing free


def test_after_the_wait_the_ledger_grants_with_what_it_heard() -> None:
    ledger = CreditLedger(ALL3, wait_until=1.0)
    ledger.backlog = 2
    ledger.notice(notice(entry(0, best=((1, 5, 0),))))
    assert ledger.plan(0.5) == []
    grants = ledger.plan(2.0)  # one for the message, one left waiting where least is given
    assert [(g.partition, g.credits) for g in grants] == [(0, 2)]


def test_reports_settle_grants_and_a_new_epoch_voids_them() -> None:
    ledger = CreditLedger(ALL3[:1], wait_until=0.0)
    ledger.backlog = 3
    ledger.notice(notice(entry(0, best=((1, 1, 0), (1, 2, 1)))))
    (grant,) = ledger.plan(0.0)
    assert grant.credits == 3 and ledger.used() == 3
    ledger.notice(notice(entry(0, credit=1, leased=2, applied=grant.seq)))
    assert ledger.used() == 3 and ledger.plan(0.0) == []
    ledger.notice(notice(entry(0, credit=1, leased=1, applied=grant.seq)))  # one acknowledged
    (again,) = ledger.plan(0.0)
    assert (again.credits, again.epoch) == (1, 1)
    # The partition's owner died: its successor has no credit, no leases, and ignores grants
    # for epoch 1; a late report of epoch 1 changes nothing.
    ledger.notice(notice(entry(0, epoch=2)))
    assert ledger.used() == 0
    ledger.notice(notice(entry(0, epoch=1, credit=3)))
    assert ledger.used() == 0
    (fresh,) = ledger.plan(0.0)
    assert (fresh.epoch, fresh.credits) == (2, 3)


def test_one_worker_holding_everything_needs_no_credit() -> None:
    ledger = CreditLedger(ALL3, wait_until=0.0)
    ledger.backlog = 5
    ledger.notice(notice(*(entry(p, whole=True) for p in range(3))))
    assert ledger.whole() and ledger.plan(0.0) == []


def test_idle_credit_is_taken_back_for_a_message_waiting_elsewhere() -> None:
    ledger = CreditLedger(ALL3[:2], wait_until=0.0)
    ledger.backlog = 1
    ledger.notice(notice(entry(0, credit=1), entry(1, best=((1, 3, 0),))))
    (take,) = ledger.plan(0.0)
    assert (take.partition, take.credits) == (0, -1)
    assert ledger.plan(0.0) == []  # taken back once; it counts until the owner reports it
    ledger.notice(notice(entry(0, credit=0, applied=take.seq), entry(1, best=((1, 3, 0),))))
    (give,) = ledger.plan(0.0)
    assert (give.partition, give.credits) == (1, 1)


# --- the simulation ---


class Worker:
    """One worker owning one partition of ``work``."""

    def __init__(self, partition: int, **settings: Any) -> None:
        self.partition = partition
        self.machine = QueueMachine(QueueConfig(name="WQ", underlying_topic="work", **settings))
        self.desk = CreditDesk(self.machine, "WQ")
        self.desk.take("work", partition, 1000 + partition)
        self.desk.set_whole(False)
        self.inbox: deque[tuple[str, Any]] = deque()  # grants and acks, in order
        self.offset = 0


class Subscriber:
    def __init__(self, key: str, backlog: int) -> None:
        self.key = key
        self.ledger = CreditLedger(ALL3, wait_until=float("inf"))
        self.backlog = backlog
        self.inbox: deque[tuple[str, Any]] = deque()  # leases and notices, per worker in order
        self.held: list[Bookmark] = []
        self.order: list[int] = []


class Cluster:
    def __init__(self, rng: random.Random, subs: dict[str, int], **settings: Any) -> None:
        self.rng = rng
        self.workers = [Worker(p, **settings) for p in range(3)]
        self.subs = {key: Subscriber(key, backlog) for key, backlog in subs.items()}
        for worker in self.workers:
            for sub in self.subs.values():
                backlog = worker.machine.subscribe(sub.key, client=sub.key, max_backlog=sub.backlog)
                sub.ledger.backlog = backlog
        # What each worker sent each subscriber, in order (one reply topic, one producer each).
        self.wires: dict[tuple[int, str], deque[tuple[str, Any]]] = {
            (w.partition, s): deque() for w in self.workers for s in self.subs
        }
        self.max_held: dict[str, int] = dict.fromkeys(subs, 0)

    def publish(self, priority: int | None) -> None:
        worker = self.rng.choice(self.workers)
        worker.offset += 1
        body = {"p": priority} if priority is not None else {}
        body["id"] = worker.partition * 10_000 + worker.offset
        worker.machine.append(
            Bookmark("work", worker.partition, worker.offset), b"", body, worker.offset
        )

    def run_worker(self, worker: Worker) -> None:
        while worker.inbox:
            kind, item = worker.inbox.popleft()
            if kind == "grant":
                key, grant = item
                worker.desk.apply(key, grant)
            else:
                worker.machine.ack([item], client="x", now_ms=0)
        leases, _ = worker.machine.dispatch(0)
        for lease in leases:
            self.wires[(worker.partition, lease.sub_key)].append(("lease", lease.message))
        for key in self.subs:
            self.wires[(worker.partition, key)].append(("notice", worker.desk.notice(key)))
        self.check()

    def check(self) -> None:
        for key, sub in self.subs.items():
            held = sum(len(w.machine.leases(key)) for w in self.workers)
            assert held <= sub.backlog, f"{key} holds {held} > backlog {sub.backlog}"
            self.max_held[key] = max(self.max_held[key], held)

    def carry(self, wire: tuple[int, str]) -> None:
        kind, item = self.wires[wire].popleft()
        sub = self.subs[wire[1]]
        if kind == "lease":
            sub.held.append(item.bookmark)
            sub.order.append(item.body.get("p", -1))
        else:
            sub.ledger.notice(item)
            self.grant(sub)

    def grant(self, sub: Subscriber) -> None:
        for grant in sub.ledger.plan(0.0):
            self.workers[grant.partition].inbox.append(("grant", (sub.key, grant)))

    def ack_one(self, sub: Subscriber) -> None:
        if sub.held:
            b = sub.held.pop(self.rng.randrange(len(sub.held)))
            self.workers[b.partition].inbox.append(("ack", b))

    def step(self, ack_rate: float) -> None:
        rng = self.rng
        roll = rng.random()
        busy = [w for w, q in self.wires.items() if q]
        if roll < 0.4 and busy:
            self.carry(rng.choice(busy))
        elif roll < 0.4 + ack_rate:
            self.ack_one(rng.choice(list(self.subs.values())))
        else:
            self.run_worker(rng.choice(self.workers))

    def settle(self) -> None:
        for _ in range(20):
            for worker in self.workers:
                self.run_worker(worker)
            for wire in list(self.wires):
                while self.wires[wire]:
                    self.carry(wire)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), backlog=st.integers(1, 4), n=st.integers(1, 40))
def test_a_subscription_never_holds_more_than_its_backlog_over_three_workers(
    seed: int, backlog: int, n: int
) -> None:
    rng = random.Random(seed)
    cluster = Cluster(rng, {"A": backlog, "B": 1}, max_per_subscription_backlog=4)
    for sub in cluster.subs.values():
        cluster.grant(sub)
    published = 0
    for _ in range(40 * n):
        if published < n and rng.random() < 0.1:
            cluster.publish(rng.choice([None, 1, 5]))
            published += 1
        cluster.step(ack_rate=0.2)
    # Everything acknowledged in the end: nothing stuck behind credit.
    for _ in range(200):
        cluster.settle()
        for sub in cluster.subs.values():
            while sub.held:
                cluster.ack_one(sub)
        if all(w.machine.stats().depth == 0 for w in cluster.workers):
            break
    assert [w.machine.stats().depth for w in cluster.workers] == [0, 0, 0]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), priorities=st.lists(st.integers(0, 9), min_size=1, max_size=20))
def test_messages_waiting_on_three_workers_are_leased_in_priority_order(
    seed: int, priorities: list[int]
) -> None:
    """Q12 over three workers: with backlog 1 and everything published first, the subscriber
    gets the highest priority first, wherever it is."""
    rng = random.Random(seed)
    cluster = Cluster(rng, {"A": 1}, priority="/p")
    for p in priorities:
        cluster.publish(p)
    for worker in cluster.workers:
        cluster.run_worker(worker)
    sub = cluster.subs["A"]
    for _ in range(len(priorities)):
        cluster.settle()
        cluster.ack_one(sub)
    cluster.settle()
    assert sub.order == sorted(priorities, reverse=True)
    assert cluster.max_held["A"] == 1


def test_round_robin_alternates_between_subscriptions_with_credit_where_the_message_is() -> None:
    """Two subscriptions with room for everything: credit waits on every partition, and each
    worker applies round-robin to its own messages among the subscriptions with credit."""
    cluster = Cluster(
        random.Random(1),
        {"A": 30, "B": 30},
        fairness_model="round-robin",
        max_per_subscription_backlog=30,
    )
    cluster.settle()  # every report heard: the backlogs wait as credit on every partition
    for _ in range(30):
        cluster.publish(None)
    cluster.settle()
    a, b = (len(cluster.subs[k].order) for k in ("A", "B"))
    assert a + b == 30 and abs(a - b) <= 3


def test_a_worker_leases_from_a_partition_only_within_its_credit() -> None:
    q = QueueMachine(
        QueueConfig(name="WQ", underlying_topic="work", max_per_subscription_backlog=5)
    )
    q.subscribe("S", client="C", max_backlog=5)
    assert not q.grant("S", "work", 0, 1)  # not in credit mode: the backlog alone decides
    q.set_credited(True)
    q.append(Bookmark("work", 0, 1), b"", {"n": 1}, 1)
    q.append(Bookmark("work", 1, 1), b"", {"n": 2}, 2)
    assert q.dispatch(0) == ([], [])  # no credit anywhere
    assert q.grant("S", "work", 1, 1)
    (lease,), _ = q.dispatch(0)
    assert lease.message.bookmark == Bookmark("work", 1, 1)
    views = q.credit_view("S", [("work", 0), ("work", 1)], 5)
    assert (views[("work", 1)].credit, views[("work", 1)].leased) == (0, 1)
    assert [k[4] for k in views[("work", 0)].best] == [1] and views[("work", 1)].best == ()
    q.grant("S", "work", 0, 2)
    q.grant("S", "work", 0, -5)  # taken back: never below zero
    assert q.credit_view("S", [("work", 0)], 5)[("work", 0)].credit == 0
    assert q.dispatch(0)[0] == []
    q.grant("S", "work", 0, 1)
    (lease,), _ = q.dispatch(0)
    assert lease.message.bookmark == Bookmark("work", 0, 1)
    q.drop_partition("work", 0)
    assert q.credit_view("S", [("work", 0)], 5)[("work", 0)].leased == 0


def test_waiting_credit_spreads_out_again_when_a_partition_is_heard_late() -> None:
    ledger = CreditLedger(ALL3[:2], wait_until=0.0)
    ledger.backlog = 4
    ledger.notice(notice(entry(0, credit=4)))  # partition 1 was not heard in time
    ledger.notice(notice(entry(0, credit=4), entry(1)))
    (take,) = ledger.plan(0.0)
    assert (take.partition, take.credits) == (0, -1)
    ledger.notice(notice(entry(0, credit=3, applied=take.seq)))
    (give,) = ledger.plan(0.0)
    assert (give.partition, give.credits) == (1, 1)
    ledger.notice(notice(entry(1, credit=1, applied=give.seq)))
    (take,) = ledger.plan(0.0)  # 3 against 1: once more
    ledger.notice(notice(entry(0, credit=2, applied=take.seq)))
    (give,) = ledger.plan(0.0)
    ledger.notice(notice(entry(1, credit=2, applied=give.seq)))
    assert ledger.plan(0.0) == []  # 2 and 2: settled


def test_over_two_queues_one_held_whole_the_other_still_gets_credit() -> None:
    ledger = CreditLedger([("WQ", "work", 0), ("XQ", "x", 0), ("XQ", "x", 1)], wait_until=0.0)
    ledger.backlog = 2
    ledger.notice(notice(entry(0, whole=True)))  # WQ: one worker holds it whole
    ledger.notice(
        CreditNotice(
            "XQ",
            (
                PartitionCredit("x", 0, 1, False, 0, 0, 0, ((1, 5, 0),)),
                PartitionCredit("x", 1, 1, False, 0, 0, 0),
            ),
        )
    )
    assert not ledger.whole()
    grants = ledger.plan(0.0)
    assert [(g.queue, g.partition, g.credits) for g in grants] == [("XQ", 0, 1), ("XQ", 1, 1)]
