"""View definitions: the model's checks, the cross-definition checks and both parsers."""

from __future__ import annotations

import logging
import xml.etree.ElementTree as ET
from typing import Any

import pytest
import yaml

from sowstream.config import load_config_text
from sowstream.config.errors import ConfigError
from sowstream.config.views import (
    ViewConfig,
    ViewProblem,
    check_views,
    view_from_xml,
    view_from_yaml,
)


def yaml_view(text: str) -> ViewConfig:
    return view_from_yaml(yaml.safe_load(text), "views[0]", "test.yaml")


def yaml_error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        yaml_view(text)
    return info.value


BASE = """
Name: BY_REGION
MessageType: json
UnderlyingTopic: orders
Projection: ["/region", "SUM(/qty) AS /total"]
Grouping: ["/region"]
"""


def test_yaml_view_with_defaults() -> None:
    view = yaml_view(BASE)
    assert view.name == "BY_REGION"
    assert view.underlying_names == ("orders",)
    assert view.effective_key_domain == "BY_REGION"
    assert view.conflation == "none" and view.join_null_equivalency is False
    assert view.all_hash_indexes == (("/region",),)


def test_yaml_join_view_with_every_option() -> None:
    view = yaml_view(
        """
Topic: TCV
MessageType: json
UnderlyingTopic:
  Join:
    - "[ORDERS]./Tick = [COMPANIES]./Tick"
Projection:
  Field: ["[COMPANIES]./Name", "SUM([ORDERS]./Shares) AS /TotalVolume"]
Grouping:
  Field: "[ORDERS]./Tick"
KeyDomain: shared
Conflation: inline
JoinNullEquivalency: enabled
HashIndex:
  - Key: [/Name]
FileName: ./sow/%n.sow
"""
    )
    assert view.underlying_names == ("ORDERS", "COMPANIES")
    assert view.effective_key_domain == "shared"
    assert view.conflation == "inline" and view.join_null_equivalency is True
    assert view.hash_indexes == (("/Name",),)
    assert view.all_hash_indexes == (("/Name",),)  # Grouping field not projected: no auto index


def test_xml_view_and_view_definition_synonym() -> None:
    xml = """
<ViewDefinition>
  <MessageType>json</MessageType>
  <Topic>CompleteByRegion</Topic>
  <UnderlyingTopic>orders</UnderlyingTopic>
  <Projection>
    <Field>COUNT(/orderId) AS /completedOrders</Field>
    <Field><![CDATA[SUM(IF_NOT_A_FUNCTION) AS /x]]></Field>
  </Projection>
  <Grouping><Field>/region</Field></Grouping>
  <Filter>/status = 'complete'</Filter>
</ViewDefinition>"""
    with pytest.raises(ConfigError) as info:
        view_from_xml(ET.fromstring(xml), "SOW", 1, "amps.xml")
    err = info.value
    assert err.element == "SOW/ViewDefinition[CompleteByRegion]/Projection"
    assert "Field[2]" in err.problem and "position" in err.problem

    ok = xml.replace("<![CDATA[SUM(IF_NOT_A_FUNCTION) AS /x]]>", "/region AS /region")
    view, path = view_from_xml(ET.fromstring(ok), "SOW", 1, "amps.xml")
    assert path == "SOW/ViewDefinition[CompleteByRegion]"
    assert view.filter == "/status = 'complete'"
    assert view.projection == ("COUNT(/orderId) AS /completedOrders", "/region AS /region")


def test_xml_joins_and_hash_indexes() -> None:
    xml = """
<View>
  <Name>V</Name>
  <MessageType>json</MessageType>
  <UnderlyingTopic>
    <Join>[Orders].[/OrderId]=[Extra].[/OrderId]</Join>
    <Join>[Orders].[/OrderType]=[Extra].[/OrderType]</Join>
  </UnderlyingTopic>
  <Projection><Field>[Orders]./OrderId AS /id</Field><Field>[Extra]./n AS /n</Field></Projection>
  <Grouping><Field>[Orders]./OrderId</Field></Grouping>
  <HashIndex><Key>/n</Key></HashIndex>
  <HashIndex><Key>/id</Key><Key>/n</Key></HashIndex>
</View>"""
    view, _ = view_from_xml(ET.fromstring(xml), "SOW", 1, "amps.xml")
    assert len(view.join_conditions) == 2
    assert view.all_hash_indexes == (("/id",), ("/n",), ("/id", "/n"))


def test_xml_join_with_no_condition() -> None:
    xml = """
<View><Name>V</Name><MessageType>json</MessageType>
  <UnderlyingTopic><Join></Join></UnderlyingTopic>
  <Projection><Field>/a</Field></Projection><Grouping><Field>/a</Field></Grouping>
</View>"""
    with pytest.raises(ConfigError) as info:
        view_from_xml(ET.fromstring(xml), "SOW", 1, "amps.xml")
    assert info.value.element == "SOW/View[V]/UnderlyingTopic/Join"
    assert "no condition" in info.value.problem


@pytest.mark.parametrize(
    ("change", "element", "problem"),
    [
        ({"UnderlyingTopic": None}, "views[0].UnderlyingTopic", "is required"),
        (
            {"Filter": "/a = 1", "UnderlyingTopic": {"Join": ["[A]./x = [B]./x"]}},
            "views[0].Filter",
            "only allowed on a view over a single topic",
        ),
        ({"UnderlyingTopic": {"Join": [None]}}, "views[0].UnderlyingTopic", "no condition"),
        (
            {"UnderlyingTopic": {"Join": ["[A]./x"]}},
            "views[0].UnderlyingTopic",
            "must be one equality",
        ),
        (
            {"UnderlyingTopic": {"Join": ["[A]./x = [A]./y"]}},
            "views[0].UnderlyingTopic",
            "relates topic 'A' to itself",
        ),
        (
            {"UnderlyingTopic": {"Join": ["[A]./x = [B]./x", "[C]./x = [D]./x"]}},
            "views[0].UnderlyingTopic",
            "not connected by any Join",
        ),
        (
            {"UnderlyingTopic": {"Join": ["A./x = [B]./x"]}},
            "views[0].UnderlyingTopic",
            "is not a qualified field",
        ),
        ({"MessageType": "binary"}, "views[0].MessageType", "binary message type has no fields"),
        ({"MessageType": "protobuf"}, "views[0].MessageType", "not supported for views"),
        ({"Conflation": "sometimes"}, "views[0].Conflation", "must be one of none, inline"),
        ({"JoinNullEquivalency": "maybe"}, "views[0].JoinNullEquivalency", "enabled, disabled"),
        ({"Projection": []}, "views[0].Projection", "at least one Field"),
        ({"Grouping": None}, "views[0].Grouping", "is required"),
        ({"Projection": ["SUM(/qty"]}, "views[0].Projection", "Field[1], position"),
        ({"Projection": ["SUM(/qty) + /x"]}, "views[0].Projection", "needs an output path"),
        ({"Projection": ["SUM(MAX(/qty)) AS /t"]}, "views[0].Projection", "cannot be nested"),
        (
            {"Projection": ["MEDIAN(/qty) AS /t"]},
            "views[0].Projection",
            "aggregate functions are AVG, COUNT, COUNT_DISTINCT, MAX, MIN, SUM, ANY, STDDEV_POP",
        ),
        ({"Projection": ["/a AS /t", "/b AS /t"]}, "views[0].Projection", "already produced"),
        (
            {"Projection": ["[trades]./qty AS /q"]},
            "views[0].Projection",
            "Field[1], position 0: topic 'trades' is not an underlying topic",
        ),
        ({"Grouping": ["SUM(/qty)"]}, "views[0].Grouping", "field paths such as /region"),
        ({"Grouping": ["/region", "/region"]}, "views[0].Grouping", "already a Grouping Field"),
        ({"Filter": "/a = "}, "views[0].Filter", "position 5: expected"),
        ({"Colour": "red"}, "views[0].Colour", "unknown key"),
        ({"Topic": "OTHER"}, "views[0].Topic", "Name and Topic disagree"),
    ],
)
def test_yaml_errors_name_the_element(change: dict[str, Any], element: str, problem: str) -> None:
    item = yaml.safe_load(BASE)
    item.update(change)
    item = {k: v for k, v in item.items() if v is not None or k in ("Grouping",)}
    if change.get("UnderlyingTopic", "") is None:
        item.pop("UnderlyingTopic", None)
    with pytest.raises(ConfigError) as info:
        view_from_yaml(item, "views[0]", "test.yaml")
    err = info.value
    assert err.source == "test.yaml"
    assert err.element == element, str(err)
    assert problem in err.problem, str(err)


def test_join_view_refuses_an_unqualified_field() -> None:
    with pytest.raises(ConfigError) as info:
        yaml_view(
            """
Name: J
UnderlyingTopic: {Join: ["[A]./k = [B]./k"]}
Projection: ["[A]./k AS /k", "SUM(/qty) AS /total"]
Grouping: ["[A]./k"]
"""
        )
    assert info.value.element == "views[0].Projection"
    assert "Field[2], position 4: /qty does not say which topic it reads" in info.value.problem


def test_non_grouped_plain_field_is_allowed() -> None:
    view = yaml_view(BASE.replace('"/region", "SUM', '"/region", "/trader", "SUM'))
    assert view.compile().projection.loose == ("/trader",)


def views(*specs: tuple[str, str | list[str]]) -> list[ViewConfig]:
    out = []
    for name, under in specs:
        fields: dict[str, Any] = {"name": name, "projection": ["/a"], "grouping": ["/a"]}
        if isinstance(under, str):
            fields["underlying_topic"] = under
        else:
            fields["joins"] = [f"[{under[0]}]./a = [{under[1]}]./a"]
            fields["projection"] = [f"[{under[0]}]./a AS /a"]
            fields["grouping"] = [f"[{under[0]}]./a"]
        out.append(ViewConfig(**fields))
    return out


def defs(*names: str) -> list[tuple[str, str | None]]:
    """Definitions in order, all json."""
    return [(name, "json") for name in names]


def test_check_views_accepts_stacked_views() -> None:
    check_views(
        views(("V1", "orders"), ("V2", "V1"), ("V3", ["V1", "orders"])),
        defs("orders", "V1", "V2", "V3"),
    )


def test_check_views_unknown_topic() -> None:
    with pytest.raises(ViewProblem) as info:
        check_views(views(("V1", "trades")), defs("orders", "V1"))
    assert (info.value.index, info.value.field) == (0, "underlying_topic")
    assert "reads topic 'trades', which is not defined" in str(info.value)


def test_check_views_later_definition() -> None:
    with pytest.raises(ViewProblem) as info:
        check_views(views(("V1", "orders")), defs("V1", "orders"))
    assert "'orders', which is defined after it" in str(info.value)


def test_check_views_cycle() -> None:
    with pytest.raises(ViewProblem) as info:
        check_views(
            views(("V1", "orders"), ("V2", ["orders", "V3"]), ("V3", "V2")),
            defs("orders", "V1", "V2", "V3"),
        )
    assert info.value.index == 1 and info.value.field == "joins"
    assert "cycle: V2 -> V3 -> V2" in str(info.value)


def test_check_views_self_reference_and_duplicates() -> None:
    with pytest.raises(ViewProblem, match="cycle: V1 -> V1"):
        check_views(views(("V1", "V1")), defs("V1"))
    with pytest.raises(ViewProblem, match="defined more than once"):
        check_views(views(("orders", "x")), defs("x", "orders", "orders"))


def test_v12_a_view_may_share_a_name_with_a_topic_of_another_message_type() -> None:
    (view,) = views(("example", "[json].[example]"))
    nvfix = view.model_copy(update={"message_type": "nvfix"})
    check_views([nvfix], [("example", "json"), ("example", "nvfix")])
    # The same message type is one topic: refused, and so is reading itself unqualified.
    with pytest.raises(ViewProblem, match="defined more than once"):
        check_views([view], [("example", "json"), ("example", "json")])
    (unqualified,) = views(("example", "example"))
    unqualified = unqualified.model_copy(update={"message_type": "nvfix"})
    with pytest.raises(ViewProblem, match="cycle: example -> example"):
        check_views([unqualified], [("example", "nvfix")])
    # A conflated topic's type may not be known yet: it clashes with any type.
    with pytest.raises(ViewProblem, match="defined more than once"):
        check_views([nvfix], [("example", None), ("example", "nvfix")])


# ---- the views: list of a whole YAML configuration


def load_views_yaml(views: str, extra: str = "") -> Any:
    from sowstream.config.loader import load_yaml_text

    text = f"""
sow:
  - Name: orders
    Key: /orderId
  - Name: limits
    Key: /desk
topics:
  - Name: ticks
{extra}
views:
{views}
"""
    return load_yaml_text(text, "test.yaml")


def load_views_error(views: str, extra: str = "") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_views_yaml(views, extra)
    return info.value


def test_yaml_configuration_holds_views_and_their_topics() -> None:
    config = load_views_yaml(
        """
  - Name: BY_REGION
    UnderlyingTopic: orders
    Projection: ["/region", "SUM(/qty) AS /total"]
    Grouping: ["/region"]
    Partitions: 2
  - Name: TOP
    UnderlyingTopic: BY_REGION
    Projection: ["COUNT(/region) AS /regions", "/one AS /one"]
    Grouping: ["/one"]
"""
    )
    assert [v.name for v in config.views] == ["BY_REGION", "TOP"]
    topic = config.view_topics[0]
    assert (topic.name, topic.keys, topic.partitions, topic.sow) == ("BY_REGION", (), 2, True)
    assert topic.hash_indexes == (("/region",),)
    assert config.view("TOP").underlying_names == ("BY_REGION",)


def test_a_hash_index_on_a_field_the_view_lacks_loads_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """AMPS loads such an index (chapter 05's hash-sample-view); it can only stay empty."""
    caplog.set_level(logging.WARNING, logger="sowstream.config")
    config = load_views_yaml(
        """
  - Name: BY_REGION
    UnderlyingTopic: orders
    Projection: ["/region", "SUM(/qty) AS /total"]
    Grouping: ["/region"]
    HashIndex: [[/nope, /total], [/region]]
"""
    )
    assert config.view("BY_REGION").all_hash_indexes == (("/region",), ("/nope", "/total"))
    assert config.view("BY_REGION").unprojected_index_keys == ("/nope",)
    assert [r.getMessage() for r in caplog.records] == [
        "test.yaml: views[0].HashIndex: HashIndex Key /nope is not a field of view BY_REGION "
        "(its fields: /region, /total); the index stays empty and an exact match on /nope "
        "finds no record"
    ]


@pytest.mark.parametrize(
    ("views", "element", "problem"),
    [
        (
            "  - {Name: v, UnderlyingTopic: nope, Projection: ['/a'], Grouping: ['/a']}",
            "views[0].UnderlyingTopic",
            "reads topic 'nope', which is not defined",
        ),
        (
            "  - {Name: v, UnderlyingTopic: {Join: [null]}, Projection: ['/a'], Grouping: ['/a']}",
            "views[0].UnderlyingTopic",
            "Join[1] has no condition",
        ),
        (
            "  - {Name: v, UnderlyingTopic: w, Projection: ['/a'], Grouping: ['/a']}\n"
            "  - {Name: w, UnderlyingTopic: v, Projection: ['/a'], Grouping: ['/a']}",
            "views[0].UnderlyingTopic",
            "views form a cycle: v -> w -> v",
        ),
        (
            "  - {Name: v, UnderlyingTopic: ticks, Projection: ['/a'], Grouping: ['/a']}",
            "views[0].UnderlyingTopic",
            "reads topic 'ticks', which keeps no SOW",
        ),
        (
            "  - {Name: orders, UnderlyingTopic: limits, Projection: ['/a'], Grouping: ['/a']}",
            "views[0].Name",
            "'orders' is defined more than once",
        ),
        (
            "  - {Name: v, UnderlyingTopic: orders, Projection: ['/a'], Grouping: ['/a'],"
            " Partitions: 0}",
            "views[0].Partitions",
            "Partitions must be between 1 and",
        ),
    ],
)
def test_yaml_configuration_view_errors_name_the_view(
    views: str, element: str, problem: str
) -> None:
    err = load_views_error(views)
    assert err.element == element
    assert problem in err.problem


def test_a_view_over_a_queue_reads_the_topic_of_its_available_messages() -> None:
    """V15's configuration: the engine keeps ``WQ.available`` for the view, partitioned like
    the queue's topic; a queue nobody views gets none."""
    queues = (
        "queues:\n  - {Name: WQ, UnderlyingTopic: orders}\n"
        "  - {Name: other, UnderlyingTopic: orders}"
    )
    config = load_views_yaml(
        "  - {Name: v, UnderlyingTopic: WQ, Projection: ['COUNT(/id) AS /n', '/kind'],"
        " Grouping: ['/kind']}\n"
        "  - {Name: j, UnderlyingTopic: {Join: ['[WQ]./desk = [limits]./desk']},"
        " Projection: ['COUNT([WQ]./id) AS /n', '[WQ]./desk AS /desk'],"
        " Grouping: ['[WQ]./desk']}",
        queues,
    )
    (only,) = config.queue_view_topics.items()
    assert only[0] == "WQ"
    assert (only[1].name, only[1].message_type, only[1].keys) == ("WQ.available", "json", ())
    assert only[1].partitions == config.topic("orders").partitions


@pytest.mark.parametrize(
    ("views", "extra", "problem"),
    [
        (
            "  - {Name: v, UnderlyingTopic: NQ, Projection: ['/a'], Grouping: ['/a']}",
            "queues:\n  - {Name: WQ, UnderlyingTopic: orders}",
            "reads topic 'NQ', which is not defined",
        ),
        (
            "  - {Name: v, UnderlyingTopic: '[nvfix].[WQ]', Projection: ['/a'], Grouping: ['/a']}",
            "queues:\n  - {Name: WQ, UnderlyingTopic: orders}",
            "reads topic '[nvfix].[WQ]', which is not defined",  # queues are json
        ),
        (
            "  - {Name: WQ.available, UnderlyingTopic: orders, Projection: ['/a'],"
            " Grouping: ['/a']}\n"
            "  - {Name: v, UnderlyingTopic: WQ, Projection: ['/a'], Grouping: ['/a']}",
            "queues:\n  - {Name: WQ, UnderlyingTopic: orders}",
            "the engine keeps as topic 'WQ.available', but a topic or view is already called",
        ),
    ],
)
def test_a_view_over_a_queue_refused_names_the_view(views: str, extra: str, problem: str) -> None:
    err = load_views_error(views, extra)
    assert err.element.startswith("views[")
    assert err.element.endswith(".UnderlyingTopic")
    assert problem in err.problem


def test_a_view_over_a_queue_defined_later_is_refused() -> None:
    """AMPS XML keeps document order: a queue after the view is a later definition."""
    topic = "<Topic><Name>work</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"
    view = (
        "<View><Name>by_kind</Name><MessageType>json</MessageType>"
        "<UnderlyingTopic>WQ</UnderlyingTopic>"
        "<Projection><Field>/kind</Field><Field>COUNT(/id) AS /n</Field></Projection>"
        "<Grouping><Field>/kind</Field></Grouping></View>"
    )
    queue = (
        "<Queue><Name>WQ</Name><MessageType>json</MessageType>"
        "<UnderlyingTopic>work</UnderlyingTopic></Queue>"
    )
    with pytest.raises(ConfigError) as info:
        load_config_text(f"<SOW>{topic}{view}{queue}</SOW>", "amps.xml")
    err = info.value
    assert err.element == "SOW/View[by_kind]/UnderlyingTopic"
    assert "reads 'WQ', which is defined after it" in err.problem
    config = load_config_text(f"<SOW>{topic}{queue}{view}</SOW>", "amps.xml")
    assert list(config.queue_view_topics) == ["WQ"]


def test_the_queue_entitlements_hold_on_its_available_messages() -> None:
    """``WQ.available`` holds WQ's messages: an identity sees there what it may see of WQ."""
    config = load_config_text(
        "sow:\n  - {Name: orders, Key: /id}\n"
        "queues:\n  - {Name: WQ, UnderlyingTopic: orders}\n"
        "views:\n  - {Name: v, UnderlyingTopic: WQ, Projection: ['/a'], Grouping: ['/a']}\n"
        "entitlements:\n  alice: {WQ: \"/owner = 'alice'\"}\n",
        "test.yaml",
    )
    lookup = config.entitlement_lookup("WQ.available")
    alice = lookup("alice")
    assert alice is not None and alice.matches({"owner": "alice"})
    assert not alice.matches({"owner": "bob"})
    assert lookup("bob") is None
