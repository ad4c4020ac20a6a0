"""The worker's reply-topic bookkeeping: parked replies keep their order and their bounds, and
the tracked set forgets the topics of clients that are gone (issue 26)."""

from __future__ import annotations

import asyncio

from sowstream.engine.replytopics import Parking, ReplyTopics


def _topics(wait: float = 30.0, max_bytes: int = 1_000) -> ReplyTopics:
    return ReplyTopics(wait=wait, max_bytes=max_bytes)


def test_parked_replies_come_out_in_order_and_then_the_topic_is_no_longer_parked() -> None:
    topics = _topics()
    assert topics.park("r.a", b"1", None, 0.0) is Parking.STARTED
    assert topics.park("r.a", b"2", [("sow.cmd", b"publish")], 0.1) is Parking.QUEUED
    assert topics.is_parked("r.a") and not topics.is_parked("r.b")
    out = []
    while (reply := topics.take("r.a")) is not None:
        out.append((reply.value, reply.headers))
    assert out == [(b"1", None), (b"2", [("sow.cmd", b"publish")])]
    assert not topics.is_parked("r.a")
    assert topics.parked_bytes() == 0


def test_a_reply_parked_while_draining_goes_out_before_the_topic_is_released() -> None:
    topics = _topics()
    topics.park("r.a", b"1", None, 0.0)
    first = topics.take("r.a")
    topics.park("r.a", b"2", None, 0.5)  # arrives while the first one is being sent
    second = topics.take("r.a")
    assert first is not None and second is not None and second.value == b"2"
    assert topics.take("r.a") is None and not topics.is_parked("r.a")


def test_parking_past_the_byte_bound_drops_what_waited_once_and_keeps_what_follows() -> None:
    topics = _topics(max_bytes=100)
    topics.park("r.a", b"x" * 60, None, 0.0)
    # The bound is crossed: everything parked goes, and the caller ends the client (once).
    assert topics.park("r.a", b"y" * 60, None, 0.1) is Parking.OVERFLOW
    assert topics.parked_bytes() == 0
    # What follows (the failure messages telling the client) is kept while it fits.
    assert topics.park("r.a", b"failure", None, 0.2) is Parking.QUEUED
    assert topics.park("r.a", b"z" * 95, None, 0.3) is Parking.QUEUED
    kept = []
    while (reply := topics.take("r.a")) is not None:
        kept.append(reply.value)
    assert kept == [b"z" * 95], "a second overflow makes room again, without a second report"


def test_headers_count_towards_the_bound() -> None:
    topics = _topics(max_bytes=50)
    topics.park("r.a", b"v", [("sow.sub_id", b"s" * 30)], 0.0)
    assert topics.parked_bytes() == 1 + len("sow.sub_id") + 30
    assert topics.park("r.a", b"v", [("sow.sub_id", b"s" * 30)], 0.1) is Parking.OVERFLOW


def test_a_topic_expires_after_the_wait_and_dropping_reports_how_many_waited() -> None:
    topics = _topics(wait=5.0)
    topics.park("r.a", b"1", None, 10.0)
    topics.park("r.a", b"2", None, 14.0)
    assert not topics.expired("r.a", 14.9)
    assert topics.expired("r.a", 15.1)  # counted from the first reply parked
    assert topics.drop("r.a") == 2
    assert not topics.is_parked("r.a") and not topics.expired("r.a", 99.0)
    assert topics.drop("r.a") == 0


def test_the_tracked_set_stays_bounded_over_a_thousand_clients_that_connect_and_close() -> None:
    async def run() -> int:
        loop = asyncio.get_running_loop()
        topics = _topics()
        most = 0
        live: list[str] = []
        for i in range(1_000):
            topic = f"sowstream.reply.client-{i}"
            assert topics.track(topic)
            assert not topics.track(topic)
            done = loop.create_future()
            topics.sent(topic, done)
            assert not topics.idle(topic), "a reply in flight keeps the topic"
            done.set_result(None)
            assert topics.idle(topic)
            live.append(topic)
            if len(live) > 5:  # a few clients connected at a time
                assert topics.forget(live.pop(0))
            most = max(most, len(topics.tracked()))
        for topic in live:
            topics.forget(topic)
        assert topics.tracked() == frozenset()
        assert not topics.forget("sowstream.reply.client-0")
        return most

    assert asyncio.run(run()) == 5


def test_a_parked_topic_is_not_idle() -> None:
    topics = _topics()
    topics.track("r.a")
    topics.park("r.a", b"1", None, 0.0)
    assert not topics.idle("r.a")
    topics.take("r.a")
    topics.take("r.a")
    assert topics.idle("r.a")
