"""Replies go to clients' reply topics only: a command, registration or publish header naming
another topic (a log, a changelog) must not make the engine write there."""

from __future__ import annotations

import pytest

from sowstream.wire.topics import TopicNames

NAMES = TopicNames("p")


@pytest.mark.parametrize("topic", ["p.reply.c1", "p.reply.alice-7f3a"])
def test_a_clients_reply_topic_is_taken(topic: str) -> None:
    assert NAMES.reply_topic_problem(topic) is None


@pytest.mark.parametrize(
    "topic", ["p.log.orders", "p.ctl.orders", "p.reply.", "q.reply.c1", "p.subs", "", "reply.c1"]
)
def test_any_other_topic_is_refused_naming_it(topic: str) -> None:
    problem = NAMES.reply_topic_problem(topic)
    assert problem is not None and repr(topic) in problem and "p.reply.<client>" in problem
