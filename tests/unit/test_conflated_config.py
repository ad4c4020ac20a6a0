"""Conflated topic definitions: defaults, YAML and AMPS XML, and every error naming its element."""

from __future__ import annotations

import re

import pytest

from sowstream.config import ConfigError
from sowstream.config import load_config_text as load
from sowstream.config.conflated import conflated_pattern
from sowstream.sow.compiled import compile_stages

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
        ("    TopicFormat: '%n-C'\n", "conflated_topics[0].TopicFormat", "only applies over"),
        ("    TopicFormat: 'x-C'\n", "conflated_topics[0].TopicFormat", "must contain %n"),
        ("    TopicFormat: '%n.C'\n", "conflated_topics[0].TopicFormat", "regular expression"),
        ("    TopicFormat: '%n-%n'\n", "conflated_topics[0].TopicFormat", "only once"),
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


PATTERN = "sow:\n  - Name: quotes\n    Pattern: '/q/.*'\n    Key: [/sym]\n"


def test_regex_underlying_topic_without_topic_format_is_refused() -> None:
    err = yaml_error(PATTERN + "conflated_topics:\n  - Name: c\n    UnderlyingTopic: quotes\n")
    assert err.element == "conflated_topics[0].UnderlyingTopic"
    assert "give a TopicFormat such as '%n-C'" in err.problem


def test_regex_underlying_topic_with_topic_format_is_a_pattern_topic() -> None:
    config = load(
        PATTERN + "conflated_topics:\n  - Name: quotes-C\n    UnderlyingTopic: quotes\n"
        "    TopicFormat: '%n-C'\n"
    )
    (own,) = config.conflated_topic_configs
    assert own.name == "quotes-C"
    assert own.hash_indexes == (("/sym",),)
    assert own.matches_name("/q/eu-C")
    assert not own.matches_name("/q/eu")
    assert not own.matches_name("/r/eu-C")
    assert config.conflated_topics[0].topic_name("/q/eu") == "/q/eu-C"


@pytest.mark.parametrize(
    ("pattern", "topic_format", "names", "others"),
    [
        ("/q/.*", "%n-C", ["/q/eu-C", "/q/-C"], ["/q/eu", "/q/eu-D", "x/q/eu-C"]),
        ("^/q/.*$", "%n-C", ["/q/eu-C"], ["/q/eu-C-D", "/q/eu"]),
        ("^a|^b$", "x/%n", ["x/a", "x/b"], ["x/ab", "a", "x/ba"]),
        (r"\Aa+\Z", "c/%n/d", ["c/aa/d"], ["c/aa/d/d", "aa"]),
        ("[^]$^]+", "%n-C", ["ab-C"], ["]-C", "$-C", "-C"]),
    ],
)
def test_conflated_pattern_matches_the_formatted_names_only(
    pattern: str, topic_format: str, names: list[str], others: list[str]
) -> None:
    regex = re.compile(conflated_pattern(pattern, topic_format))
    assert [n for n in names if regex.fullmatch(n)] == names
    assert [n for n in others if regex.fullmatch(n)] == []


def test_a_conflated_topic_over_a_conflated_regex_topic_needs_a_topic_format_too() -> None:
    text = (
        PATTERN + "conflated_topics:\n  - Name: c\n    UnderlyingTopic: quotes\n"
        "    TopicFormat: '%n-C'\n  - Name: cc\n    UnderlyingTopic: c\n"
    )
    err = yaml_error(text)
    assert err.element == "conflated_topics[1].UnderlyingTopic"
    assert "conflated topic 'c'" in err.problem and "TopicFormat" in err.problem
    config = load(text + "    TopicFormat: 'slow/%n'\n")
    outer = config.conflated_topic_configs[1]
    assert outer.matches_name("slow//q/eu-C") and not outer.matches_name("slow//q/eu")


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


def test_a_conflated_topic_over_another_keeps_the_key_index() -> None:
    config = load(
        TOPIC + "conflated_topics:\n  - Name: c\n    UnderlyingTopic: orders\n"
        "  - Name: cc\n    UnderlyingTopic: c\n    Interval: 10s\n"
    )
    outer = config.conflated_topic_configs[1]
    assert (outer.name, outer.hash_indexes, outer.pattern) == ("cc", (("/id",),), None)


def test_conflated_topics_may_not_read_each_other_in_a_cycle() -> None:
    err = yaml_error(
        TOPIC + "conflated_topics:\n  - Name: a\n    UnderlyingTopic: b\n"
        "  - Name: b\n    UnderlyingTopic: a\n"
    )
    assert err.element == "conflated_topics[0].UnderlyingTopic"
    assert "defined after it" in err.problem or "cycle" in err.problem


VIEW = (
    "views:\n  - Name: v\n    UnderlyingTopic: orders\n"
    "    Projection: [/region, SUM(/qty) AS /qty]\n    Grouping: [/region]\n"
)


def test_yaml_conflated_topic_over_a_view_and_a_view_over_that() -> None:
    config = load(
        TOPIC + VIEW + "  - Name: w\n    UnderlyingTopic: vc\n    Projection: [COUNT(/qty) AS /n]\n"
        "    Grouping: [/qty]\n"
        "conflated_topics:\n  - Name: vc\n    UnderlyingTopic: v\n    Interval: 1s\n"
    )
    (own,) = config.conflated_topic_configs
    assert (own.name, own.hash_indexes) == ("vc", (("/region",),))


def test_yaml_view_and_conflated_topic_reading_each_other_are_refused() -> None:
    err = yaml_error(
        TOPIC + "views:\n  - Name: v\n    UnderlyingTopic: vc\n    Projection: [/id]\n"
        "    Grouping: [/id]\n"
        "conflated_topics:\n  - Name: vc\n    UnderlyingTopic: v\n"
    )
    assert err.element in ("views[0].UnderlyingTopic", "conflated_topics[0].UnderlyingTopic")
    assert "defined after it" in err.problem


def test_conflated_topic_over_a_view_of_another_message_type_is_refused() -> None:
    err = yaml_error(
        TOPIC + VIEW + "conflated_topics:\n  - Name: vc\n    UnderlyingTopic: v\n"
        "    MessageType: xml\n"
    )
    assert err.element == "conflated_topics[0].MessageType"
    assert "view 'v' is json, not xml" in err.problem


def test_conflated_topic_over_a_queue_is_refused() -> None:
    err = yaml_error(
        TOPIC + "queues:\n  - Name: work\n    UnderlyingTopic: orders\n"
        "conflated_topics:\n  - Name: c\n    UnderlyingTopic: work\n"
    )
    assert err.element == "conflated_topics[0].UnderlyingTopic"
    assert "which is a queue" in err.problem


def test_xml_conflated_topic_over_a_view() -> None:
    config = load(
        xml(
            "<View><Name>v</Name><UnderlyingTopic>orders</UnderlyingTopic>"
            "<Projection><Field>/id</Field></Projection><Grouping><Field>/id</Field></Grouping>"
            "</View><ConflatedTopic><Name>c</Name><UnderlyingTopic>v</UnderlyingTopic>"
            "</ConflatedTopic>"
        )
    )
    assert [c.topic_config(config.view_topics[0]).name for c in config.conflated_topics] == ["c"]


def test_xml_conflated_topic_before_its_view_is_refused() -> None:
    err = xml_error(
        "<ConflatedTopic><Name>c</Name><UnderlyingTopic>v</UnderlyingTopic></ConflatedTopic>"
        "<View><Name>v</Name><UnderlyingTopic>orders</UnderlyingTopic>"
        "<Projection><Field>/id</Field></Projection><Grouping><Field>/id</Field></Grouping>"
        "</View>"
    )
    assert err.element == "SOW/ConflatedTopic[c]/UnderlyingTopic"
    assert "defined after it" in err.problem


def test_xml_topic_format_over_a_regex_topic() -> None:
    config = load(
        "<SOW><Topic><Name>Quotes</Name><MessageType>json</MessageType><Pattern>/q/.*</Pattern>"
        "<Key>/sym</Key></Topic><ConflatedTopic><Name>Quotes-C</Name>"
        "<UnderlyingTopic>Quotes</UnderlyingTopic><TopicFormat>%n-C</TopicFormat>"
        "</ConflatedTopic></SOW>",
        "amps.xml",
    )
    assert config.conflated_topic_configs[0].matches_name("/q/us-C")


ENRICHED = TOPIC + "conflated_topics:\n  - Name: c\n    UnderlyingTopic: orders\n"


def test_enrichment_becomes_the_conflated_topics_enrichment() -> None:
    config = load(
        "engine:\n  instance_name: east\n"
        + ENRICHED
        + "    Enrichment: ['/qty * 2 AS /double', 'AMPS_INSTANCE_NAME() AS /src']\n"
    )
    (own,) = config.conflated_topic_configs
    assert own.enrichment == ("/qty * 2 AS /double", "AMPS_INSTANCE_NAME() AS /src")
    stages = compile_stages(own)
    assert stages.enrichment is not None
    assert stages.enrichment.apply({"id": 1, "qty": 4}, None, 0) == {
        "id": 1,
        "qty": 4,
        "double": 8,
        "src": "east",
    }


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("    Enrichment: ['/qty OF PREVIOUS AS /was']\n", "OF PREVIOUS is not available"),
        ("    Enrichment: ['/qty + AS /x']\n", "Field[1]"),
        ("    Enrichment: ['SUM(/qty) AS /x']\n", "SUM"),
        ("    Enrichment: ['/qty AS /id']\n", "Key field /id"),
        ("    Enrichment: []\n", "at least one Field"),
    ],
)
def test_enrichment_errors_name_the_element(body: str, problem: str) -> None:
    err = yaml_error(ENRICHED + body)
    assert err.element == "conflated_topics[0].Enrichment"
    assert problem in err.problem


def test_enrichment_over_a_regex_topic_is_refused() -> None:
    err = yaml_error(
        PATTERN + "conflated_topics:\n  - Name: c\n    UnderlyingTopic: quotes\n"
        "    TopicFormat: '%n-C'\n    Enrichment: ['/p * 2 AS /p2']\n"
    )
    assert err.element == "conflated_topics[0].Enrichment"
    assert "regular expression (Pattern) topic" in err.problem


def test_xml_enrichment_and_of_previous_refused() -> None:
    config = load(
        xml(
            "<ConflatedTopic><Name>c</Name><UnderlyingTopic>orders</UnderlyingTopic>"
            "<Enrichment><Field>/qty * 2 AS /double</Field></Enrichment></ConflatedTopic>"
        )
    )
    assert config.conflated_topics[0].enrichment == ("/qty * 2 AS /double",)
    err = xml_error(
        "<ConflatedTopic><Name>c</Name><UnderlyingTopic>orders</UnderlyingTopic>"
        "<Enrichment><Field>/qty OF PREVIOUS AS /was</Field></Enrichment></ConflatedTopic>"
    )
    assert err.element == "SOW/ConflatedTopic[c]/Enrichment"
    assert "OF PREVIOUS is not available on a conflated topic" in err.problem
