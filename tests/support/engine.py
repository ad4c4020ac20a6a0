"""Run real sowstream workers as subprocesses against the test broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient

from sowstream.auth import Auth
from sowstream.client import Client
from sowstream.errors import SowstreamError

REPO = Path(__file__).resolve().parents[2]
# For tests that SIGKILL workers: a killed worker's partitions move once its group session times
# out (10 s by default), so its replacement is served this much sooner. The broker's least.
QUICK_SESSION_TIMEOUT = 6.0


def write_config(
    path: Path,
    topics: list[dict[str, Any]],
    *,
    prefix: str,
    kafka: dict[str, str] | None = None,
    engine_extra: dict[str, Any] | None = None,
    entitlements: dict[str, dict[str, str]] | None = None,
    plain_topics: list[dict[str, Any]] | None = None,
    queues: list[dict[str, Any]] | None = None,
    views: list[dict[str, Any]] | None = None,
    conflated_topics: list[dict[str, Any]] | None = None,
    publish_entitlements: dict[str, dict[str, str]] | None = None,
) -> Path:
    """Write a YAML config with an isolated app id and topic prefix."""
    engine: dict[str, Any] = {"app_id": prefix, "topic_prefix": prefix, **(engine_extra or {})}
    if kafka:
        engine["kafka"] = kafka
    doc: dict[str, Any] = {"engine": engine, "sow": topics}
    if entitlements:
        doc["entitlements"] = entitlements
    if publish_entitlements:
        doc["publish_entitlements"] = publish_entitlements
    if plain_topics:
        doc["topics"] = plain_topics
    if queues:
        doc["queues"] = queues
    if conflated_topics:
        doc["conflated_topics"] = conflated_topics
    if views:
        doc["views"] = views
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class EngineProcesses:
    """A set of worker processes sharing one config, each with its own data dir and log file."""

    def __init__(
        self,
        bootstrap: str,
        workdir: Path,
        topics: list[dict[str, Any]],
        prefix: str | None = None,
        kafka: dict[str, str] | None = None,
        engine_extra: dict[str, Any] | None = None,
        entitlements: dict[str, dict[str, str]] | None = None,
        plain_topics: list[dict[str, Any]] | None = None,
        queues: list[dict[str, Any]] | None = None,
        views: list[dict[str, Any]] | None = None,
        conflated_topics: list[dict[str, Any]] | None = None,
        publish_entitlements: dict[str, dict[str, str]] | None = None,
        auth: Auth | None = None,
        session_timeout: float | None = None,
    ) -> None:
        """``auth``: the credentials of the clients the harness makes itself (readiness probes,
        :meth:`client`), for engines that require them; ``session_timeout``: the workers' group
        session timeout in seconds (``sowstream worker --session-timeout``; default 10)."""
        self.bootstrap = bootstrap
        self.session_timeout = session_timeout
        self.auth = auth
        self.workdir = workdir
        self.kafka = dict(kafka or {})
        self.prefix = prefix or f"t{uuid.uuid4().hex[:10]}"
        self.config = write_config(
            workdir / "sowstream.yaml",
            topics,
            prefix=self.prefix,
            kafka=self.kafka,
            engine_extra=engine_extra,
            entitlements=entitlements,
            plain_topics=plain_topics,
            queues=queues,
            views=views,
            conflated_topics=conflated_topics,
            publish_entitlements=publish_entitlements,
        )
        self.views = [v["Name"] for v in views or ()]
        self.views += [c["Name"] for c in conflated_topics or ()]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *extra_args: str, env: dict[str, str] | None = None) -> None:
        """Start worker ``name`` (its RocksDB dir survives restarts of the same name); ``env``:
        more environment variables for it (e.g. SOWSTREAM_TEST_HOOKS, sowstream.engine.gates)."""
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.procs[name] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sowstream",
                "worker",
                "--config",
                str(self.config),
                "--bootstrap",
                self.bootstrap,
                "--name",
                name,
                "--data-dir",
                str(self.workdir / "data"),
                "--log-level",
                "info",
                *(
                    ("--session-timeout", str(self.session_timeout))
                    if self.session_timeout is not None
                    else ()
                ),
                *extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
        )

    def stop(self, name: str, *, kill: bool = False, timeout: float = 30.0) -> None:
        """Stop a worker gracefully (SIGTERM) or with SIGKILL."""
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        _wait_or_kill(proc, timeout)

    def stop_all(self) -> None:
        """Stop every worker, all told at once (each takes a few seconds to leave its group)."""
        procs, self.procs = self.procs, {}
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            _wait_or_kill(proc, 30)

    def alive(self, name: str) -> bool:
        """Whether worker ``name`` is running."""
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def log_tail(self, name: str, lines: int = 60) -> str:
        """The end of a worker's log, for assertion messages."""
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def data_dir(self, name: str) -> Path:
        """Worker ``name``'s own state directory (RocksDB)."""
        return self.workdir / "data" / self.prefix / name

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``sowstream ARGS`` against this engine (bootstrap and prefix added)."""
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "sowstream",
                *args,
                "--bootstrap",
                self.bootstrap,
                "--prefix",
                self.prefix,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
        )

    def client(self, **kwargs: Any) -> Client:
        """A connected client for this engine."""
        kwargs.setdefault("auth", self.auth)
        return Client(self.bootstrap, prefix=self.prefix, config=self.kafka, **kwargs).connect()

    def wait_stable(self, deadline: float) -> None:
        """Block until every running worker has joined the consumer group and it is stable."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap, **self.kafka})
        while time.monotonic() < deadline:
            try:
                desc = admin.describe_consumer_groups([self.prefix])[self.prefix].result(10)
                if desc.state == ConsumerGroupState.STABLE and len(desc.members) == len(
                    [n for n in self.procs if self.alive(n)]
                ):
                    return
            except (KafkaException, TimeoutError):
                pass  # a loaded machine can take longer than one call's timeout: ask again
            time.sleep(0.5)

    def wait_ready(self, topics: list[str] | list[tuple[str, str]], timeout: float = 120.0) -> None:
        """Block until all workers joined and every partition of every topic answers a query.

        A topic is a name (json) or a (name, message type) pair.
        """
        deadline = time.monotonic() + timeout
        self.wait_stable(deadline)
        last: Exception | None = None
        with Client(
            self.bootstrap, prefix=self.prefix, config=self.kafka, timeout=5.0, auth=self.auth
        ) as client:
            while time.monotonic() < deadline:
                for name in self.procs:
                    if not self.alive(name):
                        raise RuntimeError(f"worker {name} died:\n{self.log_tail(name)}")
                try:
                    for topic in topics:
                        name, kind = topic if isinstance(topic, tuple) else (topic, "json")
                        list(client.sow(name, top_n=0, message_type=kind))
                    return
                except SowstreamError as exc:
                    last = exc
                    time.sleep(0.5)
        tails = "\n".join(f"--- {n}\n{self.log_tail(n)}" for n in self.procs)
        raise RuntimeError(f"engine not ready after {timeout}s: {last}\n{tails}")


@contextmanager
def running_engine(
    bootstrap: str,
    workdir: Path,
    topics: list[dict[str, Any]],
    workers: tuple[str, ...] = ("w1", "w2"),
    **options: Any,
) -> Iterator[EngineProcesses]:
    """Workers serving ``topics``, ready for queries; stopped on exit."""
    procs = EngineProcesses(bootstrap, workdir, topics, **options)
    for name in workers:
        procs.start(name)
    try:
        ready = [(t["Name"], t.get("MessageType", "json").lower()) for t in topics]
        procs.wait_ready([*ready, *((v, "json") for v in procs.views)])
        yield procs
    finally:
        procs.stop_all()


def metrics_text(port: int) -> str:
    """A worker's Prometheus page (``--metrics-port``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        text: str = resp.read().decode()
        return text


def metric(port: int, name: str, **labels: str) -> float:
    """The sum of metric ``name`` over the series carrying every label given."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics_text(port).splitlines()
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items())
    )


def _wait_or_kill(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait for a signalled worker to exit, killing it after ``timeout``."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
