"""The worker's runtime: every faust call of the engine is made here.

faust runs the consumer group (assignment, rebalances), the RocksDB tables with their changelogs
and the agents reading control and input topics. The rest of the engine sees it only through the
ports (:class:`FaustSender` is the :class:`~sowstream.engine.ports.Sender`,
:class:`FaustAssignment` the :class:`~sowstream.engine.ports.Assignment`, :class:`FaustTable`
a :class:`~sowstream.engine.ports.StateTable`) and the
:class:`~sowstream.engine.units.base.Wiring` the units declare with.

The rule: only the runtime modules, this one and the ``runtime_*`` modules beside it
(:mod:`~sowstream.engine.runtime_restore`: faust's table recovery with the bulk copy), import
faust or aiokafka, or reach into their objects; ``tests/unit/test_import_graph.py`` checks the
imports.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import aiokafka
import faust
from aiokafka.errors import KafkaError, RebalanceInProgressError
from aiokafka.protocol.group import HeartbeatRequest
from faust.auth import SASLCredentials, SSLCredentials
from faust.exceptions import NotReady
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer
from faust.types import TP
from faust.types.auth import CredentialsT

from sowstream.config.models import EngineConfig, RocksDBConfig
from sowstream.engine import metrics
from sowstream.engine.commands import ControlRecord
from sowstream.engine.fence import GroupCheck
from sowstream.engine.ports import Sender
from sowstream.engine.pump import LOG_BATCH_MAX
from sowstream.engine.replytopics import Parking, ReplyTopics
from sowstream.engine.runtime_restore import batched_table_manager, restore_progress
from sowstream.engine.security import kafka_security
from sowstream.engine.units.base import ControlInbox, Partitions
from sowstream.sow.ops import RawRecord
from sowstream.wire import headers as h
from sowstream.wire.kafka import MAX_RECORD_BYTES

log = logging.getLogger("sowstream.engine")

PRODUCER_BATCH_BYTES = 512 * 1024  # under Kafka's default 1 MB message.max.bytes per batch
INPUT_BATCH_MAX = 2_000  # change events a view maintainer (or conflated topic) takes in one go
INPUT_BATCH_WITHIN = 0.01  # seconds an input agent waits to fill a batch
# How long a reply waits for its topic's metadata before it is parked (see send_reply).
REPLY_METADATA_WAIT = 5.0
DEFAULT_EXECUTOR_THREADS = 32  # the worker loop's run_in_executor(None, ...) pool
REPLY_BATCH_MIN = 64  # replies to one topic from one batch sent as Kafka batches from this many

# Called with the partitions a rebalance assigned or revoked.
Rebalance = Callable[[Partitions], Awaitable[None]]


class FaustSender(Sender):
    """Produces through the faust app's own producer, so faust flushes it before committing.

    Replies (answers, subscription messages, queue leases) go through the producer's second
    aiokafka producer (:class:`EngineProducer`): aiokafka keeps one produce request in flight
    per broker, and a reply queued behind a 512 KiB changelog request waited for it.
    """

    def __init__(self, app: faust.App, replies: ReplyTopics | None = None) -> None:
        self._app = app
        self._tracked: set[str] = set()  # topics aiokafka keeps metadata for (see send)
        self._reply_tracked: set[str] = set()  # the same for the producer of replies
        # The clients' reply topics: which are tracked, and the replies parked for slow ones.
        self.replies = replies or ReplyTopics(wait=30.0, max_bytes=16 * 1024 * 1024)
        self._waiting: dict[str, asyncio.Task[None]] = {}
        self._listening = False
        self._missing: set[str] = set()  # tracked reply topics a refresh did not find
        # Told when the replies to a topic were given up on, with a text saying why and whether
        # the client can still be told (its topic may appear): its subscriptions end.
        self.on_gone: Callable[[str, str, bool], None] | None = None
        # Told when a metadata refresh misses a tracked reply topic (deleted, or a hiccup).
        self.on_missing: Callable[[str], None] | None = None
        # Whether a topic exists (a blocking admin call, run in an executor) while replies wait.
        self.exists: Callable[[str], bool] | None = None
        # Why a topic is no client's reply topic (None: it is one); set by the engine. Replies
        # go nowhere else, whatever a command, registration or publish header names.
        self.reply_topic_problem: Callable[[str], str | None] = lambda topic: None
        self._misdirected: set[str] = set()

    def _refused_topic(self, topic: str) -> bool:
        """Whether replies to ``topic`` are refused (warned once per topic)."""
        if self.replies.is_tracked(topic):
            return False  # sent to before, so checked before (the hot path: one set lookup)
        problem = self.reply_topic_problem(topic)
        if problem is None:
            return False
        if topic not in self._misdirected:
            self._misdirected.add(topic)
            log.warning("replies to %s are dropped: %s", topic, problem)
        return True

    def _producer(self) -> Any:
        """The producer of replies, watched for metadata refreshes (see _refreshed)."""
        producer = self._replies()
        if not self._listening:
            self._listening = True
            producer.client.cluster.add_listener(self._refreshed)
        return producer

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[Any] | None:
        # faust's aiokafka producer, minus faust's per-message wrapper (this is the hot path)
        producer = self._app.producer._ensure_producer()  # type: ignore[attr-defined]
        if topic not in self._tracked:
            track_topic(producer, topic)
            self._tracked.add(topic)
        fut = await producer.send(topic, value, key=key, partition=partition, headers=headers)
        return cast("asyncio.Future[Any]", fut)

    def _replies(self) -> Any:
        """The aiokafka producer of replies, which tracks every reply topic it sends to."""
        return self._app.producer.replies()  # type: ignore[attr-defined]

    def _track_reply_topic(self, producer: Any, topic: str) -> None:
        if topic not in self._reply_tracked:
            track_topic(producer, topic)
            self._reply_tracked.add(topic)

    async def _send_reply(
        self, topic: str, value: bytes, headers: list[tuple[str, bytes]] | None
    ) -> asyncio.Future[Any]:
        producer = self._replies()
        self._track_reply_topic(producer, topic)
        fut = await producer.send(topic, value, headers=headers)
        return cast("asyncio.Future[Any]", fut)

    async def send_many(
        self,
        topic: str,
        partition: int,
        records: Sequence[tuple[bytes, bytes | None]],
        headers: Sequence[list[tuple[str, bytes]]] | None = None,
    ) -> list[tuple[asyncio.Future[Any], int]]:
        # aiokafka's send costs ~8 us of event-loop CPU per record (a future, a batch lookup);
        # filling its batches here costs ~1 us (docs/benchmarks.md, issue 13).
        producer = self._app.producer._ensure_producer()  # type: ignore[attr-defined]
        if topic not in self._tracked:
            track_topic(producer, topic)
            self._tracked.add(topic)
        out: list[tuple[asyncio.Future[Any], int]] = []
        batch, count = producer.create_batch(), 0
        for i, (key, value) in enumerate(records):
            extra = [] if headers is None else headers[i]
            if batch.append(key=key, value=value, timestamp=None, headers=extra) is None:
                # Full (a first record always fits): queue it, after the batches before it.
                out.append((await producer.send_batch(batch, topic, partition=partition), count))
                batch, count = producer.create_batch(), 0
                batch.append(key=key, value=value, timestamp=None, headers=extra)
            count += 1
        if count:
            out.append((await producer.send_batch(batch, topic, partition=partition), count))
        return out

    def prepare(self, topic: str) -> None:
        # The first send to a topic otherwise waits for its metadata (100 ms and more), and
        # meanwhile holds up every other lease of the queue's delivery loop. Prepared topics
        # are reply topics: they are sent to by the producer of replies.
        self.replies.track(topic)  # a queue subscriber's reply topic
        self._track_reply_topic(self._producer(), topic)

    async def send_reply(
        self, topic: str, value: bytes, headers: list[tuple[str, bytes]] | None = None
    ) -> asyncio.Future[Any] | None:
        if self._refused_topic(topic):
            return None
        replies = self.replies
        if replies.is_parked(topic):
            # Earlier replies wait for the topic: this one queues behind them (order).
            self._park(topic, value, headers)
            return None
        producer = self._producer()
        if producer.client.cluster.partitions_for_topic(topic):
            # Metadata is cached, so the send cannot wait on it (the hot path of fan-out).
            replies.track(topic)
            fut = await self._send_reply(topic, value, headers)
            replies.sent(topic, fut)
            return fut
        # No metadata yet: usually a new client, whose topic's metadata comes within
        # milliseconds, so wait for it here (the batch then waits for this reply's
        # acknowledgement, and a crash repeats it). A topic still missing after that (a slow
        # broker, a topic created late or deleted) must not hold the partition longer: park
        # the reply, and every later one behind it, and fetch the metadata in the background.
        try:
            fut = await asyncio.wait_for(
                self._send_reply(topic, value, headers), REPLY_METADATA_WAIT
            )
        except (TimeoutError, KafkaError):
            self._park(topic, value, headers)
            return None
        replies.track(topic)
        replies.sent(topic, fut)
        return fut

    def _park(self, topic: str, value: bytes, headers: list[tuple[str, bytes]] | None) -> None:
        outcome = self.replies.park(topic, value, headers, time.monotonic())
        if outcome is Parking.STARTED:
            self._waiting[topic] = asyncio.ensure_future(self._wait_for(topic))
        elif outcome is Parking.OVERFLOW:
            text = (
                f"more than {self.replies.max_bytes} bytes of replies waited for reply topic "
                f"{topic} to appear"
            )
            log.warning("dropped the replies parked for %s: %s", topic, text)
            metrics.REPLIES_PARKED_DROPPED.inc()
            if self.on_gone is not None:
                self.on_gone(topic, text, True)

    async def _wait_for(self, topic: str) -> None:
        """Send what is parked for ``topic`` once its metadata is there; past the wait, drop
        it and report the topic gone."""
        producer = self._producer()
        loop = asyncio.get_running_loop()
        try:
            while True:
                # Ask aiokafka for the topic (one refresh); if the broker does not know it yet,
                # stop asking (each refresh for a missing topic logs an error) and poll the
                # admin API until it exists.
                self._track_reply_topic(producer, topic)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(producer.client.force_metadata_update(), 2.0)
                if producer.client.cluster.partitions_for_topic(topic):
                    await self._drain(topic)
                    return
                self._untrack(topic)
                while True:
                    if self.replies.expired(topic, time.monotonic()):
                        self._give_up(topic)
                        return
                    exists = self.exists
                    if exists is None or await loop.run_in_executor(None, exists, topic):
                        break
                    await asyncio.sleep(0.5)
        finally:
            self._waiting.pop(topic, None)

    async def _drain(self, topic: str) -> None:
        """Send the replies parked for ``topic``, oldest first (those parked meanwhile too)."""
        self.replies.track(topic)
        sent = 0
        while (reply := self.replies.take(topic)) is not None:
            fut = await self._send_reply(topic, reply.value, reply.headers)
            self.replies.sent(topic, fut)
            sent += 1
        log.debug("sent %d replies parked for %s", sent, topic)

    def _give_up(self, topic: str) -> None:
        dropped = self.replies.drop(topic)
        self.replies.forget(topic)
        self._untrack(topic)
        wait = self.replies.wait
        text = f"reply topic {topic} did not appear within {wait:.0f}s"
        log.warning("%s: dropped %d parked replies, taking its client for gone", text, dropped)
        metrics.REPLIES_PARKED_DROPPED.inc(dropped)
        if self.on_gone is not None:
            self.on_gone(topic, text, False)

    def _untrack(self, topic: str) -> None:
        """Stop asking aiokafka for ``topic``'s metadata (its next refresh drops it)."""
        if topic not in self._reply_tracked:
            return
        self._reply_tracked.discard(topic)
        client = self._replies().client
        remaining = set(client._topics) - {topic}
        if remaining:  # an empty set would make aiokafka fetch every topic's metadata
            client.set_topics(remaining)

    def forget(self, topic: str) -> None:
        """``topic``'s client is gone: stop tracking it, unless replies still wait for it."""
        if self.replies.is_parked(topic):
            return
        self.replies.forget(topic)
        self._missing.discard(topic)
        self._untrack(topic)

    async def release(self, topic: str) -> None:
        """``topic``'s client has no subscription left: forget the topic once the last reply
        sent to it is acknowledged (a later reply tracks it again), so that a client that
        closes and deletes its topic leaves nothing behind."""
        if not self.replies.is_tracked(topic):
            return
        for _ in range(50):
            if self.replies.idle(topic):
                self.forget(topic)
                return
            await asyncio.sleep(0.1)

    def _refreshed(self, cluster: Any) -> None:
        """After each metadata refresh: a tracked reply topic it did not find is reported (its
        client may have closed and deleted it), once until it is found again."""
        for topic in self.replies.tracked():
            if self.replies.is_parked(topic) or topic not in self._reply_tracked:
                continue
            if cluster.partitions_for_topic(topic):
                self._missing.discard(topic)
            elif topic not in self._missing:
                self._missing.add(topic)
                if self.on_missing is not None:
                    self.on_missing(topic)

    async def send_replies(
        self, topic: str, messages: Sequence[tuple[bytes, list[tuple[str, bytes]]]]
    ) -> list[asyncio.Future[Any]]:
        # Many are filled into aiokafka batches here (one future per batch): a send per message
        # costs ~8 us of event-loop CPU, a batch append ~1 us (as send_many). But send_batch
        # waits until the topic's previous batch has left for the broker (a round trip when a
        # request is in flight), and this runs under the partition lock: a few go one by one,
        # appended to the producer's open batch without waiting.
        if not messages or self._refused_topic(topic):
            return []
        producer = self._producer()
        partitions = producer.client.cluster.partitions_for_topic(topic)
        if not partitions or len(messages) < REPLY_BATCH_MIN or self.replies.is_parked(topic):
            # One by one: the first reply also waits for the topic's metadata, and replies to a
            # topic that is late are parked behind the ones before them (send_reply).
            return await super().send_replies(topic, messages)
        self._track_reply_topic(producer, topic)
        self.replies.track(topic)
        # One partition for all (a reply topic has one): messages for a client stay in order.
        partition = min(partitions)
        out: list[asyncio.Future[Any]] = []
        batch, count = producer.create_batch(), 0
        for value, headers in messages:
            if batch.append(key=None, value=value, timestamp=None, headers=headers) is None:
                out.append(await producer.send_batch(batch, topic, partition=partition))
                batch, count = producer.create_batch(), 0
                batch.append(key=None, value=value, timestamp=None, headers=headers)
            count += 1
        if count:
            out.append(await producer.send_batch(batch, topic, partition=partition))
        for fut in out:
            self.replies.sent(topic, fut)
        return out


def track_topic(producer: Any, topic: str) -> None:
    """Make aiokafka keep ``topic``'s metadata in every refresh.

    aiokafka refreshes metadata only for the topics it was told to track, and a send to a topic
    it already knows (e.g. from the all-topics refresh at start) does not add it. The next
    refresh for another topic (a new client's reply topic) then drops the topic's leaders, and a
    full batch queued for it waits for a leader until the producer's request timeout (20 min
    with faust's settings): a worker whose changelog batches were caught this way stopped
    storing, acknowledging and leasing (seen in the queue benchmark).
    """
    producer.client.add_topic(topic)


# Heartbeat answers that leave ``generation`` current: the group is at it, or preparing the
# next one (which is formed, and assigns partitions anew, only after every member rejoined or
# was dropped).
_STILL_AT_GENERATION = frozenset({0, RebalanceInProgressError.errno})


async def heartbeat_at(coordinator: Any, generation: int) -> bool:
    """Whether the group of aiokafka's ``coordinator`` is still at ``generation`` with this
    member in it, asked with a heartbeat of that generation: the coordinator answers
    ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID once the group has moved on without it. Leaves
    aiokafka's coordinator alone (its own heartbeat resets or rejoins on such an answer)."""
    member = coordinator.member_id
    if generation < 0 or not member:
        return False
    request = HeartbeatRequest(coordinator.group_id, generation, member)
    try:
        response = await coordinator._send_req(request)
    except KafkaError:
        return False
    return int(response.error_code) in _STILL_AT_GENERATION


class AssignmentProgress:
    """Whether the worker's current assignment has been taken up: assigned after the last
    revocation, and its recovery over with the stream flow resumed.

    faust's own flags race when one rebalance follows another: a recovery of the assignment
    just revoked can still finish (resume the flow, end "the rebalance") after the revocation,
    which made a worker in the middle of the next rebalance look settled; it then loaded newly
    assigned partitions from stores not yet restored (a queue took a whole log again)."""

    def __init__(self) -> None:
        self.assigned = False  # an assignment arrived since the last revocation
        self.flow_resumed = False  # ... and its recovery resumed the stream flow

    def revoked(self) -> None:
        """A rebalance begins (faust calls this first, from the consumer's thread)."""
        self.assigned = self.flow_resumed = False

    def assignment(self) -> None:
        """The rebalance's new assignment arrived; its recovery is still to run."""
        self.assigned, self.flow_resumed = True, False

    def resumed(self) -> None:
        """faust resumed the stream flow: for the current assignment only if one arrived."""
        if self.assigned:
            self.flow_resumed = True

    def settled(self, in_recovery: bool) -> bool:
        # Records read between the flow's resumption and faust's end of the rebalance are this
        # worker's (commands left unanswered there were lost: test_conflation under load).
        return self.flow_resumed and not in_recovery


class FaustAssignment:
    """The consumer group's assignment of this worker, as faust's assignor holds it."""

    def __init__(self, app: faust.App) -> None:
        self._app = app
        self._check = GroupCheck(self._probe)

    def _thread(self) -> Any:
        """faust's consumer thread: aiokafka's consumer lives there, on its own event loop."""
        return getattr(self._app.consumer, "_thread", None)

    def _coordinator(self) -> Any:
        return getattr(getattr(self._thread(), "_consumer", None), "_coordinator", None)

    @property
    def generation(self) -> int:
        coordinator = self._coordinator()
        return int(coordinator.generation) if coordinator is not None else -1

    async def still_current(self, generation: int) -> bool:
        return await self._check.still_current(generation)

    async def _probe(self, generation: int) -> bool:
        coordinator = self._coordinator()
        if coordinator is None:
            return False
        return bool(await self._thread().call_thread(heartbeat_at, coordinator, generation))

    @property
    def settled(self) -> bool:
        progress: AssignmentProgress = cast(Any, self._app).progress
        return progress.settled(bool(self._app.in_recovery))

    def owns(self, topic: str, partition: int) -> bool:
        return (topic, partition) in self._app.assignor.assigned_actives()

    def partitions(self, topic: str) -> set[int]:
        return {tp.partition for tp in self._app.assignor.assigned_actives() if tp.topic == topic}


class FaustTable:
    """A faust ``Table`` as the engine's :class:`~sowstream.engine.ports.StateTable`: its
    partitions' RocksDB databases (faust's rocksdict store) and its changelog."""

    def __init__(self, table: Any) -> None:
        self.faust_table = table  # the faust Table itself, for the runtime (and its tests)

    @property
    def name(self) -> str:
        return str(self.faust_table.name)

    @property
    def changelog(self) -> str:
        return str(self.faust_table.changelog_topic.get_topic_name())

    def db(self, partition: int) -> Any:
        # faust opens a partition's database on first use and closes it when revoked.
        return self.faust_table.data._db_for_partition(partition)

    def partition_path(self, partition: int) -> Path:
        return Path(self.faust_table.data.partition_path(partition))

    def set_changelog_offset(self, partition: int, offset: int) -> None:
        store = self.faust_table.data
        # Skip when the partition moved away meanwhile: writing would reopen its database.
        if partition in store._dbs:
            store.set_persisted_offset(TP(self.changelog, partition), offset)


class PumpedConsumer(AIOKafkaConsumer):
    """faust's consumer, never fetching the partitions of *pumped* topics: the group assigns
    them (and the tables co-partitioned with them), an input pump of our own reads them
    (engine.inputs). aiokafka still prefetches one response per such partition, which waits
    unread."""

    def _fetched(self, tps: Iterable[Any]) -> set[Any]:
        pumped: set[str] = getattr(self.app, "pumped_topics", set())
        return {tp for tp in tps if tp.topic not in pumped}

    def _set_active_tps(self, tps: Any) -> Any:
        return super()._set_active_tps(self._fetched(tps))

    def resume_flow(self) -> None:
        super().resume_flow()
        self.app.progress.resumed()  # type: ignore[attr-defined]

    def resume_partitions(self, tps: Iterable[Any]) -> None:
        super().resume_partitions(self._fetched(tps))


# How long a flush (faust flushes on every revocation) waits for replies: one to a reply topic
# that is gone waits in aiokafka's accumulator for minutes, and held the revocation, the worker
# missed the rebalance and stayed out of the group.
REPLY_FLUSH_SECONDS = 5.0


async def bounded_flush(flush: Callable[[], Awaitable[None]], what: str, seconds: float) -> bool:
    """Wait for ``flush`` at most ``seconds``; False (logged) when it had not finished. What it
    was flushing is still sent: nothing waits for it any more, which is safe for replies (a
    batch's watermark is stored only after its own replies are acknowledged)."""
    try:
        await asyncio.wait_for(flush(), seconds)
    except TimeoutError:
        log.warning("%s not all delivered within %.0fs of a flush: going on", what, seconds)
        return False
    return True


# How long a step of the worker's start waits for a broker that went away meanwhile.
UNREACHABLE_WAIT_SECONDS = 300.0


async def while_unreachable(
    attempt: Callable[[], Awaitable[None]],
    what: str,
    *,
    wait: float = UNREACHABLE_WAIT_SECONDS,
    first_pause: float = 0.5,
) -> None:
    """Run ``attempt`` again, with growing pauses, while it fails because Kafka cannot be
    reached (a retriable error), for up to ``wait`` seconds; other errors pass through."""
    deadline = time.monotonic() + wait
    pause = first_pause
    while True:
        try:
            await attempt()
            return
        except KafkaError as exc:
            if not exc.retriable or time.monotonic() + pause > deadline:
                raise
            log.warning("%s: Kafka is not reachable (%r): retrying in %.1fs", what, exc, pause)
        await asyncio.sleep(pause)
        pause = min(pause * 2, 5.0)


class EngineProducer(faust_aiokafka.Producer):
    """faust's producer with a second aiokafka producer beside it, for clients' replies.

    aiokafka sends one request per broker at a time, so a reply or a lease queued behind a
    changelog request waited for that request's round trip. The two start and stop together,
    and :meth:`flush` (which faust calls before committing consumer offsets) flushes both, so a
    command is still committed only once its answer is in Kafka.
    """

    _replies: aiokafka.AIOKafkaProducer | None = None

    def replies(self) -> aiokafka.AIOKafkaProducer:
        """The producer of replies (faust's NotReady before the service started)."""
        if self._replies is None:
            raise NotReady("Producer service not yet started")
        return self._replies

    async def on_start(self) -> None:
        await super().on_start()
        replies = self._replies = self._new_producer()
        await replies.start()

    async def on_stop(self) -> None:
        replies, self._replies = self._replies, None
        if replies is not None:
            await replies.stop()  # sends what it holds first
        await super().on_stop()

    async def flush(self) -> None:
        if self._replies is not None:
            await bounded_flush(self._replies.flush, "replies", REPLY_FLUSH_SECONDS)
        await super().flush()

    async def create_topic(self, topic: str, partitions: int, replication: int, **kw: Any) -> None:
        # faust declares the changelog topics while the worker starts: a broker that goes away
        # just then (a restart) must not stop the worker.
        await while_unreachable(
            lambda: super(EngineProducer, self).create_topic(topic, partitions, replication, **kw),
            f"creating topic {topic}",
        )


class EngineApp(faust.App):
    """faust's App with *early tasks*: faust starts ``app.task`` coroutines only once table
    recovery is over, but the probes' heartbeat and the status announcements must run while a
    store is being restored (or a long restore fails the liveness probe and shows nothing)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._early_tasks: list[Callable[[], Awaitable[None]]] = []
        self.pumped_topics: set[str] = set()  # assigned by the group, never fetched by faust
        self.progress = AssignmentProgress()  # see FaustAssignment.settled

    def _new_consumer(self) -> Any:
        return PumpedConsumer(
            self.transport,
            callback=self.topics.on_message,
            on_partitions_revoked=self._on_partitions_revoked,
            on_partitions_assigned=self._on_partitions_assigned,
            beacon=self.beacon,
            loop=self.transport.loop,
        )

    def on_rebalance_start(self) -> None:
        self.progress.revoked()  # first: faust calls this as soon as a rebalance begins
        super().on_rebalance_start()

    async def _on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        self.progress.assignment()
        await super()._on_partitions_assigned(assigned, generation_id)

    def early_task(self, fun: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        """Run ``fun`` from the app's first start on (a decorator, like ``app.task``)."""
        self._early_tasks.append(fun)
        return fun

    def _new_producer(self) -> EngineProducer:
        return EngineProducer(self.transport, loop=self.loop, beacon=self.beacon)

    async def on_first_start(self) -> None:
        await super().on_first_start()
        for fun in self._early_tasks:
            self.add_future(fun())


def faust_credentials(kafka: dict[str, str]) -> CredentialsT | None:
    """faust's ``broker_credentials`` for ``engine.kafka``; None for a plaintext cluster."""
    security = kafka_security(kafka)
    if security is None:
        return None
    if security.mechanism is None:
        return SSLCredentials(security.ssl_context)
    return SASLCredentials(
        username=security.username,
        password=security.password,
        mechanism=security.mechanism,
        ssl_context=security.ssl_context,
    )


def _control_record(msg: Any) -> ControlRecord:
    raw = msg.headers
    pairs = list(raw.items()) if isinstance(raw, Mapping) else raw  # faust allows either
    return ControlRecord(
        msg.topic,
        msg.partition,
        msg.offset,
        msg.value,
        h.header_map(pairs),
        msg.key,
        int(msg.timestamp * 1000),
    )


def _event_record(msg: Any) -> RawRecord:
    """A faust message of an input topic as a RawRecord."""
    return RawRecord(msg.partition, msg.offset, int(msg.timestamp * 1000), msg.key, msg.value, {})


class FaustRuntime:
    """The faust application of one worker, with what the units declare on it."""

    def __init__(
        self,
        engine: EngineConfig,
        *,
        bootstrap: str,
        data_dir: Path,
        worker_name: str,
        session_timeout: float = 10.0,
        static_membership: bool = False,
    ) -> None:
        brokers = [f"kafka://{b.strip()}" for b in bootstrap.split(",") if b.strip()]
        restore: dict[str, Any] = {}
        if engine.restore == "batched":
            # Stores far behind their changelog are copied in bulk before faust's recovery.
            restore["TableManager"] = batched_table_manager(
                {"bootstrap.servers": bootstrap, **engine.kafka}
            )
        self.app = EngineApp(
            engine.app_id,
            broker=brokers,
            store="rocksdb://",
            datadir=str(data_dir),
            topic_replication_factor=engine.replication_factor,
            topic_disable_leader=True,
            web_enabled=False,
            consumer_auto_offset_reset="earliest",
            table_standby_replicas=0,
            broker_session_timeout=session_timeout,
            broker_heartbeat_interval=min(3.0, session_timeout / 4),
            broker_rebalance_timeout=max(30.0, session_timeout * 3),
            broker_commit_interval=1.0,
            stream_buffer_maxsize=max(4 * LOG_BATCH_MAX, 8192),
            stream_wait_empty=False,
            # aiokafka has one produce request in flight per broker, with one batch per
            # partition: 16 KiB batches (faust's default) capped a partition's changelog at
            # about 100 records per round trip (docs/benchmarks.md, issue 13).
            producer_max_batch_size=PRODUCER_BATCH_BYTES,
            # What the engine writes for a log record (its changelog form, a dead letter,
            # replies) is a little larger than the record: allow what the broker takes
            # (faust's default, 1,000,000, refused some of them; see LARGEST_LOG_RECORD).
            producer_max_request_size=MAX_RECORD_BYTES,
            broker_credentials=faust_credentials(engine.kafka),
            # Static membership (KIP-345): the worker name is the group member, so a worker that
            # restarts within the session timeout takes its own partitions back without a
            # rebalance; one that stops is only replaced once the session times out.
            consumer_group_instance_id=worker_name if static_membership else None,
            **restore,
        )
        slow = engine.slow_consumer
        self.sender = FaustSender(
            self.app,
            ReplyTopics(wait=slow.reply_topic_wait / 1000, max_bytes=slow.max_parked_bytes),
        )
        self.assignment = FaustAssignment(self.app)
        self._background: set[asyncio.Future[None]] = set()

    # -- what the units declare (Wiring) ----------------------------------------------------------

    def _raw_topic(self, name: str, partitions: int) -> Any:
        """A faust topic of raw bytes (keys and values are our own Avro or JSON)."""
        return self.app.topic(
            name,
            partitions=partitions,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
        )

    def table(self, name: str, partitions: int, rocksdb: RocksDBConfig | None = None) -> FaustTable:
        tuning: dict[str, Any] = {}
        if rocksdb is not None:
            tuning["options"] = {
                "block_cache_size": rocksdb.block_cache_size,
                "write_buffer_size": rocksdb.write_buffer_size,
                "max_write_buffer_number": rocksdb.max_write_buffer_number,
            }
        return FaustTable(
            self.app.Table(
                name,
                partitions=partitions,
                default=None,
                key_type=bytes,
                value_type=bytes,
                **tuning,
            )
        )

    def command_agent(self, topic: str, partitions: int, name: str, inbox: ControlInbox) -> None:
        async def forward_commands(stream: Any) -> None:
            # Acknowledged by whoever handles them (see sowstream.engine.commands).
            manual = stream.noack()
            async for event in manual.events():
                await inbox.put(
                    functools.partial(manual.ack, event), _control_record(event.message)
                )

        self.app.agent(self._raw_topic(topic, partitions), name=name)(forward_commands)

    def record_agent(
        self,
        topic: str,
        partitions: int,
        name: str,
        handle: Callable[[ControlRecord], Awaitable[None]],
    ) -> None:
        async def one_by_one(stream: Any) -> None:
            async for event in stream.events():
                await handle(_control_record(event.message))

        self.app.agent(self._raw_topic(topic, partitions), name=name)(one_by_one)

    def pumped_agent(
        self,
        topic: str,
        partitions: int,
        name: str,
        handle: Callable[[list[RawRecord]], Awaitable[None]],
    ) -> None:
        # The agent subscribes the group to the topic; the consumer never fetches it, so
        # ``handle`` sees nothing unless faust resumes it some way we missed (still correct:
        # the runners skip what they applied and read gaps themselves).
        self.app.pumped_topics.add(topic)

        async def in_batches(stream: Any) -> None:
            async for events in stream.take_events(INPUT_BATCH_MAX, INPUT_BATCH_WITHIN):
                await handle([_event_record(e.message) for e in events])

        self.app.agent(self._raw_topic(topic, partitions), name=name)(in_batches)

    def task(self, fun: Callable[[], Awaitable[None]]) -> None:
        self.app.task(fun)

    def background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- what the worker declares -----------------------------------------------------------------

    def early_task(self, fun: Callable[[], Awaitable[None]]) -> None:
        """Run ``fun`` from the start on, during table recovery too (probes, announcements)."""
        self.app.early_task(fun)

    def timer(self, interval: float, fun: Callable[[], Awaitable[None]]) -> None:
        """Run ``fun`` every ``interval`` seconds once the worker has started."""
        self.app.timer(interval=interval)(fun)

    def on_rebalance(self, *, assigned: Rebalance, revoked: Rebalance) -> None:
        """Call ``revoked``, then ``assigned``, with each rebalance's partitions."""

        async def on_revoked(sender: Any, revoked_tps: Any, **kwargs: Any) -> None:
            await revoked(Partitions(revoked_tps))

        async def on_assigned(sender: Any, assigned_tps: Any, **kwargs: Any) -> None:
            await assigned(Partitions(assigned_tps))

        self.app.on_partitions_revoked.connect(cast(Any, on_revoked))
        self.app.on_partitions_assigned.connect(cast(Any, on_assigned))

    def restore_progress(self) -> list[dict[str, Any]]:
        """Where each changelog partition's restore stands (``sowstream status``)."""
        return restore_progress(self.app)

    def run(self, log_level: str) -> None:
        """Run the faust worker until it is stopped (SIGINT/SIGTERM)."""
        worker = faust.Worker(self.app, loglevel=log_level, quiet=True, override_logging=False)
        # The registry, directory and queue followers block a default-executor thread in a poll
        # for as long as the worker runs; asyncio's default pool (cpu count + 4 threads) left
        # short calls (a watermark read, a flush) queued behind them for whole poll timeouts.
        worker.loop.set_default_executor(
            ThreadPoolExecutor(DEFAULT_EXECUTOR_THREADS, thread_name_prefix="sowstream-io")
        )
        worker.execute_from_commandline()
