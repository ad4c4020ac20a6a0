"""``sowstream worker --processes 2``: two worker processes under one parent share the
partitions like two workers, answer queries completely, and stop with the parent."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from sowstream.broker.local import free_port
from sowstream.cli.processes import CRASH_LOOP_SECONDS
from sowstream.errors import SowstreamError
from tests.support.engine import QUICK_SESSION_TIMEOUT, EngineProcesses, metric

pytestmark = pytest.mark.integration

TOPICS = [{"Name": "orders", "Key": "/id", "Partitions": 4}]
RECORDS = 200


def _status(engine: EngineProcesses, deadline: float) -> dict[str, Any]:
    """The cluster status once both children answer, ready, each with partitions."""
    doc: dict[str, Any] = {}
    with engine.client(timeout=10.0) as client:
        while time.monotonic() < deadline:
            if not engine.alive("pool"):
                raise AssertionError(f"the parent exited:\n{engine.log_tail('pool')}")
            try:
                doc = client.cluster_status(answer_seconds=3.0)
            except SowstreamError:
                time.sleep(1)
                continue
            owners = {p.get("worker") for p in doc["partitions"] if p["topic"] == "orders"}
            if (
                len(doc["workers"]) == 2
                and all(w["answering"] and w["ready"] for w in doc["workers"])
                and owners == {"pool-0", "pool-1"}
            ):
                return doc
            time.sleep(1)
    raise AssertionError(f"no two settled workers: {doc}\n{engine.log_tail('pool')}")


def test_two_processes_share_the_partitions_and_stop_with_the_parent(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    engine = EngineProcesses(kafka_bootstrap, tmp_path, TOPICS)
    port = free_port()
    engine.start("pool", "--processes", "2", "--metrics-port", str(port))
    try:
        doc = _status(engine, time.monotonic() + 180)
        assert sorted(w["worker"] for w in doc["workers"]) == ["pool-0", "pool-1"]
        children = psutil.Process(engine.procs["pool"].pid).children()
        assert len(children) == 2
        # Each child has its own data dir (named after it) and metrics port.
        for i in range(2):
            assert engine.data_dir(f"pool-{i}").is_dir()

        with engine.client() as client:
            for i in range(RECORDS):
                client.publish("orders", {"id": i, "qty": i})
            client.flush()
            deadline = time.monotonic() + 60
            found: list[Any] = []
            while time.monotonic() < deadline:
                found = [m for m in client.sow("orders") if m.command == "sow"]
                if len(found) == RECORDS:
                    break
                time.sleep(0.5)
        assert sorted(m.json()["id"] for m in found) == list(range(RECORDS))
        applied = [metric(port + i, "sowstream_updates_applied_total") for i in range(2)]
        assert sum(applied) == RECORDS and all(n > 0 for n in applied), applied

        engine.procs["pool"].send_signal(signal.SIGTERM)
        assert engine.procs["pool"].wait(90) == 0, engine.log_tail("pool")
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"children left running: {alive}"
    finally:
        engine.stop_all()


def test_a_child_that_dies_is_restarted(kafka_bootstrap: str, tmp_path: Path) -> None:
    # a child is SIGKILLed: the group gives its partitions back sooner (the parent passes
    # --session-timeout on to its children)
    engine = EngineProcesses(
        kafka_bootstrap, tmp_path, TOPICS, session_timeout=QUICK_SESSION_TIMEOUT
    )
    engine.start("pool", "--processes", "2")
    try:
        _status(engine, time.monotonic() + 180)
        parent = psutil.Process(engine.procs["pool"].pid)
        victim = sorted(parent.children(), key=lambda p: p.pid)[0]
        # Past the supervisor's crash-loop window: a child that dies sooner counts as failing
        # at start (the others are stopped), which is not what this test is about.
        up = time.time() - victim.create_time()
        time.sleep(max(0.0, CRASH_LOOP_SECONDS + 1 - up))
        victim.kill()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            children = parent.children()
            if len(children) == 2 and victim.pid not in {c.pid for c in children}:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"not restarted:\n{engine.log_tail('pool')}")
        assert "exited with code -9" in engine.log_tail("pool", 200)
        _status(engine, time.monotonic() + 180)
    finally:
        engine.stop_all()
