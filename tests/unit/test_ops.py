"""How each log operation changes a SOW record, including replay and expiration rules."""

from __future__ import annotations

import orjson
import pytest

from sowstream.config import load_config_text
from sowstream.config.models import TopicConfig
from sowstream.errors import InvalidMessageError
from sowstream.sow.compiled import CompiledTopic, compile_topic
from sowstream.sow.expiration import expiration_time, parse_expiration_header
from sowstream.sow.keys import generated_sow_key
from sowstream.sow.ops import apply_keyed, decode_log_record, deleted_by_filter
from sowstream.sow.record import SowRecord
from sowstream.wire import headers as h


def topic(extra: str = "") -> CompiledTopic[TopicConfig]:
    cfg = load_config_text(f"sow:\n  - Name: orders\n    Key: /id\n{extra}")
    return compile_topic(cfg.topics[0])


def op(
    t: CompiledTopic[TopicConfig],
    body: object,
    offset: int,
    *,
    cmd: str = "publish",
    headers: dict[str, str] | None = None,
    key: bytes | None = None,
    ts: int = 1000,
):
    value = orjson.dumps(body) if body is not None else None
    hdrs = {h.COMMAND: cmd, **(headers or {})}
    if key is None and isinstance(body, dict):
        d = t.definition
        key = generated_sow_key(d.name, d.effective_key_domain, d.keys, body).encode()
    return decode_log_record(t, key, value, hdrs, offset, ts)


def test_publish_inserts_then_replaces() -> None:
    t = topic()
    rec = apply_keyed(t, None, op(t, {"id": 1, "a": 1}, 10))
    assert rec is not None and rec.parsed(t.codec) == {"id": 1, "a": 1} and rec.log_offset == 10
    rec2 = apply_keyed(t, rec, op(t, {"id": 1, "b": 2}, 11))
    assert rec2 is not None and rec2.parsed(t.codec) == {"id": 1, "b": 2}


def test_delta_merges_and_inserts_when_absent() -> None:
    t = topic()
    rec = apply_keyed(t, None, op(t, {"id": 1, "a": 1}, 10, cmd="delta_publish"))
    assert rec is not None and rec.parsed(t.codec) == {"id": 1, "a": 1}
    rec = apply_keyed(t, rec, op(t, {"id": 1, "b": 2}, 11, cmd="delta_publish"))
    assert rec is not None and rec.parsed(t.codec) == {"id": 1, "a": 1, "b": 2}


def test_replayed_op_is_ignored() -> None:
    t = topic()
    rec = apply_keyed(t, None, op(t, {"id": 1, "a": 2}, 20))
    assert apply_keyed(t, rec, op(t, {"id": 1, "a": 1}, 15)) is rec
    assert apply_keyed(t, rec, op(t, {"id": 1}, 20, cmd="sow_delete")) is rec


def test_delete_by_data_and_by_key() -> None:
    t = topic()
    rec = apply_keyed(t, None, op(t, {"id": 1}, 1))
    by_data = op(t, {"id": 1, "whatever": True}, 2, cmd="sow_delete")
    assert by_data.sow_key == rec.sow_key and apply_keyed(t, rec, by_data) is None
    by_key = decode_log_record(t, rec.sow_key.encode(), None, {h.COMMAND: "sow_delete"}, 3, 0)
    assert by_key.sow_key == rec.sow_key and not by_key.rekey


def test_filter_delete_spares_records_written_after_it() -> None:
    t = topic()
    flt = decode_log_record(t, None, None, {h.COMMAND: "sow_delete", h.FILTER: "/a = 1"}, 50, 0)
    assert flt.sow_key is None and flt.filter is not None
    older = SowRecord("k", b'{"id": 1, "a": 1}', 40, 0)
    newer = SowRecord("k", b'{"id": 1, "a": 1}', 60, 0)
    other = SowRecord("k", b'{"id": 1, "a": 2}', 40, 0)
    assert deleted_by_filter(t, older, flt)
    assert not deleted_by_filter(t, newer, flt)
    assert not deleted_by_filter(t, other, flt)


def test_unkeyed_or_wrongly_keyed_records_are_rekeyed() -> None:
    t = topic()
    assert decode_log_record(t, None, b'{"id": 1}', {}, 1, 0).rekey
    assert decode_log_record(t, b"mine", b'{"id": 1}', {}, 1, 0).rekey
    assert not op(t, {"id": 1}, 1).rekey


@pytest.mark.parametrize(
    ("value", "headers", "reason"),
    [
        (b"{bad", {}, "malformed_json"),
        (b"", {}, "malformed_json"),
        (b"[1]", {}, "malformed_json"),
        (b'{"x": 1}', {}, "missing_key_field"),
        (b'{"id": 1}', {h.COMMAND: "upsert"}, "unknown_command"),
        (b'{"id": 1}', {h.EXPIRATION: "tomorrow"}, "bad_expiration"),
        (None, {h.COMMAND: "sow_delete", h.FILTER: "/a = = 1"}, "bad_filter"),
    ],
)
def test_bad_records_raise_with_reason(
    value: bytes | None, headers: dict[str, str], reason: str
) -> None:
    with pytest.raises(InvalidMessageError) as err:
        decode_log_record(topic(), None, value, headers, 1, 0)
    assert err.value.reason == reason
    assert "orders" in str(err.value)


def test_user_keyed_topic_takes_key_or_header() -> None:
    t = compile_topic(load_config_text("sow:\n  - Name: blobs\n").topics[0])
    assert decode_log_record(t, b"QUJD", b'{"v": 1}', {}, 1, 0).sow_key == "QUJD"
    via_header = decode_log_record(t, None, b'{"v": 1}', {h.SOW_KEY: "QUJD"}, 1, 0)
    assert via_header.sow_key == "QUJD" and via_header.rekey
    with pytest.raises(InvalidMessageError):
        decode_log_record(t, None, b'{"v": 1}', {}, 1, 0)


def test_expiration_rules() -> None:
    t = topic("    Expiration: 30s\n")
    rec = apply_keyed(t, None, op(t, {"id": 1}, 1, ts=1_000))
    assert rec is not None and rec.expiration == 31_000
    # every update resets the clock
    rec = apply_keyed(t, rec, op(t, {"id": 1}, 2, ts=5_000))
    assert rec is not None and rec.expiration == 35_000
    # per-message override, and 0 = never
    rec = apply_keyed(t, rec, op(t, {"id": 1}, 3, ts=5_000, headers={h.EXPIRATION: "2"}))
    assert rec is not None and rec.expiration == 7_000
    rec = apply_keyed(t, rec, op(t, {"id": 1}, 4, headers={h.EXPIRATION: "0"}))
    assert rec is not None and rec.expiration is None


def test_expiration_policies() -> None:
    enabled = topic("    Expiration: enabled\n").definition.expiration
    disabled = topic().definition.expiration
    assert expiration_time(enabled, None, 100) is None
    assert expiration_time(enabled, 1000, 100) == 1100
    assert expiration_time(disabled, 1000, 100) == 1100  # stored, though never processed
    assert parse_expiration_header("t", "30") == 30_000
    assert parse_expiration_header("t", "1m") == 60_000
    assert parse_expiration_header("t", None) is None


def test_record_avro_round_trip() -> None:
    rec = SowRecord("k", b'{"a": 1}', 7, 123, None)
    assert SowRecord.from_bytes(rec.to_bytes()) == rec
    rec2 = SowRecord("k", b"{}", 2**40, 2**41, 2**42)
    assert SowRecord.from_bytes(rec2.to_bytes()) == rec2
