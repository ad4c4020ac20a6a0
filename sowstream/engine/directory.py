"""The worker's view of the meta topic: which topics the engine created on first use.

A topic in no configuration is created by the worker that owns partition 0 of the shared control
topic ``<prefix>.ctl-auto`` when a client first asks for it; that worker writes its definition to
the compacted meta topic (``auto`` set). Every worker follows the meta topic, so whichever worker
owns a partition of those topics, now or after a rebalance, serves them too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from sowstream.engine.registry import poll_batch
from sowstream.wire import headers as h
from sowstream.wire.topics import JSON
from sowstream.wire.versions import decode_headed

log = logging.getLogger("sowstream.engine")

CATCH_UP_SECONDS = 10.0


class TopicDirectory:
    """Follows the meta topic and reports every auto-created topic's name to ``found``."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        extra: Mapping[str, str],
        found: Callable[[str, str], None],
    ) -> None:
        self.topic = topic
        self._bootstrap = bootstrap
        self._extra = dict(extra)
        self._found = found
        self._position = 0
        self._moved = asyncio.Event()

    def _consumer(self) -> Consumer:
        return Consumer(
            {
                "bootstrap.servers": self._bootstrap,
                "group.id": "sowstream-directory",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 20,
                "log_level": 4,
                **self._extra,
            }
        )

    async def run(self) -> None:
        """Read the meta topic from the start, then follow it until cancelled."""
        loop = asyncio.get_running_loop()
        consumer = self._consumer()
        try:
            consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
            while True:
                for msg in await loop.run_in_executor(None, poll_batch, consumer):
                    if msg.error():
                        continue
                    self._position = (msg.offset() or 0) + 1
                    value = msg.value()
                    if value is None:
                        continue
                    try:
                        info = decode_headed("TopicInfo", value, h.header_map(msg.headers()))
                    except Exception as exc:  # anything a foreign producer may have written
                        log.warning(
                            "ignored unreadable topic definition on %s: %s", self.topic, exc
                        )
                        continue
                    if info.get("auto"):
                        self._found(info["name"], info.get("message_type") or JSON)
                self._moved.set()
                self._moved.clear()
        finally:
            await loop.run_in_executor(None, consumer.close)

    async def caught_up(self, timeout: float = CATCH_UP_SECONDS) -> None:
        """Wait until every definition written so far has been read (a command can name a topic
        another worker created a moment ago)."""
        loop = asyncio.get_running_loop()

        def end() -> int:
            consumer = self._consumer()
            try:
                _, high = consumer.get_watermark_offsets(
                    TopicPartition(self.topic, 0), timeout=timeout
                )
                return int(high)
            finally:
                consumer.close()

        try:
            high = await loop.run_in_executor(None, end)
        except KafkaException as exc:
            log.warning("cannot read the end of %s: %s", self.topic, exc)
            return
        deadline = time.monotonic() + timeout
        while self._position < high and time.monotonic() < deadline:
            try:
                await asyncio.wait_for(self._moved.wait(), deadline - time.monotonic())
            except TimeoutError:
                return
