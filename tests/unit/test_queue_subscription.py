"""The client's queue subscription: the processed ack's backlog, and the acknowledgements of a
subscription over several queues going to each message's queue."""

from __future__ import annotations

from sowstream.client.messages import Message
from sowstream.client.queue import QueueSubscription
from sowstream.subscriptions.model import SUBSCRIBE, SubscriptionSpec
from sowstream.subscriptions.options import parse_options


def spec(queue: str) -> SubscriptionSpec:
    return SubscriptionSpec(
        sub_id="s1",
        reply_to="reply.c1",
        topic=queue,
        command=SUBSCRIBE,
        options=parse_options("max_backlog=10"),
        topic_regex="Q[AB]",
    )


def message(queue: str, bookmark: str) -> Message:
    return Message("publish", topic=queue, sub_id="s1", bookmark=bookmark)


def test_the_processed_ack_sets_the_backlog() -> None:
    sent: list[tuple[str, list[str], str, bool]] = []
    sub = QueueSubscription(
        "s1",
        [spec("QA")],
        lambda queue, bookmarks, action, wait: sent.append((queue, bookmarks, action, wait)),
        ack_batch_size=5,
        ack_interval=60,
    )
    assert sub.max_backlog is None and sub.wait_processed(0) is None
    sub.on_processed("max_backlog=bad")  # not options it reads: ignored
    sub.on_processed("")
    assert sub.max_backlog is None
    sub.on_processed("max_backlog=2")
    sub.on_processed("max_backlog=7")  # another worker's: the first one stays
    assert sub.max_backlog == 2 == sub.wait_processed(0)
    # Batches stay as asked: close() relies on them to apply the last acks before the leases
    # go back.
    sub.ack(message("QA", "a|0|1"))
    sub.ack(message("QA", "a|0|2"))
    assert sent == []
    sub.flush_acks()
    assert sent == [("QA", ["a|0|1", "a|0|2"], "", False)]


def test_acks_of_a_subscription_over_several_queues_go_to_each_queue() -> None:
    sent: list[tuple[str, list[str], str, bool]] = []
    sub = QueueSubscription(
        "s1",
        [spec("QA"), spec("QB")],
        lambda queue, bookmarks, action, wait: sent.append((queue, bookmarks, action, wait)),
        ack_batch_size=10,
        ack_interval=60,
    )
    assert sub.queues == ("QA", "QB")
    sub.ack(message("QA", "a|0|1"))
    sub.ack(message("QB", "b|0|1"))
    sub.cancel(message("QB", "b|0|2"))
    sub.ack(message("QA", "a|1|5"))
    sub.flush_acks(wait=True)
    assert sent == [
        ("QA", ["a|0|1", "a|1|5"], "", True),
        ("QB", ["b|0|1"], "", True),
        ("QB", ["b|0|2"], "cancel", True),
    ]
