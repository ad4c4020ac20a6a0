"""sowstream YAML configuration, the models it builds and the errors it raises."""

from __future__ import annotations

import contextlib
import pickle
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sowstream.config import (
    ConfigError,
    EngineConfig,
    ExpirationPolicy,
    HistoryConfig,
    RocksDBConfig,
    SowstreamConfig,
    TopicConfig,
    load_config,
)
from sowstream.config import load_config_text as load
from sowstream.errors import InvalidCommandError, SowstreamError, UnknownTopicError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MIB = 1024 * 1024

FULL_EXAMPLE = """
engine:
  app_id: trading
  bootstrap_servers: broker-1:9092,broker-2:9092
  data_dir: /var/lib/sowstream
  topic_prefix: trading.sow
  replication_factor: 3
  web_port: 9100
  restore: faust
  kafka:
    security.protocol: SASL_SSL
    sasl.mechanism: PLAIN
    session.timeout.ms: 45000
    enable.idempotence: true
  rocksdb:
    block_cache_size: 256MB
    write_buffer_size: 33554432
    max_write_buffer_number: 3

sow:
  - Name: orders
    MessageType: json
    Key: [/region, /orderId]
    KeyDomain: order-ids
    Durability: persistent
    RecoveryPoint: epoch
    Expiration: 30s
    HashIndex:
      - [/customer]
      - Key: [/customer, /status]
    Index: [/qty, /price]
    Partitions: 12
  - Name: catalog
    Key: /sku
    Durability: transient
    RecoveryPoint: now
    History:
      Window: 7d
      Granularity: 15m
  - Name: blobs
"""


def load_error(text: str, **kwargs: bool) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load(text, "cfg.yaml", **kwargs)
    return caught.value


def one_topic(body: str) -> TopicConfig:
    (topic,) = load("sow:\n  - Name: t\n" + body).topics
    return topic


# --- The example files and a full configuration ---


def test_orders_example() -> None:
    config = load_config(EXAMPLES / "orders.yaml")
    assert config.source == str(EXAMPLES / "orders.yaml")
    orders = config.topic("orders")
    assert orders.message_type == "json"
    assert orders.keys == ("/order",)
    assert orders.partitions == 4
    assert orders.hash_indexes == (("/customer",),)
    assert orders.indexes == ("/qty",)
    quotes = config.topic("quotes")
    assert quotes.keys == ("/symbol",)
    assert quotes.expiration == ExpirationPolicy(mode="default", default_ms=5 * 60_000)


def test_full_example() -> None:
    config = load(FULL_EXAMPLE)
    engine = config.engine
    assert engine.app_id == "trading"
    assert engine.bootstrap_servers == "broker-1:9092,broker-2:9092"
    assert engine.data_dir == "/var/lib/sowstream"
    assert engine.topic_prefix == "trading.sow"
    assert engine.replication_factor == 3
    assert engine.web_port == 9100
    assert engine.restore == "faust"
    # librdkafka takes every setting as text.
    assert engine.kafka == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "session.timeout.ms": "45000",
        "enable.idempotence": "true",
    }
    assert engine.rocksdb == RocksDBConfig(
        block_cache_size=256 * MIB, write_buffer_size=32 * MIB, max_write_buffer_number=3
    )

    orders, catalog, blobs = config.topics
    assert orders.keys == ("/region", "/orderId")
    assert orders.key_domain == orders.effective_key_domain == "order-ids"
    assert orders.expiration == ExpirationPolicy(mode="default", default_ms=30_000)
    assert orders.hash_indexes == (("/customer",), ("/customer", "/status"))
    assert orders.all_hash_indexes == (
        ("/region", "/orderId"),
        ("/customer",),
        ("/customer", "/status"),
    )
    assert orders.indexes == ("/qty", "/price")
    assert orders.partitions == 12
    assert not orders.user_supplied_keys

    assert catalog.durability == "transient"
    assert catalog.recovery_point == "now"
    assert catalog.history == HistoryConfig(window_ms=7 * 86_400_000, granularity_ms=900_000)
    assert catalog.effective_key_domain == "catalog"

    assert blobs.user_supplied_keys
    assert blobs.all_hash_indexes == ()


def test_defaults() -> None:
    config = load("sow:\n  - Name: t\n")
    assert config.source == "<string>"
    assert config.engine == EngineConfig()
    engine = config.engine
    assert (engine.app_id, engine.bootstrap_servers, engine.topic_prefix) == (
        "sowstream",
        None,
        "sowstream",
    )
    assert engine.data_dir == ".sowstream/data"
    assert engine.replication_factor == 1
    assert engine.web_port is None
    assert engine.kafka == {}
    assert engine.restore == "batched"
    # Sized for a laptop, far below faust's 2 GiB cache and 3 x 64 MiB buffers per partition.
    assert engine.rocksdb == RocksDBConfig(
        block_cache_size=64 * MIB, write_buffer_size=16 * MIB, max_write_buffer_number=2
    )
    (topic,) = config.topics
    assert topic == TopicConfig(name="t")
    assert topic.message_type == "json"
    assert topic.keys == ()
    assert topic.key_domain is None
    assert topic.durability == "persistent"
    assert topic.recovery_point == "epoch"
    assert topic.expiration == ExpirationPolicy(mode="disabled", default_ms=None)
    assert topic.partitions == 4
    assert topic.history is None


@pytest.mark.parametrize("text", ["", "\n# only a comment\n", "engine:\nsow:\n", "sow: []\n"])
def test_empty_configurations(text: str) -> None:
    config = load(text)
    assert config.topics == ()
    assert config.engine == EngineConfig()


def test_yaml_or_xml_is_chosen_by_content(tmp_path: Path) -> None:
    xml = tmp_path / "config.yaml"  # the extension does not matter
    xml.write_bytes(b"\xef\xbb\xbf\n  <SOW><Topic><Name>x</Name></Topic></SOW>")
    assert load_config(xml).topic("x").message_type == "json"
    yml = tmp_path / "config.xml"
    yml.write_bytes(b"\xef\xbb\xbf# yaml\nsow:\n  - Name: y\n")
    assert load_config(yml).topic("y").name == "y"
    assert load("\n\n   <SOW/>").topics == ()


# --- Shapes the YAML accepts ---


def test_key_forms() -> None:
    assert one_topic("    Key: /id\n").keys == ("/id",)
    assert one_topic("    Key: [/b, /a]\n").keys == ("/b", "/a")
    assert one_topic("    Key:\n      - /x/y\n      - /z\n").keys == ("/x/y", "/z")


def test_hash_index_forms() -> None:
    body = "    HashIndex:\n      - [/a, /b]\n      - Key: [/c]\n      - Key: /d\n      - /e\n"
    assert one_topic(body).hash_indexes == (("/a", "/b"), ("/c",), ("/d",), ("/e",))
    assert one_topic("    HashIndex: /f\n").hash_indexes == (("/f",),)


def test_hash_index_is_a_set_and_the_key_index_is_implicit() -> None:
    topic = one_topic("    Key: [/a, /b]\n    HashIndex: [[/b, /a], [/c, /d], [/d, /c], [/a]]\n")
    assert topic.hash_indexes == (("/c", "/d"), ("/a",))
    assert topic.all_hash_indexes == (("/a", "/b"), ("/c", "/d"), ("/a",))


def test_index_forms() -> None:
    assert one_topic("    Index: /q\n").indexes == ("/q",)
    assert one_topic("    Index: [/q, /r, /q]\n").indexes == ("/q", "/r")


@pytest.mark.parametrize(
    ("value", "policy"),
    [
        ("disabled", ExpirationPolicy(mode="disabled")),
        ("DISABLED", ExpirationPolicy(mode="disabled")),
        ("enabled", ExpirationPolicy(mode="enabled")),
        ("30s", ExpirationPolicy(mode="default", default_ms=30_000)),
        ("1.5h", ExpirationPolicy(mode="default", default_ms=5_400_000)),
        ("30", ExpirationPolicy(mode="default", default_ms=30_000)),
        ("0", ExpirationPolicy(mode="enabled")),
        ("0s", ExpirationPolicy(mode="enabled")),
        ("'0'", ExpirationPolicy(mode="enabled")),
    ],
)
def test_expiration_values(value: str, policy: ExpirationPolicy) -> None:
    assert one_topic(f"    Expiration: {value}\n").expiration == policy


def test_expiration_policy_parse() -> None:
    assert ExpirationPolicy.parse("enabled") == ExpirationPolicy(mode="enabled")
    assert ExpirationPolicy.parse(5) == ExpirationPolicy(mode="default", default_ms=5_000)
    with pytest.raises(ValueError, match="'disabled', 'enabled' or an interval"):
        ExpirationPolicy.parse("sometimes")


def test_history_forms() -> None:
    assert one_topic("    History: {}\n").history == HistoryConfig()
    assert one_topic("    History: {Window: 60}\n").history == HistoryConfig(window_ms=60_000)
    assert one_topic("    History: {Granularity: 0s}\n").history == HistoryConfig(
        window_ms=None, granularity_ms=0
    )
    assert one_topic("    History:\n").history is None  # an empty value means "not given"


def test_history_allows_disabled_expiration() -> None:
    topic = one_topic("    Expiration: disabled\n    History: {Window: 1d}\n")
    assert topic.history is not None


def test_message_type_and_choices_ignore_case() -> None:
    topic = one_topic("    MessageType: JSON\n    Durability: Transient\n    RecoveryPoint: NOW\n")
    assert (topic.message_type, topic.durability, topic.recovery_point) == (
        "json",
        "transient",
        "now",
    )


def test_paths_are_trimmed() -> None:
    assert one_topic("    Key: ' /id '\n").keys == ("/id",)


def test_topic_name_limits() -> None:
    assert one_topic("").name == "t"
    assert TopicConfig(name="a" * 180).name == "a" * 180
    assert TopicConfig(name="Orders.v2_EU-west").name == "Orders.v2_EU-west"


# --- The models ---


def test_models_are_frozen() -> None:
    topic = TopicConfig(name="t", keys=("/id",))
    with pytest.raises(ValidationError):
        topic.name = "u"
    with pytest.raises(ValidationError):
        EngineConfig().app_id = "x"
    assert hash(topic) == hash(TopicConfig(name="t", keys=("/id",)))


def test_direct_construction_validates_too() -> None:
    with pytest.raises(ValueError, match="between 1 and 1024"):
        TopicConfig(name="t", partitions=0)
    with pytest.raises(ValueError, match="Extra inputs"):
        TopicConfig(name="t", colour="blue")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="more than once"):
        SowstreamConfig(topics=(TopicConfig(name="a"), TopicConfig(name="a")))
    with pytest.raises(ValueError, match="needs a default_ms"):
        ExpirationPolicy(mode="default")
    with pytest.raises(ValueError, match="takes no default_ms"):
        ExpirationPolicy(mode="enabled", default_ms=5)
    with pytest.raises(ValueError, match="Window must be longer than 0"):
        HistoryConfig(window_ms=0)
    assert HistoryConfig(window_ms="1h", granularity_ms="1m") == HistoryConfig(  # type: ignore[arg-type]
        window_ms=3_600_000, granularity_ms=60_000
    )


def test_topic_lookup() -> None:
    config = load("sow:\n  - Name: orders\n  - Name: orders_eu\n  - Name: quotes\n")
    assert config.topic("quotes").name == "quotes"
    with pytest.raises(UnknownTopicError) as caught:
        config.topic("nope")
    assert "nope" in str(caught.value)


@pytest.mark.parametrize(
    ("pattern", "names"),
    [
        ("orders", ["orders"]),
        ("ord", []),  # full match, not search
        ("orders.*", ["orders", "orders_eu"]),
        ("orders|quotes", ["orders", "quotes"]),
        (".*s", ["orders", "quotes"]),
        ("ORDERS", []),
    ],
)
def test_topics_matching(pattern: str, names: list[str]) -> None:
    config = load("sow:\n  - Name: orders\n  - Name: orders_eu\n  - Name: quotes\n")
    assert [t.name for t in config.topics_matching(pattern)] == names


def test_topics_matching_invalid_regex() -> None:
    with pytest.raises(InvalidCommandError, match="not a valid regular expression"):
        load("sow:\n  - Name: a\n").topics_matching("orders(")


# --- ConfigError ---


def test_config_error_shape() -> None:
    err = ConfigError(source="f.yaml", element="sow[0].Key", problem="bad")
    assert str(err) == "f.yaml: sow[0].Key: bad"
    assert isinstance(err, ValueError)
    assert isinstance(err, SowstreamError)
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.source, copy.element, copy.problem) == ("f.yaml", "sow[0].Key", "bad")


def test_missing_file() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config("/nonexistent/sowstream.yaml")
    assert caught.value.source == "/nonexistent/sowstream.yaml"
    assert caught.value.element == "file"
    assert "cannot read it" in caught.value.problem


def test_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"sow:\n  - Name: caf\xe9\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.element == "byte 18"
    assert "UTF-8" in caught.value.problem


@pytest.mark.parametrize(
    ("text", "element", "problem"),
    [
        # Malformed YAML, with the line.
        ("sow:\n  - Name: a\n   Key: /a\n", "line 3, column 4", "malformed YAML"),
        ("sow: [\n", "line 2, column 1", "malformed YAML"),
        ("sow:\n  - Name: a\n    Key: /a\n    Key: /b\n", "line 4, column 5", "Key: [/a, /b]"),
        ("engine: {app_id: a, app_id: b}\n", "line 1, column 21", "'app_id' appears twice"),
        # The document's shape.
        ("- Name: a\n", "document", "expected a mapping"),
        ("just text\n", "document", "expected a mapping"),
        ("toppics: []\n", "toppics", "did you mean 'topics'? expected one of: engine, sow, topics"),
        ("sow: {Name: a}\n", "sow", "must be a list of topics"),
        ("sow:\n  - orders\n", "sow[0]", "each topic must be a mapping"),
        # engine settings.
        ("engine: []\n", "engine", "must be a mapping"),
        ("engine: {appid: x}\n", "engine.appid", "did you mean 'app_id'?"),
        ("engine: {rocksdb: {cache: 1}}\n", "engine.rocksdb.cache", "unknown key"),
        ("engine: {app_id: my app}\n", "engine.app_id", "Kafka topic names cannot hold"),
        ("engine: {app_id: '" + "a" * 49 + "'}\n", "engine.app_id", "the limit is 48"),
        ("engine: {topic_prefix: 'a/b'}\n", "engine.topic_prefix", "'a_b'"),
        ("engine: {bootstrap_servers: ''}\n", "engine.bootstrap_servers", "non-empty"),
        ("engine: {data_dir: 5}\n", "engine.data_dir", "non-empty string"),
        ("engine: {replication_factor: 0}\n", "engine.replication_factor", "between 1 and"),
        ("engine: {replication_factor: true}\n", "engine.replication_factor", "whole number"),
        ("engine: {web_port: 70000}\n", "engine.web_port", "between 1 and 65535"),
        ("engine: {kafka: {a: [1]}}\n", "engine.kafka", "'a' must be a single value"),
        ("engine: {kafka: 5}\n", "engine.kafka", "must be a mapping"),
        ("engine: {restore: fast}\n", "engine.restore", "must be batched or faust, got 'fast'"),
        (
            "engine: {rocksdb: {block_cache_size: lots}}\n",
            "engine.rocksdb.block_cache_size",
            "'lots'",
        ),
        (
            "engine: {rocksdb: {max_write_buffer_number: 0}}\n",
            "engine.rocksdb.max_write_buffer_number",
            "between 1",
        ),
        # Topics.
        ("sow:\n  - Key: /a\n", "sow[0].Name", "is required"),
        ("sow:\n  - Name: ''\n", "sow[0].Name", "topic name is empty"),
        ("sow:\n  - Name: 0123\n", "sow[0].Name", "quote it"),
        ("sow:\n  - Name: orders us\n", "sow[0].Name", "no spaces or control characters"),
        (
            "sow:\n  - Name: /a/b\n  - Name: __-a_-b\n",
            "sow",
            "would share the Kafka topic names",
        ),
        ("sow:\n  - Name: '" + "a" * 181 + "'\n", "sow[0].Name", "the limit is 180"),
        (
            "sow:\n  - Name: a\n  - Name: b\n  - Name: a\n",
            "sow[2].Name",
            "already defined by sow[0]",
        ),
        ("sow:\n  - Name: a\n    Keys: /a\n", "sow[0].Keys", "did you mean 'Key'?"),
        ("sow:\n  - Name: a\n    FileName: x.sow\n", "sow[0].FileName", "unknown key"),
        (
            "sow:\n  - Name: a\n    MessageType: 7\n",
            "sow[0].MessageType",
            "not supported; supported: json",
        ),
        ("sow:\n  - Name: a\n    Key: id\n", "sow[0].Key", "must start with '/'"),
        ("sow:\n  - Name: a\n    Key: /\n", "sow[0].Key", "empty segment"),
        ("sow:\n  - Name: a\n    Key: /a/\n", "sow[0].Key", "empty segment"),
        ("sow:\n  - Name: a\n    Key: [/a, /a]\n", "sow[0].Key", "lists '/a' twice"),
        ("sow:\n  - Name: a\n    Key: {x: 1}\n", "sow[0].Key", "a path or a list of paths"),
        ("sow:\n  - Name: a\n    Key: [1]\n", "sow[0].Key", "must be a path like '/id'"),
        ("sow:\n  - Name: a\n    KeyDomain: d\n", "sow[0].KeyDomain", "only valid with Key"),
        ("sow:\n  - Name: a\n    Key: /a\n    KeyDomain: ''\n", "sow[0].KeyDomain", "non-empty"),
        (
            "sow:\n  - Name: a\n    Durability: durable\n",
            "sow[0].Durability",
            "persistent, transient",
        ),
        ("sow:\n  - Name: a\n    RecoveryPoint: 5\n", "sow[0].RecoveryPoint", "epoch, now"),
        (
            "sow:\n  - Name: a\n    Expiration: 5 fortnights\n",
            "sow[0].Expiration",
            "unknown unit 'fortnights'",
        ),
        ("sow:\n  - Name: a\n    Expiration: -3s\n", "sow[0].Expiration", "negative"),
        ("sow:\n  - Name: a\n    Expiration: off\n", "sow[0].Expiration", "quote the word"),
        ("sow:\n  - Name: a\n    Expiration: [1]\n", "sow[0].Expiration", "Input should be"),
        (
            "sow:\n  - Name: a\n    HashIndex: {Key: /a}\n",
            "sow[0].HashIndex",
            "must be a list of indexes",
        ),
        ("sow:\n  - Name: a\n    HashIndex: [[]]\n", "sow[0].HashIndex", "at least one Key"),
        ("sow:\n  - Name: a\n    HashIndex: [{}]\n", "sow[0].HashIndex[0].Key", "at least one Key"),
        (
            "sow:\n  - Name: a\n    HashIndex: [{Keys: [/a]}]\n",
            "sow[0].HashIndex[0].Keys",
            "did you mean 'Key'?",
        ),
        (
            "sow:\n  - Name: a\n    HashIndex: [[/a, /a]]\n",
            "sow[0].HashIndex",
            "a HashIndex lists '/a' twice",
        ),
        ("sow:\n  - Name: a\n    HashIndex: [[a]]\n", "sow[0].HashIndex", "must start with '/'"),
        ("sow:\n  - Name: a\n    Index: [a]\n", "sow[0].Index", "must start with '/'"),
        (
            "sow:\n  - Name: a\n    Partitions: 0\n",
            "sow[0].Partitions",
            "between 1 and 1024, got 0",
        ),
        ("sow:\n  - Name: a\n    Partitions: 1025\n", "sow[0].Partitions", "between 1 and 1024"),
        ("sow:\n  - Name: a\n    Partitions: 1.5\n", "sow[0].Partitions", "whole number"),
        ("sow:\n  - Name: a\n    Partitions: yes\n", "sow[0].Partitions", "whole number"),
        ("sow:\n  - Name: a\n    History: 7d\n", "sow[0].History", "must be a mapping"),
        (
            "sow:\n  - Name: a\n    History: {Window: 7d, Size: 1}\n",
            "sow[0].History.Size",
            "unknown key",
        ),
        (
            "sow:\n  - Name: a\n    History: {Window: 0s}\n",
            "sow[0].History.Window",
            "longer than 0",
        ),
        (
            "sow:\n  - Name: a\n    History: {Window: 1q}\n",
            "sow[0].History.Window",
            "unknown unit 'q'",
        ),
        (
            "sow:\n  - Name: a\n    History: {Granularity: yes}\n",
            "sow[0].History.Granularity",
            "interval like",
        ),
        (
            "sow:\n  - Name: a\n    History: {Window: 1m, Granularity: 2m}\n",
            "sow[0].History.Granularity",
            "longer than Window",
        ),
        (
            "sow:\n  - Name: a\n    History: {Window: 1d}\n    Expiration: enabled\n",
            "sow[0].Expiration",
            "must be 'disabled' when History",
        ),
    ],
)
def test_errors_name_the_element_and_problem(text: str, element: str, problem: str) -> None:
    err = load_error(text)
    assert err.source == "cfg.yaml"
    assert err.element == element
    assert problem in err.problem
    assert str(err) == f"cfg.yaml: {element}: {err.problem}"


@pytest.mark.parametrize("key", ["Preprocessing", "Enrichment"])
def test_stage_keys_are_read_and_checked(key: str) -> None:
    """Once unsupported, now read: a bad Field is an error even with skip_unsupported."""
    config = load(f"sow:\n  - Name: a\n    Key: /id\n    {key}: [/x * 2 AS /y]\n")
    assert getattr(config.topics[0], key.lower()) == ("/x * 2 AS /y",)
    err = load_error(f"sow:\n  - Name: a\n    {key}: x\n  - Name: b\n", skip_unsupported=True)
    assert err.element == f"sow[0].{key}"
    assert err.problem.startswith("Field[1]: position 1: expected '('")


def test_other_message_types_are_unsupported() -> None:
    text = "sow:\n  - Name: a\n    MessageType: msgpack\n  - Name: b\n"
    err = load_error(text)
    assert err.element == "sow[0].MessageType"
    assert "'msgpack' is not supported" in err.problem
    assert "json, fix, nvfix, xml, binary, avro" in err.problem
    assert [t.name for t in load(text, skip_unsupported=True).topics] == ["b"]


def test_skipping_does_not_hide_invalid_values() -> None:
    err = load_error("sow:\n  - Name: a\n    Partitions: 0\n", skip_unsupported=True)
    assert err.element == "sow[0].Partitions"


# --- Whatever the input, the loader raises ConfigError or succeeds ---

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 2000),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "/a", "/a/b", "a", "30s", "enabled", "json", "fix", "-1", "//", "x y"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["Key", "Window", "Granularity", "x"]), inner, max_size=3)
    ),
    max_leaves=6,
)
_topic_keys = st.sampled_from(
    [
        "Name",
        "MessageType",
        "Key",
        "KeyDomain",
        "Durability",
        "RecoveryPoint",
        "Expiration",
        "HashIndex",
        "Index",
        "Partitions",
        "History",
        "Pattern",
        "Bogus",
    ]
)


@settings(max_examples=300, deadline=None)
@given(topic=st.dictionaries(_topic_keys, _values, max_size=6), skip=st.booleans())
def test_arbitrary_topics_raise_only_config_error(topic: dict[str, Any], skip: bool) -> None:
    text = yaml.safe_dump({"sow": [topic]})
    with contextlib.suppress(ConfigError):
        load(text, skip_unsupported=skip)
