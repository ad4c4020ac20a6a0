"""The bson, bflat, protobuf and composite message types: wire round trips (bflat from
hand-built bytes laid out as the BFlat description says), SowKeys, filters, delta_publish merges
and delta subscriptions through the SOW operations, and their configuration (no Kafka)."""

from __future__ import annotations

import struct
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sowstream.config import ConfigError, load_config_text
from sowstream.config.models import TopicConfig
from sowstream.errors import InvalidMessageError
from sowstream.filters import compile_filter
from sowstream.messagetypes import (
    MessageParseError,
    MessageSerialiseError,
    MessageTypeConfigError,
    TypeOptions,
    get,
    registry,
)
from sowstream.messagetypes.bflat import Datetime, decode, encode
from sowstream.messagetypes.composite import frame
from sowstream.sow.compiled import compile_topic
from sowstream.sow.ops import apply_keyed, decode_log_record
from sowstream.sow.record import SowRecord
from sowstream.subscriptions.matcher import TopicSubscriptions
from sowstream.subscriptions.model import Change, SubscriptionSpec
from sowstream.subscriptions.options import parse_options
from sowstream.wire import headers as h

PROTO2 = """
syntax = "proto2";
package shop;
message Order {
  required int64 id = 1;
  optional string sym = 2;
  optional int32 qty = 3;
  optional Address ship = 4;
  repeated string tags = 5;
  enum Side { BUY = 0; SELL = 1; }
  optional Side side = 6;
  map<string, int32> legs = 7;
  optional bytes blob = 8;
}
message Address { optional string city = 1; optional string zip = 2; }
"""
PROTO3 = """
syntax = "proto3";
package shop3;
message Order { int64 id = 1; string sym = 2; int32 qty = 3; }
"""


@pytest.fixture(scope="module")
def protos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("protos")
    (folder / "order.proto").write_text(PROTO2)
    (folder / "order3.proto").write_text(PROTO3)
    return folder


def op(topic: Any, value: bytes, offset: int, command: str = h.PUBLISH, key: str | None = None):  # type: ignore[no-untyped-def]
    headers = {h.COMMAND: command}
    kafka_key = key.encode() if key else None
    decoded = decode_log_record(topic, kafka_key, value, headers, offset, 0)
    if decoded.rekey and key is None:
        return decode_log_record(topic, decoded.sow_key.encode(), value, headers, offset, 0)
    return decoded


def change(before: bytes | None, after: bytes | None, offset: int) -> Change:
    return Change(
        "k1",
        SowRecord("k1", before, offset - 1, 0) if before is not None else None,
        SowRecord("k1", after, offset, 0) if after is not None else None,
        0,
        offset,
        0,
        "deleted",
    )


def spec(flt: str | None, mtype: str, command: str = "delta_subscribe") -> SubscriptionSpec:
    return SubscriptionSpec("s", "r", "t", command, flt, parse_options("oof"), "", None, mtype)


def walk(topic: TopicConfig, first: dict[str, Any], delta: dict[str, Any]) -> tuple[Any, Any]:
    """Publish ``first``, delta_publish ``delta`` to it; the two stored records."""
    t = compile_topic(topic)
    codec = t.codec
    one = apply_keyed(t, None, op(t, codec.serialise(first), 1))
    two = apply_keyed(t, one, op(t, codec.serialise_delta(delta), 2, h.DELTA_PUBLISH))
    assert one is not None and two is not None
    return one, two


# --- bson ---


def test_bson_round_trip_keys_filter_delta_and_merge() -> None:
    topic = TopicConfig(name="t", message_type="bson", keys=("/order/id",))
    codec = get("bson")
    body = {"order": {"id": 7, "sym": "IBM"}, "qty": 100, "px": 1.5, "blob": b"\x00\xff"}
    assert codec.parse(codec.serialise(body)) == body
    one, two = walk(topic, body, {"order": {"id": 7}, "qty": 200})
    assert one.sow_key == two.sow_key
    merged = codec.parse(two.data)
    assert merged == {**body, "qty": 200}
    assert compile_filter("/qty > 150 AND /order/sym = 'IBM'").matches(merged)

    subs = TopicSubscriptions(compile_topic(topic))
    subs.upsert(spec("/qty > 50", "bson"))
    (delta,) = subs.dispatch([change(one.data, two.data, 3)], 0)
    assert delta.is_delta and codec.parse(delta.data) == {"qty": 200, "order": {"id": 7}}


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "empty message body"),
        (b"\x05\x00\x00", "at least 5 bytes"),
        (b"\x09\x00\x00\x00\x00", "declares 9 bytes but the message has 5"),
        (b"\x0c\x00\x00\x00\x02a\x00\xff\x00\x00\x00\x00", "malformed BSON message"),
    ],
)
def test_bson_errors_say_what_is_wrong(data: bytes, problem: str) -> None:
    with pytest.raises(MessageParseError, match=problem):
        get("bson").parse(data)


def test_bson_cannot_write_what_it_has_no_type_for() -> None:
    with pytest.raises(MessageSerialiseError, match="cannot write the fields as BSON"):
        get("bson").serialise({"a": object()})


# --- bflat: fixtures built by hand from the format's layout ---


def header(kind: int, tag: bytes, *, array: bool = False) -> bytes:
    """A field header byte (array bit, type in bits 6-3, short tag length) and the tag."""
    short = len(tag) if len(tag) <= 7 else 0
    out = bytes([(0x80 if array else 0) | kind << 3 | short])
    return out + (bytes([len(tag)]) if not short else b"") + tag


BFLAT_FIXTURES: list[tuple[bytes, dict[str, Any]]] = [
    (header(5, b"id") + struct.pack("<i", 70000), {"id": 70000}),
    (header(3, b"q") + struct.pack("<b", -3), {"q": -3}),
    (header(4, b"q") + struct.pack("<h", 300), {"q": 300}),
    (header(6, b"big") + struct.pack("<q", 1 << 40), {"big": 1 << 40}),
    (header(7, b"px") + struct.pack("<d", 123.45), {"px": 123.45}),
    (header(1, b"sym") + b"\x03IBM", {"sym": "IBM"}),
    (header(2, b"raw") + b"\x02\x00\xff", {"raw": b"\x00\xff"}),
    (header(0, b"none"), {"none": None}),
    (header(8, b"at") + struct.pack("<q", 1700000000123), {"at": 1700000000123}),
    # signed LEB128: -129 is 0xff 0x7e; a tag of 9 bytes has its length after the header
    (header(9, b"longertag") + b"\xff\x7e", {"longertag": -129}),
    (header(9, b"n", array=True) + b"\x03\x00\x7f\x80\x01", {"n": [0, -1, 128]}),
    (header(1, b"s", array=True) + b"\x02\x00\x01a", {"s": ["", "a"]}),
    (header(3, b"e", array=True) + b"\x00", {"e": []}),
    # a repeated tag reads as the list of its values
    (header(3, b"r") + b"\x01" + header(1, b"r") + b"\x01x", {"r": [1, "x"]}),
]


@pytest.mark.parametrize(("data", "fields"), BFLAT_FIXTURES)
def test_bflat_decodes_hand_built_fields(data: bytes, fields: dict[str, Any]) -> None:
    assert decode(data) == fields
    assert decode(encode(fields)) == fields


def test_bflat_writes_the_most_compact_types() -> None:
    assert encode({"id": 5}) == header(3, b"id") + b"\x05"
    assert encode({"id": 300}) == header(4, b"id") + struct.pack("<h", 300)
    assert encode({"id": 1 << 70}) == header(9, b"id") + b"\x80" * 10 + b"\x01"
    assert encode({"x": [1, 300]}) == header(4, b"x", array=True) + b"\x02" + b"\x01\x00,\x01"
    assert encode({"x": [7]}) == header(3, b"x", array=True) + b"\x01\x07"
    assert encode({"b": True}) == header(3, b"b") + b"\x01"
    stamp = Datetime(1700000000123)
    assert encode({"at": stamp}) == header(8, b"at") + struct.pack("<q", 1700000000123)
    assert type(decode(encode({"at": stamp}))["at"]) is Datetime


@pytest.mark.parametrize(
    ("data", "problem", "position"),
    [
        (header(1, b"sym") + b"\x05IB", "needs 5 bytes but the message ends after 2", 5),
        (bytes([0x7B]) + b"abc", "unknown value type 15", 0),
        (bytes([0x08, 0x00]), "empty tag", 0),
        (header(9, b"n") + b"\x80", "the LEB128 number is cut off", 2),
        (header(5, b"i") + b"\x01\x00", "needs 4 bytes", 2),
        (header(5, b"i", array=True) + b"\x80\x80\x80\x80\x10", "declares 4294967296", 0),
        (header(0, b"z", array=True) + b"\x80\x80\x04", "declares 65536 elements", 0),
    ],
)
def test_bflat_errors_name_the_byte(data: bytes, problem: str, position: int) -> None:
    with pytest.raises(MessageParseError, match=problem) as caught:
        get("bflat").parse(data)
    assert caught.value.position == position


def test_bflat_refuses_nested_fields_and_huge_integers() -> None:
    with pytest.raises(MessageSerialiseError, match="BFlat is flat"):
        encode({"a": {"b": 1}})
    with pytest.raises(MessageSerialiseError, match="128-bit"):
        encode({"a": 1 << 130})


bflat_scalar = st.one_of(
    st.none(),
    st.integers(min_value=-(1 << 100), max_value=1 << 100),
    st.floats(allow_nan=False),
    st.text(),
    st.binary(),
)


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=12),
        st.one_of(
            bflat_scalar,
            st.lists(st.integers(min_value=-(1 << 70), max_value=1 << 70), max_size=4),
            st.lists(st.text(), max_size=4),
        ),
        max_size=6,
    )
)
def test_bflat_round_trip(fields: dict[str, Any]) -> None:
    assert decode(encode(fields)) == fields


def test_bflat_keys_filter_delta_publish_and_delta_subscribe() -> None:
    topic = TopicConfig(name="t", message_type="bflat", keys=("/id",))
    codec = get("bflat")
    one, two = walk(topic, {"id": 1, "sym": "IBM", "qty": 100}, {"id": 1, "qty": 200})
    assert codec.parse(two.data) == {"id": 1, "sym": "IBM", "qty": 200}
    assert compile_filter("/qty > 150").matches(codec.parse(two.data))
    subs = TopicSubscriptions(compile_topic(topic))
    subs.upsert(spec("/qty > 50", "bflat"))
    (delta,) = subs.dispatch([change(one.data, two.data, 3)], 0)
    assert delta.is_delta and codec.parse(delta.data) == {"qty": 200, "id": 1}


def test_the_chapters_bflat_topic_enriches_and_keys() -> None:
    xml = """<SOW><Topic><Name>sales-reps</Name><Key>/employeeId</Key>
    <MessageType>bflat</MessageType><Key>/id</Key>
    <Enrichment><Field>CONCAT(/firstName, " ", /lastName) AS /fullName</Field></Enrichment>
    </Topic></SOW>"""
    (topic,) = load_config_text(xml, "amps.xml").topics
    t = compile_topic(topic)
    rec = apply_keyed(t, None, op(t, encode({"employeeId": 4, "id": 9, "firstName": "Ada",
                                              "lastName": "L"}), 1))  # fmt: skip
    assert rec is not None
    assert decode(rec.data)["fullName"] == "Ada L"


# --- protobuf ---


def proto_topic(folder: Path, file: str = "order.proto#shop.Order", **extra: Any) -> TopicConfig:
    return TopicConfig(name="t", message_type="protobuf", schema_file=str(folder / file), **extra)


ORDER = {
    "id": 1,
    "sym": "IBM",
    "qty": 100,
    "ship": {"city": "Oslo"},
    "tags": ["a", "b"],
    "side": "SELL",
    "legs": {"x": 2},
    "blob": b"\x00",
}


def test_protobuf_round_trip_from_a_proto_file_and_a_descriptor_set(
    protos: Path, tmp_path: Path
) -> None:
    codec = get("protobuf", proto_topic(protos))
    assert codec.parse(codec.serialise(ORDER)) == ORDER
    assert codec.supports_delta  # proto2 tracks presence
    # the same type from the schema the engine publishes, and from a descriptor set file
    again = registry.for_options("protobuf", TypeOptions(schema=codec.schema_text))
    assert again.parse(codec.serialise(ORDER)) == ORDER
    import base64

    import orjson

    desc = tmp_path / "order.desc"
    desc.write_bytes(base64.b64decode(orjson.loads(codec.schema_text)["descriptor_set"]))
    from_set = get("protobuf", TopicConfig(name="d", message_type="protobuf",
                                            schema_file=str(desc)))  # fmt: skip
    assert from_set.parse(codec.serialise(ORDER)) == ORDER  # the file's first message


def test_protobuf_keys_filter_delta_publish_and_delta_subscribe(protos: Path) -> None:
    topic = proto_topic(protos, keys=("/id",))
    codec = get("protobuf", topic)
    one, two = walk(topic, ORDER, {"id": 1, "qty": 200, "ship": {"zip": "0150"}})
    merged = codec.parse(two.data)
    assert merged == {**ORDER, "qty": 200, "ship": {"city": "Oslo", "zip": "0150"}}
    assert compile_filter("/qty > 150 AND /ship/city = 'Oslo' AND /side = 'SELL'").matches(merged)
    subs = TopicSubscriptions(compile_topic(topic))
    subs.upsert(spec("/qty > 50", "protobuf"))
    (delta,) = subs.dispatch([change(one.data, two.data, 3)], 0)
    assert delta.is_delta
    assert codec.parse(delta.data) == {"id": 1, "qty": 200, "ship": {"zip": "0150"}}


def test_protobuf_3_takes_no_deltas(protos: Path) -> None:
    topic = proto_topic(protos, "order3.proto#shop3.Order", keys=("/id",))
    codec = get("protobuf", topic)
    assert not codec.supports_delta
    one, two = walk(topic, {"id": 1, "sym": "IBM", "qty": 5}, {"id": 1, "qty": 6})
    assert codec.parse(two.data) == {"id": 1, "qty": 6}  # replaced, as the chapter says
    subs = TopicSubscriptions(compile_topic(topic))
    subs.upsert(spec(None, "protobuf"))
    (whole,) = subs.dispatch([change(one.data, two.data, 3)], 0)
    assert not whole.is_delta and whole.data == two.data


def test_protobuf_problems_are_named(protos: Path, tmp_path: Path) -> None:
    codec = get("protobuf", proto_topic(protos))
    with pytest.raises(MessageParseError, match=r"not a shop\.Order message"):
        codec.parse(b"\xff\xff\xff")
    with pytest.raises(MessageSerialiseError, match="has no field 'nope'"):
        codec.serialise({"nope": 1})
    with pytest.raises(MessageSerialiseError, match=r"shop\.Order\.qty cannot hold 'many'"):
        codec.serialise({"qty": "many"})
    with pytest.raises(MessageSerialiseError, match="not a value of enum"):
        codec.serialise({"side": "HOLD"})

    def proto(file: str) -> Any:
        return registry.for_options("protobuf", TypeOptions(topic="t", schema_file=file))

    with pytest.raises(MessageTypeConfigError, match=r"has no message type 'shop\.Nope'"):
        proto(f"{protos}/order.proto#shop.Nope")
    with pytest.raises(MessageTypeConfigError, match="needs its schema"):
        registry.for_options("protobuf", TypeOptions(topic="t"))
    (tmp_path / "bad.proto").write_text("message {")
    with pytest.raises(MessageTypeConfigError, match="does not compile"):
        proto(str(tmp_path / "bad.proto"))
    with pytest.raises(MessageTypeConfigError, match=r"cannot read the \.proto file"):
        proto(str(tmp_path / "none.proto"))
    (tmp_path / "junk.desc").write_bytes(b"\xff\x00junk")
    with pytest.raises(MessageTypeConfigError, match="not a usable protobuf descriptor set"):
        proto(str(tmp_path / "junk.desc"))
    with pytest.raises(MessageTypeConfigError, match="cannot read the protobuf descriptor set"):
        proto(str(tmp_path / "none.desc"))
    with pytest.raises(MessageTypeConfigError, match="the protobuf schema is malformed"):
        registry.for_options("protobuf", TypeOptions(schema="{}"))


# --- composite ---


def local(*parts: str) -> TopicConfig:
    return TopicConfig(name="t", message_type="composite-local", parts=parts, keys=("/0/id",))


def test_composite_local_paths_start_with_the_part_number() -> None:
    codec = get("composite-local", local("json", "nvfix", "binary"))
    data = frame([b'{"id":1,"qty":5}', b"sym=IBM\x01", b"\x89PNG"])
    body = codec.parse(data)
    assert body == {"0": {"id": 1, "qty": 5}, "1": {"sym": "IBM"}, "2": b"\x89PNG"}
    assert codec.serialise(body) == data
    assert compile_filter("/0/qty = 5 AND /1/sym = 'IBM'").matches(body)


def test_composite_local_delta_publish_keeps_empty_parts_and_merges_the_others() -> None:
    topic = local("json", "binary")
    codec = get("composite-local", topic)
    first = {"0": {"id": 1, "qty": 5, "sym": "IBM"}, "1": b"IMAGE"}
    one, two = walk(topic, first, {"0": {"id": 1, "qty": 6}})
    assert codec.parse(two.data) == {"0": {"id": 1, "qty": 6, "sym": "IBM"}, "1": b"IMAGE"}
    # on the wire: an empty (zero-length) part is unchanged
    assert codec.serialise_delta({"0": {"id": 1, "qty": 6}}).endswith(b"\x00\x00\x00\x00")
    t = compile_topic(topic)
    three = apply_keyed(t, two, op(t, frame([b'{"id":1}', b"NEW"]), 3, h.DELTA_PUBLISH))
    assert three is not None
    assert codec.parse(three.data) == {"0": {"id": 1, "qty": 6, "sym": "IBM"}, "1": b"NEW"}

    subs = TopicSubscriptions(t)
    subs.upsert(spec("/0/qty > 1", "composite-local"))
    (delta,) = subs.dispatch([change(one.data, two.data, 4)], 0)
    assert delta.is_delta
    assert codec.parse_delta(delta.data) == {"0": {"qty": 6, "id": 1}}


def test_composite_global_reads_all_parts_as_one_document_and_takes_no_deltas() -> None:
    topic = TopicConfig(
        name="t", message_type="composite-global", parts=("json", "xml", "binary"), keys=("/id",)
    )
    codec = get("composite-global", topic)
    data = frame([b'{"id":1,"qty":5}', b"<meta><by>ann</by></meta>", b"\x00"])
    assert codec.parse(data) == {"id": 1, "qty": 5, "meta": {"by": "ann"}}
    assert not codec.supports_delta
    t = compile_topic(topic)
    one = apply_keyed(t, None, op(t, data, 1))
    update = frame([b'{"id":1,"qty":9}', b"<meta/>", b""])
    two = apply_keyed(t, one, op(t, update, 2, h.DELTA_PUBLISH))
    assert two is not None and two.data == update  # replaced whole


def test_composite_errors_name_the_part() -> None:
    codec = get("composite-local", local("json", "binary"))
    with pytest.raises(MessageParseError, match="part 0 declares 9 bytes but only 2 follow"):
        codec.parse(b"\x00\x00\x00\x09{}")
    with pytest.raises(MessageParseError, match="part 1: its 4-byte length is cut off"):
        codec.parse(frame([b"{}"]) + b"\x00")
    with pytest.raises(MessageParseError, match=r"part 0 \(json\)"):
        codec.parse(frame([b"nope", b""]))
    assert codec.parse(codec.empty) == {"0": {}, "1": b""}
    with pytest.raises(MessageSerialiseError, match="keyed by part number"):
        codec.serialise({"id": 1})
    with pytest.raises(MessageSerialiseError, match=r"part 1 \(binary\) takes bytes"):
        codec.serialise({"0": {}, "1": {"a": 1}})
    with pytest.raises(MessageTypeConfigError, match="needs its parts"):
        registry.for_options("composite-local", TypeOptions(topic="x"))
    with pytest.raises(MessageTypeConfigError, match="cannot be composite"):
        registry.for_options("composite-local", TypeOptions(parts=("json", "composite-global")))


def test_a_malformed_composite_message_is_refused_by_the_topic() -> None:
    t = compile_topic(local("json", "binary"))
    with pytest.raises(InvalidMessageError, match="malformed composite-local message"):
        decode_log_record(t, None, b"\x00\x00", {}, 1, 0)


# --- configuration ---


def test_yaml_names_schema_and_parts(protos: Path, tmp_path: Path) -> None:
    (tmp_path / "order.proto").write_text(PROTO2)
    path = tmp_path / "c.yaml"
    path.write_text(
        textwrap.dedent(
            """
            sow:
              - {Name: p, MessageType: protobuf, Schema: order.proto#shop.Order, Key: /id}
              - {Name: c, MessageType: composite-local, Parts: [json, binary], Key: /0/id}
              - {Name: b, MessageType: bson, Key: /id}
            topics:
              - {Name: g, MessageType: composite-global, Parts: [json, binary]}
            """
        )
    )
    from sowstream.config import load_config

    config = load_config(path)
    assert config.topic("p", "protobuf").schema_file == f"{tmp_path}/order.proto#shop.Order"
    assert config.topic("c", "composite-local").parts == ("json", "binary")
    assert config.topic("g", "composite-global").sow is False


def test_amps_message_types_declare_composite_and_protobuf_types(tmp_path: Path) -> None:
    (tmp_path / "protos").mkdir()
    (tmp_path / "protos" / "order.proto").write_text(PROTO2)
    path = tmp_path / "amps.xml"
    path.write_text(
        """<AMPSConfig><MessageTypes>
          <MessageType><Name>images</Name><Module>composite-local</Module>
            <MessageType>json</MessageType><MessageType>binary</MessageType></MessageType>
          <MessageType><Name>orders-pb</Name><Module>protobuf</Module>
            <ProtoPath>protos</ProtoPath><ProtoFile>order.proto</ProtoFile>
            <Type>shop.Order</Type></MessageType>
        </MessageTypes><SOW>
          <Topic><Name>pics</Name><MessageType>images</MessageType><Key>/0/id</Key></Topic>
          <Topic><Name>orders</Name><MessageType>orders-pb</MessageType><Key>/id</Key></Topic>
          <Topic><Name>b</Name><MessageType>bson</MessageType><Key>/id</Key></Topic>
          <Queue><Name>q</Name><UnderlyingTopic>b</UnderlyingTopic>
            <MessageType>bson</MessageType></Queue>
        </SOW></AMPSConfig>"""
    )
    from sowstream.config import load_config

    config = load_config(path)
    pics = config.topic("pics", "composite-local")
    assert pics.parts == ("json", "binary")
    orders = config.topic("orders", "protobuf")
    assert orders.schema_file == f"{tmp_path}/protos/order.proto#shop.Order"
    assert [(q.name, q.message_type) for q in config.queues] == [("q", "bson")]


@pytest.mark.parametrize(
    ("yaml", "element", "problem"),
    [
        (
            "sow:\n  - {Name: c, MessageType: composite-local}\n",
            "sow[0].Parts",
            "needs its parts' message types",
        ),
        (
            "sow:\n  - {Name: c, MessageType: json, Parts: [json]}\n",
            "sow[0].Parts",
            "Parts only applies to composite",
        ),
        (
            "sow:\n  - {Name: c, MessageType: composite-local, Parts: [json, msgpack]}\n",
            "sow[0].Parts",
            "'msgpack' is not supported",
        ),
        (
            "sow:\n  - {Name: c, MessageType: bson, Schema: x.proto}\n",
            "sow[0].Schema",
            "Schema only applies to avro and protobuf",
        ),
        (
            "sow:\n  - {Name: c, MessageType: protobuf}\n",
            "sow[0].Schema",
            "needs its schema",
        ),
        (
            "sow:\n  - Name: c\n    MessageType: composite-global\n    Parts: [json]\n"
            "    Enrichment: ['1 AS /x']\n",
            "sow[0].Enrichment",
            "takes no Enrichment or Preprocessing",
        ),
    ],
)
def test_configuration_errors_name_the_element(yaml: str, element: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text(yaml)
    assert caught.value.element == element
    assert problem in caught.value.problem


@pytest.mark.parametrize(
    ("types", "element", "problem"),
    [
        (
            "<MessageType><Name>x</Name><Module>protobuf</Module></MessageType>",
            "MessageTypes/MessageType[x]/ProtoFile",
            "needs its <ProtoFile>",
        ),
        (
            "<MessageType><Name>x</Name><Module>composite-local</Module></MessageType>",
            "MessageTypes/MessageType[x]/MessageType",
            "lists its parts",
        ),
    ],
)
def test_amps_message_type_declarations_need_their_settings(
    types: str, element: str, problem: str
) -> None:
    xml = f"<AMPSConfig><MessageTypes>{types}</MessageTypes><SOW/></AMPSConfig>"
    with pytest.raises(ConfigError) as caught:
        load_config_text(xml, "amps.xml")
    assert caught.value.element == element
    assert problem in caught.value.problem


def test_a_queue_reads_topics_of_its_own_type() -> None:
    config = load_config_text(
        """
sow:
  - {Name: orders, MessageType: bflat, Key: /id}
queues:
  - {Name: q, UnderlyingTopic: orders, MessageType: bflat}
"""
    )
    (queue,) = config.queues
    assert queue.reads(config.topic("orders", "bflat"))
    with pytest.raises(ConfigError, match="carries bflat, the queue json"):
        load_config_text(
            "sow:\n  - {Name: orders, MessageType: bflat, Key: /id}\n"
            "queues:\n  - {Name: q, UnderlyingTopic: orders}\n"
        )


def test_the_compiled_fold_covers_json_topics_only(protos: Path) -> None:
    from sowstream.engine.native import covers

    assert covers(compile_topic(TopicConfig(name="t", keys=("/id",))))
    for topic in (
        TopicConfig(name="t", message_type="bson", keys=("/id",)),
        TopicConfig(name="t", message_type="bflat", keys=("/id",)),
        proto_topic(protos, keys=("/id",)),
        local("json", "binary"),
        TopicConfig(name="t", message_type="composite-global", parts=("json",), keys=("/id",)),
    ):
        assert not covers(compile_topic(topic)), topic.message_type


def test_amps_topic_lists_its_parts_in_parts() -> None:
    xml = """<SOW><Topic><Name>c</Name><MessageType>composite-global</MessageType>
    <Parts>json binary</Parts><Key>/id</Key></Topic></SOW>"""
    (topic,) = load_config_text(xml, "amps.xml").topics
    assert (topic.message_type, topic.parts) == ("composite-global", ("json", "binary"))


def test_a_view_cannot_read_a_queue_of_another_type_than_json() -> None:
    with pytest.raises(ConfigError, match="reads queue 'q', a bflat queue: views read json"):
        load_config_text(
            "sow:\n  - {Name: w, MessageType: bflat, Key: /id}\n"
            "queues:\n  - {Name: q, UnderlyingTopic: w, MessageType: bflat}\n"
            "views:\n  - {Name: v, UnderlyingTopic: q, Projection: [/id], Grouping: [/id]}\n"
        )


def test_command_line_payloads_of_binary_encoded_types_are_json_objects() -> None:
    from sowstream.cli.common import payload_for
    from sowstream.errors import SowstreamError

    for name in ("bson", "bflat"):
        assert payload_for('{"id": 1}', get(name), None) == {"id": 1}
        with pytest.raises(SowstreamError, match=f"a {name} payload is given as a JSON object"):
            payload_for("[1]", get(name), None)
    assert payload_for("id=1|", get("nvfix"), "|") == "id=1\x01"


def test_an_expired_queue_message_of_another_type_is_base64_in_its_event() -> None:
    import base64

    import orjson

    from sowstream.engine.queues import expired_body

    body = encode({"id": 1})
    event = orjson.loads(orjson.dumps(expired_body(get("bflat"), body)))
    assert event == {"message": base64.b64encode(body).decode(), "encoding": "base64"}
    assert orjson.loads(orjson.dumps(expired_body(get("json"), b'{"a":1}'))) == {
        "message": {"a": 1}
    }


def test_a_conflated_topic_takes_its_underlying_topics_settings(protos: Path) -> None:
    config = load_config_text(
        f"""
sow:
  - {{Name: p, MessageType: protobuf, Schema: "{protos}/order.proto#shop.Order", Key: /id}}
  - {{Name: c, MessageType: composite-local, Parts: [json, binary], Key: /0/id}}
conflated_topics:
  - {{Name: p-C, UnderlyingTopic: p, MessageType: protobuf, Interval: 1s}}
  - {{Name: c-C, UnderlyingTopic: c, MessageType: composite-local, Interval: 1s}}
"""
    )
    pc, cc = config.conflated_topic_configs
    assert pc.schema_file == f"{protos}/order.proto#shop.Order"
    assert cc.parts == ("json", "binary")
    assert get("composite-local", cc).parse(frame([b"{}", b"x"])) == {"0": {}, "1": b"x"}
