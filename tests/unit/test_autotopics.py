"""Topics created on first use: registrations held for a topic until it turns up."""

from __future__ import annotations

from typing import Any

from sowstream.engine.autotopics import AutoTopics
from sowstream.subscriptions.model import SubscriptionSpec
from tests.support.router import Setup


def test_a_bad_registration_held_for_a_new_topic_is_refused_and_the_rest_served() -> None:
    """It raised out of serving the topic: the topic went unserved for every subscriber."""
    setup = Setup()
    auto = AutoTopics(setup.config, setup.topology)
    refused: list[tuple[Any, ...]] = []
    auto.refuse = lambda *args: refused.append(args)
    good = SubscriptionSpec(sub_id="ok", reply_to="reply.c1", topic="fresh", command="subscribe")
    bad = SubscriptionSpec(
        sub_id="bad", reply_to="reply.c1", topic="fresh", command="subscribe", filter="/a = = 1"
    )
    auto.hold("fresh", bad.key, bad)
    auto.hold("fresh", good.key, good)
    auto.add("fresh")
    unit = setup.topology.topics["fresh"]
    assert [spec.key for spec in unit.proc.subs.specs()] == [good.key]
    ((key, raw, reason, text),) = refused
    assert (key, raw["sub_id"], raw["reply_to"], reason) == (
        bad.key,
        "bad",
        "reply.c1",
        "bad_filter",
    )
    assert text.startswith("topic 'fresh': filter error at position 5")


def test_a_name_a_regex_queue_matches_is_created_and_feeds_the_queue() -> None:
    """AMPS needs no declaration of a queue's topics: ORDERS_NEW is created on first use and
    its publishes go to MQ; a name the expression does not match stays a plain topic."""
    config = (
        "engine:\n  auto_create_topics: true\nsow:\n  - Name: orders\n    Key: /id\n"
        "queues:\n  - Name: MQ\n    UnderlyingTopic: ORDERS_.*\n"
        "    DefaultPublishTarget: ORDERS_DIRECT\n"
    )
    setup = Setup(config=config)
    auto = AutoTopics(setup.config, setup.topology)
    assert auto.refusal("ORDERS_NEW") is None
    auto.add("ORDERS_NEW")
    auto.add("fresh")
    queued, plain = setup.topology.topics["ORDERS_NEW"], setup.topology.topics["fresh"]
    assert queued.auto and queued.feeds_queues
    assert [q.name for q in queued.proc.queues] == ["MQ"]
    assert queued.proc.ownership.created_on_first_use  # every queue takes its whole log
    assert not plain.feeds_queues and plain.proc.queues == []
