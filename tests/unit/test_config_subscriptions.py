"""Configuration for subscriptions: entitlements, the slow-consumer policy and plain topics."""

from __future__ import annotations

import pytest

from sowstream.config import ConfigError
from sowstream.config import load_config_text as load

TOPICS = "sow:\n  - Name: orders\n    Key: /id\n"


def test_entitlements_resolve_per_identity_with_a_default() -> None:
    config = load(
        TOPICS
        + "entitlements:\n  alice: {orders: \"/owner = 'alice'\"}\n  '*': {orders: '/public = 1'}\n"
    )
    lookup = config.entitlement_lookup("orders")
    alice, other = lookup("alice"), lookup("bob")
    assert alice is not None and alice.matches({"owner": "alice"})
    assert other is not None and other.matches({"public": 1})
    assert load(TOPICS).entitlement_lookup("orders")("anyone") is None


@pytest.mark.parametrize(
    ("text", "element", "problem"),
    [
        ("entitlements:\n  alice: {nope: '/a = 1'}\n", "entitlements.alice.nope", "unknown topic"),
        ("entitlements:\n  alice: {orders: '/a = = 1'}\n", "entitlements.alice.orders", "position"),
        ("entitlements:\n  alice: [1]\n", "entitlements.alice", "must map"),
        ("entitlements:\n  alice: {orders: ''}\n", "entitlements.alice.orders", "filter"),
    ],
)
def test_bad_entitlements_name_the_element(text: str, element: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(TOPICS + text)
    assert err.value.element == element and problem in str(err.value)


def test_slow_consumer_policy_defaults_and_units() -> None:
    policy = load(TOPICS).engine.slow_consumer
    assert (policy.conflate_after, policy.drop_after) == (10_000, 100_000)
    custom = load(
        "engine:\n  slow_consumer: {conflate_after: 5, drop_after: 50, conflation_interval: 2s}\n"
    ).engine.slow_consumer
    assert (custom.conflate_after, custom.drop_after, custom.conflation_interval) == (5, 50, 2000)
    assert (policy.reply_topic_wait, policy.max_parked_bytes) == (30_000, 16 * 1024 * 1024)
    parking = load(
        "engine:\n  slow_consumer: {reply_topic_wait: 1m, max_parked_bytes: 64KB}\n"
    ).engine.slow_consumer
    assert (parking.reply_topic_wait, parking.max_parked_bytes) == (60_000, 65_536)


@pytest.mark.parametrize(
    ("engine", "problem"),
    [
        ("{conflate_after: 50, drop_after: 5}", "drop_after"),
        ("{conflation_interval: 10ms}", "between 100"),
        ("{bogus: 1}", "bogus"),
        ("{reply_topic_wait: 1ms}", "reply_topic_wait"),
        ("{max_parked_bytes: 10}", "max_parked_bytes"),
        ("{max_parked_bytes: lots}", "max_parked_bytes"),
    ],
)
def test_bad_slow_consumer_policy(engine: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load(f"engine:\n  slow_consumer: {engine}\n")


def test_plain_topics_have_no_sow() -> None:
    config = load(TOPICS + "topics:\n  - Name: ticks\n    Partitions: 2\n")
    ticks = config.topic("ticks")
    assert not ticks.sow and ticks.partitions == 2 and config.topic("orders").sow


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("topics:\n  - Name: t\n    Expiration: 5s\n", "only applies to SOW topics"),
        ("topics:\n  - Name: orders\n", "already defined"),
        ("topics: {Name: t}\n", "must be a list"),
    ],
)
def test_bad_plain_topics(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load(TOPICS + text)
