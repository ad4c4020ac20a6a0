"""The slow-consumer policy: a subscriber that stops reading must not cost anyone else.

Replies travel through the client's own reply topic, so a client that stops reading never blocks
the engine: its backlog piles up in Kafka. The client commits how far it has read (consumer group
= its reply topic), and every few seconds each worker compares that with the topic's end:

* backlog at or above ``conflate_after`` messages: the client's subscriptions are conflated
  (``conflation_interval``) so it gets the latest state per record instead of every update; this
  lifts once the backlog is below half the threshold;
* backlog at or above ``drop_after``: its subscriptions end, the registry forgets them and the
  client receives a ``failure`` message with reason ``slow_consumer`` (raised by the iterator).

The same commits carry the client's clock as metadata, every few seconds even when it reads
nothing: a client silent for ``client_timeout`` (killed, paused, or cut off) is taken for gone,
so its subscriptions end, the queue messages it held return to their queues at once, and it
finds a ``failure`` with reason ``client_timeout`` when it reads again (the Python client then
places its subscriptions again from where it was).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from sowstream.config.models import SlowConsumerConfig
from sowstream.engine import metrics
from sowstream.engine.processor import TopicProcessor
from sowstream.subscriptions.model import SubscriptionSpec

log = logging.getLogger("sowstream.engine")

SLOW_CONSUMER = "slow_consumer"
CLIENT_TIMEOUT = "client_timeout"

# Told (reply topic, reason, text) when a client is taken for gone.
Gone = Callable[[str, str, str], None]


def taken_for_gone(beat: int, ended: int | None, now: int, grace_until: int, timeout: int) -> bool:
    """Whether a client whose last heartbeat was at ``beat`` (ms) is gone at ``now``: silent for
    over ``timeout``, outside a grace period (after a broker restart, when nobody could
    heartbeat), and not within ``timeout`` of ``ended``, when its subscriptions were last ended
    (it places them again before its next heartbeat lands)."""
    if now <= grace_until:
        return False
    return now - max(beat, ended or 0) > timeout


class SlowConsumerWatch:
    """Measures each subscribed client's backlog and applies the policy."""

    def __init__(
        self,
        bootstrap: str,
        extra: Mapping[str, str],
        policy: SlowConsumerConfig,
        processors: Callable[[], Iterable[TopicProcessor]],
        forget: Callable[[SubscriptionSpec], None],
        queue_clients: Callable[[], Iterable[str]] = lambda: (),
        gone: Gone = lambda reply, reason, text: None,
    ) -> None:
        self._bootstrap = bootstrap
        self._extra = dict(extra)
        self.policy = policy
        self._processors = processors
        self._forget = forget
        self._queue_clients = queue_clients
        self._gone = gone
        self.last_seen: dict[str, int] = {}  # reply topic -> the client's last heartbeat (ms)
        self._admin: AdminClient | None = None
        self._consumer: Consumer | None = None
        self.conflated: set[str] = set()
        self._blind = False  # the last check could not read the cluster
        self._grace_until = 0  # no client is taken for gone before this (epoch ms)
        self._ended: dict[str, int] = {}  # reply topic -> when its subscriptions were ended (ms)

    def _backlogs(self, clients: list[str]) -> dict[str, int]:
        """Unread messages per reply topic (clients that never committed count from 0)."""
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self._bootstrap, **self._extra})
            self._consumer = Consumer(
                {
                    "bootstrap.servers": self._bootstrap,
                    "group.id": "sowstream-slow-consumer-watch",
                    "log_level": 3,
                    **self._extra,
                }
            )
        assert self._consumer is not None
        out: dict[str, int] = {}
        unreachable = 0
        for reply in clients:
            try:
                _, end = self._consumer.get_watermark_offsets(TopicPartition(reply, 0), timeout=5)
                futures = self._admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(reply, [TopicPartition(reply, 0)])]
                )
                result = futures[reply].result(timeout=5)
                committed = result.topic_partitions[0].offset
                beat = result.topic_partitions[0].metadata
            except (KafkaException, TimeoutError):
                # gone (the reply path handles vanished clients), or the cluster is away
                unreachable += 1
                continue
            out[reply] = end - max(committed, 0)
            if beat and beat.isdigit():
                self.last_seen[reply] = int(beat)
        if clients and unreachable == len(clients):
            raise TimeoutError(f"no backlog of {len(clients)} clients could be read")
        return out

    async def check(self) -> None:
        """One round: measure every subscribed client and act on its backlog."""
        procs = list(self._processors())
        clients = sorted({c for p in procs for c in p.subs.clients()} | set(self._queue_clients()))
        if not clients:
            return
        loop = asyncio.get_running_loop()
        try:
            backlogs = await loop.run_in_executor(None, self._backlogs, clients)
        except TimeoutError:
            self._blind = True  # the cluster is away: nobody could heartbeat meanwhile
            raise
        now = int(time.time() * 1000)
        if self._blind:
            # Back in sight of the cluster: clients silent meanwhile (a broker restart) get a
            # whole client_timeout from now before they are taken for gone.
            self._blind = False
            self._grace_until = now + self.policy.client_timeout
        timeout = self.policy.client_timeout
        self._ended = {r: at for r, at in self._ended.items() if now - at <= timeout}
        for reply, backlog in backlogs.items():
            seen = self.last_seen.get(reply)
            if seen is not None and taken_for_gone(
                seen, self._ended.get(reply), now, self._grace_until, timeout
            ):
                text = (
                    f"client {reply} sent no heartbeat for {(now - seen) / 1000:.0f}s (limit "
                    f"{self.policy.client_timeout / 1000:.0f}s): the engine ended the subscription"
                )
                log.warning("%s", text)
                self.last_seen.pop(reply, None)
                self._ended[reply] = now
                self._gone(reply, CLIENT_TIMEOUT, text)
            elif backlog >= self.policy.drop_after:
                await self._drop(reply, backlog, procs)
            elif backlog >= self.policy.conflate_after and reply not in self.conflated:
                log.warning("client %s is %d messages behind: conflating", reply, backlog)
                self.conflated.add(reply)
                for proc in procs:
                    proc.subs.force_conflation(reply, self.policy.conflation_interval)
            elif backlog < self.policy.conflate_after // 2 and reply in self.conflated:
                self.conflated.discard(reply)
                for proc in procs:
                    proc.subs.force_conflation(reply, None)

    async def _drop(self, reply: str, backlog: int, procs: list[TopicProcessor]) -> None:
        log.warning(
            "client %s is %d messages behind (limit %d): dropping its subscriptions",
            reply,
            backlog,
            self.policy.drop_after,
        )
        self.conflated.discard(reply)
        for proc in procs:
            proc.subs.force_conflation(reply, None)
            for spec in proc.subs.remove_client(reply):
                self._forget(spec)
                metrics.SUBSCRIPTIONS_DROPPED.labels(SLOW_CONSUMER).inc()
                text = (
                    f"{backlog} unread messages on {reply} reached the limit of "
                    f"{self.policy.drop_after}: the engine dropped the subscription"
                )
                await proc.send_failure(spec, SLOW_CONSUMER, text)

    async def run(self, interval: float) -> None:
        """Check every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.check()
            except Exception as exc:  # a failed round (the cluster away) must not end the worker
                log.warning("slow-consumer check failed: %r", exc)
