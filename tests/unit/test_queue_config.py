"""Queue definitions: YAML ``queues:``, AMPS ``<Queue>``/``<LocalQueue>``/``<GroupLocalQueue>``,
their defaults, and every load-time check (errors name the element and say why)."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sowstream.config import ConfigError, SowstreamConfig, TopicConfig
from sowstream.config import load_config_text as load
from sowstream.config.queues import QUEUE_ELEMENTS, QueueConfig
from sowstream.errors import UnknownTopicError

# --- Chapter 05's two queue examples, verbatim ---

SPEC_05_QUEUE_EXAMPLE = """\
<!-- Notice that the topics to use for the queue (ORDERS_.*) must be
    recorded in a transaction log. -->
<SOW>
    <Queue>
        <Name>MQ</Name>
        <MessageType>json</MessageType>
        <UnderlyingTopic>ORDERS_.*</UnderlyingTopic>
        <DefaultPublishTarget>ORDERS_DIRECT</DefaultPublishTarget>
        <LeasePeriod>60s</LeasePeriod>
        <Expiration>1d</Expiration>
        <MaxBacklog>3</MaxBacklog>
    </Queue>
  </SOW>
"""

SPEC_05_GROUP_LOCAL_QUEUE_EXAMPLE = """\
<SOW>
    <GroupLocalQueue>
        <Name>GroupQueue</Name>
        <MessageType>json</MessageType>
        <UnderlyingTopic>ORDERS_.*</UnderlyingTopic>
        <DefaultPublishTarget>ORDERS_DIRECT</DefaultPublishTarget>
        <GroupLocalQueueDomain>CONSUME_INSTANCES</GroupLocalQueueDomain>
    </GroupLocalQueue>
</SOW>
"""

# The examples assume ORDERS_* topics recorded in the transaction log; sowstream's AMPS reader
# only knows topics declared in <SOW>, so the tests add one.
ORDERS_TOPIC = "<Topic><Name>ORDERS_DIRECT</Name><MessageType>json</MessageType></Topic>"


def with_orders_topic(example: str) -> str:
    return example.replace("<SOW>", "<SOW>" + ORDERS_TOPIC, 1)


def load_error(text: str, source: str = "cfg", **kwargs: bool) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load(text, source, **kwargs)
    return caught.value


def test_spec_05_mq_example_loads() -> None:
    config = load(with_orders_topic(SPEC_05_QUEUE_EXAMPLE), "amps.xml")
    mq = config.queue("MQ")
    assert mq.kind == "queue" and mq.element == "Queue"
    assert mq.underlying_topic == "ORDERS_.*" and mq.underlying_is_pattern
    assert mq.default_publish_target == "ORDERS_DIRECT" == mq.publish_target
    assert mq.lease_period_ms == 60_000
    assert mq.expiration_ms == 86_400_000
    assert mq.max_backlog == 3
    assert mq.max_per_subscription_backlog == 1
    assert mq.fairness_model == "proportional" and mq.semantics == "at-least-once"
    assert mq.underlying_topics(t.name for t in config.topics) == ["ORDERS_DIRECT"]


def test_spec_05_mq_example_loads_as_printed() -> None:
    # Issue 27: AMPS needs no declaration of the topics a queue reads. A regular expression
    # takes topics as they come; its DefaultPublishTarget becomes a topic without a SOW.
    config = load(SPEC_05_QUEUE_EXAMPLE, "amps.xml")
    mq = config.queue("MQ")
    assert mq.publish_target == "ORDERS_DIRECT"
    (target,) = config.topics
    assert (target.name, target.sow, target.message_type) == ("ORDERS_DIRECT", False, "json")
    assert mq.underlying_topics(t.name for t in config.topics) == ["ORDERS_DIRECT"]
    group = load(SPEC_05_GROUP_LOCAL_QUEUE_EXAMPLE, "amps.xml")
    assert [t.name for t in group.topics] == ["ORDERS_DIRECT"]


@pytest.mark.parametrize("kind", ["yaml", "xml"])
def test_a_regex_queue_may_match_no_topic_yet(kind: str) -> None:
    body = {"UnderlyingTopic": "zz.*", "DefaultPublishTarget": "zz1"}
    text = xml_queue(body, "Queue") if kind == "xml" else yaml_queue(body, "Queue")
    config = load(text, f"q.{kind}")
    assert config.queue("Q").publish_target == "zz1"
    assert config.topic("zz1").sow is False
    # With a declared target nothing is added; a plain UnderlyingTopic must still be declared.
    declared = load(text.replace("work_b", "zz1"), f"q.{kind}")
    assert [t.name for t in declared.topics].count("zz1") == 1
    err = load_error(
        xml_queue({"UnderlyingTopic": "nothing"}, "Queue")
        if kind == "xml"
        else yaml_queue({"UnderlyingTopic": "nothing"}, "Queue"),
        f"q.{kind}",
    )
    assert "'nothing' matches no topic of this configuration" in err.problem


def test_spec_05_group_queue_example_loads_as_printed(caplog: pytest.LogCaptureFixture) -> None:
    # The example leaves out InitialOwner, which AMPS requires: accepted with a warning, since
    # on one Kafka cluster the owner would not change delivery.
    verbatim = with_orders_topic(SPEC_05_GROUP_LOCAL_QUEUE_EXAMPLE)
    with caplog.at_level("WARNING", logger="sowstream.config"):
        queue = load(verbatim, "amps.xml").queue("GroupQueue")
    assert "GroupQueue has no InitialOwner" in caplog.text
    assert queue.kind == "group_local"
    assert queue.initial_owner is None
    assert queue.group_local_queue_domain == "CONSUME_INSTANCES"
    assert queue.publish_target == "ORDERS_DIRECT"


# --- YAML ---

FULL_YAML = """
sow:
  - Name: orders
    Key: /id
topics:
  - Name: work
queues:
  - Name: WQ
    Kind: LocalQueue
    MessageType: json
    UnderlyingTopic: work
    DefaultPublishTarget: work
    LeasePeriod: 30s
    Semantics: at-least-once
    MaxBacklog: 50
    MaxPerSubscriptionBacklog: 10
    Expiration: 1h
    Filter: /kind = 'job'
    RecoveryPoint: 20261123T080000
    FairnessModel: fast
    Leasing: strict
    MaxDeliveries: 5
    MaxCancels: 3
    Priority: /p * 2
    DeferredAckExpiration: 15m
    FileBackedMetadata: enabled
  - Name: OQ
    UnderlyingTopic: orders
    TargetQueueDepth: 5000
    Semantics: AT-MOST-ONCE
"""


def test_full_yaml_queue() -> None:
    config = load(FULL_YAML, "q.yaml")
    wq, oq = config.queues
    assert wq == QueueConfig(
        name="WQ",
        kind="local",
        underlying_topic="work",
        default_publish_target="work",
        lease_period_ms=30_000,
        max_backlog=50,
        max_per_subscription_backlog=10,
        expiration_ms=3_600_000,
        filter="/kind = 'job'",
        recovery_point="20261123T080000",
        fairness_model="fast",
        leasing="strict",
        max_deliveries=5,
        max_cancels=3,
        priority="/p * 2",
        deferred_ack_expiration_ms=900_000,
        file_backed_metadata=True,
    )
    assert wq.recovery_point_ms == 1_795_420_800_000
    assert oq.semantics == "at-most-once"
    assert oq.fairness_model == "round-robin"  # the default for at-most-once
    assert oq.target_queue_depth == 5000
    assert config.queue("OQ") is oq
    with pytest.raises(UnknownTopicError):
        config.queue("work")  # a topic, not a queue


def test_queue_defaults() -> None:
    config = load("topics:\n  - Name: WQ\nqueues:\n  - Name: WQ\n")
    (queue,) = config.queues
    assert queue.kind == "queue"
    assert queue.message_type == "json"
    assert queue.underlying_topic == "WQ" == queue.default_publish_target
    assert queue.lease_period_ms is None  # infinite
    assert queue.semantics == "at-least-once" and queue.fairness_model == "proportional"
    assert queue.max_backlog is None and queue.max_per_subscription_backlog == 1
    assert queue.target_queue_depth is None and queue.expiration_ms is None
    assert queue.filter is None and queue.priority is None and queue.barrier_expression is None
    assert queue.recovery_point == "epoch" and queue.recovery_point_ms is None
    assert queue.leasing == "sublet"
    assert queue.max_deliveries == 0 and queue.max_cancels == 0
    assert queue.deferred_ack_expiration_ms == 86_400_000
    assert queue.initial_owner is None and queue.group_local_queue_domain is None


@pytest.mark.parametrize(
    ("value", "stored", "millis"),
    [
        ("epoch", "epoch", None),
        ("NOW", "now", None),
        ("creation", "now", None),
        ("20261123T080000", "20261123T080000", 1_795_420_800_000),
        ("2026-11-23T08:00:00Z", "2026-11-23T08:00:00Z", 1_795_420_800_000),
    ],
)
def test_recovery_points(value: str, stored: str, millis: int | None) -> None:
    queue = QueueConfig(name="q", recovery_point=value)
    assert queue.recovery_point == stored
    assert queue.recovery_point_ms == millis


def test_bare_numbers_are_seconds_for_yaml_intervals() -> None:
    text = (
        "topics:\n  - Name: w\nqueues:\n  - Name: q\n    UnderlyingTopic: w\n    LeasePeriod: 5\n"
    )
    assert load(text).queue("q").lease_period_ms == 5_000


def test_kinds_in_yaml() -> None:
    for kind, expected in [
        ("Queue", "queue"),
        ("QueueDefinition", "queue"),
        ("LocalQueue", "local"),
    ]:
        text = (
            f"topics: [{{Name: w}}]\nqueues:\n  - {{Name: q, UnderlyingTopic: w, Kind: {kind}}}\n"
        )
        assert load(text).queue("q").kind == expected


def test_queue_matches_topics_q18_fan_out_configuration() -> None:
    # Q18 / section 3: one publish to ORDERS feeds both queues; each direct topic feeds one.
    text = """
topics:
  - Name: ORDERS
  - Name: ORDERS_ANALYTICS_DIRECT
  - Name: ORDERS_RISK_DIRECT
queues:
  - Name: ORDERS_ANALYTICS
    UnderlyingTopic: ^ORDERS$|^ORDERS_ANALYTICS_DIRECT$
    DefaultPublishTarget: ORDERS_ANALYTICS_DIRECT
  - Name: ORDERS_RISK
    UnderlyingTopic: ^ORDERS$|^ORDERS_RISK_DIRECT$
    DefaultPublishTarget: ORDERS_RISK_DIRECT
"""
    analytics, risk = load(text).queues
    fed = {
        topic: [q.name for q in (analytics, risk) if q.matches_topic(topic)]
        for topic in ("ORDERS", "ORDERS_ANALYTICS_DIRECT", "ORDERS_RISK_DIRECT")
    }
    assert fed == {
        "ORDERS": ["ORDERS_ANALYTICS", "ORDERS_RISK"],
        "ORDERS_ANALYTICS_DIRECT": ["ORDERS_ANALYTICS"],
        "ORDERS_RISK_DIRECT": ["ORDERS_RISK"],
    }
    assert analytics.publish_target == "ORDERS_ANALYTICS_DIRECT"


# --- Validation: every rule, in both formats ---

TOPICS_YAML = "sow:\n  - Name: work\n    Key: /id\ntopics:\n  - Name: work_b\n"
TOPICS_XML = (
    "<Topic><Name>work</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"
    "<Topic><Name>work_b</Name><MessageType>json</MessageType></Topic>"
)


def yaml_queue(body: dict[str, str], kind: str = "Queue") -> str:
    lines = [f"    {key}: {value!r}" for key, value in body.items()]
    return TOPICS_YAML + f"queues:\n  - Name: Q\n    Kind: {kind}\n" + "\n".join(lines) + "\n"


def xml_queue(body: dict[str, str], kind: str = "Queue") -> str:
    inner = "".join(f"<{key}>{value}</{key}>" for key, value in body.items())
    return f"<SOW>{TOPICS_XML}<{kind}><Name>Q</Name>{inner}</{kind}></SOW>"


RULES = [
    # (queue elements, kind, element named, words in the problem)
    (
        {"UnderlyingTopic": "work", "Priority": "/p", "BarrierExpression": "/sync IS NOT NULL"},
        "Queue",
        "Priority",
        "cannot be combined with BarrierExpression",
    ),
    (
        {"UnderlyingTopic": "work", "TargetQueueDepth": "2000", "Priority": "/p"},
        "Queue",
        "TargetQueueDepth",
        "cannot be combined with Priority",
    ),
    (
        {"UnderlyingTopic": "work", "TargetQueueDepth": "2000", "BarrierExpression": "/b = 1"},
        "Queue",
        "TargetQueueDepth",
        "cannot be combined with BarrierExpression",
    ),
    (
        {"UnderlyingTopic": "work", "TargetQueueDepth": "999"},
        "Queue",
        "TargetQueueDepth",
        "between 1000 and",
    ),
    (
        {"UnderlyingTopic": "work.*"},
        "Queue",
        "DefaultPublishTarget",
        "is required because UnderlyingTopic 'work.*' is a regular expression",
    ),
    (
        {"UnderlyingTopic": "work_.*", "DefaultPublishTarget": "work"},
        "Queue",
        "DefaultPublishTarget",
        "'work' is not matched by UnderlyingTopic 'work_.*'",
    ),
    (
        {"UnderlyingTopic": "work", "DefaultPublishTarget": "work_b"},
        "Queue",
        "DefaultPublishTarget",
        "is not the underlying topic 'work'",
    ),
    (
        {"UnderlyingTopic": "work", "InitialOwner": "a"},
        "Queue",
        "InitialOwner",
        "only applies to a GroupLocalQueue, not to a Queue",
    ),
    (
        {"UnderlyingTopic": "work", "InitialOwner": "a"},
        "LocalQueue",
        "InitialOwner",
        "only applies to a GroupLocalQueue, not to a LocalQueue",
    ),
    (
        {"UnderlyingTopic": "work", "GroupLocalQueueDomain": "d"},
        "Queue",
        "GroupLocalQueueDomain",
        "only applies to a GroupLocalQueue",
    ),
    (
        {"UnderlyingTopic": "work", "Semantics": "at-most-once", "FairnessModel": "proportional"},
        "Queue",
        "FairnessModel",
        "at-most-once queue only supports FairnessModel round-robin, not proportional",
    ),
    (
        {"UnderlyingTopic": "work", "Semantics": "at-most-once", "FairnessModel": "fast"},
        "Queue",
        "FairnessModel",
        "only supports FairnessModel round-robin",
    ),
    (
        {"UnderlyingTopic": "nothing"},
        "Queue",
        "UnderlyingTopic",
        "'nothing' matches no topic of this configuration",
    ),
    (
        {"UnderlyingTopic": "work", "Filter": "/a = 1 AND UNIX_TIMESTAMP() > 5"},
        "Queue",
        "Filter",
        "Filter calls UNIX_TIMESTAMP at position 11",
    ),
    (
        {"UnderlyingTopic": "work", "BarrierExpression": "LAST_READ(/x) = 1"},
        "Queue",
        "BarrierExpression",
        "BarrierExpression calls LAST_READ at position 0",
    ),
    (
        {"UnderlyingTopic": "work", "Filter": "VALUE_LOOKUP('t', /k) IS NULL"},
        "Queue",
        "Filter",
        "calls VALUE_LOOKUP",
    ),
    (
        {"UnderlyingTopic": "work", "Filter": "/a = = 1"},
        "Queue",
        "Filter",
        "bad Filter: filter error at position 5",
    ),
    (
        {"UnderlyingTopic": "work", "Filter": "/a + 1"},
        "Queue",
        "Filter",
        "is a value, not a condition",
    ),
    (
        {"UnderlyingTopic": "work", "Priority": "/p *"},
        "Queue",
        "Priority",
        "bad Priority: filter error at position 4",
    ),
    (
        {"UnderlyingTopic": "wo(rk"},
        "Queue",
        "UnderlyingTopic",
        "neither a topic name nor a valid regular expression",
    ),
    (
        {"UnderlyingTopic": "work", "LeasePeriod": "5 parsecs"},
        "Queue",
        "LeasePeriod",
        "unknown unit",
    ),
    (
        {"UnderlyingTopic": "work", "LeasePeriod": "0s"},
        "Queue",
        "LeasePeriod",
        "must be longer than 0",
    ),
    (
        {"UnderlyingTopic": "work", "Semantics": "exactly-once"},
        "Queue",
        "Semantics",
        "must be one of at-least-once, at-most-once",
    ),
    (
        {"UnderlyingTopic": "work", "Leasing": "loose"},
        "Queue",
        "Leasing",
        "must be one of strict, sublet",
    ),
    (
        {"UnderlyingTopic": "work", "MaxPerSubscriptionBacklog": "0"},
        "Queue",
        "MaxPerSubscriptionBacklog",
        "between 1 and",
    ),
    (
        {"UnderlyingTopic": "work", "MaxCancels": "-1"},
        "Queue",
        "MaxCancels",
        "whole number",
    ),
    (
        {"UnderlyingTopic": "work", "RecoveryPoint": "yesterday"},
        "Queue",
        "RecoveryPoint",
        "must be epoch, now, creation or a timestamp",
    ),
    (
        {"UnderlyingTopic": "work", "FileBackedMetadata": "sometimes"},
        "Queue",
        "FileBackedMetadata",
        "must be 'enabled'",
    ),
]


@pytest.mark.parametrize(("body", "kind", "element", "problem"), RULES)
def test_rules_in_yaml(body: dict[str, str], kind: str, element: str, problem: str) -> None:
    err = load_error(yaml_queue(body, kind), "q.yaml")
    assert err.source == "q.yaml"
    assert err.element == f"queues[0].{element}"
    assert problem in err.problem
    assert str(err).startswith(f"q.yaml: queues[0].{element}: ")


@pytest.mark.parametrize(("body", "kind", "element", "problem"), RULES)
def test_rules_in_amps_xml(body: dict[str, str], kind: str, element: str, problem: str) -> None:
    err = load_error(xml_queue(body, kind), "amps.xml")
    assert err.element == f"SOW/{kind}[Q]/{element}"
    assert problem in err.problem


def test_bad_filter_error_shows_the_position() -> None:
    err = load_error(yaml_queue({"UnderlyingTopic": "work", "Filter": "/a = = 1"}))
    assert "position 5 (line 1, column 6)" in err.problem
    assert "^" in err.problem


def test_queue_name_may_not_be_another_topic() -> None:
    err = load_error(TOPICS_YAML + "queues:\n  - Name: work_b\n    UnderlyingTopic: work\n")
    assert err.element == "queues[0].Name"
    assert "'work_b' is already a topic name" in err.problem
    err = load_error(
        f"<SOW>{TOPICS_XML}<Queue><Name>work</Name><UnderlyingTopic>work_b</UnderlyingTopic></Queue></SOW>"
    )
    assert err.element == "SOW/Queue[work]/Name"


def test_queue_may_share_its_name_with_its_own_underlying_topic() -> None:
    # The AMPS default: no UnderlyingTopic means the topic named like the queue.
    config = load(TOPICS_YAML + "queues:\n  - Name: work\n")
    assert config.queue("work").underlying_topic == "work"
    assert config.topic("work").name == "work"


def test_queue_names_are_unique() -> None:
    text = (
        TOPICS_YAML
        + "queues:\n  - {Name: Q, UnderlyingTopic: work}\n  - {Name: Q, UnderlyingTopic: work}\n"
    )
    err = load_error(text)
    assert err.element == "queues[1].Name"
    assert "defined twice" in err.problem


def test_yaml_queue_shape_errors() -> None:
    assert load_error("queues: {Name: q}").element == "queues"
    assert load_error("queues:\n  - just-a-name\n").element == "queues[0]"
    err = load_error(
        TOPICS_YAML + "queues:\n  - Name: Q\n    UnderlyingTopic: work\n    LeasPeriod: 5s\n"
    )
    assert err.element == "queues[0].LeasPeriod"
    assert "did you mean 'LeasePeriod'?" in err.problem
    err = load_error(
        TOPICS_YAML + "queues:\n  - Name: Q\n    UnderlyingTopic: work\n    Kind: Topic\n"
    )
    assert err.element == "queues[0].Kind"
    assert "Queue, LocalQueue, GroupLocalQueue" in err.problem
    assert load_error("queues:\n  - UnderlyingTopic: work\n").element == "queues[0].Name"


def test_xml_queue_shape_errors() -> None:
    def queue(body: str, tag: str = "Queue") -> str:
        return f"<SOW>{TOPICS_XML}<{tag}><Name>Q</Name>{body}</{tag}></SOW>"

    err = load_error(queue("<UnderlyingTopic>work</UnderlyingTopic><Key>/id</Key>"))
    assert err.element == "SOW/Queue[Q]/Key"
    assert "unknown element <Key> in a queue" in err.problem
    err = load_error(
        queue("<UnderlyingTopic>work</UnderlyingTopic><Filter>/a=1</Filter><Filter>/b=1</Filter>")
    )
    assert err.element == "SOW/Queue[Q]/Filter"
    assert "appears 2 times" in err.problem
    err = load_error(queue("<UnderlyingTopic>work</UnderlyingTopic><Topic>P</Topic>"))
    assert err.element == "SOW/Queue[Q]/Topic"
    assert "disagree" in err.problem
    err = load_error(queue("<UnderlyingTopic></UnderlyingTopic>"))
    assert err.element == "SOW/Queue[Q]/UnderlyingTopic"


def test_xml_synonyms_topic_and_queue_definition() -> None:
    text = (
        f"<SOW>{TOPICS_XML}<QueueDefinition><Topic>Q</Topic>"
        "<UnderlyingTopic>work</UnderlyingTopic><MaxDeliveries>4</MaxDeliveries>"
        "</QueueDefinition><LocalQueue><Name>L</Name><UnderlyingTopic>work_b</UnderlyingTopic>"
        "</LocalQueue></SOW>"
    )
    config = load(text)
    assert config.queue("Q").kind == "queue" and config.queue("Q").max_deliveries == 4
    assert config.queue("L").kind == "local"
    err = load_error(text.replace("<MaxDeliveries>4", "<MaxDeliveries>x"))
    assert err.element == "SOW/QueueDefinition[Q]/MaxDeliveries"
    # An error about the name names the tag that was used.
    err = load_error(text.replace("<Topic>Q</Topic>", "<Topic>work_b</Topic>"))
    assert err.element == "SOW/QueueDefinition[work_b]/Topic"


def test_unsupported_message_type_can_be_skipped(caplog: pytest.LogCaptureFixture) -> None:
    yaml_text = (
        TOPICS_YAML + "queues:\n  - {Name: Q, UnderlyingTopic: work, MessageType: msgpack}\n"
    )
    assert load_error(yaml_text).element == "queues[0].MessageType"
    assert load(yaml_text, skip_unsupported=True).queues == ()
    xml_text = xml_queue({"UnderlyingTopic": "work", "MessageType": "msgpack"})
    assert load_error(xml_text).element == "SOW/Queue[Q]/MessageType"
    with caplog.at_level(logging.WARNING, "sowstream.config"):
        assert load(xml_text, skip_unsupported=True).queues == ()
    assert any("skipping queue 'Q'" in r.getMessage() for r in caplog.records)


def test_unknown_xml_element_can_be_skipped() -> None:
    text = xml_queue({"UnderlyingTopic": "work", "Bogus": "1"})
    assert load_error(text).element == "SOW/Queue[Q]/Bogus"
    config = load(text, skip_unsupported=True)
    assert config.queues == () and [t.name for t in config.topics] == ["work", "work_b"]


def test_direct_construction_checks_queues_against_topics() -> None:
    queue = QueueConfig(name="Q", underlying_topic="work")
    with pytest.raises(ValidationError, match="matches no topic"):
        SowstreamConfig(queues=(queue,))
    config = SowstreamConfig(topics=(TopicConfig(name="work"),), queues=(queue,))
    assert config.queue("Q") == queue
    with pytest.raises(ValidationError, match="cannot be combined"):
        QueueConfig(name="Q", priority="/p", barrier_expression="/b = 1")
    with pytest.raises(ValidationError):
        queue.name = "other"  # frozen


# --- Whatever the input, loading raises ConfigError or succeeds ---

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 3000),
    st.sampled_from(
        ["", "work", "work.*", "w(", "/a = 1", "/p", "30s", "at-most-once", "fast", "strict"]
    ),
    st.sampled_from(["GroupLocalQueue", "LocalQueue", "UNIX_TIMESTAMP()", "enabled", "now"]),
    st.lists(st.sampled_from(["a", "/b"]), max_size=2),
    st.dictionaries(st.sampled_from(["Key", "x"]), st.just("y"), max_size=2),
)
_keys = st.sampled_from([*QUEUE_ELEMENTS, "Kind", "Bogus"])


@settings(max_examples=300, deadline=None)
@given(queue=st.dictionaries(_keys, _values, max_size=7), skip=st.booleans())
def test_arbitrary_queues_raise_only_config_error(queue: dict[str, Any], skip: bool) -> None:
    text = yaml.safe_dump({"topics": [{"Name": "work"}], "queues": [queue]})
    with contextlib.suppress(ConfigError):
        load(text, skip_unsupported=skip)
    xml = "".join(
        f"<{key}>{value}</{key}>" for key, value in queue.items() if isinstance(value, str | int)
    )
    with contextlib.suppress(ConfigError):
        load(f"<SOW>{TOPICS_XML}<Queue>{xml}</Queue></SOW>", skip_unsupported=skip)


# --- ExpirationModel ---


def test_expiration_model_defaults_and_loads_from_yaml_and_xml() -> None:
    assert QueueConfig(name="WQ", underlying_topic="work").expiration_model == "default"
    yaml_text = (
        "topics:\n  - Name: work\nqueues:\n  - Name: WQ\n    UnderlyingTopic: work\n"
        "    Expiration: 10s\n    ExpirationModel: Latest\n"
    )
    assert load(yaml_text, "q.yaml").queue("WQ").expiration_model == "latest"
    xml_text = (
        "<SOW><Topic><Name>work</Name><MessageType>json</MessageType></Topic>"
        "<Queue><Name>WQ</Name><MessageType>json</MessageType><UnderlyingTopic>work"
        "</UnderlyingTopic><Expiration>10s</Expiration><ExpirationModel>earliest"
        "</ExpirationModel></Queue></SOW>"
    )
    assert load(xml_text, "amps.xml").queue("WQ").expiration_model == "earliest"


def test_bad_expiration_model_is_named() -> None:
    xml_text = (
        "<SOW><Topic><Name>work</Name><MessageType>json</MessageType></Topic>"
        "<Queue><Name>WQ</Name><MessageType>json</MessageType><UnderlyingTopic>work"
        "</UnderlyingTopic><ExpirationModel>oldest</ExpirationModel></Queue></SOW>"
    )
    err = load_error(xml_text, "amps.xml")
    assert err.element == "SOW/Queue[WQ]/ExpirationModel"
    assert "ExpirationModel must be one of default, queue, latest, earliest" in err.problem
    err = load_error(
        "topics:\n  - Name: work\nqueues:\n  - Name: WQ\n    ExpirationModel: 3\n", "q.yaml"
    )
    assert err.element == "queues[0].ExpirationModel"
