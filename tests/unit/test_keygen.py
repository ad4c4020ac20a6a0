"""KeyGenerator: user code that makes SowKeys, loaded by config, engine, client and Spark alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import pytest

from sowstream.config import ConfigError
from sowstream.config import load_config_text as load
from sowstream.errors import InvalidMessageError
from sowstream.sow.compiled import compile_topic
from sowstream.sow.fold import apply_record
from sowstream.sow.keygen import KeyGeneratorError, joined, load_key_generator
from sowstream.sow.ops import RawRecord, decode_log_record
from sowstream.sow.record import SowRecord

# -- generators a user might write (this module is importable as tests.unit.test_keygen) ------


def by_upper_symbol(options: Mapping[str, str]) -> Any:
    prefix = options.get("Prefix", "")
    return lambda record: prefix + str(record["symbol"]).upper()


def refusing(options: Mapping[str, str]) -> Any:
    raise ValueError("Prefix is required")


def not_a_function(options: Mapping[str, str]) -> Any:
    return 42


def empty_key(options: Mapping[str, str]) -> Any:
    return lambda record: ""


NOT_CALLABLE = "just a string"

YAML = """
sow:
  - Name: quotes
    KeyGenerator:
      Module: tests.unit.test_keygen:by_upper_symbol
      Options: {Prefix: "Q-"}
"""

XML = """
<SOW>
  <Topic>
    <Name>quotes</Name>
    <MessageType>json</MessageType>
    <KeyGenerator>
      <Module>tests.unit.test_keygen:by_upper_symbol</Module>
      <Options><Prefix>Q-</Prefix></Options>
    </KeyGenerator>
  </Topic>
</SOW>
"""


def test_yaml_and_amps_xml_configure_the_same_generator() -> None:
    from_yaml = load(YAML).topic("quotes")
    from_xml = load(XML).topic("quotes")
    assert from_yaml.key_generator == from_xml.key_generator
    assert from_yaml.key_generator is not None
    assert from_yaml.key_generator.options == (("Prefix", "Q-"),)
    assert not from_yaml.user_supplied_keys


def test_engine_and_rebuild_use_the_generator() -> None:
    topic = compile_topic(load(YAML).topic("quotes"))
    op = decode_log_record(topic, None, b'{"symbol": "ibm", "px": 1}', {}, 0, 0)
    assert op.sow_key == "Q-IBM"
    # The fold behind the Spark rebuild decodes the same way, so it keys the same.
    state: dict[str, SowRecord] = {}
    for offset, (key, body) in enumerate(
        [
            (b"Q-IBM", b'{"symbol": "ibm", "px": 1}'),
            (b"Q-IBM", b'{"symbol": "IBM", "px": 2}'),
            (b"Q-MSFT", b'{"symbol": "msft", "px": 3}'),
        ]
    ):
        apply_record(topic, state, RawRecord(0, offset, offset, key, body, {}))
    assert {k: orjson.loads(v.data)["px"] for k, v in state.items()} == {"Q-IBM": 2, "Q-MSFT": 3}


def test_joined_builtin_makes_readable_keys() -> None:
    key = joined({"Fields": "/desk, /id", "Separator": ":"})
    assert key({"desk": "fx", "id": 7}) == "fx:7"
    assert load_key_generator("sowstream.sow.keygen:joined", {"Fields": "/a"})({"a": 1.0}) == "1"
    with pytest.raises(KeyGeneratorError, match="Fields must list paths"):
        joined({"Fields": "desk"})


@pytest.mark.parametrize(
    ("module", "problem"),
    [
        ("tests.unit.no_such_module:f", "cannot be imported"),
        ("tests.unit.test_keygen:missing", "has no 'missing'"),
        ("tests.unit.test_keygen:NOT_CALLABLE", "is not callable"),
        ("tests.unit.test_keygen:refusing", "refused its Options"),
        ("tests.unit.test_keygen:not_a_function", "must return a function"),
        ("no-colon-and-no-entry-point", "entry point"),
    ],
)
def test_a_generator_that_cannot_load_fails_at_start_naming_the_element(
    module: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load(f"sow:\n  - Name: quotes\n    KeyGenerator: {{Module: '{module}'}}\n")
    assert "sow[0].KeyGenerator.Module" in str(info.value) and problem in str(info.value)
    xml = XML.replace("tests.unit.test_keygen:by_upper_symbol", module)
    with pytest.raises(ConfigError) as info:
        load(xml)
    assert "KeyGenerator/Module" in str(info.value) and problem in str(info.value)


def test_key_domain_is_refused_with_a_generator() -> None:
    with pytest.raises(ConfigError, match="KeyDomain is not valid with a KeyGenerator"):
        load(YAML + "    KeyDomain: shared\n")


def test_bad_key_generator_shapes_are_named() -> None:
    with pytest.raises(ConfigError, match=r"KeyGenerator\.Modul"):
        load("sow:\n  - Name: q\n    KeyGenerator: {Modul: x}\n")
    with pytest.raises(ConfigError, match="needs a <Module>"):
        load("<SOW><Topic><Name>q</Name><KeyGenerator/></Topic></SOW>")
    with pytest.raises(ConfigError, match="unknown element <Opts>"):
        load("<SOW><Topic><Name>q</Name><KeyGenerator><Opts/></KeyGenerator></Topic></SOW>")


def test_a_message_the_generator_fails_on_is_rejected_with_the_reason() -> None:
    topic = compile_topic(load(YAML).topic("quotes"))
    with pytest.raises(InvalidMessageError) as info:
        decode_log_record(topic, None, b'{"px": 1}', {}, 0, 0)
    assert info.value.reason == "key_generator_failed"
    assert "by_upper_symbol" in str(info.value) and "KeyError" in str(info.value)
    empty = compile_topic(load(YAML.replace("by_upper_symbol", "empty_key")).topic("quotes"))
    with pytest.raises(InvalidMessageError) as info:
        decode_log_record(empty, None, b'{"symbol": "x"}', {}, 0, 0)
    assert info.value.reason == "bad_sow_key"
