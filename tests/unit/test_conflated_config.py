"""Conflated topic definitions: defaults, YAML and AMPS XML, and every error naming its element."""

from __future__ import annotations

import pytest

from sowstream.config import ConfigError
from sowstream.config import load_config_text as load

TOPIC = "sow:\n  - Name: orders\n    Key: [/id]\n"


def yaml_error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load(text, "c.yaml")
    return caught.value


def test_yaml_defaults_and_the_conflated_topic_as_a_sow_topic() -> None:
    config = load(TOPIC + "conflated_topics:\n  - Name: orders-C\n    UnderlyingTopic: orders\n")
    (ct,) = config.conflated_topics
    assert (ct.name, ct.underlying_topic, ct.interval_ms, ct.filter) == (
        "orders-C",
        "orders",
        5000,
        None,
    )
    as_topic = ct.topic_config(config.topics[0])
    assert (as_topic.name, as_topic.message_type, as_topic.keys) == ("orders-C", "json", ())
    assert as_topic.hash_indexes == (("/id",),)


def test_yaml_every_option() -> None:
    config = load(
        TOPIC + "conflated_topics:\n  - Topic: orders-C\n    UnderlyingTopic: orders\n"
        "    MessageType: json\n    Interval: 250ms\n    Filter: /qty > 10\n"
        "    HashIndex: [{Key: [/region]}]\n    Partitions: 2\n"
    )
    (ct,) = config.conflated_topics
    assert (ct.interval_ms, ct.filter, ct.hash_indexes, ct.partitions) == (
        250,
        "/qty > 10",
        (("/region",),),
        2,
    )


@pytest.mark.parametrize(
    ("body", "element", "problem"),
    [
        ("    Interval: 50ms\n", "conflated_topics[0].Interval", "minimum of 100ms"),
        ("    Interval: soon\n", "conflated_topics[0].Interval", "Interval"),
        ("    Filter: /qty >\n", "conflated_topics[0].Filter", "does not compile"),
        ("    HashIndex: [qty]\n", "conflated_topics[0].HashIndex", "Key paths"),
        ("    MessageType: xml\n", "conflated_topics[0].MessageType", "no xml SOW topic"),
        ("    Colour: red\n", "conflated_topics[0].Colour", "unknown key"),
        ("    TopicFormat: '%n-C'\n", "conflated_topics[0].TopicFormat", "not supported yet"),
        ("    TopicFormat: 'x-C'\n", "conflated_topics[0].TopicFormat", "must contain %n"),
    ],
)
def test_yaml_errors_name_the_element(body: str, element: str, problem: str) -> None:
    err = yaml_error(
        TOPIC + "conflated_topics:\n  - Name: orders-C\n    UnderlyingTopic: orders\n" + body
    )
    assert err.element == element
    assert problem in err.problem


def test_unknown_underlying_topic_is_refused() -> None:
    err = yaml_error(TOPIC + "conflated_topics:\n  - Name: c\n    UnderlyingTopic: trades\n")
    assert err.element == "conflated_topics[0].UnderlyingTopic"
    assert "'trades', which is not defined" in err.problem


def test_underlying_topic_without_a_sow_is_refused() -> None:
    err = yaml_error(
        "topics:\n  - Name: ticks\nconflated_topics:\n  - Name: c\n    UnderlyingTopic: ticks\n"
    )
    assert err.element == "conflated_topics[0].UnderlyingTopic"
    assert "keeps no SOW" in err.problem


def test_regex_underlying_topic_is_not_supported_yet() -> None:
    err = yaml_error(
        "sow:\n  - Name: fx\n    Pattern: 'fx/.*'\n    Key: [/id]\n"
        "conflated_topics:\n  - Name: c\n    UnderlyingTopic: fx\n"
    )
    assert err.element == "conflated_topics[0].UnderlyingTopic"
    assert "not supported yet" in err.problem


def test_name_taken_twice_is_refused() -> None:
    err = yaml_error(
        TOPIC + "conflated_topics:\n  - Name: c\n    UnderlyingTopic: orders\n"
        "  - Name: c\n    UnderlyingTopic: orders\n"
    )
    assert err.element == "conflated_topics[0].Name"
    assert "defined more than once" in err.problem


def test_missing_underlying_topic_names_the_element() -> None:
    err = yaml_error(TOPIC + "conflated_topics:\n  - Name: c\n")
    assert err.element == "conflated_topics[0].UnderlyingTopic"


def test_a_view_may_read_a_conflated_topic() -> None:
    config = load(
        TOPIC + "conflated_topics:\n  - Name: c\n    UnderlyingTopic: orders\n"
        "views:\n  - Name: v\n    UnderlyingTopic: c\n    Projection: [/id]\n"
        "    Grouping: [/id]\n"
    )
    assert [v.name for v in config.views] == ["v"]


def xml(body: str) -> str:
    topic = "<Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"
    return f"<SOW>{topic}{body}</SOW>"


def xml_error(body: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load(xml(body), "amps.xml")
    return caught.value


def test_xml_interval_under_100ms_names_the_element() -> None:
    err = xml_error(
        "<ConflatedTopic><Name>c</Name><UnderlyingTopic>orders</UnderlyingTopic>"
        "<Interval>99ms</Interval></ConflatedTopic>"
    )
    assert err.element == "SOW/ConflatedTopic[c]/Interval"
    assert "minimum of 100ms" in err.problem


def test_xml_unknown_underlying_topic_names_the_element() -> None:
    err = xml_error(
        "<ReplicaDefinition><Name>c</Name><UnderlyingTopic>nope</UnderlyingTopic>"
        "</ReplicaDefinition>"
    )
    assert err.element == "SOW/ReplicaDefinition[c]/UnderlyingTopic"
    assert "'nope', which is not defined" in err.problem


def test_xml_unknown_element_and_hash_index() -> None:
    err = xml_error(
        "<ConflatedTopic><Name>c</Name><UnderlyingTopic>orders</UnderlyingTopic>"
        "<Projection/></ConflatedTopic>"
    )
    assert err.element == "SOW/ConflatedTopic[c]/Projection"
    config = load(
        xml(
            "<ConflatedTopic><Name>c</Name><UnderlyingTopic>orders</UnderlyingTopic>"
            "<HashIndex><Key>/a</Key><Key>/b</Key></HashIndex></ConflatedTopic>"
        )
    )
    assert config.conflated_topics[0].hash_indexes == (("/a", "/b"),)


def test_xml_underlying_topic_defined_after_is_refused() -> None:
    text = (
        "<SOW><ConflatedTopic><Name>c</Name><UnderlyingTopic>orders</UnderlyingTopic>"
        "</ConflatedTopic><Topic><Name>orders</Name><MessageType>json</MessageType>"
        "<Key>/id</Key></Topic></SOW>"
    )
    with pytest.raises(ConfigError) as caught:
        load(text, "amps.xml")
    assert caught.value.element == "SOW/ConflatedTopic[c]/UnderlyingTopic"
    assert "defined after it" in caught.value.problem


def test_a_conflated_topic_over_another_is_not_supported_yet() -> None:
    err = yaml_error(
        TOPIC + "conflated_topics:\n  - Name: c\n    UnderlyingTopic: orders\n"
        "  - Name: cc\n    UnderlyingTopic: c\n"
    )
    assert err.element == "conflated_topics[1].UnderlyingTopic"
    assert "not supported yet" in err.problem


def test_xml_conflated_topic_over_a_view_is_not_supported_yet() -> None:
    err = xml_error(
        "<View><Name>v</Name><UnderlyingTopic>orders</UnderlyingTopic>"
        "<Projection><Field>/id</Field></Projection><Grouping><Field>/id</Field></Grouping>"
        "</View><ConflatedTopic><Name>c</Name><UnderlyingTopic>v</UnderlyingTopic>"
        "</ConflatedTopic>"
    )
    assert err.element == "SOW/ConflatedTopic[c]/UnderlyingTopic"
    assert "'v', which is a queue, view or conflated topic" in err.problem
