"""Broker faults, on a broker of this module's own (the session's broker is shared):

* the broker is unreachable when a worker starts: it says so, naming the bootstrap, and retries
  until the broker appears, then serves; the CLI fails with one line;
* the broker restarts (stop, start on the same data directory) under load: workers and clients
  reconnect by themselves, nothing acknowledged is lost and a subscriber's copy equals the SOW.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sowstream.broker.local import LocalBroker, free_port
from sowstream.client import Client
from sowstream.errors import SowstreamError
from tests.support.engine import REPO, EngineProcesses

pytestmark = pytest.mark.integration

TOPICS = [{"Name": "orders", "Key": "/id", "Partitions": 2}]
KEYS = 50


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalBroker, int]]:
    """A broker home and the port it always listens on; not started."""
    home = LocalBroker(tmp_path_factory.mktemp("faulty-broker"))
    try:
        yield home, free_port()
    finally:
        home.stop()


def wait_for_log(engine: EngineProcesses, name: str, text: str, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = (engine.workdir / f"{name}.log").read_text(errors="replace")
        if text in log:
            return log
        assert engine.alive(name), f"worker {name} exited:\n{engine.log_tail(name)}"
        time.sleep(0.5)
    raise AssertionError(f"{text!r} not in the log of {name}:\n{engine.log_tail(name)}")


def test_a_worker_waits_for_an_unreachable_broker_and_the_cli_fails_in_one_line(
    broker: tuple[LocalBroker, int], tmp_path: Path
) -> None:
    home, port = broker
    home.stop()
    bootstrap = f"127.0.0.1:{port}"
    engine = EngineProcesses(bootstrap, tmp_path, TOPICS)
    try:
        engine.start("w1")
        # The CLI gives up after its own 10 s while the worker goes on waiting: both at once.
        with ThreadPoolExecutor(1) as pool:
            status = pool.submit(engine.cli, "status", timeout=60)
            log = wait_for_log(engine, "w1", f"cannot reach Kafka at {bootstrap}")
            wait_for_log(engine, "w1", "retrying in 2s")  # a second attempt, after a longer pause
            assert "Traceback" not in log
            result = status.result()
        assert result.returncode == 1
        assert result.stderr.strip().splitlines() == [
            f"error: cannot reach Kafka at {bootstrap} within 10s "
            "(Failed to get metadata: Local: Broker transport failure)"
        ]
        assert result.stdout == ""

        home.start(port=port)
        engine.wait_ready(["orders"])
        assert engine.alive("w1")
        with engine.client() as client:
            client.publish("orders", {"id": 1, "v": 1}, ack=True)
            assert client.sow_records("orders") == [{"id": 1, "v": 1}]
        assert "Traceback" not in (tmp_path / "w1.log").read_text(errors="replace")
    finally:
        engine.stop_all()


def test_a_worker_told_to_wait_a_while_gives_up_in_one_line(tmp_path: Path) -> None:
    bootstrap = f"127.0.0.1:{free_port()}"  # nothing listens there
    engine = EngineProcesses(bootstrap, tmp_path, TOPICS)
    result = subprocess.run(
        [
            *(sys.executable, "-m", "sowstream", "worker", "--config", str(engine.config)),
            *("--bootstrap", bootstrap, "--data-dir", str(tmp_path / "data"), "--kafka-wait", "1"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: cannot reach Kafka at {bootstrap} within 1s (Failed to get metadata: Local: "
        "Broker transport failure); gave up after 1s (--kafka-wait 1)"
    )


class Publisher(threading.Thread):
    """Publishes ``{"id": k, "v": n}`` with n rising, flushing every round of keys; a round is
    acknowledged once a flush after it returned without error."""

    def __init__(self, client: Client) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.stop = threading.Event()
        self.version = 0
        self.acked: dict[int, int] = {}
        self.flush_failures = 0

    def run(self) -> None:
        while not self.stop.is_set():
            self.version += 1
            for k in range(KEYS):
                self.client.publish("orders", {"id": k, "v": self.version})
            try:
                self.client.flush()
            except SowstreamError:
                self.flush_failures += 1  # not acknowledged (yet): a later flush may deliver it
                continue
            self.acked = dict.fromkeys(range(KEYS), self.version)
            time.sleep(0.05)


def apply(cache: dict[str, Any], msg: Any) -> None:
    if msg.command in ("sow", "publish"):
        cache[msg.sow_key] = msg.json()
    elif msg.command == "oof":
        cache.pop(msg.sow_key, None)


def test_a_broker_restart_under_load_loses_nothing_acknowledged(
    broker: tuple[LocalBroker, int], tmp_path: Path
) -> None:
    home, port = broker
    bootstrap = home.start(port=port)
    engine = EngineProcesses(bootstrap, tmp_path, TOPICS)
    try:
        engine.start("w1")
        engine.start("w2")
        engine.wait_ready(["orders"])
        with engine.client() as subscriber, engine.client(timeout=120) as publisher:
            sub = subscriber.sow_and_subscribe("orders")
            cache: dict[str, Any] = {}
            load = Publisher(publisher)
            load.start()
            while load.version < 20:  # under load before the broker goes
                msg = sub.next(0.5)
                if msg is not None:
                    apply(cache, msg)
            before = dict(load.acked)
            assert home.stop()
            time.sleep(3)  # the broker is away while the publisher goes on
            home.start(port=port)
            restarted_at = load.version
            while load.version < restarted_at + 20:  # and under load after it is back
                msg = sub.next(0.5)
                if msg is not None:
                    apply(cache, msg)
                assert load.is_alive()
            load.stop.set()
            load.join(120)
            publisher.flush()  # everything published is now acknowledged
            final = dict.fromkeys(range(KEYS), load.version)
            assert all(final[k] >= v for k, v in before.items())

            deadline = time.monotonic() + 120
            sow: dict[str, Any] = {}
            while time.monotonic() < deadline:
                try:
                    sow = {m.sow_key: m.json() for m in publisher.sow("orders") if m.sow_key}
                except SowstreamError:
                    sow = {}
                if sorted((r["id"], r["v"]) for r in sow.values()) == sorted(final.items()):
                    break
                time.sleep(1)
            assert sorted((r["id"], r["v"]) for r in sow.values()) == sorted(final.items()), (
                engine.log_tail("w1"),
                engine.log_tail("w2"),
            )
            # The subscriber resumed by itself: its copy ends equal to the SOW.
            while time.monotonic() < deadline and cache != sow:
                msg = sub.next(1.0)
                if msg is not None:
                    apply(cache, msg)
            assert cache == sow
            assert engine.alive("w1") and engine.alive("w2")
            sub.close()
    finally:
        engine.stop_all()
