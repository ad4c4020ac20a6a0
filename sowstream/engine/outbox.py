"""What a topic's processor sends besides replies: subscription messages and change events.

An :class:`Outbox` sends the live messages the subscription rules produced and the change
events of the views and conflated topics that read the topic, and waits for Kafka's
acknowledgements of them; the apply, placement and maintenance stages share one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from sowstream.config.models import TopicConfig
from sowstream.engine import metrics
from sowstream.engine.partition import DELIVERY_WAIT_SECONDS
from sowstream.engine.ports import Sender
from sowstream.sow.compiled import CompiledTopic
from sowstream.subscriptions.model import (
    ACK,
    FAILURE,
    PROCESSED,
    Change,
    Delivery,
    SubscriptionSpec,
)
from sowstream.views.conflated import ConflatedFeed
from sowstream.views.routing import ViewFeed
from sowstream.wire import headers as h

log = logging.getLogger("sowstream.engine")


class Outbox:
    """Sends one topic's subscription messages and the change events of the views over it."""

    def __init__(
        self,
        compiled: CompiledTopic[TopicConfig],
        sender: Sender,
        views: list[ViewFeed | ConflatedFeed],
    ) -> None:
        """``views``: the feeds of the views and conflated topics reading this topic (the
        engine adds to the list as it wires them)."""
        self.topic = compiled.definition
        self.codec = compiled.codec  # the changes' bodies are read by it
        self.views = views
        self._sender = sender

    async def deliver(
        self, deliveries: Sequence[Delivery], *, wait: bool = False
    ) -> list[asyncio.Future[Any]]:
        """Send subscription messages; with ``wait``, until Kafka has them all.

        Returns the delivery futures of the messages sent.
        """
        futures: list[asyncio.Future[Any]] = []
        if not deliveries:
            return futures
        # Grouped per reply topic (a client's messages keep their order; many go as Kafka
        # batches, see FaustSender.send_replies).
        by_client: dict[str, list[tuple[bytes, list[tuple[str, bytes]]]]] = {}
        for d in deliveries:
            by_client.setdefault(d.spec.reply_to, []).append((d.data, live_headers(d)))
        for reply_to, messages in by_client.items():
            futures.extend(await self._sender.send_replies(reply_to, messages))
        metrics.DELIVERED.labels(self.topic.name).inc(len(deliveries))
        if wait:
            await self.acknowledged(futures)
        return futures

    async def feed_views(self, changes: Sequence[Change]) -> list[asyncio.Future[Any]]:
        """Send the change events of ``changes`` to the input topics of the views reading this
        topic; returns their delivery futures (the batch is stored once Kafka has them).

        Events go out per input partition in Kafka batches (``send_many``), in the order the
        changes were applied: a send per event cost several times more event-loop time.
        A change re-announced after a crash (``resent``) sends nothing: its events were
        acknowledged before its result was stored, which is how it came to be stored.
        """
        pending: dict[tuple[str, int], list[tuple[bytes, bytes | None]]] = {}
        codec = self.codec
        for change in changes:
            if change.resent:
                continue
            before = change.before_body(codec)
            after = change.after_body(codec)
            source = (self.topic.ident, change.partition, change.offset, change.seq)
            for feed in self.views:
                for event in feed.events(change.sow_key, before, after, source):
                    pending.setdefault((feed.input_topic, event.partition), []).append(
                        (event.key, event.value)
                    )
        futures: list[asyncio.Future[Any]] = []
        for (topic, partition), events in pending.items():
            futures.extend(fut for fut, _ in await self._sender.send_many(topic, partition, events))
            metrics.VIEW_EVENTS.labels(self.topic.name).inc(len(events))
        return futures

    async def acknowledged(self, futures: list[asyncio.Future[Any]]) -> None:
        """Wait until Kafka has acknowledged ``futures``, for a bounded time."""
        if futures:
            # Bounded: a reply topic deleted under us must not hold the partition for the
            # producer's whole delivery timeout (its client is gone anyway).
            _, late = await asyncio.wait(futures, timeout=DELIVERY_WAIT_SECONDS)
            if late:
                log.warning(
                    "topic %s: %d subscription messages not acknowledged by Kafka within %.0fs",
                    self.topic.name,
                    len(late),
                    DELIVERY_WAIT_SECONDS,
                )

    async def send_failure(self, spec: SubscriptionSpec, reason: str, text: str) -> None:
        """Tell a subscriber the engine ended its subscription, and why."""
        await self._sender.send_reply(spec.reply_to, text.encode(), failure_headers(spec, reason))


def live_headers(d: Delivery) -> list[tuple[str, bytes]]:
    """Kafka headers of a live subscription message (documented in docs/protocol.md)."""
    pairs = [
        (h.COMMAND, d.command.encode()),
        (h.SUB_ID, d.spec.sub_id.encode()),
        (h.TOPIC, (d.topic or d.spec.topic).encode()),
        (h.PARTITION, str(d.partition).encode()),
        (h.OFFSET, str(d.offset).encode()),
        (h.TIMESTAMP, str(d.timestamp).encode()),
    ]
    if not d.spec.options.no_sowkey:
        pairs.append((h.SOW_KEY, d.sow_key.encode()))
    if d.reason:
        pairs.append((h.REASON, d.reason.encode()))
    if d.is_delta:
        pairs.append((h.DELTA, b"1"))
    if d.seq:
        pairs.append((h.SEQ, str(d.seq).encode()))
    return pairs


def failure_headers(spec: SubscriptionSpec, reason: str) -> list[tuple[str, bytes]]:
    """Headers of the message that tells a client the engine ended its subscription."""
    return refusal_headers(spec.sub_id, spec.topic, reason)


def processed_headers(spec: SubscriptionSpec, backlog: int) -> list[tuple[str, bytes]]:
    """Headers of the ``processed`` ack of a queue subscription: it is leasing, with the
    effective backlog in its options (``max_backlog=<n>``, as AMPS reports it)."""
    return [
        (h.COMMAND, ACK.encode()),
        (h.ACK_TYPE, PROCESSED.encode()),
        (h.SUB_ID, spec.sub_id.encode()),
        (h.TOPIC, spec.topic.encode()),
        (h.OPTIONS, f"max_backlog={backlog}".encode()),
    ]


def refusal_headers(sub_id: str, topic: str, reason: str) -> list[tuple[str, bytes]]:
    """Headers of a ``failure`` message for subscription ``sub_id`` on ``topic`` (ended, or
    refused: its registration could not be served), with the reason's code."""
    return [
        (h.COMMAND, FAILURE.encode()),
        (h.SUB_ID, sub_id.encode()),
        (h.TOPIC, topic.encode()),
        (h.REASON, reason.encode()),
    ]
