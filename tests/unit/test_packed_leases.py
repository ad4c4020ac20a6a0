"""Packed leases: the layout docs/protocol.md gives, read as a client in another language would;
a queue's packed deliveries against its per-message ones; splitting at the size bound; the
registration header; and damaged batches, which cost only what is damaged."""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sowstream.client.messages import Message
from sowstream.client.queue import QueueSubscription
from sowstream.client.subscription import _Live
from sowstream.config.queues import QueueConfig
from sowstream.engine.partition import AppliedPublish
from sowstream.engine.queues import QueueRuntime
from sowstream.engine.registry import SubscriptionRegistry
from sowstream.errors import CorruptReplyError
from sowstream.subscriptions.model import SUBSCRIBE, SubscriptionSpec
from sowstream.subscriptions.options import parse_options
from sowstream.wire import headers as h
from sowstream.wire import leases
from sowstream.wire.avro import encode
from sowstream.wire.leases import MAX_PACKED_BYTES, LeaseBatch, PackedLease, lease_entry, pack
from sowstream.wire.topics import TopicNames
from tests.support.sender import RecordingSender

BODIES = [b"", '{"name": "Zo\u00eb \u2603 \U0001f600"}'.encode(), b'{"n": 1}', b"x" * 200_000]


# -- the documented layout, read with struct only ---------------------------------------------


def read_as_documented(batch: bytes) -> list[dict[str, Any]]:
    """A reader written from docs/protocol.md alone (*Packed deliveries*)."""
    version, _flags, count = struct.unpack_from(">BBI", batch, 0)
    assert version == 1
    ends = struct.unpack_from(f">{count}I", batch, 6)
    area = batch[6 + 4 * count :]
    assert ends[-1] == len(area)
    out = []
    begin = 0
    for end in ends:
        lease = area[begin:end]
        begin = end
        partition, offset, timestamp, deliveries, expires, size = struct.unpack_from(
            ">IqqIqH", lease, 0
        )
        topic = lease[34 : 34 + size].decode("utf-8")
        out.append(
            {
                "bookmark": f"{topic}|{partition}|{offset}",
                "timestamp": timestamp,
                "deliveries": deliveries,
                "lease": expires,
                "data": lease[34 + size :],
            }
        )
    return out


def as_documented(lease: PackedLease) -> dict[str, Any]:
    return {
        "bookmark": lease.bookmark,
        "timestamp": lease.timestamp,
        "deliveries": lease.deliveries,
        "lease": lease.lease_expires or 0,
        "data": lease.data,
    }


leases_strategy = st.lists(
    st.builds(
        PackedLease,
        topic=st.text(min_size=1, max_size=40).filter(lambda t: len(t.encode()) < 65536),
        partition=st.integers(0, 2**32 - 1),
        offset=st.integers(0, 2**63 - 1),
        timestamp=st.integers(0, 2**63 - 1),
        deliveries=st.integers(1, 2**32 - 1),
        lease_expires=st.one_of(st.none(), st.integers(1, 2**63 - 1)),
        data=st.binary(max_size=300),
    ),
    min_size=1,
    max_size=20,
)


def entry(lease: PackedLease) -> bytes:
    return lease_entry(
        lease.topic.encode(),
        lease.partition,
        lease.offset,
        lease.timestamp,
        lease.deliveries,
        lease.lease_expires,
        lease.data,
    )


@settings(max_examples=200, deadline=None)
@given(leases_strategy)
def test_a_batch_reads_back_what_was_packed_and_as_the_documentation_says(
    items: list[PackedLease],
) -> None:
    batch = pack([entry(lease) for lease in items])
    read = LeaseBatch(batch)
    assert [read.lease(i) for i in range(read.count)] == items
    assert read_as_documented(batch) == [as_documented(lease) for lease in items]


def test_bodies_empty_unicode_and_large_round_trip() -> None:
    items = [PackedLease("jobs", 1, n, 10 + n, 1, None, body) for n, body in enumerate(BODIES)]
    read = LeaseBatch(pack([entry(lease) for lease in items]))
    assert [read.lease(i) for i in range(read.count)] == items
    assert read.lease(0).data == b"" and read.lease(3).bookmark == "jobs|1|3"


def test_split_keeps_each_batch_within_the_bound_and_the_order() -> None:
    sizes = [300_000, 300_000, 300_000, 10, 1_000_000, 5]
    runs = leases.split(sizes)
    assert [list(r) for r in runs] == [[0, 1], [2, 3], [4], [5]]
    for run in runs[:2]:
        assert leases.batch_size(sum(sizes[i] for i in run), len(run)) <= MAX_PACKED_BYTES
    assert leases.split([]) == []


# -- the engine: packed and per-message deliveries of the same pass -----------------------------


async def _stored(_topic: str, _partition: int, _changes: object) -> bool:
    return True


def queue_spec(sub_id: str, reply_to: str, backlog: int = 100) -> SubscriptionSpec:
    return SubscriptionSpec(
        sub_id=sub_id,
        reply_to=reply_to,
        topic="WQ",
        command=SUBSCRIBE,
        options=parse_options(f"max_backlog={backlog}"),
    )


def runtime(sender: RecordingSender, lease_period_ms: int | None = None) -> QueueRuntime:
    config = QueueConfig(
        name="WQ",
        underlying_topic="work",
        max_per_subscription_backlog=100,
        lease_period_ms=lease_period_ms,
    )
    queue = QueueRuntime(config, TopicNames("p"), sender, _stored)
    queue.partitions = frozenset({("work", 0), ("work", 1)})
    queue.load("work", 0, [], -1)
    queue.load("work", 1, [], -1)
    return queue


def publishes(bodies: list[bytes], first: int = 0) -> list[AppliedPublish]:
    return [AppliedPublish(first + n, 1000 + n, body, {}, None) for n, body in enumerate(bodies)]


def client_sub(sub_id: str = "s1") -> tuple[QueueSubscription, list[tuple[str, list[str]]]]:
    acked: list[tuple[str, list[str]]] = []
    sub = QueueSubscription(
        sub_id,
        [queue_spec(sub_id, "r1")],
        lambda queue, bookmarks, action, wait: acked.append((queue, bookmarks)),
        ack_batch_size=1000,
        ack_interval=60,
    )
    return sub, acked


def received(sub: QueueSubscription) -> list[Message]:
    out = []
    while (msg := sub.next(timeout=0)) is not None:
        out.append(msg)
    return out


def test_a_packed_subscriber_gets_one_record_a_pass_and_the_same_messages() -> None:
    """One subscriber asks for packed leases, one does not: the first gets the pass in one
    ``publish_packed`` record, the second one ``publish`` per message, and the client makes
    the same messages of both (the bookmarks differ: each subscriber leases its own)."""

    async def go() -> None:
        sender = RecordingSender()
        queue = runtime(sender, lease_period_ms=30_000)
        queue.subscribe(queue_spec("s1", "r1"), packed=True)
        queue.subscribe(queue_spec("s2", "r2"))
        queue.append("work", 0, publishes(BODIES * 2))
        assert await queue.deliver_once() == 8
        packed = [r for r in sender.replied if r.topic == "r1"]
        plain = [r for r in sender.replied if r.topic == "r2"]
        (record,) = packed
        assert record.headers == {
            h.COMMAND: leases.PUBLISH_PACKED,
            h.SUB_ID: "s1",
            h.TOPIC: "WQ",
        }
        assert [r.headers[h.COMMAND] for r in plain if r.headers] == [h.PUBLISH] * 4
        sub1, _ = client_sub("s1")
        sub1.on_packed("WQ", record.value)
        sub2, _ = client_sub("s2")
        for reply in plain:
            assert reply.headers is not None
            sub2.on_live(_Live.from_headers(reply.value, reply.headers))
        got1, got2 = received(sub1), received(sub2)
        assert len(got1) == 4 and not sub1.damaged
        bodies = BODIES * 2
        expires = got2[0].lease_expires
        assert expires is not None

        def expected(sub_id: str, msg: Message) -> Message:
            """The message the publish at the bookmark's offset makes for ``sub_id``."""
            offset = int(msg.bookmark.rsplit("|", 1)[1])
            return Message(
                "publish",
                topic="WQ",
                data=bodies[offset],
                timestamp=1000 + offset,
                sub_id=sub_id,
                bookmark=f"work|0|{offset}",
                deliveries=1,
                lease_expires=expires,
            )

        assert got1 == [expected("s1", m) for m in got1]
        assert got2 == [expected("s2", m) for m in got2]
        assert sorted(m.bookmark for m in got1 + got2) == [f"work|0|{n}" for n in range(8)]
        counts = queue.counts[("work", 0)]
        assert counts["delivered"] == 8

    asyncio.run(go())


def test_messages_made_from_a_batch_equal_messages_made_one_by_one() -> None:
    sub, _ = client_sub()
    items = [PackedLease("work", 0, n, 5 + n, 2, 99, b) for n, b in enumerate(BODIES)]
    sub.on_packed("WQ", pack([entry(lease) for lease in items]))
    got = received(sub)
    assert got == [
        Message(
            "publish",
            topic="WQ",
            data=lease.data,
            timestamp=lease.timestamp,
            sub_id="s1",
            bookmark=lease.bookmark,
            deliveries=2,
            lease_expires=99,
        )
        for lease in items
    ]
    assert got[1].json() == {"name": "Zo\u00eb \u2603 \U0001f600"}
    assert got[0].fields() == {}


def test_a_pass_larger_than_the_bound_is_split_and_a_huge_lease_goes_alone() -> None:
    async def go() -> None:
        sender = RecordingSender()
        queue = runtime(sender)
        queue.subscribe(queue_spec("s1", "r1"), packed=True)
        bodies = [bytes([65 + n]) * 250_000 for n in range(7)] + [b"H" * 950_000, b"tail"]
        queue.append("work", 1, publishes(bodies))
        assert await queue.deliver_once() == 9
        commands = [r.headers[h.COMMAND] for r in sender.replied if r.headers]
        assert commands == [leases.PUBLISH_PACKED] * 3 + [h.PUBLISH, leases.PUBLISH_PACKED]
        assert all(len(r.value) <= MAX_PACKED_BYTES for r in sender.replied if r.value != bodies[7])
        sub, _ = client_sub()
        for reply in sender.replied:
            assert reply.headers is not None
            if reply.headers[h.COMMAND] == leases.PUBLISH_PACKED:
                sub.on_packed("WQ", reply.value)
            else:
                sub.on_live(_Live.from_headers(reply.value, reply.headers))
        got = received(sub)
        assert [m.data for m in got] == bodies
        assert [m.bookmark for m in got] == [f"work|1|{n}" for n in range(9)]
        assert queue.counts[("work", 1)]["delivered"] == 9

    asyncio.run(go())


def test_a_subscription_registered_again_without_packing_gets_one_record_a_message() -> None:
    async def go() -> None:
        sender = RecordingSender()
        queue = runtime(sender)
        queue.subscribe(queue_spec("s1", "r1"), packed=True)
        queue.subscribe(queue_spec("s1", "r1"))  # an older client took over the key
        queue.append("work", 0, publishes([b"{}", b"{}"]))
        await queue.deliver_once()
        assert [r.headers[h.COMMAND] for r in sender.replied if r.headers] == [h.PUBLISH] * 2

    asyncio.run(go())


# -- damaged batches ---------------------------------------------------------------------------


GOOD = [PackedLease("work", 0, n, 7, 1, None, b'{"n": %d}' % n) for n in range(3)]


@pytest.mark.parametrize(
    ("batch", "problem"),
    [
        (b"\x01\x00", "shorter than its header"),
        (b"\x02" + pack([entry(GOOD[0])])[1:], "layout version 2"),
        (b"\x01\x00\x00\x00\x00\x00", "holds 0 leases"),
        (b"\x01\x00\x00\x00\x00\x09" + b"\x00" * 10, "holds 9 leases"),
        (pack([entry(lease) for lease in GOOD])[:-1], "leases end at byte"),
        (pack([entry(lease) for lease in GOOD]) + b"!", "leases end at byte"),
        (
            # the first two ends swapped: the second lease would end before it starts
            (lambda b: b[:6] + b[10:14] + b[6:10] + b[14:])(pack([entry(x) for x in GOOD])),
            "shorter than a lease header",
        ),
    ],
)
def test_a_batch_that_cannot_be_read_is_refused_naming_the_problem(
    batch: bytes, problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(CorruptReplyError, match=problem):
        LeaseBatch(batch)
    sub, _ = client_sub()
    with caplog.at_level(logging.ERROR, "sowstream.client"):
        sub.on_packed("WQ", batch)
        sub.on_packed("WQ", pack([entry(lease) for lease in GOOD]))  # the next one is read
    assert [m.bookmark for m in received(sub)] == [lease.bookmark for lease in GOOD]
    (error,) = sub.damaged
    assert "queue subscription s1 on 'WQ'" in str(error) and problem in str(error)
    assert problem in caplog.text


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda e: e[:32] + b"\xff\xff" + e[34:], "topic (65535 bytes) runs past"),
        (lambda e: e[:34] + b"\xff" + e[35:], "topic is not UTF-8"),
        (lambda e: e[:32] + b"\x00\x00" + e[34:], "topic is empty"),
    ],
)
def test_a_damaged_lease_costs_only_itself(damage: Any, problem: str) -> None:
    entries = [entry(lease) for lease in GOOD]
    entries[1] = damage(entries[1])
    sub, acked = client_sub()
    sub.on_packed("WQ", pack(entries))
    got = received(sub)
    assert [m.bookmark for m in got] == [GOOD[0].bookmark, GOOD[2].bookmark]
    (error,) = sub.damaged
    assert "lease batch lease 1" in str(error) and problem in str(error)
    for msg in got:
        sub.ack(msg)
    sub.flush_acks()
    assert acked == [("WQ", [GOOD[0].bookmark, GOOD[2].bookmark])]


# -- the registration header ---------------------------------------------------------------------


class Registration:
    """What confluent-kafka hands the registry for one registry record."""

    def __init__(self, key: bytes, value: bytes | None, headers: list[tuple[str, bytes]]) -> None:
        self._key, self._value, self._headers = key, value, headers

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (1, 0)


def test_the_registry_knows_which_registrations_ask_for_packed_leases() -> None:
    applied: list[tuple[str, bool]] = []
    registry: SubscriptionRegistry

    def apply(key: str, spec: SubscriptionSpec | None) -> None:
        applied.append((key, key in registry.packed))

    registry = SubscriptionRegistry("127.0.0.1:1", "p.subs", {}, apply)
    spec = queue_spec("s1", "p.reply.c1")
    key, value = spec.key.encode(), encode("Subscription", spec.to_wire())
    registry._handle(Registration(key, value, [(h.PACKED, b"1")]))
    registry._handle(Registration(key, value, [(h.PACKED, b"2")]))  # a layout it does not write
    registry._handle(Registration(key, value, [(h.PACKED, b"1")]))
    registry._handle(Registration(key, None, []))
    registry._handle(Registration(key, value, []))
    assert [packed for _, packed in applied] == [True, False, True, False, False]
