"""AMPS XML configuration: the spec chapters' own examples, loaded verbatim, strict and skipping."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sowstream.config import ConfigError, ExpirationPolicy, HistoryConfig, load_config
from sowstream.config import load_config_text as load
from sowstream.wire.topics import TopicNames

# --- Examples copied verbatim from the AMPS documentation chapters in /work/shared/spec ---

# Chapter 05 (SOW configuration), the SOW/Topic example.
SPEC_05_SOW_EXAMPLE = """\
<SOW>
    <!-- Simple SOW topic definition -->
    <Topic>
        <Name>orders</Name>
        <Key>/orderId</Key>
        <MessageType>nvfix</MessageType>
        <FileName>./sow/%n.sow</FileName>
    </Topic>

    <!-- SOW with hash indexes -->
    <Topic>
        <Name>customers</Name>
        <Key>/customerId</Key>
        <MessageType>json</MessageType>
        <FileName>./sow/%n.sow</FileName>

        <!-- Index for exact match on customerName -->
        <HashIndex>
            <Key>/customerName</Key>
        </HashIndex>

        <!-- Index for exact match on company -->
        <HashIndex>
             <Key>/company</Key>
        </HashIndex>

        <!-- Index for exact match on *both*
            customerName and company.
         -->
        <HashIndex>
            <Key>/customerName</Key>
            <Key>/company</Key>
        </HashIndex>

    </Topic>

    <!-- Historical SOW -->
    <Topic>
        <Name>catalog</Name>
        <Key>/sku</Key>
        <MessageType>json</MessageType>
        <FileName>./sow/%n.sow</FileName>
        <History>
            <Window>7d</Window>
            <Granularity>15m</Granularity>
        </History>
    </Topic>

    <!-- SOW with enrichment

        Add a /fullName field constructed
        from /firstName and /lastName. -->
    <Topic>
        <Name>sales-reps</Name>
        <Key>/employeeId</Key>
        <MessageType>bflat</MessageType>
        <FileName>./sow/%n.sow</FileName>
        <Key>/id</Key>
        <Enrichment>
            <Field>CONCAT(/firstName, " ", /lastName) AS /fullName</Field>
        </Enrichment>
    </Topic>
</SOW>
"""

# Chapter 05, SOW/View examples.
SPEC_05_VIEW_EXAMPLE = """\
<SOW>
    <!-- Single topic aggregation -->
    <Topic>
        <Topic>/ett/order</Topic>
        <MessageType>fix</MessageType>
        <Key>/orderId</Key>
    </Topic>
    <View>
        <MessageType>nvfix</MessageType>
        <Topic>TOTAL_VALUE</Topic>
        <UnderlyingTopic>/ett/order</UnderlyingTopic>
        <Projection>
            <Field>/109</Field>
            <Field>SUM(/14 * /6) AS /71406</Field>
        </Projection>
        <Grouping>
            <Field>/109</Field>
        </Grouping>
    </View>

    <!-- Single topic aggregation with filter -->
    <Topic>
        <Name>orders</Name>
        <MessageType>json</MessageType>
        <Key>/orderId</Key>
        <FileName>./sow/%n.sow</FileName>
    </Topic>
    <View>
        <Name>CompleteByRegion</Name>
        <UnderlyingTopic>orders</UnderlyingTopic>
        <MessageType>json</MessageType>
        <Projection>
            <Field>COUNT(/orderId) AS /completedOrders</Field>
            <Field>/region AS /region</Field>
        </Projection>
        <Grouping>
            <Field>/region</Field>
        </Grouping>
        <Filter>/status = 'complete'</Filter>
    </View>

  <!-- Single topic aggregation with a hash index
       for faster query. -->
  <Topic>
      <Name>source-for-hash-sample</Name>
      <MessageType>json</MessageType>
      <Key>/id</Key>
      <FileName>./sow/%n.sow</FileName>
  </Topic>
  <View>
      <Name>hash-sample-view</Name>
      <MessageType>json</MessageType>
      <UnderlyingTopic>source-for-hash-sample</UnderlyingTopic>
      <Projection>
         <Field>SUM(/qty) as /quantity</Field>
         <Field>/customerName</Field>
         <Field>/orderType</Field>
       </Projection>
       <Grouping>
         <Field>/customerName</Field>
         <Field>/orderType</Field>
       </Grouping>
       <!-- provide fast query for exact matches on
            *either* name or orderType -->
       <HashIndex>
          <Key>/name</Key>
       </HashIndex>
       <HashIndex>
          <Key>/orderType</Key>
       </HashIndex>
   </View>

    <!-- Project from one message type to another -->
    <Topic>
        <Name>example</Name>
        <MessageType>json</MessageType>
        <Key>/id</Key>
        <FileName>./sow/%n.sow</FileName>
    </Topic>
    <View>
        <!-- notice that nvfix topic named 'example' is not the same topic as the json
            topic named 'example' -->
        <Name>example</Name>
        <MessageType>nvfix</MessageType>
        <UnderlyingTopic>[json].[example]</UnderlyingTopic>
        <Projection>
            <Field>[json].[example]./id AS /id</Field>
        </Projection>
        <Grouping>
            <Field>[json].[example]./id</Field>
        </Grouping>
    </View>

   <!-- JOIN topics -->
   <Topic>
        <Name>ORDERS</Name>
        <MessageType>nvfix</MessageType>
        <Key>/OrderID</Key>
        <FileName>./sow/%n.sow</FileName>
    </Topic>
    <Topic>
        <Name>COMPANIES</Name>
        <MessageType>nvfix</MessageType>
        <Key>/CompanyId</Key>
        <FileName>./sow/%n.sow</FileName>
    </Topic>
    <View>
        <Name>TOTAL_COMPANY_VOLUME</Name>
        <UnderlyingTopic>
            <Join>[ORDERS]./Tick = [COMPANIES]./Tick</Join>
        </UnderlyingTopic>
        <MessageType>nvfix</MessageType>
        <Projection>
            <Field>[COMPANIES]./CompanyId</Field>
            <Field>[COMPANIES]./Tick</Field>
            <Field>[COMPANIES]./Name</Field>
            <Field>SUM([ORDERS]./Shares) AS /TotalVolume</Field>
        </Projection>
        <Grouping>
            <Field>[ORDERS]./Tick</Field>
        </Grouping>
    </View>
</SOW>
"""

# Chapter 01 (State of the World), custom SOW key generator.
SPEC_01_KEY_GENERATOR = """\
<AMPSConfig>
...
<!-- load the module -->
<Modules>
<Module>
<Name>key-generator</Name>
<Library>libmy_key_generator.so</Library>
</Module>
</Modules>
<!-- use the module to generate keys -->
<SOW>
<Topic>
<Name>custom-keyed-sow</Name>
<FileName>./sow/%n.sow</FileName>
<KeyGenerator>
<Module>key-generator</Module>
<Options>
<OptionOne>module-specific-option</OptionOne>
<OptionTwo>another-specific-option</OptionTwo>
</Options>
</KeyGenerator>
</Topic>
</SOW>
...
</AMPSConfig>
"""

# Chapter 01, Example 7.1: Topic Expiration.
SPEC_01_EXAMPLE_7_1 = """\
<SOW>
<Topic>
<Name>ORDERS</Name>
<FileName>sow/%n.sow</FileName>
<Expiration>30s</Expiration>
<Key>/55</Key>
<Key>/109</Key>
<MessageType>fix</MessageType>
</Topic>
</SOW>
"""

# Chapter 01, Example 7.2: Topic Expiration.
SPEC_01_EXAMPLE_7_2 = """\
<SOW>
<Topic>
<Name>ORDERS</Name>
<FileName>sow/%n.sow</FileName>
<Expiration>enabled</Expiration>
<Key>/55</Key>
<Key>/109</Key>
<MessageType>fix</MessageType>
</Topic>
</SOW>
"""

# Chapter 01, Example 7.3: Sample SOW Configuration.
SPEC_01_EXAMPLE_7_3 = """\
<SOW>
<Topic>
<Name>ORDERS</Name>
<FileName>sow/%n.sow</FileName>
<Key>/invoice</Key>
<Key>/customerId</Key>
<MessageType>json</MessageType>
<SlabSize>1MB</SlabSize>
<HashIndex>
<Key>/region</Key>
</HashIndex>
</Topic>
<Topic>
<Name>ALERTS</Name>
<FileName>sow/%n.sow</FileName>
<Key>/alert/id</Key>
<MessageType>xml</MessageType>
<!-- Pregenerate an index for the /alert/type element. This is seldom necessary,
since AMPS will generate the index when it is needed, but the directive is included here
for example purposes. -->
<Index>/alert/type</Index>
</Topic>
</SOW>
"""

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SECONDS = 1000
MINUTES = 60 * SECONDS
DAYS = 24 * 60 * MINUTES


def load_error(text: str, **kwargs: bool) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load(text, "amps.xml", **kwargs)
    return caught.value


def sow(topics: str) -> str:
    return f"<SOW>{topics}</SOW>"


def json_topic(body: str, name: str = "t") -> str:
    return f"<Topic><Name>{name}</Name><MessageType>json</MessageType>{body}</Topic>"


# --- Chapter 05 SOW/Topic example ---


def test_spec_05_example_loads_whole_with_the_bflat_sales_reps_topic() -> None:
    config = load(SPEC_05_SOW_EXAMPLE, "amps.xml")
    assert [t.ident for t in config.topics] == [
        "nvfix:orders",
        "customers",
        "catalog",
        "bflat:sales-reps",
    ]
    reps = config.topic("sales-reps", "bflat")
    assert reps.keys == ("/employeeId", "/id")
    assert reps.enrichment == ('CONCAT(/firstName, " ", /lastName) AS /fullName',)


def test_spec_05_example_keeps_customers_and_catalog(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sowstream.config")
    config = load(SPEC_05_SOW_EXAMPLE, "amps.xml", skip_unsupported=True)

    assert [t.ident for t in config.topics] == [
        "nvfix:orders",
        "customers",
        "catalog",
        "bflat:sales-reps",
    ]
    assert config.topic("orders").message_type == "nvfix"
    customers = config.topic("customers")
    assert customers.keys == ("/customerId",)
    assert customers.hash_indexes == (
        ("/customerName",),
        ("/company",),
        ("/customerName", "/company"),
    )
    assert customers.all_hash_indexes[0] == ("/customerId",)
    assert len(customers.all_hash_indexes) == 4
    catalog = config.topic("catalog")
    assert catalog.keys == ("/sku",)
    assert catalog.hash_indexes == ()
    assert catalog.history == HistoryConfig(window_ms=7 * DAYS, granularity_ms=15 * MINUTES)
    assert catalog.expiration == ExpirationPolicy(mode="disabled")

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert not any("sales-reps" in w for w in warnings)
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("SOW/Topic[customers]/FileName" in i and "RocksDB" in i for i in infos)


def test_spec_05_example_from_a_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "amps.xml"
    # A type sowstream lacks in the chapter's example: the error names the file and element.
    path.write_text(SPEC_05_SOW_EXAMPLE.replace(">bflat<", ">msgpack<"))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.source == str(path)
    assert caught.value.element == "SOW/Topic[sales-reps]/MessageType"
    assert [t.name for t in load_config(path, skip_unsupported=True).topics] == [
        "orders",
        "customers",
        "catalog",
    ]


# --- Chapter 01 examples ---


def test_spec_01_example_7_3_loads_the_json_orders_and_the_xml_alerts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="sowstream.config")
    config = load(SPEC_01_EXAMPLE_7_3, "amps.xml")

    orders, alerts = config.topics
    assert (alerts.name, alerts.message_type, alerts.keys) == ("ALERTS", "xml", ("/alert/id",))
    assert alerts.indexes == ("/alert/type",)
    assert orders.name == "ORDERS"
    assert orders.message_type == "json"
    assert orders.keys == ("/invoice", "/customerId")
    assert orders.hash_indexes == (("/region",),)
    assert orders.all_hash_indexes == (("/invoice", "/customerId"), ("/region",))
    assert orders.effective_key_domain == "ORDERS"
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("SOW/Topic[ORDERS]/SlabSize" in i and "ignored" in i for i in infos)


@pytest.mark.parametrize("example", [SPEC_01_EXAMPLE_7_1, SPEC_01_EXAMPLE_7_2])
def test_spec_01_expiration_examples_are_fix_topics_keyed_by_tags(example: str) -> None:
    (orders,) = load(example).topics
    assert (orders.message_type, orders.keys, orders.ident) == (
        "fix",
        ("/55", "/109"),
        "fix:ORDERS",
    )
    assert TopicNames().log(orders.name, orders.message_type) == "sowstream.log.fix.ORDERS"


def test_spec_01_example_7_1_as_json_expires_after_30s_by_default() -> None:
    text = SPEC_01_EXAMPLE_7_1.replace("<MessageType>fix<", "<MessageType>json<")
    (orders,) = load(text).topics
    assert orders.expiration == ExpirationPolicy(mode="default", default_ms=30 * SECONDS)
    assert orders.keys == ("/55", "/109")


def test_spec_01_example_7_2_as_json_processes_per_message_expiration_only() -> None:
    text = SPEC_01_EXAMPLE_7_2.replace("<MessageType>fix<", "<MessageType>json<")
    (orders,) = load(text).topics
    assert orders.expiration == ExpirationPolicy(mode="enabled", default_ms=None)


def test_spec_01_key_generator_names_its_native_library() -> None:
    err = load_error(SPEC_01_KEY_GENERATOR)
    assert err.element == "SOW/Topic[custom-keyed-sow]/KeyGenerator/Module"
    assert "libmy_key_generator.so" in err.problem and "write it in Python" in err.problem
    python = SPEC_01_KEY_GENERATOR.replace(
        "libmy_key_generator.so", "tests.unit.test_keygen:by_upper_symbol"
    )
    (topic,) = load(python).topics
    assert topic.key_generator is not None
    assert topic.key_generator.module == "tests.unit.test_keygen:by_upper_symbol"
    assert dict(topic.key_generator.options) == {
        "OptionOne": "module-specific-option",
        "OptionTwo": "another-specific-option",
    }


# --- Queues and views inside SOW ---


# The queue examples are loaded in test_queue_config.py (they need their underlying topics).


def test_spec_05_view_example_loads_and_warns_of_the_index_field_the_view_lacks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The reference's own example indexes /name, which its Projection does not produce: AMPS
    # loads it (the index stays empty), so sowstream warns once, naming the view and the field.
    caplog.set_level(logging.WARNING, logger="sowstream.config")
    config = load(SPEC_05_VIEW_EXAMPLE, "amps.xml")
    assert config.view("hash-sample-view").hash_indexes == (("/name",), ("/orderType",))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "amps.xml: SOW/View[hash-sample-view]/HashIndex: HashIndex Key /name is not a field of "
        "view hash-sample-view (its fields: /quantity, /customerName, /orderType); the index "
        "stays empty and an exact match on /name finds no record"
    ]
    assert [t.ident for t in config.topics] == [
        "fix:/ett/order",
        "orders",
        "source-for-hash-sample",
        "example",
        "nvfix:ORDERS",
        "nvfix:COMPANIES",
    ]
    # the nvfix view 'example' over the json topic 'example' (a topic per message type)
    assert config.view("example").message_type == "nvfix"
    assert config.topic("example").message_type == "json"


def _spec_05_views_fixed() -> str:
    """The chapter 05 example with its HashIndex on a view field and without the nvfix view
    named like its json topic (the whole example loads in the test above)."""
    text = SPEC_05_VIEW_EXAMPLE.replace("<Key>/name</Key>", "<Key>/customerName</Key>")
    start = text.index("<!-- Project from one message type to another -->")
    return text[:start] + text[text.index("<!-- JOIN topics -->") :]


def test_a_view_over_a_topic_defined_later_names_the_view() -> None:
    text = sow(
        "<View><Name>v</Name><UnderlyingTopic>t</UnderlyingTopic>"
        "<Projection><Field>COUNT(/id) AS /n</Field></Projection>"
        "<Grouping><Field>/id</Field></Grouping></View>" + json_topic("<Key>/id</Key>")
    )
    err = load_error(text)
    assert err.element == "SOW/View[v]/UnderlyingTopic"
    assert "defined after it" in err.problem


def test_a_view_with_no_underlying_topic_names_the_element() -> None:
    err = load_error(sow("<View><Name>x</Name></View>" + json_topic("<Key>/id</Key>")))
    assert err.element.startswith("SOW/View[x]")


def test_a_conflated_topic_and_its_replica_definition_synonym_are_read() -> None:
    text = sow(
        json_topic("<Key>/id</Key>", name="orders")
        + "<ConflatedTopic><Name>orders-C</Name><UnderlyingTopic>orders</UnderlyingTopic>"
        "<Interval>1s</Interval><Filter>/qty > 1</Filter></ConflatedTopic>"
        "<ReplicaDefinition><Topic>orders-R</Topic><UnderlyingTopic>orders</UnderlyingTopic>"
        "</ReplicaDefinition>"
    )
    first, second = load(text).conflated_topics
    assert (first.name, first.interval_ms, first.filter) == ("orders-C", 1000, "/qty > 1")
    assert (second.name, second.interval_ms) == ("orders-R", 5000)


# --- Document shapes and synonyms ---


def test_whole_amps_config_with_other_sections() -> None:
    text = (
        "<?xml version='1.0'?><AMPSConfig><Name>inst</Name><Transports/>"
        + sow(json_topic("<Key>/id</Key>"))
        + "<TransactionLog><JournalDirectory>x</JournalDirectory></TransactionLog></AMPSConfig>"
    )
    assert [t.name for t in load(text).topics] == ["t"]


def test_amps_config_without_sow_has_no_topics() -> None:
    assert load("<AMPSConfig><Name>inst</Name></AMPSConfig>").topics == ()


def test_pre_5_synonyms_topic_metadata_topic_definition_topic_and_duration() -> None:
    text = """
    <TopicMetaData>
      <TopicDefinition>
        <Topic>legacy</Topic>
        <MessageType>json</MessageType>
        <Key>/id</Key>
        <Duration>transient</Duration>
        <RecoveryPoint>now</RecoveryPoint>
      </TopicDefinition>
    </TopicMetaData>"""
    (legacy,) = load(text).topics
    assert legacy.name == "legacy"
    assert legacy.durability == "transient"
    assert legacy.recovery_point == "now"


def test_topic_metadata_inside_amps_config() -> None:
    text = "<AMPSConfig><TopicMetaData>" + json_topic("") + "</TopicMetaData></AMPSConfig>"
    (topic,) = load(text).topics
    assert topic.user_supplied_keys


def test_name_wins_when_topic_agrees_and_disagreement_is_an_error() -> None:
    same = "<SOW><Topic><Name>a</Name><Topic>a</Topic><MessageType>json</MessageType></Topic></SOW>"
    assert load(same).topics[0].name == "a"
    err = load_error(same.replace("<Topic>a</Topic>", "<Topic>b</Topic>"))
    assert err.element == "SOW/Topic[a]/Topic"
    assert "disagrees" in err.problem


def test_missing_message_type_means_json_and_case_is_ignored() -> None:
    text = sow(
        "<Topic><Name>a</Name></Topic><Topic><Name>b</Name><MessageType>JSON</MessageType></Topic>"
    )
    assert [t.message_type for t in load(text).topics] == ["json", "json"]


def test_all_supported_elements() -> None:
    text = sow(
        json_topic(
            "<Key>/a</Key><Key>/b/c</Key><KeyDomain>dom</KeyDomain>"
            "<Durability>persistent</Durability><RecoveryPoint>epoch</RecoveryPoint>"
            "<Expiration>0s</Expiration><HashIndex><Key>/x</Key><Key>/y</Key></HashIndex>"
            "<Index>/q</Index><Index>/r</Index><Partitions>8</Partitions>",
            name="all",
        )
    )
    (topic,) = load(text).topics
    assert topic.keys == ("/a", "/b/c")
    assert topic.effective_key_domain == "dom"
    assert topic.expiration == ExpirationPolicy(mode="enabled")
    assert topic.hash_indexes == (("/x", "/y"),)
    assert topic.indexes == ("/q", "/r")
    assert topic.partitions == 8


def test_ignored_storage_elements_are_logged_with_topic_and_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="sowstream.config")
    ignored = {
        "FileName": "./sow/%n.sow",
        "SlabSize": "5MB",
        "InitialSlabCount": "1",
        "RecordSize": "512",
        "InitialSize": "2048",
        "IncrementSize": "1000",
        "ExpectedKeyCountHint": "536870912",
    }
    body = "".join(f"<{tag}>{value}</{tag}>" for tag, value in ignored.items())
    (topic,) = load(sow(json_topic(body, name="big")), "amps.xml").topics
    assert topic.name == "big"
    messages = [r.getMessage() for r in caplog.records]
    for tag in ignored:
        assert any(f"SOW/Topic[big]/{tag}: ignored:" in m and "RocksDB" in m for m in messages), tag
    assert all(r.name == "sowstream.config" and r.levelname == "INFO" for r in caplog.records)


# --- Preprocessing and Enrichment (once unsupported) ---


@pytest.mark.parametrize(
    "element",
    [
        "<Preprocessing><Field>1 AS /x</Field></Preprocessing>",
        "<Enrichment><Field>1 AS /x</Field></Enrichment>",
    ],
)
def test_stage_elements_are_read(element: str) -> None:
    tag = element[1 : element.index(">")]
    text = sow(json_topic("<Key>/id</Key>" + element, name="x") + json_topic("", name="y"))
    (x, y) = load(text).topics
    assert getattr(x, tag.lower()) == ("1 AS /x",) and not y.preprocessing
    bad = text.replace("1 AS /x", "1 AS x")
    err = load_error(bad, skip_unsupported=True)  # a bad Field is never "unsupported"
    assert err.element == f"SOW/Topic[x]/{tag}"
    assert err.problem.startswith("Field[1]: position 5: AS must be followed by a field path")


def test_unknown_topic_element_is_an_error_or_skips_the_topic() -> None:
    text = sow(json_topic("<Kye>/id</Kye>", name="x"))
    err = load_error(text)
    assert err.element == "SOW/Topic[x]/Kye"
    assert "unknown element <Kye>" in err.problem
    assert load(text, skip_unsupported=True).topics == ()


def test_unknown_sow_element() -> None:
    err = load_error(sow("<Topics><Name>x</Name></Topics>"))
    assert err.element == "SOW/Topics[x]"
    assert "unknown element <Topics> in <SOW>" in err.problem


# --- Errors ---


def test_malformed_xml_reports_the_line() -> None:
    err = load_error("<SOW>\n  <Topic>\n    <Name>x</Nam>\n  </Topic>\n</SOW>\n")
    assert err.element == "line 3, column 14"
    assert err.problem == "malformed XML: mismatched tag"


def test_not_an_amps_document() -> None:
    err = load_error("<html><body/></html>")
    assert err.element == "html"
    assert "<AMPSConfig>, <SOW> or <TopicMetaData>" in err.problem


def test_nameless_topic() -> None:
    err = load_error(sow("<Topic><MessageType>json</MessageType></Topic>"))
    assert err.element == "SOW/Topic[#1]/Name"
    assert err.problem == "is required"


def test_duplicate_topic_names() -> None:
    err = load_error(sow(json_topic("", name="a") + json_topic("", name="a")))
    assert err.element == "SOW/Topic[a]/Name"
    assert "already defined at SOW/Topic[a]" in err.problem


def test_element_given_twice() -> None:
    err = load_error(sow(json_topic("<Expiration>1s</Expiration><Expiration>2s</Expiration>")))
    assert err.element == "SOW/Topic[t]/Expiration"
    assert "appears 2 times" in err.problem


def test_durability_and_duration_together() -> None:
    err = load_error(
        sow(json_topic("<Durability>transient</Durability><Duration>transient</Duration>"))
    )
    assert err.element == "SOW/Topic[t]/Duration"
    assert "not both" in err.problem


@pytest.mark.parametrize(
    ("body", "element", "problem"),
    [
        ("<Key></Key>", "SOW/Topic[t]/Key", "<Key> is empty"),
        ("<Key><x/></Key>", "SOW/Topic[t]/Key", "must hold text"),
        ("<Key>id</Key>", "SOW/Topic[t]/Key", "must start with '/'"),
        ("<Key>/a//b</Key>", "SOW/Topic[t]/Key", "empty segment"),
        ("<Key>/a</Key><Key>/a</Key>", "SOW/Topic[t]/Key", "twice"),
        ("<HashIndex/>", "SOW/Topic[t]/HashIndex[1]", "at least one <Key>"),
        (
            "<HashIndex><Field>/a</Field></HashIndex>",
            "SOW/Topic[t]/HashIndex[1]/Field",
            "only <Key>",
        ),
        ("<HashIndex><Key>a</Key></HashIndex>", "SOW/Topic[t]/HashIndex", "must start with '/'"),
        ("<Index>a</Index>", "SOW/Topic[t]/Index", "must start with '/'"),
        ("<KeyDomain>d</KeyDomain>", "SOW/Topic[t]/KeyDomain", "only valid with Key"),
        ("<Expiration>soon</Expiration>", "SOW/Topic[t]/Expiration", "'soon'"),
        ("<Expiration>-1s</Expiration>", "SOW/Topic[t]/Expiration", "negative"),
        ("<Durability>forever</Durability>", "SOW/Topic[t]/Durability", "persistent, transient"),
        ("<Duration>forever</Duration>", "SOW/Topic[t]/Duration", "persistent, transient"),
        ("<RecoveryPoint>2024</RecoveryPoint>", "SOW/Topic[t]/RecoveryPoint", "epoch, now"),
        ("<Partitions>0</Partitions>", "SOW/Topic[t]/Partitions", "between 1 and 1024"),
        ("<Partitions>many</Partitions>", "SOW/Topic[t]/Partitions", "whole number"),
        (
            "<History><Window>1d</Window></History><Expiration>1s</Expiration>",
            "SOW/Topic[t]/Expiration",
            "must be 'disabled' when History",
        ),
        ("<History><Window>1x</Window></History>", "SOW/Topic[t]/History/Window", "unknown unit"),
        ("<History><Size>1</Size></History>", "SOW/Topic[t]/History/Size", "only <Window>"),
        (
            "<History><Window>1m</Window><Granularity>1h</Granularity></History>",
            "SOW/Topic[t]/History/Granularity",
            "longer than Window",
        ),
        ("<SlabSize>lots</SlabSize>", "SOW/Topic[t]/SlabSize", "'lots'"),
        ("<InitialSlabCount>x</InitialSlabCount>", "SOW/Topic[t]/InitialSlabCount", "whole number"),
        (
            "<InitialSlabCount>1025</InitialSlabCount>",
            "SOW/Topic[t]/InitialSlabCount",
            "between 1 and 1024",
        ),
        ("<InitialSlabCount>0</InitialSlabCount>", "SOW/Topic[t]/InitialSlabCount", "between 1"),
    ],
)
def test_bad_values_name_the_element(body: str, element: str, problem: str) -> None:
    err = load_error(sow(json_topic(body)))
    assert err.element == element
    assert problem in err.problem
    # Bad values are never "unsupported": skipping does not hide them.
    assert load_error(sow(json_topic(body)), skip_unsupported=True).element == element


def test_amps_topic_names_are_accepted_and_encoded_for_kafka() -> None:
    config = load(sow(json_topic("<Key>/id</Key>", name="/ett/order")), "amps.xml")
    topic = config.topic("/ett/order")
    assert TopicNames("p").log(topic.name) == "p.log.__-ett_-order"


def test_history_defaults_and_xml_encoding_declaration(tmp_path: Path) -> None:
    path = tmp_path / "latin1.xml"
    xml = sow(json_topic("<Key>/id</Key><History/>", name="caf\u00e9"))
    path.write_bytes(b"<?xml version='1.0' encoding='ISO-8859-1'?>\n" + xml.encode("latin-1"))
    (topic,) = load_config(path).topics
    assert topic.name == "caf\u00e9"  # decoded per the declaration (and encoded for Kafka)
    assert topic.history == HistoryConfig(window_ms=None, granularity_ms=0)


def test_example_amps_file_loads_strictly() -> None:
    config = load_config(EXAMPLES / "amps-sow.xml")
    assert config.source.endswith("amps-sow.xml")
    names = [t.name for t in config.topics]
    assert names and all(t.message_type == "json" for t in config.topics)
