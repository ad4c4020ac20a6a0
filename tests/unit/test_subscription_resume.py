"""Where a subscription the engine ended is placed again from (issue 26): per partition, right
after the last message the application got, so the replay leaves no gap; and what the replay
repeats is dropped."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest

from sowstream.client.connection import Connection
from sowstream.client.messages import Message
from sowstream.client.querying import Querying
from sowstream.client.queueing import Queueing
from sowstream.client.subscribing import Subscribing
from sowstream.client.subscription import RESUME, Subscription, _Live
from sowstream.client.topics import TopicInfo
from sowstream.errors import CommandTimeoutError
from sowstream.sow.bookmarks import EPOCH, parse_bookmark
from sowstream.subscriptions.model import SUBSCRIBE, SubscriptionSpec
from sowstream.subscriptions.options import parse_options


def _sub() -> Subscription:
    spec = SubscriptionSpec(
        sub_id="s1",
        reply_to="r",
        topic="t",
        command=SUBSCRIBE,
        filter=None,
        options=parse_options(None),
    )
    return Subscription("s1", [spec], parse_options(None), key_fields={"t": ("/id",)})


def _live(partition: int, offset: int, seq: int = 0, ts: int = 1_000) -> _Live:
    return _Live("publish", "t", partition, offset, f"k{offset}", b'{"id": 1}', ts, "", False, seq)


def _offsets(sub: Subscription) -> list[tuple[int, int]]:
    out = []
    while (msg := sub.next(timeout=0)) is not None:
        partition, offset = (int(x) for x in msg.bookmark.split("|")[1:])
        out.append((partition, offset))
    return out


def test_each_partition_resumes_right_after_what_was_delivered() -> None:
    sub = _sub()
    sub.set_cut("t", 0, 9)  # placement: the partition was at 9
    sub.set_cut("t", 1, 4)
    sub.set_cut("t", 2, -1)  # an empty partition
    sub.release()
    sub.on_live(_live(0, 12, ts=5_000))
    sub.on_live(_live(3, 7, seq=2, ts=6_000))  # two of a delete by filter's records at 7
    marks = sub.resume_bookmarks()
    assert marks[("t", 0)] == "5000|0|12"
    assert marks[("t", 1)] == "0|1|4"  # nothing since the cut: after the cut
    assert marks[("t", 2)] == EPOCH
    # Only part of offset 7's records may have come: replay offset 7 again.
    assert marks[("t", 3)] == "6000|3|6"
    for (_, partition), text in marks.items():
        if text != EPOCH:
            mark = parse_bookmark(text)
            assert mark.partition == partition and mark.offset is not None


def test_what_a_replay_from_there_repeats_is_dropped_and_the_rest_comes_in_order() -> None:
    sub = _sub()
    sub.set_cut("t", 0, 9)
    sub.release()
    sub.on_live(_live(0, 10))
    sub.on_live(_live(0, 11, seq=1))
    assert _offsets(sub) == [(0, 10), (0, 11)]
    # The engine ended it; placing it again holds live messages until the replay is in.
    sub.hold()
    assert sub.resume_bookmarks()[("t", 0)] == "1000|0|10"
    for offset, seq in [(11, 1), (11, 2), (12, 0)]:  # the replay from offset 11
        sub.on_live(_live(0, offset, seq))
    sub.set_cut("t", 0, 10)  # its part_end: one below the first replayed offset
    sub.release()
    assert _offsets(sub) == [(0, 11), (0, 12)]
    assert sub.resume_bookmarks()[("t", 0)] == "1000|0|12"


def test_a_replayed_message_that_arrives_after_a_later_live_one_is_not_lost() -> None:
    """Found by the chaos run: the partition's owner sent a live message (offset 140) on reading
    the registration, before it ran the placement whose replay from the bookmark holds offset
    121; released in arrival order, 121 looked like a repeat and was dropped."""
    sub = _sub()
    sub.set_cut("t", 7, 18)
    sub.release()
    sub.hold()  # placed again from its resume bookmark (after 18)
    sub.on_live(_live(7, 140, ts=3_000))  # live, before the placement ran
    sub.on_live(_live(7, 121, ts=2_000))  # the replay
    sub.on_live(_live(7, 140, ts=3_000))
    sub.on_live(_live(3, 5, ts=2_500))
    sub.set_cut("t", 7, 18)  # the replay's part_end: the bookmark's offset
    sub.release()
    assert _offsets(sub) == [(3, 5), (7, 121), (7, 140)]


def test_of_two_held_messages_at_one_position_the_later_one_is_kept() -> None:
    """Found by the chaos run: a conflated subscription placed again got, before its replay, a
    flush built on reading the registration, an oof carrying a state from before the client's
    bookmark; the replay's oof at the same offset carries what the subscriber holds."""
    sub = _sub()
    sub.set_cut("t", 0, 20)
    sub.release()
    sub.hold()
    early = _Live("oof", "t", 0, 30, "k", b'{"id": 1, "v": 48}', 3_000, "match", False, 0)
    replayed = _Live("oof", "t", 0, 30, "k", b'{"id": 1, "v": 54}', 3_000, "match", False, 0)
    sub.on_live(early)
    sub.on_live(_live(0, 27))
    sub.on_live(replayed)
    sub.set_cut("t", 0, 20)
    sub.release()
    got = []
    while (msg := sub.next(timeout=0)) is not None:
        got.append((msg.command, msg.json()))
    assert got == [("publish", {"id": 1}), ("oof", {"id": 1, "v": 54})]


class _Engine:
    """What placing a subscription again needs of the connection: the topic's definition and a
    registry that takes registrations (the engine's answers come through ``place`` below)."""

    def __init__(self) -> None:
        self.on_ended: object = None

    def topic_info(self, topic: str, message_type: str | None = None) -> TopicInfo:
        return TopicInfo(topic, ("/id",), topic, 8, f"log.{topic}", f"ctl.{topic}")

    def register(self, specs: object) -> None:
        pass


class _FlakyPlacement(Subscribing):
    """The first placement again times out after partition 7's owner sent a live message (its
    replay never came: its owner was killed); the second brings the replay."""

    def __init__(self) -> None:
        super().__init__(cast(Connection, _Engine()), cast(Querying, None), cast(Queueing, None))
        self.tries = 0

    def place(self, sub: Any, *args: Any, **kwargs: Any) -> Iterator[Message]:
        self.tries += 1
        assert kwargs["bookmarks"][("t", 7)] == "0|7|18"
        sub.on_live(_live(7, 140, ts=3_000))
        if self.tries == 1:
            raise CommandTimeoutError("no complete answer to command c within 30s")
        sub.on_live(_live(7, 121, ts=2_000))  # the replay from the bookmark
        sub.set_cut("t", 7, 18)
        return iter(())


def test_a_placement_again_that_times_out_keeps_holding_until_one_completes() -> None:
    """Found by the chaos run: the first try's timeout let the held live message (140) through,
    and the replay (121) that the second try brought was dropped as a repeat."""
    sub = _sub()
    sub.set_cut("t", 7, 18)
    sub.release()
    subscribing = _FlakyPlacement()
    sub.hold(RESUME)
    with pytest.raises(CommandTimeoutError):
        subscribing._place_again(sub)
    assert _offsets(sub) == []  # still held
    subscribing._place_again(sub)
    assert _offsets(sub) == [(7, 121), (7, 140)]


def test_the_first_placement_ending_does_not_release_what_a_resume_holds() -> None:
    """Found by the chaos run: the engine ended the subscription while its first placement was
    still being read; that placement's end let live messages through while the placement again
    was on its way, and its replay (offset 87) was dropped behind them (100)."""
    sub = _sub()  # held by its first placement
    sub.set_cut("t", 0, 52)
    sub.hold(RESUME)  # the engine ended it: placing it again from the cuts known so far
    sub.release()  # the first placement completes
    sub.on_live(_live(0, 100, ts=3_000))  # live, from the new registration
    assert _offsets(sub) == []
    sub.on_live(_live(0, 87, ts=2_000))  # the replay
    sub.set_cut("t", 0, 52)
    sub.release(RESUME)
    assert _offsets(sub) == [(0, 87), (0, 100)]
