"""The worker's clients: their subscriptions, and what happens when one goes or falls behind.

Subscriptions are kept on the registry topic (:class:`~sowstream.engine.registry.
SubscriptionRegistry`), which every worker follows: each registration is placed on the topic's or
queue's unit here. A client whose reply topic is gone, or that stops reading
(:class:`~sowstream.engine.slow.SlowConsumerWatch`), loses its subscriptions and its leases.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from sowstream.config.models import SlowConsumerConfig
from sowstream.engine import metrics
from sowstream.engine.autotopics import AutoTopics
from sowstream.engine.outbox import refusal_headers
from sowstream.engine.queries import refusal
from sowstream.engine.registry import SubscriptionRegistry
from sowstream.engine.slow import SlowConsumerWatch
from sowstream.engine.topology import Topology
from sowstream.errors import InvalidCommandError
from sowstream.filters import FilterError
from sowstream.subscriptions.model import SubscriptionSpec

log = logging.getLogger("sowstream.engine")


class Clients:
    """Places registrations on units and ends the subscriptions of clients that went away."""

    def __init__(
        self,
        topology: Topology,
        auto: AutoTopics,
        slow_consumer: SlowConsumerConfig,
        forget_gone: Callable[[str], None],
    ) -> None:
        self._topology = topology
        self._auto = auto
        self._ctx = ctx = topology.ctx
        # Called when a reply topic thought gone is there after all: send replies to it again.
        self._forget_gone = forget_gone
        self._admin: AdminClient | None = None
        self.registry = SubscriptionRegistry(
            ctx.bootstrap,
            ctx.names.subscriptions,
            ctx.kafka,
            self.registration,
            refuse=self.refuse,
            loaded=ctx.subscriptions_known,
            authenticator=ctx.authenticator,
        )
        self.slow_consumers = SlowConsumerWatch(
            ctx.bootstrap,
            ctx.kafka,
            slow_consumer,
            lambda: [unit.proc for unit in topology.topics.values()],
            self._forget,
            lambda: {c for q in topology.queues.values() for c in q.clients()},
            self.client_gone,
        )
        self._check_every = slow_consumer.check_interval / 1000
        auto.refuse = self.refuse

    def declare(self) -> None:
        """Follow the registry, and watch for slow consumers, from the worker's start."""
        wiring = self._ctx.wiring
        wiring.task(self.registry.run)
        wiring.task(self.watch_slow_consumers)

    async def watch_slow_consumers(self) -> None:
        await self.slow_consumers.run(self._check_every)

    def _forget(self, spec: SubscriptionSpec) -> None:
        self.registry.write(spec, remove=True)

    def registration(self, key: str, spec: SubscriptionSpec | None) -> None:
        """A registry record arrived: start, change or stop a subscription."""
        # The key ends with the topic's identity (SubscriptionSpec.key): its name, or
        # <type>:<name> for a message type other than json.
        topic = spec.ident if spec is not None else key.rsplit("|", 1)[-1]
        queue = self._topology.queues.get(topic)
        if queue is not None:
            if spec is None:
                self._ctx.wiring.background(queue.unsubscribe(key))
                return
            try:
                queue.subscribe(spec)
            except (FilterError, ValueError) as exc:
                self.refuse(key, spec.to_wire(), refusal(exc), f"queue {topic!r}: {exc}")
            return
        unit = self._topology.topics.get(topic)
        if unit is None:
            # Maybe a topic created on first use that this worker has not read about yet.
            self._auto.hold(topic, key, spec)
            return
        proc = unit.proc
        if spec is None:
            proc.unsubscribe(key)
            return
        try:
            proc.subs.upsert(spec, held=proc.partitions)
        except (FilterError, InvalidCommandError) as exc:
            self.refuse(key, spec.to_wire(), refusal(exc), f"topic {spec.topic!r}: {exc}")

    def refuse(self, key: str, raw: Mapping[str, Any], reason: str, text: str) -> None:
        """Tell the client behind a registration that it is refused, and why: a ``failure``
        message for its subscription id on its reply topic (the registry record stays until
        the client removes it; every worker that reads it refuses it)."""
        log.warning("refused registration %s: %s", key, text)
        reply_to = str(raw.get("reply_to") or "")
        if not reply_to:
            return
        headers = refusal_headers(str(raw.get("sub_id") or ""), str(raw.get("topic") or ""), reason)
        sender = self._ctx.sender

        async def send() -> None:
            await sender.send_reply(reply_to, text.encode(), headers)

        self._ctx.wiring.background(send())

    def reply_topic_missing(self, reply_to: str) -> None:
        """A reply could not be sent: make sure the client is really gone before acting."""
        self._ctx.wiring.background(self._confirm_gone(reply_to))

    async def _confirm_gone(self, reply_to: str) -> None:
        loop = asyncio.get_running_loop()
        exists = await loop.run_in_executor(None, self._topic_exists, reply_to)
        if not exists:
            self.client_gone(reply_to)
            return
        # Only its metadata was slow to come: replies flow again, and queue messages whose
        # delivery was dropped meanwhile go back to the queue for another one.
        log.info("reply topic %s is there after all: keeping its client", reply_to)
        self._forget_gone(reply_to)
        for queue in self._topology.queues.values():
            await queue.redeliver(reply_to)

    def _topic_exists(self, topic: str) -> bool:
        if self._admin is None:
            self._admin = AdminClient(
                {"bootstrap.servers": self._ctx.bootstrap, "log_level": 3, **self._ctx.kafka}
            )
        try:
            found = self._admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        except KafkaException:
            return True  # cannot tell: do not drop a client on a broker hiccup
        return found is not None and found.error is None

    def client_gone(self, reply_to: str) -> None:
        """A client's reply topic vanished (it crashed or closed): end its subscriptions."""
        for queue in self._topology.queues.values():
            for spec in queue.specs(reply_to):
                self.registry.write(spec, remove=True)
            self._ctx.wiring.background(queue.disconnect(reply_to))
        for unit in list(self._topology.topics.values()):
            for spec in unit.proc.subs.remove_client(reply_to):
                self.registry.write(spec, remove=True)
                metrics.SUBSCRIPTIONS_DROPPED.labels("client_gone").inc()
