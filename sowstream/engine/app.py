"""The worker: a faust application that owns SOW partitions, fed by the log and control topics.

Per SOW topic it declares the log topic, the control topic and (for persistent topics) a RocksDB
table with a changelog, all with the same partition count, so faust assigns partition p of each to
the same worker. Kafka topics the engine needs are created up front with confluent-kafka.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import faust
import orjson
from aiokafka.errors import KafkaError
from confluent_kafka import (
    KafkaException,
    Producer,
)
from confluent_kafka.admin import AdminClient

from sowstream.config.conflated import ConflatedTopicConfig
from sowstream.config.models import TopicConfig
from sowstream.config.queues import QUEUE_MESSAGE_TYPES
from sowstream.config.root import SowstreamConfig
from sowstream.config.views import ViewConfig
from sowstream.engine import metrics
from sowstream.engine.commands import CommandInbox, runs
from sowstream.engine.conflated import ConflatedRunner
from sowstream.engine.directory import TopicDirectory
from sowstream.engine.health import BEAT_SECONDS, Health, Readiness, serve
from sowstream.engine.partition import PartitionMoved
from sowstream.engine.processor import RawRecord, Sender, TopicProcessor
from sowstream.engine.pump import LOG_BATCH_MAX, KafkaLogReader, LogPump
from sowstream.engine.queue_views import QueueViewFeed
from sowstream.engine.queues import NO_ANSWER, QueueRuntime
from sowstream.engine.registry import SubscriptionRegistry
from sowstream.engine.restore import batched_table_manager, restore_progress
from sowstream.engine.security import expand_environment, faust_credentials
from sowstream.engine.seed import ingest_seed
from sowstream.engine.slow import SlowConsumerWatch
from sowstream.engine.views import ViewRunner
from sowstream.errors import InvalidCommandError, KafkaUnreachableError, SowstreamError
from sowstream.filters import FilterError
from sowstream.queues.machine import Bookmark
from sowstream.subscriptions.model import SUBSCRIBE_COMMANDS, SubscriptionSpec
from sowstream.views.conflated import ConflatedFeed
from sowstream.views.projection import TopicRef
from sowstream.views.routing import ViewFeed, input_partitions
from sowstream.wire import headers as h
from sowstream.wire.avro import encode
from sowstream.wire.kafka import TopicSpec, ensure_topics, producer_config
from sowstream.wire.protocol import Command
from sowstream.wire.topics import TopicNames, kafka_topic_part, topic_ident

log = logging.getLogger("sowstream.engine")
KAFKA_PROBE_SECONDS = 10.0  # one attempt to reach Kafka at start
ANNOUNCE_SECONDS = 2.0  # how often a worker announces itself on the workers topic

PRODUCER_BATCH_BYTES = 512 * 1024  # under Kafka's default 1 MB message.max.bytes per batch
VIEW_BATCH_MAX = 2_000  # change events a view maintainer applies and stores in one go
VIEW_BATCH_WITHIN = 0.01  # seconds a view maintainer waits to fill a batch
VIEW_INPUT_RETENTION_MS = 7 * 24 * 3_600_000  # change events only matter until applied
CONFLATION_TICK = 0.02
REPLY_METADATA_WAIT = 5.0
GC_THRESHOLDS = (50_000, 20, 100)  # CPython's defaults are (700, 10, 10)


class FaustSender(Sender):
    """Produces through the faust app's own producer, so faust flushes it before committing."""

    def __init__(self, app: faust.App) -> None:
        self._app = app
        self._gone = _GoneTopics()
        self._tracked: set[str] = set()  # topics aiokafka keeps metadata for (see send)
        # Told when a client's reply topic disappears, so its subscriptions can go too.
        self.on_gone: Callable[[str], None] | None = None

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

    async def send_many(
        self, topic: str, partition: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> list[tuple[asyncio.Future[Any], int]]:
        # aiokafka's send costs ~8 us of event-loop CPU per record (a future, a batch lookup);
        # filling its batches here costs ~1 us (docs/benchmarks.md, issue 13).
        producer = self._app.producer._ensure_producer()  # type: ignore[attr-defined]
        if topic not in self._tracked:
            track_topic(producer, topic)
            self._tracked.add(topic)
        out: list[tuple[asyncio.Future[Any], int]] = []
        batch, count = producer.create_batch(), 0
        for key, value in records:
            if batch.append(key=key, value=value, timestamp=None) is None:
                # Full (a first record always fits): queue it, after the batches before it.
                out.append((await producer.send_batch(batch, topic, partition=partition), count))
                batch, count = producer.create_batch(), 0
                batch.append(key=key, value=value, timestamp=None)
            count += 1
        if count:
            out.append((await producer.send_batch(batch, topic, partition=partition), count))
        return out

    def prepare(self, topic: str) -> None:
        # The first send to a topic otherwise waits for its metadata (100 ms and more), and
        # meanwhile holds up every other lease of the queue's delivery loop.
        if topic in self._tracked:
            return
        producer = self._app.producer._ensure_producer()  # type: ignore[attr-defined]
        track_topic(producer, topic)
        self._tracked.add(topic)

    def forget_gone(self, topic: str) -> None:
        """``topic`` turned out to exist: send replies to it again."""
        self._gone.discard(topic)

    async def send_reply(
        self, topic: str, value: bytes, headers: list[tuple[str, bytes]] | None = None
    ) -> asyncio.Future[Any] | None:
        # A client deletes its reply topic on close; answers still in flight for it would make
        # the producer wait for the topic's metadata for its whole request timeout (minutes).
        if topic in self._gone:
            return None
        producer = self._app.producer._ensure_producer()  # type: ignore[attr-defined]
        if producer.client.cluster.partitions_for_topic(topic):
            # Metadata is cached, so the send cannot wait on it: skip the timeout's task (this is
            # the hot path of subscription fan-out).
            return await self.send(topic, value, headers=headers)
        try:
            return await asyncio.wait_for(
                self.send(topic, value, headers=headers), REPLY_METADATA_WAIT
            )
        except (TimeoutError, KafkaError) as exc:
            self._gone.add(topic)
            log.info(
                "dropped replies to %s: the client's reply topic is gone (%s)",
                topic,
                type(exc).__name__,
            )
            if self.on_gone is not None:
                self.on_gone(topic)
            return None


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


class _GoneTopics:
    """Reply topics found missing recently: replies to them are dropped without waiting."""

    def __init__(self, ttl: float = 60.0) -> None:
        self._ttl = ttl
        self._until: dict[str, float] = {}

    def __contains__(self, topic: str) -> bool:
        until = self._until.get(topic)
        if until is None:
            return False
        if until < time.monotonic():
            del self._until[topic]
            return False
        return True

    def add(self, topic: str) -> None:
        self._until[topic] = time.monotonic() + self._ttl

    def discard(self, topic: str) -> None:
        self._until.pop(topic, None)


def _event_record(msg: Any) -> RawRecord:
    """A faust message of a view's input topic as a RawRecord."""
    return RawRecord(msg.partition, msg.offset, int(msg.timestamp * 1000), msg.key, msg.value, {})


def _decode_command(msg: Any) -> Command | None:
    """A control-topic record as a Command, or None (logged) when it is not one."""
    try:
        return Command.decode(msg.value)
    except Exception as exc:  # anything a foreign producer may send
        log.warning(
            "ignored undecodable command on %s[%d]@%d: %s",
            msg.topic,
            msg.partition,
            msg.offset,
            exc,
        )
        return None


def settle_garbage_collector() -> None:
    """Keep full garbage collections off the apply path once the worker is up.

    A full (generation 2) collection walks every tracked object and stops the event loop while
    it does: with faust, aiokafka and our state loaded that was 60-250 ms every few seconds under
    load, nearly all of it finding nothing to free (docs/benchmarks.md). Freezing what exists at
    start-up takes those objects out of every later collection, and larger thresholds make the
    collections that remain rarer; cycles are still collected.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class EngineApp(faust.App):
    """faust's App with *early tasks*: faust starts ``app.task`` coroutines only once table
    recovery is over, but the probes' heartbeat and the status announcements must run while a
    store is being restored (or a long restore fails the liveness probe and shows nothing)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._early_tasks: list[Callable[[], Awaitable[None]]] = []

    def early_task(self, fun: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        """Run ``fun`` from the app's first start on (a decorator, like ``app.task``)."""
        self._early_tasks.append(fun)
        return fun

    async def on_first_start(self) -> None:
        await super().on_first_start()
        for fun in self._early_tasks:
            self.add_future(fun())


class Engine:
    """Builds the faust app for a configuration; ``run()`` blocks until the worker stops."""

    def __init__(
        self,
        config: SowstreamConfig,
        *,
        bootstrap: str,
        worker_name: str | None = None,
        data_dir: str | Path | None = None,
        session_timeout: float = 10.0,
        log_level: str = "info",
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        seed_dir: str | Path | None = None,
        static_membership: bool = False,
    ) -> None:
        if config.views or config.conflated_topics:
            # A view or conflated topic is a SOW topic to readers: its log, control topic,
            # table and processor are made like any declared topic's.
            derived = (
                *config.conflated_topic_configs,
                *config.view_topics,
                *config.queue_view_topics.values(),  # a queue's available messages, for views
            )
            config = config.model_copy(update={"topics": (*config.topics, *derived)})
        # Secrets stay out of the config file: ${NAME} in engine.kafka reads the environment.
        engine = config.engine.model_copy(update={"kafka": expand_environment(config.engine.kafka)})
        config = config.model_copy(update={"engine": engine})
        self.config = config
        self.seed_dir = Path(seed_dir) if seed_dir is not None else None
        self.tables: dict[str, Any] = {}
        self.metrics_port = metrics_port if metrics_port is not None else config.engine.web_port
        self.metrics_host = metrics_host
        self.health = Health()
        self._started = time.time()
        self._assigned = False  # faust handed this worker its first assignment
        self.bootstrap = bootstrap
        self.names = TopicNames(config.engine.topic_prefix)
        self.worker_name = worker_name or socket.gethostname()
        base_dir = Path(data_dir or config.engine.data_dir)
        # One directory per engine and worker: RocksDB locks a partition database per process.
        self.data_dir = base_dir / config.engine.app_id / self.worker_name
        self.log_level = log_level
        brokers = [f"kafka://{b.strip()}" for b in bootstrap.split(",") if b.strip()]
        restore: dict[str, Any] = {}
        if config.engine.restore == "batched":
            # Stores far behind their changelog are copied in bulk before faust's recovery.
            restore["TableManager"] = batched_table_manager(
                {"bootstrap.servers": bootstrap, **config.engine.kafka}
            )
        self.app = EngineApp(
            config.engine.app_id,
            broker=brokers,
            store="rocksdb://",
            datadir=str(self.data_dir),
            topic_replication_factor=config.engine.replication_factor,
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
            broker_credentials=faust_credentials(config.engine.kafka),
            # Static membership (KIP-345): the worker name is the group member, so a worker that
            # restarts within the session timeout takes its own partitions back without a
            # rebalance; one that stops is only replaced once the session times out.
            consumer_group_instance_id=self.worker_name if static_membership else None,
            **restore,
        )
        self.sender = FaustSender(self.app)
        self.sender.on_gone = self._reply_topic_missing
        self.processors: dict[str, TopicProcessor] = {}
        self.pumps: list[LogPump] = []
        self.registry = SubscriptionRegistry(
            bootstrap, self.names.subscriptions, config.engine.kafka, self._registration
        )
        self.slow_consumers = SlowConsumerWatch(
            bootstrap,
            config.engine.kafka,
            config.engine.slow_consumer,
            lambda: self.processors.values(),
            lambda spec: self.registry.write(spec, remove=True),
            lambda: {c for q in self.queues.values() for c in q.clients()},
            self._client_gone,
        )
        # Plain topics feeding a queue keep a store too: the queue's messages and the position.
        # Queues read json topics only (config.queues.QUEUE_MESSAGE_TYPES).
        self._queue_views = config.queue_view_topics
        kept = {t.ident for t in self._queue_views.values()}
        self._fed = {
            t.ident
            for t in config.topics
            if t.message_type in QUEUE_MESSAGE_TYPES
            and t.ident not in kept
            and any(q.matches_topic(t.name) for q in config.queues)
        }
        self._inboxes: list[tuple[TopicProcessor, CommandInbox]] = []
        for topic in config.topics:
            self._wire(topic)
        self._static_pumps = list(self.pumps)
        self._wire_auto_topics()
        self.queues: dict[str, QueueRuntime] = {}
        self._tasks: set[asyncio.Future[None]] = set()
        self._admin: AdminClient | None = None
        for queue in config.queues:
            runtime = QueueRuntime(
                queue,
                self.names,
                self.sender,
                self._store_queue_changes,
                self._read_queue_store,
                config.entitlement_lookup(queue.name),
            )
            self.queues[queue.name] = runtime
            for proc in self.processors.values():
                if proc.topic.ident in self._fed and runtime.feeds_on(proc.topic.name):
                    proc.queues.append(runtime)
            available = self._queue_views.get(queue.name)
            if available is not None:
                self.processors[available.ident].view_name = queue.name
                runtime.view_feed = QueueViewFeed(
                    runtime.machine,
                    queue.name,
                    self.names.log(available.name, available.message_type),
                    self.sender,
                )
        self.view_runners: dict[str, ViewRunner] = {}
        for view in config.views:
            self._wire_view(view)
        self.conflated_runners: dict[str, ConflatedRunner] = {}
        for conflated, own in zip(
            config.conflated_topics, config.conflated_topic_configs, strict=True
        ):
            self._wire_conflated(conflated, own)
        self._wire_lifecycle()

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

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` soon, keeping a reference so the task is not collected midway."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _store_queue_changes(
        self, topic: str, partition: int, changes: Mapping[bytes, bytes | None]
    ) -> bool:
        return await self.processors[topic].store_changes(partition, changes)

    def _read_queue_store(self, topic: str, partition: int, key: bytes) -> bytes | None:
        return self.processors[topic].stored(partition, key)

    def _wire(self, topic: TopicConfig) -> None:
        app = self.app
        ctl_topic = self._raw_topic(
            self.names.control(topic.name, topic.message_type), topic.partitions
        )
        table = None
        if topic.durability == "persistent" and (topic.sow or topic.ident in self._fed):
            rocks = self.config.engine.rocksdb
            table = app.Table(
                f"sow-{topic.kafka_name}",
                partitions=topic.partitions,
                default=None,
                options={
                    "block_cache_size": rocks.block_cache_size,
                    "write_buffer_size": rocks.write_buffer_size,
                    "max_write_buffer_number": rocks.max_write_buffer_number,
                },
                key_type=bytes,
                value_type=bytes,
            )
            self.tables[topic.ident] = table
        proc = self._processor(topic, table, ctl_topic.get_topic_name()).proc

        inbox = CommandInbox()
        self._inboxes.append((proc, inbox))

        async def forward_commands(stream: Any) -> None:
            # Acknowledged by _run_commands once handled (see sowstream.engine.commands).
            manual = stream.noack()
            async for event in manual.events():
                await inbox.put(manual, event)

        app.agent(ctl_topic, name=f"sowstream.ctl.{topic.ident}")(forward_commands)

    def _wire_view(self, view: ViewConfig) -> None:
        """A view's maintainer: its input topic, its state table and the agent between them;
        and the feeds that make its underlying topics' processors fill the input topic."""
        app = self.app
        own = view.topic_config()
        self.processors[own.ident].view_name = view.name
        partitions = input_partitions(view)
        input_name = self.names.view_input(view.name, view.message_type)
        rocks = self.config.engine.rocksdb
        table = app.Table(
            f"view-{own.kafka_name}",
            partitions=partitions,
            default=None,
            options={
                "block_cache_size": rocks.block_cache_size,
                "write_buffer_size": rocks.write_buffer_size,
                "max_write_buffer_number": rocks.max_write_buffer_number,
            },
            key_type=bytes,
            value_type=bytes,
        )
        runner = ViewRunner(
            view,
            self.sender,
            table,
            KafkaLogReader(self.bootstrap, input_name, self.config.engine.kafka),
            input_topic=input_name,
            log_topic=self.names.log(view.name, view.message_type),
            codec=own.codec,
        )
        self.view_runners[own.ident] = runner
        for ref in view.topics:
            # A queue's available messages change without a log of their own: only real
            # changes count (a restated message is no change, see engine.queue_views).
            queue = ref.topic in self._queue_views
            feed = ViewFeed(view, ref.topic, input_name, only_changes=queue)
            self._underlying(ref).views.append(feed)
        input_topic = self._raw_topic(input_name, partitions)

        async def maintain(stream: Any) -> None:
            async for events in stream.take_events(VIEW_BATCH_MAX, VIEW_BATCH_WITHIN):
                await runner.handle([_event_record(e.message) for e in events])

        app.agent(input_topic, name=f"sowstream.view.{own.ident}")(maintain)

    def _wire_conflated(self, conflated: ConflatedTopicConfig, own: TopicConfig) -> None:
        """A conflated topic (``own`` as a SOW topic): its input topic, its table of flushed
        positions, the agent that folds the input in, the task that flushes every Interval, and
        the feed that makes the underlying topic's processor (a SOW topic's, a view's or another
        conflated topic's) fill the input topic."""
        app = self.app
        underlying = self.config.topic(conflated.underlying_topic, own.message_type)
        self.processors[own.ident].view_name = conflated.name
        input_name = self.names.view_input(conflated.name, own.message_type)
        table = app.Table(
            f"conflated-{own.kafka_name}",
            partitions=conflated.partitions,
            default=None,
            key_type=bytes,
            value_type=bytes,
        )
        runner = ConflatedRunner(
            conflated,
            self.sender,
            table,
            KafkaLogReader(self.bootstrap, input_name, self.config.engine.kafka),
            input_topic=input_name,
            log_topic=self.names.log(conflated.name, own.message_type),
            codec=own.codec,
            pattern=own.pattern is not None,
        )
        self.conflated_runners[own.ident] = runner
        self.processors[underlying.ident].views.append(ConflatedFeed(conflated, input_name))
        input_topic = self._raw_topic(input_name, conflated.partitions)

        async def fold(stream: Any) -> None:
            async for events in stream.take_events(VIEW_BATCH_MAX, VIEW_BATCH_WITHIN):
                await runner.handle([_event_record(e.message) for e in events])

        app.agent(input_topic, name=f"sowstream.conflated.{own.ident}")(fold)

        async def flush_every_interval() -> None:
            await runner.run()

        app.task(flush_every_interval)

    def _underlying(self, ref: TopicRef) -> TopicProcessor:
        """The processor of a view's underlying topic (json when the reference names no type
        and topics of several types share the name); for a queue, the topic of its available
        messages."""
        if ref.topic in self._queue_views:
            return self.processors[self._queue_views[ref.topic].ident]
        if ref.message_type is not None:
            return self.processors[topic_ident(ref.topic, ref.message_type)]
        found = [p for p in self.processors.values() if p.topic.name == ref.topic]
        json = [p for p in found if p.topic.message_type == "json"]
        return (json or found)[0]

    def _processor(self, topic: TopicConfig, table: Any, ctl_topic: str) -> LogPump:
        """The processor of ``topic`` and the pump that feeds it from its log (registered)."""
        reader = KafkaLogReader(
            self.bootstrap, self.names.log(topic.name, topic.message_type), self.config.engine.kafka
        )
        proc = TopicProcessor(
            topic,
            self.names,
            self.sender,
            table=table,
            log_reader=reader,
            entitlement=self.config.entitlement_lookup(topic.name),
        )
        self.processors[topic.ident] = proc
        pump = LogPump(self, proc, ctl_topic)
        self.pumps.append(pump)
        return pump

    # -- topics in no configuration ---------------------------------------------------------------

    def _wire_auto_topics(self) -> None:
        """The shared control topic of topics created on first use, and the directory of them.

        They are plain topics with one partition count, so one control topic (co-partitioned
        with their logs) serves them all, and faust's subscription never has to change.
        """
        self._declared = {t.name for t in self.config.topics} | {q.name for q in self.config.queues}
        # Registrations for topics not known (yet): applied when the topic turns up.
        self._unplaced: dict[str, dict[str, SubscriptionSpec]] = {}
        self.directory = TopicDirectory(
            self.bootstrap, self.names.meta, self.config.engine.kafka, self._add_auto
        )
        auto_ctl = self._raw_topic(
            self.names.auto_control, self.config.engine.auto_topic_partitions
        )

        async def answer_auto(stream: Any) -> None:
            async for event in stream.events():
                await self._auto_command(event)

        self.app.agent(auto_ctl, name="sowstream.ctl-auto")(answer_auto)

    def _auto_topic(self, name: str) -> TopicConfig:
        """The definition every topic created on first use has: plain, no Key."""
        return TopicConfig(
            name=name, sow=False, partitions=self.config.engine.auto_topic_partitions
        )

    def _add_auto(self, name: str) -> None:
        """Serve ``name``, a topic created on first use (found on the meta topic or just made)."""
        if name in self.processors or name in self._declared:
            return
        try:
            topic = self._auto_topic(name)
        except ValueError as exc:  # a definition some other writer put on the meta topic
            log.warning("ignored auto-created topic %r: %s", name, exc)
            return
        pump = self._processor(topic, None, self.names.auto_control)
        for spec in self._unplaced.pop(name, {}).values():
            pump.proc.subs.upsert(spec, held=pump.proc.partitions)
        self._background(self._run_pump(pump))
        log.info("serving topic %s (created on first use)", name)

    async def _run_pump(self, pump: LogPump) -> None:
        await self.registry.loaded.wait()  # subscriptions first, as for configured topics
        await pump.run()

    def _auto_refusal(self, name: str) -> str | None:
        """Why ``name`` may not be created on first use, or None."""
        try:
            owner = self.config.pattern_topic_for(name)
        except InvalidCommandError as exc:
            return str(exc)
        if owner is not None:
            return (
                f"topic {name!r} matches the Pattern {owner.pattern!r} of topic {owner.name!r}: "
                "its records go to that regular expression topic (publish with the name in the "
                f"{h.TOPIC} header to {self.names.log(owner.name, owner.message_type)})"
            )
        if not self.config.engine.auto_create_topics:
            return (
                f"topic {name!r} is not declared and engine.auto_create_topics is false: declare "
                "it under sow: or topics: in the configuration, or set "
                "engine.auto_create_topics: true"
            )
        try:
            self._auto_topic(name)
        except ValueError as exc:
            problem = "; ".join(e["msg"] for e in getattr(exc, "errors", lambda: [])())
            return f"topic {name!r} cannot be created: {problem or exc}"
        known = [*self.config.topics, *(p.topic for p in self.processors.values())]
        taken = {t.kafka_name: t for t in known}
        other = taken.get(kafka_topic_part(name, "json"))
        if other is not None and other.ident != name:
            return (
                f"topic {name!r} cannot be created: it would share the Kafka topics of "
                f"{other.ident!r} ({self.names.log(other.name, other.message_type)})"
            )
        return None

    async def _auto_command(self, event: Any) -> None:
        """A command on the shared control topic: create a topic, or one for a created topic."""
        msg = event.message
        cmd = _decode_command(msg)
        if cmd is None:
            return
        if cmd["command"] == h.DECLARE_TOPIC:
            await self._declare(cmd, msg.partition)
            return
        proc = self.processors.get(cmd["topic"])
        if proc is None:
            await self.directory.caught_up()  # created by another worker a moment ago?
            proc = self.processors.get(cmd["topic"])
        if proc is None:
            body = {
                "command": "part_end",
                "command_id": cmd["command_id"],
                "query_id": cmd.get("query_id") or "",
                "topic": cmd["topic"],
                "partition": msg.partition,
                "status": "failure",
                "reason": "unknown_topic",
                "message": f"topic {cmd['topic']!r} is not known to the engine",
            }
            await self.sender.send_reply(cmd["reply_to"], encode("Reply", body))
            return
        await self._answer(proc, cmd, msg.partition)

    async def _declare(self, cmd: Command, partition: int) -> None:
        """Create a topic on first use (or refuse to), then acknowledge: its definition is on the
        meta topic by then, so the client can read it at once."""
        name = cmd["topic"]
        answer = {
            "command": "ack",
            "command_id": cmd["command_id"],
            "topic": name,
            "partition": partition,
            "log_offset": -1,
            "count": 1,
        }
        problem = None
        if name not in self.processors and name not in self._declared:
            problem = self._auto_refusal(name)
            if problem is None:
                try:
                    await self._create_auto(name)
                except (SowstreamError, KafkaException) as exc:
                    problem = f"topic {name!r} could not be created: {exc}"
        if problem is not None:
            answer.update(status="failure", reason="not_declared", message=problem, count=0)
        await self.sender.send_reply(cmd["reply_to"], encode("Reply", answer))

    async def _create_auto(self, name: str) -> None:
        """Create the log of topic ``name`` and publish its definition (``auto`` set)."""
        loop = asyncio.get_running_loop()
        topic = self._auto_topic(name)
        spec = log_topic_spec(self.names, name, topic.partitions)
        await loop.run_in_executor(
            None,
            lambda: ensure_topics(
                self.bootstrap,
                [spec],
                replication_factor=self.config.engine.replication_factor,
                extra=self.config.engine.kafka,
            ),
        )
        info = topic_info(topic, self.names, auto=True)
        await loop.run_in_executor(None, self._write_meta, {name: info})
        self._add_auto(name)
        log.info("created topic %s on first use (engine.auto_create_topics)", name)

    def _write_meta(self, infos: Mapping[str, dict[str, Any]]) -> None:
        """Publish topic definitions to the meta topic and wait until Kafka has them."""
        producer = Producer(producer_config(self.bootstrap, self.config.engine.kafka))
        for name, info in infos.items():
            producer.produce(self.names.meta, key=name.encode(), value=encode("TopicInfo", info))
        if producer.flush(30) != 0:
            raise SowstreamError("could not publish topic definitions to the meta topic")

    def _registration(self, key: str, spec: SubscriptionSpec | None) -> None:
        """A registry record arrived: start, change or stop a subscription."""
        # The key ends with the topic's identity (SubscriptionSpec.key): its name, or
        # <type>:<name> for a message type other than json.
        topic = spec.ident if spec is not None else key.rsplit("|", 1)[-1]
        queue = self.queues.get(topic)
        if queue is not None:
            if spec is None:
                self._background(queue.unsubscribe(key))
                return
            try:
                queue.subscribe(spec)
            except (FilterError, ValueError) as exc:
                log.warning("ignored queue subscription %s: %s", key, exc)
            return
        proc = self.processors.get(topic)
        if proc is None:
            # Maybe a topic created on first use that this worker has not read about yet.
            if spec is None:
                self._unplaced.get(topic, {}).pop(key, None)
            else:
                self._unplaced.setdefault(topic, {})[key] = spec
            return
        if spec is None:
            proc.unsubscribe(key)
            return
        try:
            proc.subs.upsert(spec, held=proc.partitions)
        except (FilterError, InvalidCommandError) as exc:
            log.warning("ignored registration %s: %s", key, exc)

    def _reply_topic_missing(self, reply_to: str) -> None:
        """A reply could not be sent: make sure the client is really gone before acting."""
        self._background(self._confirm_gone(reply_to))

    async def _confirm_gone(self, reply_to: str) -> None:
        loop = asyncio.get_running_loop()
        exists = await loop.run_in_executor(None, self._topic_exists, reply_to)
        if not exists:
            self._client_gone(reply_to)
            return
        # Only its metadata was slow to come: replies flow again, and queue messages whose
        # delivery was dropped meanwhile go back to the queue for another one.
        log.info("reply topic %s is there after all: keeping its client", reply_to)
        self.sender.forget_gone(reply_to)
        for queue in self.queues.values():
            await queue.redeliver(reply_to)

    def _topic_exists(self, topic: str) -> bool:
        if self._admin is None:
            self._admin = AdminClient(
                {"bootstrap.servers": self.bootstrap, "log_level": 3, **self.config.engine.kafka}
            )
        try:
            found = self._admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        except KafkaException:
            return True  # cannot tell: do not drop a client on a broker hiccup
        return found is not None and found.error is None

    def _client_gone(self, reply_to: str) -> None:
        """A client's reply topic vanished (it crashed or closed): end its subscriptions."""
        for queue in self.queues.values():
            for spec in queue.specs(reply_to):
                self.registry.write(spec, remove=True)
            self._background(queue.disconnect(reply_to))
        for proc in self.processors.values():
            for spec in proc.subs.remove_client(reply_to):
                self.registry.write(spec, remove=True)
                metrics.SUBSCRIPTIONS_DROPPED.labels("client_gone").inc()

    async def _run_commands(self, proc: TopicProcessor, inbox: CommandInbox) -> None:
        """Handle the commands of ``proc``'s control topic, batch by batch, for ever."""
        while True:
            batch = await inbox.take()
            try:
                await self._commands(proc, [event.message for _, event in batch])
            except Exception:  # one bad batch must not stop every later command
                log.exception("topic %s: handling commands failed", proc.topic.name)
            for stream, event in batch:
                await stream.ack(event)

    async def _commands(self, proc: TopicProcessor, messages: list[Any]) -> None:
        """Handle control-topic records in order; consecutive queue acknowledgements together."""
        commands: list[tuple[Command, int]] = []
        for msg in messages:
            cmd = _decode_command(msg)
            if cmd is not None:
                commands.append((cmd, msg.partition))
        for run in runs(commands, self._is_queue_ack):
            try:
                if run.together:
                    await self._queue_acks(proc, run.items)
                else:
                    await self._answer(proc, *run.items[0])
            except Exception:
                log.exception(
                    "topic %s: command %s failed", proc.topic.name, run.items[0][0]["command_id"]
                )

    def _is_queue_ack(self, item: tuple[Command, int]) -> bool:
        cmd = item[0]
        return cmd["command"] == "queue_ack" and cmd["topic"] in self.queues

    async def _answer(self, proc: TopicProcessor, cmd: Command, partition: int) -> None:
        """Answer one partition's share of a command about ``proc``'s topic."""
        queue = self.queues.get(cmd["topic"]) if proc.topic.ident in self._fed else None
        if cmd["command"] == "status":
            row = {**await proc.partition_status(partition), "worker": self.worker_name}
            base = {
                "command_id": cmd["command_id"],
                "query_id": cmd.get("query_id") or "",
                "topic": proc.topic.name,
                "partition": partition,
            }
            await self._send_rows(proc, cmd["reply_to"], base, [("", orjson.dumps(row), 0)])
        elif queue is not None:
            await self._queue_command(proc, queue, cmd, partition)
        elif cmd["command"] == "sow":
            await proc.query(cmd, partition)
        elif cmd["command"] in SUBSCRIBE_COMMANDS:
            await proc.subscribe(cmd, partition)
        else:
            await proc.reply(
                cmd["reply_to"],
                {
                    "command": "part_end",
                    "command_id": cmd["command_id"],
                    "query_id": cmd.get("query_id") or "",
                    "topic": proc.topic.name,
                    "partition": partition,
                    "status": "failure",
                    "reason": "unknown_command",
                    "message": f"unknown command {cmd['command']!r}",
                },
            )

    async def _queue_acks(self, proc: TopicProcessor, commands: list[tuple[Command, int]]) -> None:
        """Apply ``queue_ack`` commands together: per queue one pass and one store write per log
        partition; then each command is answered (unless it asked for no answer)."""
        by_queue: dict[str, list[tuple[Command, int]]] = {}
        for cmd, partition in await self._held_acks(proc, commands):
            by_queue.setdefault(cmd["topic"], []).append((cmd, partition))
        for name, acks in by_queue.items():
            outcomes = await self.queues[name].acknowledge_all(acks, proc.topic.name)
            for (cmd, partition), outcome in zip(acks, outcomes, strict=True):
                if outcome is None:
                    # Not stored (the partition moved meanwhile): no answer, so no client takes
                    # it as done; the command is read again by the partition's next owner.
                    log.info(
                        "topic %s partition %d: queue ack left to the next owner",
                        proc.topic.name,
                        partition,
                    )
                    continue
                if (cmd.get("options") or {}).get("ack_type") == NO_ANSWER:
                    continue
                base = {
                    "command": "ack",
                    "command_id": cmd["command_id"],
                    "query_id": cmd.get("query_id") or "",
                    # One answer per log partition: a command read twice after a rebalance is
                    # answered twice, and the client counts (topic, partition) once.
                    "topic": proc.topic.name,
                    "partition": partition,
                }
                if isinstance(outcome, InvalidCommandError):
                    answer = {
                        **base,
                        "topic": name,
                        "status": "failure",
                        "reason": "invalid",
                        "message": str(outcome),
                    }
                else:
                    count, results = outcome
                    answer = {
                        **base,
                        "log_offset": 0,
                        "count": count,
                        "message": orjson.dumps(results).decode(),
                    }
                await proc.reply(cmd["reply_to"], answer)

    async def _held_acks(
        self, proc: TopicProcessor, commands: list[tuple[Command, int]]
    ) -> list[tuple[Command, int]]:
        """The acknowledgements this worker applies: those of log partitions it holds, once each
        is loaded and has applied the messages they name (``caught_up``). An ack applied
        earlier would be taken for one sent ahead of its message: deferred, answered 0, and the
        message dropped as acknowledged when the partition loads it or reads it from the log.
        The others are left unanswered, for the partition's owner (a read again) to answer."""
        highest: dict[int, int] = {}
        for cmd, partition in commands:
            top = highest.get(partition, -1)
            for text in ((cmd.get("options") or {}).get("bookmarks") or "").split(","):
                try:
                    b = Bookmark.parse(text)
                except ValueError:
                    continue  # refused with its reason by the queue
                if b.topic == proc.topic.name and b.partition == partition:
                    top = max(top, b.offset)
            highest[partition] = top
        held = set()
        for partition, offset in sorted(highest.items()):
            if not self._holds(proc, partition):
                log.info(
                    "topic %s partition %d: not held here, its queue acknowledgements are left "
                    "to its owner",
                    proc.topic.name,
                    partition,
                )
                continue
            try:
                await proc.caught_up(partition, offset)
            except PartitionMoved:
                continue
            except SowstreamError as exc:
                log.warning(
                    "topic %s: queue acknowledgements left unanswered: %s", proc.topic.name, exc
                )
                continue
            held.add(partition)
        return [item for item in commands if item[1] in held]

    def _holds(self, proc: TopicProcessor, partition: int) -> bool:
        """Whether faust has assigned this worker ``proc``'s control partition ``partition`` (so
        its log partition) and is not rebalancing or recovering: only then may a command load
        it (during a rebalance the assignment still lists partitions already revoked)."""
        app = self.app
        if app.in_recovery or app.rebalancing:
            return False
        ctl = next((pump.ctl_topic for pump in self.pumps if pump.proc is proc), None)
        return any(
            tp.topic == ctl and tp.partition == partition for tp in app.assignor.assigned_actives()
        )

    async def _queue_command(
        self, proc: TopicProcessor, queue: QueueRuntime, cmd: Command, partition: int
    ) -> None:
        """A command on a queue, answered for the queue messages of one log partition."""
        base = {
            "command_id": cmd["command_id"],
            "query_id": cmd.get("query_id") or "",
            "topic": queue.name,
            "partition": partition,
        }
        reply_to = cmd["reply_to"]
        command = cmd["command"]
        try:
            if command == "sow":
                found = queue.browse(
                    proc.topic.name, partition, cmd.get("filter"), cmd.get("identity") or ""
                )
            elif command == "queue_status":
                status = queue.status(proc.topic.name, partition)
                found = [("", orjson.dumps({"topic": proc.topic.name, **status}), 0)]
            else:
                raise InvalidCommandError(
                    f"{command} is not available on queue {queue.name!r}: use subscribe to "
                    "lease its messages and sow to browse them"
                )
        except (InvalidCommandError, FilterError) as exc:
            failure = {**base, "status": "failure", "reason": "invalid", "message": str(exc)}
            await proc.reply(reply_to, {**failure, "command": "part_end"})
            return
        await self._send_rows(proc, reply_to, base, found)

    @staticmethod
    async def _send_rows(
        proc: TopicProcessor,
        reply_to: str,
        base: dict[str, Any],
        found: list[tuple[str, bytes, int]],
    ) -> None:
        """Answer one partition's share of a command with ``(key, data, timestamp)`` rows."""
        records = [
            {"sow_key": key, "data": data, "timestamp": ts, "log_offset": -1}
            for key, data, ts in found
        ]
        answer = {**base, "answer_id": uuid.uuid4().hex[:12]}
        for start in range(0, len(records), 500):
            await proc.reply(
                reply_to, {**answer, "command": "sow", "records": records[start : start + 500]}
            )
        await proc.reply(reply_to, {**answer, "command": "part_end", "count": len(records)})

    def _wire_lifecycle(self) -> None:
        app = self.app

        @app.timer(interval=1.0)
        async def housekeeping() -> None:
            # Warm up newly assigned partitions (recovery, expiry of records that expired while
            # no worker held them), then expire what is due.
            if app.in_recovery or app.rebalancing:
                return
            for pump in self.pumps:
                for partition in pump.owned():
                    await pump.proc.ready(partition)
                await pump.proc.expire_due()
                await pump.proc.prune_history()
            if self.view_runners:
                actives = app.assignor.assigned_actives()
                for runner in self.view_runners.values():
                    await runner.warm(
                        tp.partition for tp in actives if tp.topic == runner.input_topic
                    )
            if self.conflated_runners:
                actives = app.assignor.assigned_actives()
                for crunner in self.conflated_runners.values():
                    await crunner.warm(
                        tp.partition for tp in actives if tp.topic == crunner.input_topic
                    )

        @app.task
        async def pump_logs() -> None:
            # Existing subscriptions must be known before any change is applied, or their
            # subscribers would miss it.
            await self.registry.loaded.wait()
            for proc in self.processors.values():
                proc.subs.sweep_orphans()  # conflation journals of subscriptions that are gone
            settle_garbage_collector()
            await asyncio.gather(*(pump.run() for pump in self._static_pumps))

        @app.task
        async def run_commands() -> None:
            await asyncio.gather(*(self._run_commands(p, inbox) for p, inbox in self._inboxes))

        @app.task
        async def deliver_queues() -> None:
            await self.registry.loaded.wait()  # leases only once every subscription is known
            await asyncio.gather(*(queue.run() for queue in self.queues.values()))

        @app.task
        async def follow_registry() -> None:
            await self.registry.run()

        @app.task
        async def follow_directory() -> None:
            await self.directory.run()

        @app.task
        async def watch_slow_consumers() -> None:
            await self.slow_consumers.run(self.config.engine.slow_consumer.check_interval / 1000)

        @app.task
        async def flush_conflation() -> None:
            while True:
                await asyncio.sleep(CONFLATION_TICK)
                for proc in self.processors.values():
                    await proc.flush_conflated()

        async def on_revoked(sender: Any, revoked: Any, **kwargs: Any) -> None:
            for pump in self.pumps:
                await pump.proc.drop(tp.partition for tp in revoked if tp.topic == pump.ctl_topic)
            for queue in self.queues.values():
                if queue.view_feed is not None:  # ours land before the next owner's
                    await queue.view_feed.settle()
            for runner in self.view_runners.values():
                await runner.drop(
                    [tp.partition for tp in revoked if tp.topic == runner.input_topic]
                )
            for crunner in self.conflated_runners.values():
                await crunner.drop(
                    [tp.partition for tp in revoked if tp.topic == crunner.input_topic]
                )

        async def on_assigned(sender: Any, assigned: Any, **kwargs: Any) -> None:
            self._assigned = True  # for the readiness probe
            for runner in self.view_runners.values():
                runner.assign(tp.partition for tp in assigned if tp.topic == runner.input_topic)
            for crunner in self.conflated_runners.values():
                crunner.assign(tp.partition for tp in assigned if tp.topic == crunner.input_topic)

        app.on_partitions_revoked.connect(cast(Any, on_revoked))
        app.on_partitions_assigned.connect(cast(Any, on_assigned))

        @app.early_task
        async def announce() -> None:
            # The worker's line in `sowstream status`: readers judge it by the time it carries,
            # so a worker that stops announcing shows as not answering.
            failed = False
            while True:
                try:
                    info = orjson.dumps(self.worker_info())
                    await self.sender.send(self.names.workers, info, key=self.worker_name.encode())
                    failed = False
                except Exception as exc:  # the broker may be away: try again at the next beat
                    if not failed:
                        topic = self.names.workers
                        log.warning("could not announce the worker on %s: %s", topic, exc)
                    failed = True
                await asyncio.sleep(ANNOUNCE_SECONDS)

        @app.early_task
        async def heartbeat() -> None:
            # The probes' view of the worker (sowstream.engine.health): stamped from the loop,
            # so a loop that stops turning stops the stamps.
            self.health.serve_status(asyncio.get_running_loop(), self.worker_status)
            while True:
                self.health.beat(self.readiness())
                await asyncio.sleep(BEAT_SECONDS)

    # -- probes -----------------------------------------------------------------------------------

    def readiness(self) -> Readiness:
        """Whether this worker owns its partitions and has restored them (``/ready``).

        Ready once faust has assigned partitions (none is an answer too), the rebalance and the
        changelog recovery are over, the subscription registry is read (or live changes would
        miss subscribers) and every SOW partition it owns is loaded.
        """
        app = self.app
        if not self._assigned:
            return Readiness(False, "waiting for the consumer group to assign partitions")
        if app.rebalancing or app.in_recovery:
            return Readiness(False, "rebalancing: restoring tables from their changelogs")
        if not self.registry.loaded.is_set():
            return Readiness(False, "reading the subscription registry")
        owned = 0
        for pump in self.pumps:
            for partition in sorted(pump.owned()):
                state = pump.proc.state(partition)
                if state is None or not state.ready:
                    name = pump.proc.topic.name
                    return Readiness(False, f"loading topic {name} partition {partition}")
                owned += 1
        # A view or conflated topic's input partition is usable once its state is loaded and
        # its input read up to the end it had when assigned (warm), as a SOW partition is.
        inputs = 0
        runners: list[tuple[str, str, ViewRunner | ConflatedRunner]] = [
            *(("view", name, r) for name, r in self.view_runners.items()),
            *(("conflated topic", name, r) for name, r in self.conflated_runners.items()),
        ]
        for kind, name, runner in runners:
            pending = runner.loading()
            if pending:
                return Readiness(False, f"loading {kind} {name} input partition {pending[0]}")
            inputs += len(runner.assigned())
        held = f", {inputs} view input partition(s) loaded" if inputs else ""
        return Readiness(True, f"ready: {owned} topic partition(s) owned and restored{held}")

    def worker_info(self) -> dict[str, Any]:
        """What this worker announces on the workers topic (docs/deploy.md, *Status*)."""
        readiness = self.readiness()
        partitions: list[dict[str, Any]] = []
        inputs: list[dict[str, Any]] = []
        if self._assigned:
            for pump in list(self.pumps):
                for partition in sorted(pump.owned()):
                    state = pump.proc.state(partition)
                    partitions.append(
                        {
                            "topic": pump.proc.topic.name,
                            "partition": partition,
                            "watermark": state.watermark if state is not None else None,
                            "loaded": state is not None and state.ready,
                        }
                    )
            runners: list[tuple[str, ViewRunner | ConflatedRunner]] = [
                *self.view_runners.items(),
                *self.conflated_runners.items(),
            ]
            for name, runner in runners:
                loading = set(runner.loading())
                inputs.extend(
                    {"topic": name, "partition": p, "loaded": p not in loading}
                    for p in runner.assigned()
                )
        subscriptions = {p.topic.name: len(p.subs) for p in self.processors.values() if p.subs}
        for name, queue in self.queues.items():
            if queue.subscription_count():
                subscriptions[name] = queue.subscription_count()
        return {
            "worker": self.worker_name,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": round(self._started, 3),
            "at": round(time.time(), 3),
            "ready": readiness.ready,
            "reason": readiness.reason,
            "http": f"{self.metrics_host}:{self.metrics_port}" if self.metrics_port else None,
            "partitions": partitions,
            "inputs": inputs,
            "restore": restore_progress(self.app),
            "subscriptions": subscriptions,
            # Per conflated topic, since this worker started: changes in, records written.
            "conflated": {
                r.conflated.name: {"incoming": r.incoming, "published": r.published}
                for r in self.conflated_runners.values()
            },
        }

    async def worker_status(self) -> list[dict[str, Any]]:
        """This worker's rows of ``sowstream status`` (``/status``): its partitions now."""
        rows = []
        for pump in list(self.pumps):
            for partition in sorted(pump.owned()):
                row = await pump.proc.partition_status(partition)
                rows.append({**row, "worker": self.worker_name})
        return rows

    # -- start-up ---------------------------------------------------------------------------------

    def topic_specs(self) -> list[TopicSpec]:
        """Kafka topics the engine expects, with their settings."""
        specs = [
            TopicSpec(self.names.meta, 1, {"cleanup.policy": "compact"}),
            TopicSpec(self.names.dead_letter, 1, {"retention.ms": "-1"}),
            TopicSpec(self.names.subscriptions, 1, {"cleanup.policy": "compact"}),
            TopicSpec(self.names.workers, 1, {"cleanup.policy": "compact"}),
            TopicSpec(
                self.names.auto_control,
                self.config.engine.auto_topic_partitions,
                {"retention.ms": str(3_600_000)},
            ),
        ]
        for t in self.config.topics:
            specs.append(log_topic_spec(self.names, t.name, t.partitions, t.message_type))
            specs.append(
                TopicSpec(
                    self.names.control(t.name, t.message_type),
                    t.partitions,
                    {"retention.ms": str(3_600_000)},
                )
            )
        for queue in self.config.queues:
            specs.append(TopicSpec(self.names.queue_expired(queue.name), 1, {"retention.ms": "-1"}))
        for view in self.config.views:
            specs.append(
                TopicSpec(
                    self.names.view_input(view.name, view.message_type),
                    input_partitions(view),
                    {"retention.ms": str(VIEW_INPUT_RETENTION_MS)},
                )
            )
        for conflated, own in zip(
            self.config.conflated_topics, self.config.conflated_topic_configs, strict=True
        ):
            specs.append(
                TopicSpec(
                    self.names.view_input(conflated.name, own.message_type),
                    conflated.partitions,
                    {"retention.ms": str(VIEW_INPUT_RETENTION_MS)},
                )
            )
        return specs

    def prepare(self, timeout: float = 30.0) -> None:
        """Create the Kafka topics and publish the topic definitions clients read."""
        extra = self.config.engine.kafka
        ensure_topics(
            self.bootstrap,
            self.topic_specs(),
            replication_factor=self.config.engine.replication_factor,
            extra=extra,
            timeout=timeout,
        )
        self._write_meta(definitions(self.config, self.names))

    def apply_seeds(self, root: Path) -> dict[str, list[int]]:
        """Start partitions without local state from Spark seeds under ``root``."""
        seeded = {}
        for topic in self.config.topics:
            table = self.tables.get(topic.ident)
            if table is None:
                continue
            changelog = table.changelog_topic.get_topic_name()
            seeded[topic.ident] = ingest_seed(
                root / topic.kafka_name, self.config.engine.app_id, changelog, table
            )
        return seeded

    def wait_for_kafka(self, deadline_s: float = 0.0) -> None:
        """Prepare Kafka, retrying with backoff (1 s doubling to 30 s) while no broker answers;
        ``deadline_s`` > 0 gives up after that many seconds (KafkaUnreachableError)."""
        started = time.monotonic()
        delay = 1.0
        while True:
            probe = KAFKA_PROBE_SECONDS
            if deadline_s > 0:  # the last attempt ends at the deadline, not a probe later
                probe = max(1.0, min(probe, deadline_s - (time.monotonic() - started)))
            try:
                self.prepare(probe)
                return
            except KafkaUnreachableError as exc:
                waited = time.monotonic() - started
                if deadline_s > 0 and waited + delay > deadline_s:
                    raise KafkaUnreachableError(
                        f"{exc}; gave up after {waited:.0f}s (--kafka-wait {deadline_s:.0f})"
                    ) from exc
                log.warning("%s; retrying in %.0fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 30.0)

    def run(self, kafka_wait_s: float = 0.0) -> None:
        """Prepare Kafka (waiting for it, see :meth:`wait_for_kafka`), then run the faust
        worker until it is stopped (SIGINT/SIGTERM)."""
        self.wait_for_kafka(kafka_wait_s)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.seed_dir is not None:
            self.apply_seeds(self.seed_dir)
        if self.metrics_port:
            serve(self.health, self.metrics_host, self.metrics_port)
        worker = faust.Worker(self.app, loglevel=self.log_level, quiet=True, override_logging=False)
        worker.execute_from_commandline()


def log_topic_spec(
    names: TopicNames, topic: str, partitions: int, message_type: str = "json"
) -> TopicSpec:
    """The transaction log of ``topic`` as the engine creates it.

    Kept forever by default; LogAppendTime: the broker stamps each record, so expiration,
    History and RecoveryPoint timestamps all use one clock.
    """
    return TopicSpec(
        names.log(topic, message_type),
        partitions,
        {"retention.ms": "-1", "message.timestamp.type": "LogAppendTime"},
    )


def definitions(config: SowstreamConfig, names: TopicNames) -> dict[str, dict[str, Any]]:
    """Every meta-topic record: topics, and queues (a queue named like one of its topics shares
    that topic's record: publishes go to the topic, subscriptions lease from the queue)."""
    infos = {t.ident: topic_info(t, names) for t in config.topics}
    kept = {t.name for t in config.queue_view_topics.values()}  # never a queue's own topic
    queued = [
        t.name
        for t in config.topics
        if t.message_type in QUEUE_MESSAGE_TYPES and t.name not in kept
    ]
    for queue in config.queues:
        underlying = queue.underlying_topics(queued)
        target = config.topic(queue.publish_target, queue.message_type)
        info = infos.get(queue.name) or {**topic_info(target, names), "name": queue.name}
        infos[queue.name] = {**info, "queue_of": underlying}
    for view in config.views:
        ident = topic_ident(view.name, view.message_type)
        infos[ident] = {**infos[ident], "view_of": list(view.underlying_names)}
    for conflated, own in zip(config.conflated_topics, config.conflated_topic_configs, strict=True):
        # Only the engine writes a conflated topic: clients refuse publishes as for a view.
        infos[own.ident] = {**infos[own.ident], "view_of": [conflated.underlying_topic]}
    for queue_name, own in config.queue_view_topics.items():
        if own.ident in infos:  # the engine's topic of the queue's available messages
            infos[own.ident] = {**infos[own.ident], "view_of": [queue_name]}
    return infos


def topic_info(topic: TopicConfig, names: TopicNames, *, auto: bool = False) -> dict[str, Any]:
    """The meta-topic record describing ``topic`` (schemas/TopicInfo.avsc), under the key
    ``topic.ident``; ``auto`` for a
    topic created on first use, whose commands go to the shared control topic."""
    exp = topic.expiration
    expiration = exp.mode if exp.mode != "default" else f"{exp.default_ms}ms"
    return {
        "name": topic.name,
        "message_type": topic.message_type,
        "keys": list(topic.keys),
        # A Pattern topic's names are their own key domains unless KeyDomain is set ("").
        "key_domain": topic.effective_key_domain
        if topic.pattern is None
        else topic.key_domain or "",
        "partitions": topic.partitions,
        "log_topic": names.log(topic.name, topic.message_type),
        "control_topic": names.auto_control
        if auto
        else names.control(topic.name, topic.message_type),
        "hash_indexes": [list(i) for i in topic.hash_indexes],
        "expiration": expiration,
        "durability": topic.durability,
        "sow": topic.sow,
        "key_generator": topic.key_generator.module if topic.key_generator else None,
        "key_generator_options": dict(topic.key_generator.options) if topic.key_generator else {},
        "auto": auto,
        "schema": getattr(topic.codec, "schema_text", ""),
        "pattern": topic.pattern or "",
        "preprocessing": list(topic.preprocessing),
        "instance_name": topic.instance_name,
    }
