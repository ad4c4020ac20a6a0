"""The tests' Kafka: one :class:`Sender` that keeps everything the engine sends, in order.

Records (``send``) and replies (``send_reply``) are kept apart, each in the order sent. Kafka
acknowledges at once unless the sender holds acknowledgements for the test to release
(``acknowledge``); while ``failing`` is set, or for the topics ``refuse`` names, Kafka refuses:
the delivery future carries the error and nothing is kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, NamedTuple

from aiokafka.errors import KafkaError

from sowstream.engine.ports import Sender
from sowstream.wire import headers as h
from sowstream.wire.protocol import Reply


class SentRecord(NamedTuple):
    """A record produced with ``send`` (log, dead-letter, view input, view log ... topics)."""

    topic: str
    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: dict[str, str]


class SentReply(NamedTuple):
    """A message on a client's reply topic: an answer to a command (an Avro Reply: no
    ``sow.cmd`` header, kept as None here) or a subscription message (its headers)."""

    topic: str
    value: bytes
    headers: dict[str, str] | None
    schema: str | None = None  # sow.schema: the protocol version an answer was written with


class RecordingSender(Sender):
    """Keeps every record and reply sent, in order; see the module docstring."""

    def __init__(self, *, held: bool = False, refuse: Callable[[str], bool] | None = None) -> None:
        """``held``: delivery futures stay pending until :meth:`acknowledge`. ``refuse``: asked
        for each send's topic; True makes Kafka refuse that send (as ``failing`` does all)."""
        self.records: list[SentRecord] = []
        self.replied: list[SentReply] = []
        self.failing = False
        self._held = held
        self._refuse = refuse
        self._futures: list[asyncio.Future[Any]] = []  # held ones, in the order sent

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[Any]:
        refused = self._refused(topic)
        if not refused:
            self.records.append(SentRecord(topic, partition, key, value, h.header_map(headers)))
        return self._delivery(refused)

    async def send_reply(
        self, topic: str, value: bytes, headers: list[tuple[str, bytes]] | None = None
    ) -> asyncio.Future[Any]:
        refused = self._refused(topic)
        if not refused:
            found = h.header_map(headers)
            if h.COMMAND in found:
                self.replied.append(SentReply(topic, value, found))
            else:
                self.replied.append(SentReply(topic, value, None, found.get(h.SCHEMA)))
        return self._delivery(refused)

    def _refused(self, topic: str) -> bool:
        return self.failing or (self._refuse is not None and self._refuse(topic))

    def _delivery(self, refused: bool) -> asyncio.Future[Any]:
        """The delivery future of one send: refused, held, or acknowledged at once."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if refused:
            fut.set_exception(KafkaError("broker not available"))
        elif self._held:
            self._futures.append(fut)
        else:
            fut.set_result(None)
        return fut

    def acknowledge(self, count: int | None = None) -> None:
        """Kafka acknowledges the first ``count`` held sends (every one so far when None)."""
        for fut in self._futures[:count]:
            if not fut.done():
                fut.set_result(None)

    def answers(self) -> list[SentReply]:
        """The replies to commands (acks, query results ...), as sent."""
        return [r for r in self.replied if r.headers is None]

    def replies(self) -> list[Reply]:
        """The replies to commands, decoded."""
        return [Reply.decode(r.value) for r in self.answers()]

    def live(self) -> list[tuple[bytes, dict[str, str]]]:
        """The subscription messages: each one's data with its headers."""
        return [(r.value, r.headers) for r in self.replied if r.headers is not None]

    def take(self) -> list[tuple[bytes, dict[str, str] | None]]:
        """Every reply since the last take, with its headers (None: a reply to a command); they
        are forgotten here (records are kept)."""
        out, self.replied = self.replied, []
        return [(r.value, r.headers) for r in out]
