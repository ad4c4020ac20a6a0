"""The client's reply box: replies wait for their command's caller, unread ones do not pile up."""

from __future__ import annotations

from sowstream.client.replies import ReplyBox
from sowstream.wire.protocol import ACK, Reply


def reply(command_id: str, n: int) -> Reply:
    return Reply(ACK, command_id, count=n)


def test_replies_come_back_per_command_in_arrival_order() -> None:
    box = ReplyBox(keep_s=60)
    box.park(reply("a", 1), 0.0)
    box.park(reply("b", 1), 0.0)
    box.park(reply("a", 2), 0.0)
    assert [box.take("a", 0.0), box.take("a", 0.0), box.take("a", 0.0)] == [
        reply("a", 1),
        reply("a", 2),
        None,
    ]
    assert box.has("b") and not box.has("a") and len(box) == 1


def test_replies_nobody_reads_are_dropped_after_keep_s_and_read_ones_are_kept() -> None:
    box = ReplyBox(keep_s=60)
    for i in range(1000):  # e.g. duplicate answers after a rebalance, read by nobody
        box.park(reply(f"orphan-{i}", 0), float(i % 10))
    box.park(reply("live", 1), 50.0)
    box.park(reply("live", 2), 50.0)
    assert box.take("live", 65.0) == reply("live", 1)  # reading keeps the rest alive
    box.park(reply("later", 1), 100.0)  # a sweep: the orphans are 90+ seconds old
    assert len(box) == 2 and box.take("live", 100.0) == reply("live", 2)
    assert box.take("later", 100.0) == reply("later", 1) and len(box) == 0
