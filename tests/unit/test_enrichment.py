"""Preprocessing and Enrichment without Kafka: the expression parts, the Field rules, the
configuration errors and what sow.ops does with a publish (chapter 08, part B)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from sowstream.config import load_config_text
from sowstream.config.errors import ConfigError
from sowstream.config.models import TopicConfig
from sowstream.errors import InvalidMessageError
from sowstream.filters import FilterError, ast, compile_filter, compile_value, parse_filter
from sowstream.filters.evaluate import StageInput
from sowstream.sow.compiled import CompiledTopic, compile_topic
from sowstream.sow.enrich import StageError, StageFailure, compile_stage
from sowstream.sow.keys import generated_sow_key
from sowstream.sow.ops import LogOp, apply_keyed, decode_log_record
from sowstream.sow.record import SowRecord
from sowstream.wire import headers as h

# -- expressions ----------------------------------------------------------------------------


def value(text: str, current: dict[str, Any], previous: dict[str, Any] | None = None) -> Any:
    fn = compile_value(parse_filter(text, stage=True))
    return fn(StageInput(current, previous, 1_700_000_000_123, "inst-1"))


def test_if_takes_the_else_branch_on_false_and_unknown() -> None:
    assert value("IF(/a > 1, 'big', 'small')", {"a": 5}) == "big"
    assert value("IF(/a > 1, 'big', 'small')", {"a": 0}) == "small"
    assert value("IF(/a > 1, 'big', 'small')", {}) == "small"  # NULL > 1 is UNKNOWN
    assert value("IF(/a IS NULL, NULL, /a)", {}) is None


def test_of_previous_reads_the_stored_record_and_of_current_the_message() -> None:
    assert value("/q OF PREVIOUS", {"q": 1}, {"q": 7}) == 7
    assert value("/q OF PREVIOUS", {"q": 1}, None) is None
    assert value("/q of current", {"q": 1}, {"q": 7}) == 1
    assert value("/o/q OF PREVIOUS + /q", {"q": 1}, {"o": {"q": 2}}) == 3
    assert value("COALESCE(/x OF CURRENT, /x OF PREVIOUS, 'd')", {}, {"x": "p"}) == "p"


def test_crc32_modulo_instance_name_and_log_time() -> None:
    assert value("CRC32('abc')", {}) == 891568578  # zlib's CRC-32 of the UTF-8 text
    assert value("CRC32(CONCAT(/n, /o)) % 10", {"n": "ab", "o": "c"}) == 891568578 % 10
    assert value("CRC32(/missing)", {}) is None
    assert value("AMPS_INSTANCE_NAME()", {}) == "inst-1"
    assert value("UNIX_TIMESTAMP()", {}) == 1_700_000_000.123  # the log time, in seconds
    assert value("-7 % 3", {}) == -1


def test_stage_only_syntax_is_refused_in_filters_at_its_position() -> None:
    for text, position, name in [
        ("/a OF PREVIOUS = 1", 0, "OF PREVIOUS"),
        ("/x = 1 AND IF(/a, 1, 0) = 1", 11, "IF"),
        ("CRC32(/a) = 1", 0, "CRC32"),
        ("/t > UNIX_TIMESTAMP()", 5, "UNIX_TIMESTAMP"),
    ]:
        with pytest.raises(FilterError) as err:
            compile_filter(text)
        assert err.value.position == position and name in err.value.reason
    # the stage keywords are not offered in a filter's errors, and are in a stage's
    assert "'OF'" not in parse_error("/a /")
    assert parse_error("/a OF LATEST", stage=True) == ["'CURRENT'", "'PREVIOUS'"]


def parse_error(text: str, stage: bool = False) -> list[str]:
    with pytest.raises(FilterError) as err:
        parse_filter(text, stage=stage)
    return err.value.expected


def test_previous_prints_back_and_has_its_path_as_child() -> None:
    tree = parse_filter("IF(/q < 0, /q OF PREVIOUS, /q)", stage=True)
    assert parse_filter(ast.to_text(tree), stage=True) == tree
    assert any(isinstance(n, ast.Previous) for n in ast.walk(tree))


# -- Field rules (chapter 08 B3 and the worked examples) -------------------------------------------


def enrichment(*fields: str) -> Any:
    return compile_stage("Enrichment", fields, instance_name="inst-1")


def preprocessing(*fields: str) -> Any:
    return compile_stage("Preprocessing", fields)


def test_e1_validation_keeps_the_previous_value() -> None:
    stage = enrichment(
        "IF(/qty < 0, /qty OF PREVIOUS, /qty) AS /qty",
        "IF(/price < 0, /price OF PREVIOUS, /price) AS /price",
    )
    assert stage.apply({"qty": -1, "price": 100}, None, 0) == {"qty": None, "price": 100}
    assert stage.apply({"qty": -2, "price": 101}, {"qty": 5, "price": 100}, 0) == {
        "qty": 5,
        "price": 101,
    }


def test_e3_default_value_and_e2_instance_name() -> None:
    stage = enrichment(
        "COALESCE(/important OF CURRENT, /important OF PREVIOUS, 'default') AS /important",
        "AMPS_INSTANCE_NAME() AS /publishSource",
    )
    first = stage.apply({"id": 1}, None, 0)
    assert first == {"id": 1, "important": "default", "publishSource": "inst-1"}
    assert stage.apply({"id": 1, "important": "x"}, first, 0)["important"] == "x"
    assert stage.apply({"id": 1}, {"id": 1, "important": "x"}, 0)["important"] == "x"


def test_e5_hint_optional_removes_a_null_result() -> None:
    field = "IF(/source IN ('a','e','f'), /source, NULL) AS /source"
    with_hint = preprocessing(field + " HINT OPTIONAL")
    assert with_hint.apply({"id": 1, "source": "a"}, None, 0) == {"id": 1, "source": "a"}
    assert with_hint.apply({"id": 2, "source": "z"}, None, 0) == {"id": 2}
    assert with_hint.apply({"id": 3}, None, 0) == {"id": 3}
    assert preprocessing(field).apply({"id": 2, "source": "z"}, None, 0) == {
        "id": 2,
        "source": None,
    }


def test_e6_set_current_lets_later_fields_see_a_result() -> None:
    message = {"k": 1, "a": 3}
    chained = enrichment("/a * 2 AS /b HINT SET_CURRENT", "/b + 1 AS /c")
    assert chained.apply(message, None, 0) == {"k": 1, "a": 3, "b": 6, "c": 7}
    # without the hint every field reads the message as it entered the stage
    assert enrichment("/a * 2 AS /b", "/b + 1 AS /c").apply(message, None, 0)["c"] is None
    both = enrichment("NULL AS /a HINT set_current , optional", "COALESCE(/a, 9) AS /d")
    assert both.apply(message, None, 0) == {"k": 1, "d": 9}
    assert message == {"k": 1, "a": 3}  # never changed in place


def test_nested_targets_are_created_and_multi_values_become_lists() -> None:
    stage = enrichment("/legs/qty AS /summary/qtys", "UPPER(/s) AS /summary/s")
    out = stage.apply(
        {"legs": [{"qty": 1}, {"qty": 2}, {}], "s": "x", "summary": {"k": 1}}, None, 0
    )
    assert out["summary"] == {"k": 1, "qtys": [1, 2], "s": "X"}


def test_a_field_that_cannot_be_written_fails_naming_it() -> None:
    stage = enrichment("/id AS /ok", "/q AS /totals/value")
    with pytest.raises(StageFailure) as failed:
        stage.apply({"id": 1, "q": 2, "totals": 7}, None, 0)
    assert str(failed.value) == (
        "Enrichment/Field[2] '/q AS /totals/value': cannot write /totals/value: /totals holds "
        "a number, not an object"
    )


@pytest.mark.parametrize(
    ("kind", "text", "problem"),
    [
        ("Enrichment", "SUM(/a) AS /b", "aggregate function SUM cannot be used in Enrichment"),
        ("Preprocessing", "/a + COUNT(/b) AS /c", "aggregate function COUNT cannot be used"),
        ("Enrichment", "/a", "'/a' names no target"),
        ("Enrichment", "/a AS b", "position 6: AS must be followed by a field path"),
        ("Enrichment", "/a AS", "AS needs an output path"),
        ("Enrichment", "/a AS /b AS /c", "takes one AS"),
        ("Enrichment", "/a AS /b HINT", "HINT needs a hint"),
        ("Enrichment", "/a AS /b HINT OPTIONAL HINT SET_CURRENT", "one HINT clause"),
        ("Enrichment", "/a AS /b HINT LOUD", "unknown hint 'LOUD'"),
        ("Enrichment", "FOO(/a) AS /b", "unknown function 'FOO': the functions are"),
        ("Preprocessing", "/a OF PREVIOUS AS /b", "OF PREVIOUS cannot be used in Preprocessing"),
        ("Preprocessing", "UNIX_TIMESTAMP() AS /t", "UNIX_TIMESTAMP() cannot be used in Prepro"),
        ("Enrichment", "/x AS /id", "writes /id, which holds the Key field /id"),
        ("Enrichment", "/x AS /o", "writes /o, which holds the Key field /o/k"),
        ("Enrichment", "   ", "a Field must be text"),
    ],
)
def test_field_errors_name_the_field_and_the_problem(kind: str, text: str, problem: str) -> None:
    with pytest.raises(StageError) as err:
        compile_stage(kind, ["/ok AS /fine", text], key_fields=["/id", "/o/k"])
    assert err.value.element == f"{kind}/Field[2]"
    assert problem in err.value.problem


# -- configuration ---------------------------------------------------------------------------


def yaml_error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        load_config_text(text, "cfg.yaml")
    return err.value


def xml_error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        load_config_text(f"<SOW>{text}</SOW>", "amps.xml")
    return err.value


def xml_topic(body: str, kind: str = "json") -> str:
    return f"<Topic><Name>O</Name><MessageType>{kind}</MessageType>{body}</Topic>"


@pytest.mark.parametrize(
    ("text", "element", "problem"),
    [
        ("{Name: O, Key: /id, Enrichment: []}", "sow[0].Enrichment", "needs at least one Field"),
        (
            "{Name: O, Key: /id, Enrichment: [/a AS /b, MAX(/a) AS /c]}",
            "sow[0].Enrichment",
            "Field[2]: aggregate function MAX cannot be used in Enrichment",
        ),
        (
            "{Name: O, Key: /id, Pattern: '^o', Preprocessing: [/a AS /b]}",
            "sow[0].Preprocessing",
            "cannot be used with Pattern",
        ),
        (
            "{Name: O, MessageType: binary, Enrichment: [/a AS /b]}",
            "sow[0].Enrichment",
            "topic 'O' is binary: its messages are not parsed",
        ),
        (
            "{Name: O, Key: /id, Enrichment: ['/a AS 5']}",
            "sow[0].Enrichment",
            "Field[1]: position 6: AS must be followed by a field path such as /total, not '5'",
        ),
        ("{Name: O, Key: /id, Enrichment: {a: 1}}", "sow[0].Enrichment", "list of Fields"),
    ],
)
def test_yaml_config_errors_name_file_element_and_reason(
    text: str, element: str, problem: str
) -> None:
    err = yaml_error(f"sow:\n  - {text}\n")
    assert (err.source, err.element) == ("cfg.yaml", element)
    assert problem in err.problem


def test_stages_only_on_sow_topics() -> None:
    err = yaml_error("topics:\n  - {Name: P, Enrichment: [/a AS /b]}\n")
    assert err.element == "topics[0].Enrichment" and "only applies to SOW topics" in err.problem


@pytest.mark.parametrize(
    ("body", "element", "problem"),
    [
        ("<Key>/id</Key><Enrichment/>", "SOW/Topic[O]/Enrichment", "needs at least one <Field>"),
        (
            "<Key>/id</Key><Enrichment><Expr>/a AS /b</Expr></Enrichment>",
            "SOW/Topic[O]/Enrichment/Expr",
            "holds only <Field> elements",
        ),
        (
            "<Key>/id</Key><Preprocessing><Field></Field></Preprocessing>",
            "SOW/Topic[O]/Preprocessing/Field[1]",
            "<Field> is empty",
        ),
        (
            "<Key>/id</Key><Enrichment><Field>AVG(/q) AS /q</Field></Enrichment>",
            "SOW/Topic[O]/Enrichment",
            "Field[1]: aggregate function AVG",
        ),
        (  # E11: a regular expression topic refuses both stages
            "<Key>/id</Key><Pattern>^o</Pattern><Enrichment><Field>1 AS /x</Field></Enrichment>",
            "SOW/Topic[O]/Enrichment",
            "Enrichment cannot be used with Pattern",
        ),
    ],
)
def test_amps_xml_config_errors(body: str, element: str, problem: str) -> None:
    err = xml_error(xml_topic(body))
    assert (err.source, err.element) == ("amps.xml", element)
    assert problem in err.problem


def test_xml_binary_topic_refuses_stages() -> None:
    err = xml_error(xml_topic("<Enrichment><Field>1 AS /x</Field></Enrichment>", "binary"))
    assert err.element == "SOW/Topic[O]/Enrichment" and "is binary" in err.problem


def test_instance_name_comes_from_the_engine_or_the_amps_name() -> None:
    yaml = "engine: {app_id: app7}\nsow:\n  - {Name: O, Key: /id, Enrichment: ['1 AS /x']}\n"
    assert load_config_text(yaml).topics[0].instance_name == "app7"
    named = yaml.replace("app_id: app7", "app_id: app7, instance_name: east-1")
    assert load_config_text(named).topics[0].instance_name == "east-1"
    xml = "<AMPSConfig><Name>amps-a</Name><SOW>{}</SOW></AMPSConfig>".format(
        xml_topic("<Key>/id</Key><Enrichment><Field>1 AS /x</Field></Enrichment>")
    )
    assert load_config_text(xml).topics[0].instance_name == "amps-a"


def test_the_example_configuration_gives_chapter_08s_e1_records() -> None:
    from pathlib import Path

    from sowstream.config import load_config

    config = load_config(Path(__file__).resolve().parents[2] / "examples" / "enrichment.yaml")
    orders = compile_topic(config.topic("Orders"))
    state: SowRecord | None = None
    for offset, (qty, price) in enumerate([(-1, 100), (5, 100), (-2, 101)]):
        body = {"customer_id": "A-111", "order_id": 1000, "qty": qty, "price": price}
        key = generated_sow_key("Orders", "Orders", ("/order_key",), {"order_key": "A-111-1000"})
        op = decode_log_record(orders, key.encode(), orjson.dumps(body), {}, offset, 1000 * offset)
        state = apply_keyed(orders, state, op)
        if offset == 0:
            assert stored(state)["qty"] is None
    assert stored(state) == {
        "customer_id": "A-111",
        "order_id": 1000,
        "order_key": "A-111-1000",
        "qty": 5,
        "price": 101,
        "publishSource": "desk-east",
        "created": 0.0,
        "updated": 2.0,
    }


def test_publish_entitlements_are_checked_like_entitlements() -> None:
    base = "sow:\n  - {Name: O, Key: /id}\npublish_entitlements:\n"
    topic = load_config_text(base + "  bob: {O: \"/s = 'z'\"}\n  '*': {O: '1=0'}\n").topics[0]
    assert topic.publish_filters == (("*", "1=0"), ("bob", "/s = 'z'"))
    assert topic.publish_filter("bob") == compile_filter("/s = 'z'")
    assert topic.publish_filter("eve") == compile_filter("1=0")
    err = yaml_error(base + "  bob: {Nope: '1=1'}\n")
    assert err.element == "publish_entitlements.bob.Nope" and "unknown topic" in err.problem
    err = yaml_error(base + "  bob: {O: '/s ='}\n")
    assert err.element == "publish_entitlements.bob.O" and "bad filter" in err.problem


# -- what sow.ops does with a publish -------------------------------------------------------------

ORDERS = load_config_text(
    """
engine: {app_id: east}
sow:
  - Name: Orders
    Key: /order_key
    Preprocessing:
      - CONCAT(/customer_id, "-", /order_id) AS /order_key
      - IF(/source IN ('a','e','f'), /source, NULL) AS /source HINT OPTIONAL
    Enrichment:
      - IF(/qty < 0, /qty OF PREVIOUS, /qty) AS /qty
      - COALESCE(/status OF CURRENT, /status OF PREVIOUS, 'new') AS /status
      - IF(/qty OF CURRENT IS NULL, 'missing', 'present') AS /seen
      - UNIX_TIMESTAMP() AS /at
publish_entitlements:
  bob: {Orders: "/source = 'z'"}
"""
).topics[0]
COMPILED = compile_topic(ORDERS)


def key_of(topic: TopicConfig, order_key: str) -> bytes:
    return generated_sow_key(topic.name, topic.name, topic.keys, {"order_key": order_key}).encode()


def decode(body: dict[str, Any], offset: int, *, key: bytes | None = None, **headers: str) -> LogOp:
    if key is None:
        key = key_of(ORDERS, f"{body.get('customer_id')}-{body.get('order_id')}")
    return decode_log_record(COMPILED, key, orjson.dumps(body), headers, offset, 5_000 + offset)


def stored(state: SowRecord | None) -> dict[str, Any]:
    assert state is not None
    return orjson.loads(state.data)


def test_preprocessing_builds_the_key_and_the_stored_record_is_enriched() -> None:
    op = decode({"customer_id": "A-111", "order_id": 1000, "qty": -1, "source": "x"}, 3)
    assert not op.rekey and op.sow_key == key_of(ORDERS, "A-111-1000").decode()
    assert orjson.loads(op.data or b"") == {
        "customer_id": "A-111",
        "order_id": 1000,
        "qty": -1,
        "order_key": "A-111-1000",
    }
    first = apply_keyed(COMPILED, None, op)
    assert stored(first) == {
        "customer_id": "A-111",
        "order_id": 1000,
        "qty": None,
        "order_key": "A-111-1000",
        "status": "new",
        "seen": "present",  # qty is there (as -1) when the Enrichment reads it
        "at": 5.003,  # the log time of the record, in seconds
    }
    second = apply_keyed(
        COMPILED, first, decode({"customer_id": "A-111", "order_id": 1000, "qty": 5}, 4)
    )
    assert stored(second)["qty"] == 5 and stored(second)["at"] == 5.004
    third = apply_keyed(
        COMPILED, second, decode({"customer_id": "A-111", "order_id": 1000, "qty": -2}, 5)
    )
    assert stored(third)["qty"] == 5
    # a replay of an applied record changes nothing: the Enrichment is not run again
    assert (
        apply_keyed(
            COMPILED, third, decode({"customer_id": "A-111", "order_id": 1000, "qty": 9}, 4)
        )
        is third
    )


def test_a_record_keyed_by_the_raw_message_is_rekeyed_not_applied() -> None:
    raw_key = generated_sow_key("Orders", "Orders", ("/order_key",), {"order_key": "?"}).encode()
    op = decode({"customer_id": "A", "order_id": 1}, 7, key=raw_key)
    assert op.rekey and op.kafka_key == key_of(ORDERS, "A-1").decode()


def test_e10_delta_publish_enrichment_runs_on_the_incoming_delta_before_the_merge() -> None:
    record = {"customer_id": "C", "order_id": 1, "status": "open", "qty": 5}
    first = apply_keyed(COMPILED, None, decode(record, 1))
    merged = apply_keyed(
        COMPILED,
        first,
        decode({"customer_id": "C", "order_id": 1, "qty": 6}, 2, **{h.COMMAND: h.DELTA_PUBLISH}),
    )
    assert stored(merged)["status"] == "open" and stored(merged)["qty"] == 6
    assert stored(merged)["seen"] == "present"
    # Chapter 03 (Understanding Delta Publish): AMPS enriches the incoming message, then merges.
    # OF CURRENT reads the delta, which has no /qty: the delta is enriched to seen 'missing'
    # and qty NULL (IF(/qty < 0, ...) of a NULL /qty), and both are merged over the stored ones.
    status_only = apply_keyed(
        COMPILED,
        merged,
        decode(
            {"customer_id": "C", "order_id": 1, "status": "x"}, 3, **{h.COMMAND: h.DELTA_PUBLISH}
        ),
    )
    assert stored(status_only)["seen"] == "missing"
    assert stored(status_only)["qty"] is None and stored(status_only)["status"] == "x"
    assert stored(status_only)["order_key"] == "C-1" and stored(status_only)["at"] == 5.003


def test_a_delta_enriched_before_the_merge_keeps_stored_fields_it_leaves_out() -> None:
    topic = load_config_text(
        """
sow:
  - Name: D
    Key: /id
    Enrichment:
      - COALESCE(/qty OF CURRENT, /qty OF PREVIOUS) AS /qty
      - IF(/px OF CURRENT IS NULL, NULL, /px * 2) AS /px2 HINT OPTIONAL
      - COALESCE(/n OF PREVIOUS, 0) + 1 AS /n
"""
    ).topics[0]
    compiled = compile_topic(topic)
    key = generated_sow_key("D", "D", ("/id",), {"id": 1}).encode()

    def op(body: dict[str, Any], offset: int, **headers: str) -> LogOp:
        return decode_log_record(compiled, key, orjson.dumps(body), headers, offset, offset)

    first = apply_keyed(compiled, None, op({"id": 1, "qty": 3, "px": 4}, 1))
    assert stored(first) == {"id": 1, "qty": 3, "px": 4, "px2": 8, "n": 1}
    delta = apply_keyed(
        compiled, first, op({"id": 1, "note": "n"}, 2, **{h.COMMAND: h.DELTA_PUBLISH})
    )
    # /qty: COALESCE kept the stored value; /px2: HINT OPTIONAL left it out of the delta, so the
    # stored one stays; /n counts the delta too.
    assert stored(delta) == {"id": 1, "qty": 3, "px": 4, "px2": 8, "n": 2, "note": "n"}
    repriced = apply_keyed(
        compiled, delta, op({"id": 1, "px": 5}, 3, **{h.COMMAND: h.DELTA_PUBLISH})
    )
    assert stored(repriced) == {"id": 1, "qty": 3, "px": 5, "px2": 10, "n": 3, "note": "n"}
    inserted = apply_keyed(
        compiled, None, op({"id": 1, "note": "x"}, 4, **{h.COMMAND: h.DELTA_PUBLISH})
    )
    assert stored(inserted) == {"id": 1, "note": "x", "qty": None, "n": 1}


def test_e7_publish_entitlement_sees_the_message_as_received() -> None:
    # bob may only publish source 'z', which Preprocessing then removes: accepted
    op = decode({"customer_id": "B", "order_id": 3, "source": "z"}, 1, **{h.IDENTITY: "bob"})
    assert "source" not in stored(apply_keyed(COMPILED, None, op))
    with pytest.raises(InvalidMessageError) as refused:
        decode({"customer_id": "B", "order_id": 4, "source": "a"}, 2, **{h.IDENTITY: "bob"})
    assert refused.value.reason == "entitlement"
    assert "identity 'bob' may not publish" in str(refused.value)
    # other identities have no rule
    decode({"customer_id": "B", "order_id": 4, "source": "a"}, 2, **{h.IDENTITY: "ann"})


def test_a_failing_enrichment_is_rejected_with_its_field() -> None:
    topic = load_config_text(
        "sow:\n  - Name: T\n    Key: /id\n    Enrichment:\n      - /q * 2 AS /totals/value\n"
        "      - /q * 10000000000000000000 AS /big\n"
    ).topics[0]
    compiled = compile_topic(topic)

    def apply(body: dict[str, Any]) -> SowRecord | None:
        key = generated_sow_key("T", "T", ("/id",), body).encode()
        return apply_keyed(
            compiled, None, decode_log_record(compiled, key, orjson.dumps(body), {}, 1, 1)
        )

    with pytest.raises(InvalidMessageError) as failed:
        apply({"id": 1, "q": 1, "totals": "n/a"})
    assert failed.value.reason == "enrichment_failed"
    assert "topic 'T': Enrichment/Field[1] '/q * 2 AS /totals/value': cannot write" in str(
        failed.value
    )
    with pytest.raises(InvalidMessageError) as too_big:
        apply({"id": 2, "q": 5})  # 5e19 does not fit JSON's 64-bit integers
    assert too_big.value.reason == "enrichment_failed"
    assert "the message after Enrichment cannot be written as json" in str(too_big.value)
    assert stored(apply({"id": 3, "q": 1})) == {
        "id": 3,
        "q": 1,
        "totals": {"value": 2},
        "big": 10**19,
    }


def test_a_failing_preprocessing_is_rejected_before_the_key() -> None:
    topic = compile_topic(
        load_config_text(
            "sow:\n  - Name: T\n    Key: /k/id\n    Preprocessing: [/id AS /k/id]\n"
        ).topics[0]
    )
    with pytest.raises(InvalidMessageError) as failed:
        decode_log_record(topic, None, b'{"id": 1, "k": 5}', {}, 1, 1)
    assert failed.value.reason == "preprocessing_failed"
    assert "Preprocessing/Field[1]" in str(failed.value)


# -- other message types: the stages work on the parsed message ---------------------------------


def typed(yaml: str, tmp_path: Any = None) -> CompiledTopic[TopicConfig]:
    (topic,) = load_config_text(yaml, str(tmp_path / "c.yaml") if tmp_path else "c.yaml").topics
    return compile_topic(topic)


def run(topic: CompiledTopic[TopicConfig], *bodies: bytes | tuple[str, bytes]) -> SowRecord | None:
    """Apply ``bodies`` in turn (publishes, or (command, body) pairs), each keyed right."""
    state: SowRecord | None = None
    for offset, item in enumerate(bodies):
        command, body = item if isinstance(item, tuple) else (h.PUBLISH, item)
        headers = {h.COMMAND: command}
        op = decode_log_record(topic, None, body, headers, offset, 1000)
        if op.rekey and op.kafka_key is not None:
            op = decode_log_record(topic, op.kafka_key.encode(), body, headers, offset, 1000)
        state = apply_keyed(topic, state, op)
    return state


def test_nvfix_and_fix_fields() -> None:
    nvfix = typed(
        "sow:\n  - Name: n\n    MessageType: nvfix\n    Key: /k\n"
        "    Preprocessing: [\"CONCAT(/desk, '-', /id) AS /k\"]\n"
        "    Enrichment: ['COALESCE(/n OF PREVIOUS, 0) + 1 AS /n']\n"
    )
    state = run(nvfix, b"desk=A\x01id=7\x01", b"desk=A\x01id=7\x01x=1\x01")
    assert state is not None
    assert nvfix.codec.parse(state.data) == {"desk": "A", "id": "7", "x": "1", "k": "A-7", "n": "2"}
    fix = typed(
        "sow:\n  - Name: f\n    MessageType: fix\n    Key: /11\n"
        "    Enrichment: ['/38 * 2 AS /9/1']\n"
    )
    with pytest.raises(InvalidMessageError) as failed:  # fix fields are flat
        run(fix, b"11=a\x0138=5\x01")
    assert failed.value.reason == "enrichment_failed" and "fix fields are flat" in str(failed.value)


def test_xml_fields() -> None:
    xml = typed(
        "sow:\n  - Name: x\n    MessageType: xml\n    Key: /order/@id\n"
        "    Enrichment: ['/order/qty * 2 AS /order/double', 'IF(/order/qty > 1, 1, 0) AS /flag']\n"
    )
    with pytest.raises(InvalidMessageError) as failed:  # /flag would be a second root element
        run(xml, b'<order id="1"><qty>3</qty></order>')
    assert failed.value.reason == "enrichment_failed" and "one root element" in str(failed.value)
    fine = typed(
        "sow:\n  - Name: x\n    MessageType: xml\n    Key: /order/@id\n"
        "    Enrichment: ['/order/qty * 2 AS /order/double']\n"
    )
    state = run(fine, b'<order id="1"><qty>3</qty></order>')
    assert state is not None and fine.codec.parse(state.data) == {
        "order": {"@id": "1", "qty": "3", "double": "6"}
    }


def test_avro_fields_and_a_delta_that_cannot_be_merged(tmp_path: Any) -> None:
    schema = {
        "type": "record",
        "name": "Order",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "qty", "type": "int"},
            {"name": "double", "type": ["null", "long"], "default": None},
            {"name": "note", "type": ["null", "string"], "default": None},
        ],
    }
    (tmp_path / "order.avsc").write_bytes(orjson.dumps(schema))
    base = "sow:\n  - Name: a\n    MessageType: avro\n    Key: /id\n    Schema: order.avsc\n"
    topic = typed(base + "    Enrichment: ['/qty * 2 AS /double']\n", tmp_path)
    codec = topic.codec
    state = run(topic, codec.serialise({"id": 1, "qty": 4}))
    assert state is not None and codec.parse(state.data)["double"] == 8
    merged = run(
        topic,
        codec.serialise({"id": 1, "qty": 4}),
        (h.DELTA_PUBLISH, codec.serialise_delta({"id": 1, "qty": 5})),
    )
    assert merged is not None and codec.parse(merged.data)["double"] == 10
    with pytest.raises(InvalidMessageError) as failed:  # an inserting delta without /qty
        run(topic, (h.DELTA_PUBLISH, codec.serialise_delta({"id": 2, "note": "n"})))
    assert failed.value.reason == "bad_merge"
    wrong = typed(base + "    Enrichment: [\"CONCAT('x', /qty) AS /double\"]\n", tmp_path)
    with pytest.raises(InvalidMessageError) as failed:  # a string in a long field
        run(wrong, codec.serialise({"id": 1, "qty": 4}))
    assert failed.value.reason == "enrichment_failed"
    assert "the message after Enrichment cannot be written as avro" in str(failed.value)
