"""The client's reply reader skips records it cannot read (damaged headers, bytes that are not a
Reply) instead of dying: the messages after them still arrive."""

from __future__ import annotations

from sowstream.client.connection import Connection
from sowstream.client.subscription import Subscription
from sowstream.subscriptions.model import SUBSCRIBE, SubscriptionSpec
from sowstream.subscriptions.options import parse_options
from sowstream.wire import headers as h


class Record:
    """A reply-topic record as confluent-kafka hands it over."""

    def __init__(self, value: bytes | None, headers: dict[str, str]) -> None:
        self._value = value
        self._headers = [(k, v.encode()) for k, v in headers.items()]

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers

    def offset(self) -> int:
        return 0


def live(partition: str, offset: str) -> dict[str, str]:
    return {
        h.COMMAND: "publish",
        h.SUB_ID: "s",
        h.TOPIC: "orders",
        h.PARTITION: partition,
        h.OFFSET: offset,
        h.SOW_KEY: "k",
        h.TIMESTAMP: "1",
    }


def test_damaged_records_are_skipped_and_the_next_ones_arrive() -> None:
    conn = Connection("127.0.0.1:1", prefix="p")
    spec = SubscriptionSpec("s", conn.reply_topic, "orders", SUBSCRIBE, None, parse_options(""))
    sub = Subscription("s", [spec], parse_options(""), key_fields={"orders": ("/id",)})
    sub.release()  # placed: live messages go straight to the application
    conn.add_subscription(sub)
    conn._route(Record(b'{"id": 1}', live("zero", "7")))  # a partition that is not a number
    conn._route(Record(b"\x00\xff garbage", {}))  # not a Reply
    conn._route(Record(b'{"id": 2}', live("0", "8")))
    got = sub.next(timeout=1)
    assert got is not None and got.json() == {"id": 2}
    assert sub.next(timeout=0) is None
