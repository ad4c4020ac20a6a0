"""AMPS topic names inside Kafka topic names: legal ones unchanged, others encoded reversibly."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sowstream.wire.topics import TopicNames, kafka_part, name_of_kafka_part


def test_names_kafka_accepts_are_kept() -> None:
    for name in ("orders", "order_book", "a.b-c", "X9"):
        assert kafka_part(name) == name
    assert TopicNames("p").log("orders") == "p.log.orders"


def test_amps_paths_are_encoded() -> None:
    assert kafka_part("/ett/order") == "__-ett_-order"
    assert kafka_part("a b") == "_a_x20b"
    assert kafka_part("ü/x_y") == "__xC3_xBC_-x__y"
    assert TopicNames("p").control("/ett/order") == "p.ctl.__-ett_-order"


@given(st.text(min_size=1, max_size=40))
def test_encoding_is_reversible_and_kafka_legal(name: str) -> None:
    part = kafka_part(name)
    assert all(c.isascii() and (c.isalnum() or c in "._-") for c in part)
    if part != name:  # encoded: always decodes back
        assert name_of_kafka_part(part) == name
