"""The worker's clients: their subscriptions, and what happens when one goes or falls behind.

Subscriptions are kept on the registry topic (:class:`~sowstream.engine.registry.
SubscriptionRegistry`), which every worker follows: each registration is placed on the topic's or
queue's unit here. A client whose reply topic is gone, that stops reading
(:class:`~sowstream.engine.slow.SlowConsumerWatch`) or whose replies could not wait any longer for
its reply topic loses its subscriptions and its leases, and is told why (a ``failure`` message on
its reply topic, when there is one to carry it). Once a client is gone, or has no subscription
left, the worker forgets its reply topic.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from sowstream.config.models import SlowConsumerConfig
from sowstream.engine import metrics
from sowstream.engine.autotopics import AutoTopics
from sowstream.engine.outbox import failure_headers, processed_headers, refusal_headers
from sowstream.engine.queries import refusal
from sowstream.engine.queues import QueueRuntime
from sowstream.engine.registry import SubscriptionRegistry
from sowstream.engine.replytopics import REPLY_TOPIC_GONE
from sowstream.engine.slow import SlowConsumerWatch
from sowstream.engine.topology import Topology
from sowstream.errors import InvalidCommandError
from sowstream.filters import FilterError
from sowstream.queues.machine import BacklogShare
from sowstream.subscriptions.model import SubscriptionSpec

log = logging.getLogger("sowstream.engine")

CONFIRM_GONE_SECONDS = 3.0  # between the two checks that a reply topic was deleted


class Clients:
    """Places registrations on units and ends the subscriptions of clients that went away."""

    def __init__(
        self,
        topology: Topology,
        auto: AutoTopics,
        slow_consumer: SlowConsumerConfig,
    ) -> None:
        self._topology = topology
        self._auto = auto
        self._ctx = ctx = topology.ctx
        self._sender = ctx.sender
        self._confirming: set[str] = set()  # reply topics whose existence is being checked
        self._admin: AdminClient | None = None
        # Per (reply topic, sub id) of a subscription over several queues: its shared backlog.
        self._shares: dict[tuple[str, str], BacklogShare] = {}
        self.registry = SubscriptionRegistry(
            ctx.bootstrap,
            ctx.names.subscriptions,
            ctx.kafka,
            self.registration,
            refuse=self.refuse,
            loaded=ctx.subscriptions_known,
            authenticator=ctx.authenticator,
            reply_topic_problem=ctx.names.reply_topic_problem,
            progress=ctx.registry,
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
                self._ctx.wiring.background(self._queue_unsubscribe(queue, key))
                return
            try:
                backlog = queue.subscribe(
                    spec,
                    self._covered_limit(spec),
                    self._share(spec),
                    packed=key in self.registry.packed,
                )
            except (FilterError, ValueError) as exc:
                self.refuse(key, spec.to_wire(), refusal(exc), f"queue {topic!r}: {exc}")
                return
            self._processed(spec, backlog)
            return
        unit = self._topology.topics.get(topic)
        if unit is None:
            # Maybe a topic created on first use that this worker has not read about yet.
            self._auto.hold(topic, key, spec)
            return
        proc = unit.proc
        if spec is None:
            gone = proc.unsubscribe(key)
            if gone is not None and not self.subscribed(gone.reply_to):
                self._ctx.wiring.background(self._sender.release(gone.reply_to))
            return
        try:
            proc.subs.upsert(spec, held=proc.partitions)
        except (FilterError, InvalidCommandError) as exc:
            self.refuse(key, spec.to_wire(), refusal(exc), f"topic {spec.topic!r}: {exc}")

    def _covered_limit(self, spec: SubscriptionSpec) -> int | None:
        """For a subscription over several queues (a regular expression, ``topic_regex``): the
        smallest MaxPerSubscriptionBacklog among them, which caps its backlog on each."""
        if spec.topic_regex is None:
            return None
        try:
            pattern = re.compile(spec.topic_regex)
        except re.error:
            return None
        limits = [
            q.config.max_per_subscription_backlog
            for name, q in self._topology.queues.items()
            if pattern.fullmatch(name)
        ]
        return min(limits, default=None)

    def _share(self, spec: SubscriptionSpec) -> BacklogShare | None:
        """The backlog a subscription over several queues shares among them on this worker."""
        if spec.topic_regex is None:
            return None
        for key in [k for k, share in self._shares.items() if share.empty]:
            del self._shares[key]  # every queue let go of it: unsubscribed or gone
        return self._shares.setdefault((spec.reply_to, spec.sub_id), BacklogShare())

    def _processed(self, spec: SubscriptionSpec, backlog: int) -> None:
        """Acknowledge a queue subscription to its client with its effective backlog (each
        worker that takes it does: the client keeps the first)."""
        sender, headers = self._sender, processed_headers(spec, backlog)

        async def send() -> None:
            await sender.send_reply(spec.reply_to, b"", headers)

        self._ctx.wiring.background(send())

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

    async def _queue_unsubscribe(self, queue: QueueRuntime, key: str) -> None:
        await queue.unsubscribe(key)
        reply_to = key.split("|", 1)[0]  # SubscriptionSpec.key starts with the reply topic
        if not self.subscribed(reply_to):
            await self._sender.release(reply_to)

    def subscribed(self, reply_to: str) -> bool:
        """Whether the client behind ``reply_to`` has a subscription on this worker."""
        return any(reply_to in q.clients() for q in self._topology.queues.values()) or any(
            reply_to in unit.proc.subs.clients() for unit in self._topology.topics.values()
        )

    def reply_topic_gone(self, reply_to: str, text: str, tell: bool) -> None:
        """The replies parked for ``reply_to`` were given up on (the topic did not appear in
        time, or too much waited for it): the client is taken for gone."""
        self.client_gone(reply_to, REPLY_TOPIC_GONE, text, tell=tell)

    def reply_topic_missing(self, reply_to: str) -> None:
        """A metadata refresh did not find ``reply_to``: if it is really deleted (its client
        closed), end what the client had and forget the topic."""
        if reply_to in self._confirming:
            return
        self._confirming.add(reply_to)
        self._ctx.wiring.background(self._confirm_gone(reply_to))

    async def _confirm_gone(self, reply_to: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            # Asked twice, a few seconds apart: a broker that restarts or moves leaders can
            # miss a topic for a moment.
            for attempt in range(2):
                if attempt:
                    await asyncio.sleep(CONFIRM_GONE_SECONDS)
                if await loop.run_in_executor(None, self.topic_exists, reply_to):
                    return  # a hiccup of the broker's metadata: the next refresh finds it
        finally:
            self._confirming.discard(reply_to)
        log.info("reply topic %s was deleted: its client is gone", reply_to)
        # Told all the same (a client that closed has no subscription left to tell about): if
        # the topic were only missing for a while, the failure waits for it, parked.
        self.client_gone(reply_to, REPLY_TOPIC_GONE, f"reply topic {reply_to} was deleted")
        self._sender.forget(reply_to)

    def topic_exists(self, topic: str) -> bool:
        """Whether Kafka has ``topic`` (True when the broker cannot tell: a client is never
        dropped on a hiccup). Blocking: run it in an executor."""
        if self._admin is None:
            self._admin = AdminClient(
                {"bootstrap.servers": self._ctx.bootstrap, "log_level": 3, **self._ctx.kafka}
            )
        try:
            found = self._admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        except KafkaException:
            return True  # cannot tell: do not drop a client on a broker hiccup
        if found is None:
            return False
        # Another error (no leader yet, say) is a topic that exists but is not ready.
        return found.error is None or found.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART

    def client_gone(
        self, reply_to: str, reason: str = REPLY_TOPIC_GONE, text: str = "", tell: bool = True
    ) -> None:
        """End every subscription of the client behind ``reply_to`` and give its leases back;
        with ``tell``, send it a ``failure`` per subscription with ``reason`` (once the
        registry has the removals, so a client that registers again is not ended twice)."""
        ended: list[SubscriptionSpec] = []
        for queue in self._topology.queues.values():
            for spec in queue.specs(reply_to):
                self.registry.write(spec, remove=True)
                ended.append(spec)
            self._ctx.wiring.background(queue.disconnect(reply_to))
        for unit in list(self._topology.topics.values()):
            for spec in unit.proc.subs.remove_client(reply_to):
                self.registry.write(spec, remove=True)
                ended.append(spec)
        metrics.SUBSCRIPTIONS_DROPPED.labels(reason).inc(len(ended))
        if ended:
            log.warning("ended %d subscriptions of %s (%s): %s", len(ended), reply_to, reason, text)
        if tell and ended:
            self._ctx.wiring.background(self._tell(ended, reason, text))

    async def _tell(self, ended: list[SubscriptionSpec], reason: str, text: str) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.registry.flush)
        for spec in ended:
            headers = failure_headers(spec, reason)
            await self._sender.send_reply(spec.reply_to, text.encode(), headers)
