"""The worker: the units of a configuration on a faust runtime, with their services.

The pieces, each in its module: the runtime (:mod:`~sowstream.engine.runtime`, every faust call),
the topology (:mod:`~sowstream.engine.topology`, the configuration as units: SOW topics, queues,
views, conflated topics), the command router (:mod:`~sowstream.engine.router`), topic
auto-creation (:mod:`~sowstream.engine.autotopics`), the clients' subscriptions
(:mod:`~sowstream.engine.clients`) and the worker's status (:mod:`~sowstream.engine.status`).
This module puts them together and drives the units' lifecycle: declared once, then assigned and
dropped on every rebalance, and ticked every second.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import time
from pathlib import Path

from sowstream.auth import Authenticator
from sowstream.config.root import SowstreamConfig
from sowstream.engine.autotopics import AutoTopics
from sowstream.engine.clients import Clients
from sowstream.engine.gates import REBALANCE, Gates
from sowstream.engine.health import Health, serve
from sowstream.engine.meta import write_meta
from sowstream.engine.ports import StateTable
from sowstream.engine.queues import QueueRuntime
from sowstream.engine.router import CommandRouter
from sowstream.engine.runtime import FaustRuntime
from sowstream.engine.seed import ingest_seed
from sowstream.engine.status import WorkerStatus
from sowstream.engine.topology import Topology, serving_config
from sowstream.engine.units.base import Context, Partitions
from sowstream.errors import KafkaUnreachableError, SowstreamError
from sowstream.queues.retention import LogRetention
from sowstream.wire.kafka import TopicSpec, ensure_topics, topic_configs
from sowstream.wire.topics import TopicNames

log = logging.getLogger("sowstream.engine")
KAFKA_PROBE_SECONDS = 10.0  # one attempt to reach Kafka at start
CONFLATION_TICK = 0.02  # how often conflated subscriptions are flushed
GC_THRESHOLDS = (50_000, 20, 100)  # CPython's defaults are (700, 10, 10)


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


class Engine:
    """One worker for a configuration; ``run()`` blocks until the worker stops."""

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
        self.config = config = serving_config(config)
        engine = config.engine
        self.bootstrap = bootstrap
        self.names = TopicNames(engine.topic_prefix)
        self.worker_name = worker_name or socket.gethostname()
        # One directory per engine and worker: RocksDB locks a partition database per process.
        self.data_dir = Path(data_dir or engine.data_dir) / engine.app_id / self.worker_name
        self.seed_dir = Path(seed_dir) if seed_dir is not None else None
        self.log_level = log_level
        self.metrics_port = metrics_port if metrics_port is not None else engine.web_port
        self.metrics_host = metrics_host
        self.health = Health()
        self.runtime = runtime = FaustRuntime(
            engine,
            bootstrap=bootstrap,
            data_dir=self.data_dir,
            worker_name=self.worker_name,
            session_timeout=session_timeout,
            static_membership=static_membership,
        )
        sender, assignment = runtime.sender, runtime.assignment
        sender.reply_topic_problem = self.names.reply_topic_problem
        ctx = Context(
            wiring=runtime,
            sender=sender,
            assignment=assignment,
            names=self.names,
            bootstrap=bootstrap,
            app_id=engine.app_id,
            kafka=engine.kafka,
            rocksdb=engine.rocksdb,
            authenticator=Authenticator(engine.authentication),
            native=engine.native,
        )
        self.topology = Topology(config, ctx)
        self.auto = AutoTopics(config, self.topology)
        self.gates = Gates.from_environment()
        self.router = CommandRouter(
            self.topology,
            self.auto,
            sender,
            assignment,
            self.worker_name,
            self.gates,
            ctx.authenticator,
        )
        self.clients = Clients(self.topology, self.auto, engine.slow_consumer)
        sender.on_gone = self.clients.reply_topic_gone
        sender.on_missing = self.clients.reply_topic_missing
        sender.exists = self.clients.topic_exists
        http = f"{metrics_host}:{self.metrics_port}" if self.metrics_port else None
        self.status = WorkerStatus(
            self.topology,
            assignment,
            sender,
            runtime.restore_progress,
            worker_name=self.worker_name,
            http=http,
        )
        self._declare()

    def _declare(self) -> None:
        """Declare every unit and service with the runtime, and the worker's own rhythm."""
        runtime = self.runtime
        for unit in self.topology.units:
            unit.declare()
        self.auto.declare(self.router.auto_command)
        self.clients.declare()
        runtime.task(self.router.run)
        runtime.task(self._open_logs)
        runtime.task(self._flush_conflation)
        runtime.timer(1.0, self._housekeeping)
        runtime.on_rebalance(assigned=self._assigned, revoked=self._revoked)
        runtime.early_task(self.status.announce)
        runtime.early_task(self._heartbeat)

    @property
    def tables(self) -> dict[str, StateTable]:
        """The RocksDB tables of the SOW topics, by topic identity."""
        return {
            ident: unit.table
            for ident, unit in self.topology.topics.items()
            if unit.table is not None
        }

    # -- the units' lifecycle ---------------------------------------------------------------------

    async def _assigned(self, assigned: Partitions) -> None:
        self.status.assigned = True  # for the readiness probe
        for unit in self.topology.units:
            unit.assign(assigned)

    async def _revoked(self, revoked: Partitions) -> None:
        if revoked:
            await self.gates.passing(REBALANCE)
        for unit in self.topology.units:
            await unit.drop(revoked)

    async def _housekeeping(self) -> None:
        if not self.runtime.assignment.settled:
            return
        for unit in self.topology.units:
            await unit.tick()

    async def _open_logs(self) -> None:
        """Let the log pumps apply, once existing subscriptions are known (or their subscribers
        would miss changes) and the start-up garbage is frozen."""
        ctx = self.topology.ctx
        await ctx.subscriptions_known.wait()
        for unit in list(self.topology.topics.values()):
            unit.proc.subs.sweep_orphans()  # conflation journals of subscriptions that are gone
        settle_garbage_collector()
        ctx.logs_open.set()

    async def _flush_conflation(self) -> None:
        """Flush conflated subscriptions whose interval is up."""
        while True:
            await asyncio.sleep(CONFLATION_TICK)
            for unit in list(self.topology.topics.values()):
                await unit.proc.flush_conflated()

    async def _heartbeat(self) -> None:
        await self.status.heartbeat(self.health)

    # -- start-up ---------------------------------------------------------------------------------

    def topic_specs(self) -> list[TopicSpec]:
        """Kafka topics the engine expects, with their settings."""
        return self.topology.topic_specs()

    def prepare(self, timeout: float = 30.0) -> None:
        """Create the Kafka topics and publish the topic definitions clients read."""
        kafka = self.config.engine.kafka
        ensure_topics(
            self.bootstrap,
            self.topic_specs(),
            replication_factor=self.config.engine.replication_factor,
            extra=kafka,
            timeout=timeout,
        )
        write_meta(self.bootstrap, kafka, self.names, self.topology.definitions())
        self.check_queue_logs(timeout)

    def check_queue_logs(self, timeout: float = 10.0) -> None:
        """Refuse a queue whose log is compacted, and warn about one whose log may delete
        messages the queue still holds (both name the queue): queues read their messages from
        the log. Each queue keeps its logs' retention for its alarm."""
        logs: dict[str, tuple[str, list[QueueRuntime]]] = {}
        for runtime in self.topology.queues.values():
            for topic in {topic for topic, _ in runtime.partitions}:
                name = self.names.log(topic, runtime.config.message_type)
                logs.setdefault(name, (topic, []))[1].append(runtime)
        configs = topic_configs(self.bootstrap, list(logs), self.config.engine.kafka, timeout)
        for name, (topic, runtimes) in logs.items():
            for runtime in runtimes:
                queue = runtime.config
                try:
                    retention = LogRetention.check(queue.name, name, configs.get(name, {}))
                except ValueError as exc:
                    raise SowstreamError(str(exc)) from None
                runtime.retention[topic] = retention
                if retention.outlives(queue.expiration_ms):
                    log.warning(
                        "queue %s: its log %s keeps records %d s (retention.ms) but its "
                        "messages live %s: one not acknowledged in time loses its body "
                        "(sowstream_queue_retention_alarm warns first)",
                        queue.name,
                        name,
                        (retention.retention_ms or 0) // 1000,
                        "until acknowledged"
                        if queue.expiration_ms is None
                        else f"{queue.expiration_ms // 1000} s (Expiration)",
                    )

    def apply_seeds(self, root: Path) -> dict[str, list[int]]:
        """Start partitions without local state from Spark seeds under ``root``."""
        seeded = {}
        for unit in self.topology.topics.values():
            if unit.table is None:
                continue
            seeded[unit.topic.ident] = ingest_seed(
                root / unit.topic.kafka_name,
                self.config.engine.app_id,
                unit.table.changelog,
                unit.table,
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
        self.runtime.run(self.log_level)
