"""SOW topics' RecoveryPoint forms, and telling a recreated transaction log apart."""

from __future__ import annotations

import pytest

from sowstream.config import ConfigError
from sowstream.config import load_config_text as load
from sowstream.config.models import parse_recovery_point, recovery_point_ms
from sowstream.sow.logcheck import (
    MAX_WARNINGS,
    RECREATED,
    add_warning,
    fingerprint,
    rebased,
    recreation,
    warning,
)
from sowstream.sow.record import SowRecord

NOV_23_8AM = 1_795_420_800_000


@pytest.mark.parametrize(
    ("value", "stored", "millis"),
    [
        ("epoch", "epoch", None),
        ("Now", "now", None),
        ("20261123T080000", "20261123T080000", NOV_23_8AM),
        ("20261123T080000.250Z", "20261123T080000.250Z", NOV_23_8AM + 250),
        ("2026-11-23T09:00:00+01:00", "2026-11-23T09:00:00+01:00", NOV_23_8AM),
    ],
)
def test_recovery_point_forms_in_yaml(value: str, stored: str, millis: int | None) -> None:
    (topic,) = load(f"sow:\n  - Name: t\n    Key: /id\n    RecoveryPoint: '{value}'\n").topics
    assert topic.recovery_point == stored
    assert topic.recovery_point_ms == millis


def test_recovery_point_timestamp_in_amps_xml() -> None:
    xml = (
        "<SOW><Topic><Name>t</Name><MessageType>json</MessageType><Key>/id</Key>"
        "<Durability>transient</Durability><RecoveryPoint>20261123T080000</RecoveryPoint>"
        "</Topic></SOW>"
    )
    (topic,) = load(xml).topics
    assert topic.recovery_point_ms == NOV_23_8AM


@pytest.mark.parametrize(
    ("text", "element"),
    [
        ("sow:\n  - Name: orders\n    RecoveryPoint: yesterday\n", "sow[0].RecoveryPoint"),
        (
            "<SOW><Topic><Name>orders</Name><RecoveryPoint>20261340T000000</RecoveryPoint>"
            "</Topic></SOW>",
            "SOW/Topic[orders]/RecoveryPoint",
        ),
    ],
)
def test_a_bad_recovery_point_names_topic_and_element(text: str, element: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(text, "cfg")
    assert caught.value.element == element
    assert "topic 'orders'" in str(caught.value)
    assert "epoch, now or a timestamp like 20261123T080000" in str(caught.value)


def test_queues_and_topics_share_the_parser_and_only_queues_know_creation() -> None:
    assert parse_recovery_point(" EPOCH ") == "epoch"
    assert parse_recovery_point("creation", {"creation": "now"}) == "now"
    with pytest.raises(ValueError, match="epoch, now or a timestamp"):
        parse_recovery_point("creation")
    with pytest.raises(ValueError, match="got 5"):
        parse_recovery_point(5)
    assert recovery_point_ms("now") is None
    assert recovery_point_ms("2026-11-23T08:00:00Z") == NOV_23_8AM


# --- a recreated log ---


def test_a_log_ending_below_the_watermark_was_recreated() -> None:
    assert recreation(9, -1, None, None) == (
        "the log ends at offset -1, below the stored watermark 9"
    )
    assert recreation(9, 3, fingerprint(9, 1, b"k"), None) is not None


def test_the_record_at_the_watermark_must_be_the_one_applied() -> None:
    applied = fingerprint(9, 1_000, b"key-9")
    assert recreation(9, 20, applied, fingerprint(9, 1_000, b"key-9")) is None
    other_time = recreation(9, 20, applied, fingerprint(9, 2_000, b"key-9"))
    assert other_time is not None and "record at offset 9 is not the one applied" in other_time
    assert recreation(9, 20, applied, fingerprint(9, 1_000, b"key-other")) is not None


def test_without_evidence_nothing_is_reported() -> None:
    assert recreation(-1, -1, None, None) is None  # nothing applied yet
    assert recreation(9, 20, None, fingerprint(9, 1, b"")) is None  # store older than fingerprints
    assert recreation(9, 20, fingerprint(9, 1, b""), None) is None  # record not readable
    # a fingerprint left from another position does not count
    assert recreation(9, 20, fingerprint(7, 1, b""), fingerprint(9, 2, b"")) is None


def test_rebased_records_take_any_new_offset() -> None:
    record = SowRecord("k", b"{}", 41, 5, expiration=9)
    assert rebased(record) == SowRecord("k", b"{}", -1, 5, expiration=9)


def test_the_warning_names_topic_partition_and_offsets() -> None:
    entry = warning("book", 1, 17, 0, 2, "the log ends at offset 2", 123)
    assert entry["kind"] == RECREATED and entry["at_ms"] == 123
    assert (entry["watermark"], entry["log_start"], entry["log_end"]) == (17, 0, 2)
    assert entry["message"].startswith("topic 'book' partition 1: the transaction log was")
    assert "up to offset 17" in entry["message"] and "from offset 0" in entry["message"]
    kept: list[dict[str, int]] = []
    for n in range(MAX_WARNINGS + 3):
        kept = add_warning(kept, {"n": n})
    assert [w["n"] for w in kept] == list(range(3, MAX_WARNINGS + 3))
