"""Message types: parse/serialise round trips, merges, errors with positions, the registry and
how the SOW operations and subscription rules use them (no Kafka)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sowstream.config import ConfigError, load_config_text
from sowstream.errors import InvalidCommandError, InvalidMessageError
from sowstream.messagetypes import (
    MessageParseError,
    MessageSerialiseError,
    MessageTypeConfigError,
    TypeOptions,
    get,
    registry,
)
from sowstream.messagetypes.avro import AvroType, delta_schema
from sowstream.sow.aggregate import merge_partials, parse_aggregation
from sowstream.sow.compiled import compile_topic
from sowstream.sow.ops import apply_keyed, decode_log_record
from sowstream.sow.record import SowRecord
from sowstream.subscriptions.matcher import TopicSubscriptions
from sowstream.subscriptions.model import Change, SubscriptionSpec
from sowstream.subscriptions.options import parse_options
from sowstream.wire import headers as h
from sowstream.wire.topics import TopicNames

SOH = "\x01"
ORDER_SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "qty", "type": "int"},
        {"name": "customer", "type": "string"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {
            "name": "address",
            "type": {
                "type": "record",
                "name": "Address",
                "fields": [{"name": "city", "type": "string"}, {"name": "zip", "type": "string"}],
            },
        },
    ],
}


def fix(text: str) -> bytes:
    """FIX bytes written with | for SOH, as in the FIX specification's examples."""
    return text.replace("|", SOH).encode()


def avro_type() -> AvroType:
    codec = registry.for_options("avro", TypeOptions("orders", schema=orjson.dumps(ORDER_SCHEMA)))
    assert isinstance(codec, AvroType)
    return codec


ORDER = {
    "id": 7,
    "qty": 5,
    "customer": "Ann",
    "note": None,
    "address": {"city": "Oslo", "zip": "1"},
}

# --- json ---


def test_json_parse_errors_give_the_position() -> None:
    codec = get("json")
    with pytest.raises(MessageParseError) as caught:
        codec.parse(b'{"a": 1,,}')
    assert caught.value.position == 8 and "malformed JSON message at byte 8" in str(caught.value)
    with pytest.raises(MessageParseError, match="must be an object, got list"):
        codec.parse(b"[1, 2]")
    with pytest.raises(MessageParseError, match="empty message body"):
        codec.parse(b"")


def test_json_merge_is_the_delta_publish_rule() -> None:
    merged = get("json").merge(b'{"id": 1, "a": {"x": 1, "y": 2}, "b": [1]}', b'{"a": {"y": 3}}')
    assert orjson.loads(merged) == {"id": 1, "a": {"x": 1, "y": 3}, "b": [1]}


# --- fix and nvfix ---


def test_fix_fields_are_tags() -> None:
    codec = get("fix")
    body = codec.parse(fix("35=D|55=IBM|14=100|6=10.5|"))
    assert body == {"35": "D", "55": "IBM", "14": "100", "6": "10.5"}
    assert codec.serialise(body) == fix("35=D|55=IBM|14=100|6=10.5|")
    # the last SOH may be left out; a repeated tag (a repeating group) reads as a list
    assert codec.parse(fix("35=D|447=D|447=P")) == {"35": "D", "447": ["D", "P"]}
    assert codec.serialise({"447": ["D", "P"], "38": 100, "54": True}) == fix(
        "447=D|447=P|38=100|54=true|"
    )


@pytest.mark.parametrize(
    ("data", "position", "problem"),
    [
        ("35=D|abc|55=X|", 5, "field 'abc' has no '='"),
        ("35=D|=5|", 5, "empty name"),
        ("35=D|5x=1|", 5, "tag '5x' is not a number"),
        ("", 0, "no fields"),
    ],
)
def test_fix_errors_name_the_byte(data: str, position: int, problem: str) -> None:
    with pytest.raises(MessageParseError) as caught:
        get("fix").parse(fix(data))
    assert caught.value.position == position
    assert problem in str(caught.value) and f"at byte {position}" in str(caught.value)


def test_fix_cannot_write_nested_fields_or_soh() -> None:
    with pytest.raises(MessageSerialiseError, match="field /a holds dict"):
        get("nvfix").serialise({"a": {"b": 1}})
    with pytest.raises(MessageSerialiseError, match="tag 'a' is not a number"):
        get("fix").serialise({"a": "1"})
    with pytest.raises(MessageSerialiseError, match="SOH"):
        get("nvfix").serialise({"a": "x\x01y"})


def test_nvfix_names_are_free_text_and_merge_replaces_fields() -> None:
    codec = get("nvfix")
    stored = fix("OrderID=1|Tick=IBM|Shares=10|")
    assert codec.parse(stored) == {"OrderID": "1", "Tick": "IBM", "Shares": "10"}
    assert codec.merge(stored, fix("OrderID=1|Shares=20|Side=B|")) == fix(
        "OrderID=1|Tick=IBM|Shares=20|Side=B|"
    )


_tag_names = st.integers(1, 99_999).map(str)
_nv_names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="=\x01"), min_size=1
)
_values = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01"))


@given(st.dictionaries(_tag_names, _values, min_size=1))
def test_fix_round_trip(fields: dict[str, str]) -> None:
    codec = get("fix")
    assert codec.parse(codec.serialise(fields)) == fields


@given(st.dictionaries(_nv_names, st.one_of(_values, st.lists(_values, min_size=2)), min_size=1))
def test_nvfix_round_trip(fields: dict[str, Any]) -> None:
    codec = get("nvfix")
    assert codec.parse(codec.serialise(fields)) == fields


# --- xml ---


def test_xml_paths_start_at_the_root_element() -> None:
    codec = get("xml")
    body = codec.parse(b'<alert id="9"><type>disk</type><host>a</host><host>b</host></alert>')
    assert body == {"alert": {"@id": "9", "type": "disk", "host": ["a", "b"]}}
    assert codec.parse(codec.serialise(body)) == body


def test_xml_merge_updates_elements_and_keeps_the_rest() -> None:
    codec = get("xml")
    merged = codec.merge(
        b'<order id="1"><qty>5</qty><px>10</px></order>', b"<order><qty>6</qty></order>"
    )
    assert codec.parse(merged) == {"order": {"@id": "1", "qty": "6", "px": "10"}}


def test_xml_errors_name_line_column_and_byte() -> None:
    with pytest.raises(MessageParseError) as caught:
        get("xml").parse(b"<a>\n<b></a>")
    assert "mismatched tag (line 2, column 6)" in str(caught.value)
    assert caught.value.position == 9
    with pytest.raises(MessageParseError, match="empty message body"):
        get("xml").parse(b"  ")


def test_xml_refuses_entities_and_writes_one_root() -> None:
    bomb = b'<!DOCTYPE a [<!ENTITY x "boom">]><a>&x;</a>'
    with pytest.raises(MessageParseError):
        get("xml").parse(bomb)
    with pytest.raises(MessageSerialiseError, match="one root element, got 2"):
        get("xml").serialise({"a": "1", "b": "2"})


_xml_names = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True)
_xml_text = st.text(st.characters(codec="ascii", categories=("L", "N")), min_size=1)


@given(_xml_names, st.dictionaries(_xml_names, _xml_text, min_size=1))
def test_xml_round_trip(root: str, fields: dict[str, str]) -> None:
    codec = get("xml")
    assert codec.parse(codec.serialise({root: fields})) == {root: fields}


# --- avro ---


def test_avro_round_trip_delta_form_and_merge() -> None:
    codec = avro_type()
    data = codec.serialise(ORDER)
    assert codec.parse(data) == ORDER
    delta = codec.serialise_delta({"id": 7, "qty": 9})
    assert codec.parse_delta(delta) == {"id": 7, "qty": 9}  # null means unchanged
    assert codec.parse(codec.merge(data, delta)) == {**ORDER, "qty": 9}
    # a delta message names whole top-level fields: nested records are complete
    after = {**ORDER, "address": {"city": "Oslo", "zip": "2"}}
    assert codec.changed(ORDER, after) == {"address": {"city": "Oslo", "zip": "2"}}
    assert codec.parse_delta(codec.serialise_delta(codec.changed(ORDER, after))) == {
        "address": {"city": "Oslo", "zip": "2"}
    }


def test_avro_delta_schema_makes_every_field_optional() -> None:
    derived = delta_schema(ORDER_SCHEMA)
    assert derived["name"] == "OrderDelta"
    assert [f["type"][0] for f in derived["fields"]] == ["null"] * 5
    assert derived["fields"][3]["type"] == ["null", "string"]  # already optional: not nested


def test_avro_errors_give_the_position() -> None:
    codec = avro_type()
    data = codec.serialise(ORDER)
    with pytest.raises(MessageParseError) as caught:
        codec.parse(data[:-3])
    assert "not an Avro record of the topic's schema" in str(caught.value)
    with pytest.raises(MessageParseError, match="2 bytes left over") as caught:
        codec.parse(data + b"\x00\x00")
    assert caught.value.position == len(data)
    with pytest.raises(MessageSerialiseError, match="fields the schema does not: colour"):
        codec.serialise({**ORDER, "colour": "red"})
    with pytest.raises(MessageSerialiseError, match="cannot write the avro record"):
        codec.serialise({"id": 1})


def test_avro_schema_problems_name_the_topic(tmp_path: Path) -> None:
    with pytest.raises(MessageTypeConfigError, match="topic 'o': an avro topic needs"):
        registry.for_options("avro", TypeOptions("o"))
    with pytest.raises(MessageTypeConfigError, match="cannot read the Avro schema file"):
        registry.for_options("avro", TypeOptions("o", schema_file=str(tmp_path / "none.avsc")))
    with pytest.raises(MessageTypeConfigError, match="must be a record"):
        registry.for_options("avro", TypeOptions("o", schema='"string"'))
    bad = '{"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]}'
    with pytest.raises(MessageTypeConfigError, match="not a valid Avro schema"):
        registry.for_options("avro", TypeOptions("o", schema=bad))


# --- binary ---


def test_binary_is_opaque_and_merge_replaces() -> None:
    codec = get("binary")
    assert codec.parse(b"\x00\xff anything") == {}
    assert codec.merge(b"old", b"new") == b"new"
    assert not codec.has_fields and not codec.supports_delta
    with pytest.raises(MessageSerialiseError, match="no fields"):
        codec.serialise({"a": 1})


# --- the registry and user types ---


def test_registry_knows_the_built_in_types_and_refuses_others() -> None:
    assert registry.names()[:6] == ("json", "fix", "nvfix", "xml", "binary", "avro")
    assert get("NVFIX").name == "nvfix"
    with pytest.raises(MessageTypeConfigError, match="'msgpack' is not supported"):
        get("msgpack")


def test_a_user_type_from_an_entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A real installed distribution on sys.path, found by importlib.metadata.
    (tmp_path / "kvtype.py").write_text(
        textwrap.dedent(
            """
            from sowstream.messagetypes import MessageParseError, MessageType

            class KeyValues(MessageType):
                name = "kv"

                def parse(self, data):
                    try:
                        return dict(p.split(":", 1) for p in data.decode().split(";") if p)
                    except ValueError:
                        raise MessageParseError("kv", "a field without ':'") from None

                def serialise(self, record):
                    return ";".join(f"{k}:{v}" for k, v in record.items()).encode()
            """
        )
    )
    info = tmp_path / "kvtype-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvtype\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[sowstream.message_types]\nkv = kvtype:KeyValues\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry._types.cache_clear()
    try:
        assert "kv" in registry.names()
        config = load_config_text("sow: [{Name: t, MessageType: kv, Key: /id}]")
        topic = compile_topic(config.topics[0])
        assert (topic.definition.ident, topic.codec.parse(b"id:1;a:2")) == (
            "kv:t",
            {"id": "1", "a": "2"},
        )
        merged = apply_keyed(topic, None, op(topic, b"id:1;a:2", 1))
        assert merged is not None
        assert topic.codec.parse(
            apply_keyed(topic, merged, op(topic, b"id:1;b:3", 2, h.DELTA_PUBLISH)).data  # type: ignore[union-attr]
        ) == {"id": "1", "a": "2", "b": "3"}
    finally:
        sys.modules.pop("kvtype", None)
        monkeypatch.undo()
        registry._types.cache_clear()
    assert "kv" not in registry.names()


# --- the configuration ---


def test_json_and_nvfix_topics_may_share_a_name() -> None:
    config = load_config_text(
        "sow:\n  - {Name: orders, Key: /id}\n  - {Name: orders, MessageType: nvfix, Key: /id}\n"
    )
    json_topic, nvfix_topic = config.topics
    assert (json_topic.ident, nvfix_topic.ident) == ("orders", "nvfix:orders")
    names = TopicNames()
    assert names.log(json_topic.name) == "sowstream.log.orders"  # unchanged for json
    assert names.log(nvfix_topic.name, "nvfix") == "sowstream.log.nvfix.orders"
    assert config.topic("orders") is json_topic
    assert config.topic("orders", "nvfix") is nvfix_topic


@pytest.mark.parametrize(
    ("yaml", "element", "problem"),
    [
        (
            "sow: [{Name: b, MessageType: binary, Key: /id}]",
            "sow[0].Key",
            "binary: its messages are not parsed, so it cannot have Key fields; publishers "
            "supply each record's SowKey",
        ),
        (
            "sow: [{Name: b, MessageType: binary, HashIndex: [[/a]]}]",
            "sow[0].HashIndex",
            "cannot have HashIndex fields",
        ),
        ("sow: [{Name: a, MessageType: avro, Key: /id}]", "sow[0].Schema", "needs its record"),
        (
            "sow: [{Name: a, MessageType: avro, Key: /id, Schema: /no/such.avsc}]",
            "sow[0].Schema",
            "cannot read the Avro schema file '/no/such.avsc'",
        ),
        ("sow: [{Name: j, Key: /id, Schema: x.avsc}]", "sow[0].Schema", "only applies to avro"),
        (
            "sow:\n  - {Name: nvfix.o, Key: /id}\n  - {Name: o, MessageType: nvfix, Key: /id}\n",
            "sow",
            "json topic 'nvfix.o' and nvfix topic 'o' would share the Kafka topic names",
        ),
        (
            "sow:\n  - {Name: o, MessageType: fix, Key: /1}\n  - {Name: o, MessageType: FIX}\n",
            "sow[1].Name",
            "fix topic 'o' is already defined by sow[0]",
        ),
        (
            "topics: [{Name: w, MessageType: nvfix}]\nqueues: [{Name: Q, UnderlyingTopic: w, "
            "MessageType: msgpack}]",
            "queues[0].MessageType",
            "'msgpack' is not supported",
        ),
    ],
)
def test_configuration_errors_name_the_element(yaml: str, element: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text(yaml)
    assert caught.value.element == element
    assert problem in caught.value.problem


def test_avro_schema_file_is_relative_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "order.avsc").write_text(orjson.dumps(ORDER_SCHEMA).decode())
    yaml = "sow: [{Name: o, MessageType: avro, Key: /id, Schema: schemas/order.avsc}]"
    (tmp_path / "c.yaml").write_text(yaml)
    xml = (
        "<SOW><Topic><Name>o</Name><MessageType>avro</MessageType><Key>/id</Key>"
        "<Schema>schemas/order.avsc</Schema></Topic></SOW>"
    )
    (tmp_path / "c.xml").write_text(xml)
    from sowstream.config import load_config

    for name in ("c.yaml", "c.xml"):
        (topic,) = load_config(tmp_path / name).topics
        assert topic.schema_file == str(tmp_path / "schemas" / "order.avsc")
        codec = compile_topic(topic).codec
        assert codec.parse(codec.serialise(ORDER)) == ORDER
    with pytest.raises(ConfigError) as caught:
        load_config_text(xml.replace("schemas/order", "missing"), "amps.xml")
    assert caught.value.element == "SOW/Topic[o]/Schema"


# --- the SOW operations per type ---

TYPES = load_config_text(
    """
sow:
  - {Name: t, MessageType: fix, Key: /11}
  - {Name: t, MessageType: xml, Key: /order/@id}
  - {Name: t, MessageType: binary}
  - {Name: u, MessageType: xml}
"""
)


def op(topic: Any, value: bytes, offset: int, command: str = h.PUBLISH, key: str | None = None):  # type: ignore[no-untyped-def]
    headers = {h.COMMAND: command}
    kafka_key = key.encode() if key else None
    decoded = decode_log_record(topic, kafka_key, value, headers, offset, 0)
    if decoded.rekey and key is None:
        return decode_log_record(topic, decoded.sow_key.encode(), value, headers, offset, 0)
    return decoded


def test_fix_publish_keys_by_tag_and_delta_publish_merges() -> None:
    t = compile_topic(TYPES.topic("t", "fix"))
    first = apply_keyed(t, None, op(t, fix("11=A1|55=IBM|38=100|"), 1))
    assert first is not None
    second = apply_keyed(t, first, op(t, fix("11=A1|38=200|"), 2, h.DELTA_PUBLISH))
    assert second is not None and second.sow_key == first.sow_key
    assert second.data == fix("11=A1|55=IBM|38=200|")


def test_a_malformed_body_is_refused_with_the_type_and_position() -> None:
    t = compile_topic(TYPES.topic("t", "fix"))
    with pytest.raises(InvalidMessageError) as caught:
        decode_log_record(t, None, fix("11=A1|oops|"), {}, 1, 0)
    assert caught.value.reason == "malformed_fix"
    assert str(caught.value) == (
        "fix topic 't': malformed FIX message at byte 6: field 'oops' has no '=' between name "
        "and value"
    )


def test_xml_delta_with_another_root_cannot_merge() -> None:
    # publisher SowKeys: the update is not refused for its key
    t = compile_topic(TYPES.topic("u", "xml"))
    stored = apply_keyed(t, None, op(t, b'<order id="1"><qty>1</qty></order>', 1, key="k1"))
    update = op(t, b'<trade id="1"/>', 2, h.DELTA_PUBLISH, key="k1")
    with pytest.raises(InvalidMessageError, match="cannot be merged") as caught:
        apply_keyed(t, stored, update)
    assert caught.value.reason == "bad_merge"


def test_binary_needs_a_sow_key_and_delta_publish_replaces() -> None:
    t = compile_topic(TYPES.topic("t", "binary"))
    with pytest.raises(InvalidMessageError, match="the publisher must supply a SowKey"):
        decode_log_record(t, None, b"\x00\x01", {}, 1, 0)
    first = apply_keyed(t, None, op(t, b"\x00\x01", 1, key="k1"))
    second = apply_keyed(t, first, op(t, b"\x02", 2, h.DELTA_PUBLISH, key="k1"))
    assert second is not None and second.data == b"\x02"


def test_fix_aggregate_sum_of_products_by_tag() -> None:
    codec = get("fix")
    rows = [
        codec.parse(fix(text))
        for text in ("109=C1|14=10|6=2.5|", "109=C1|14=4|6=10|", "109=C2|14=1|6=3|")
    ]
    aggregation = parse_aggregation("[/109]", "[/109, SUM(/14 * /6) AS /71406]")
    result = aggregation.finish(merge_partials(aggregation, [aggregation.partial(rows)]))
    assert sorted(codec.serialise(row) for row in result) == [
        fix("109=C1|71406=65|"),
        fix("109=C2|71406=3|"),
    ]


# --- subscription rules per type ---


def _change(topic: Any, before: bytes | None, after: bytes | None, offset: int) -> Change:
    key = "k1"
    return Change(
        key,
        SowRecord(key, before, offset - 1, 0) if before is not None else None,
        SowRecord(key, after, offset, 0) if after is not None else None,
        0,
        offset,
        0,
        "deleted",
    )


def _spec(command: str, flt: str | None, mtype: str, options: str = "oof") -> SubscriptionSpec:
    return SubscriptionSpec("s", "r", "t", command, flt, parse_options(options), "", None, mtype)


def test_fix_delta_subscription_gets_fix_deltas_and_oof() -> None:
    t = compile_topic(TYPES.topic("t", "fix"))
    subs = TopicSubscriptions(t)
    subs.upsert(_spec("delta_subscribe", "/38 > 50", "fix"))
    old, new = fix("11=A1|55=IBM|38=100|"), fix("11=A1|55=IBM|38=200|")
    (delta,) = subs.dispatch([_change(t, old, new, 2)], 0)
    assert delta.is_delta and delta.data == fix("38=200|11=A1|")
    (oof,) = subs.dispatch([_change(t, new, fix("11=A1|55=IBM|38=10|"), 3)], 0)
    assert (oof.command, oof.reason, oof.data) == ("oof", "match", fix("11=A1|55=IBM|38=10|"))


def test_binary_subscriptions_get_whole_messages_and_take_no_filter() -> None:
    t = compile_topic(TYPES.topic("t", "binary"))
    subs = TopicSubscriptions(t)
    with pytest.raises(InvalidCommandError, match="takes no content filter"):
        subs.view(_spec("delta_subscribe", "/a = 1", "binary"))
    subs.upsert(_spec("delta_subscribe", None, "binary"))
    (msg,) = subs.dispatch([_change(t, b"\x00old", b"\x00new", 2)], 0)
    assert not msg.is_delta and msg.data == b"\x00new"


def test_subscription_keys_name_the_type_unless_json() -> None:
    assert _spec("subscribe", None, "nvfix").key == "r|s|nvfix:t"
    assert _spec("subscribe", None, "json").key == "r|s|t"
    wire = _spec("subscribe", None, "nvfix").to_wire()
    assert SubscriptionSpec.from_wire(wire).message_type == "nvfix"


def test_the_spark_pipeline_refuses_other_types_by_name() -> None:
    from sowstream.errors import PipelineError
    from sowstream.pipeline.rebuild import require_supported

    require_supported(load_config_text("sow: [{Name: j, Key: /id}]").topics[0])
    with pytest.raises(PipelineError, match="fix topic 't': the Spark pipeline rebuilds json"):
        require_supported(TYPES.topic("t", "fix"))
