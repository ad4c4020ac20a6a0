"""``sowstream status`` while a worker restores a lost store: the restore's progress shows per
changelog partition (records restored, the changelog's end) and goes away once it is ready; the
liveness probe answers throughout (a long restore must not get the pod restarted).

faust's own record-at-a-time restore (``engine.restore: faust``) is used so that the restore
lasts long enough to be seen between two of the worker's announcements.
"""

from __future__ import annotations

import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from sowstream.broker.local import free_port
from tests.support.engine import EngineProcesses, running_engine

pytestmark = pytest.mark.integration

RECORDS = 100_000


def live(port: int) -> int:
    """The HTTP status of the worker's /live (0 when nothing answers yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/live", timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@pytest.fixture
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    with running_engine(
        kafka_bootstrap,
        tmp_path_factory.mktemp("status-restore"),
        [{"Name": "big", "Key": "/id", "Partitions": 1}],
        workers=("w1",),
        engine_extra={"restore": "faust"},
    ) as procs:
        yield procs


def worker_row(doc: dict[str, Any]) -> dict[str, Any] | None:
    return next((w for w in doc["workers"] if w["worker"] == "w1"), None)


def test_restore_progress_shows_while_a_lost_store_is_restored(engine: EngineProcesses) -> None:
    with engine.client(timeout=60) as client:
        for n in range(RECORDS):
            client.publish("big", {"id": n, "pad": "x" * 40})
        client.flush()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            (row,) = client.cluster_status(2.0)["partitions"]
            if row["lag"] == 0:
                break
            time.sleep(0.5)
        assert row["lag"] == 0 and row["records"] == RECORDS

        engine.stop("w1")
        shutil.rmtree(engine.workdir / "data" / engine.prefix / "w1")
        port = free_port()
        engine.start("w1", "--metrics-port", str(port))
        seen: list[dict[str, Any]] = []
        live_while_restoring: list[int] = []
        deadline = time.monotonic() + 180
        ready = False
        looks: list[tuple[float, Any]] = []
        began = time.monotonic()
        while time.monotonic() < deadline and not ready:
            worker = worker_row(client.cluster_status(1.0))
            looks.append(
                (
                    round(time.monotonic() - began, 1),
                    worker and (worker["answering"], worker["ready"], worker["restore"]),
                )
            )
            if worker is not None and worker["answering"]:
                seen.extend(worker["restore"])
                if worker["restore"]:
                    live_while_restoring.append(live(port))
                ready = worker["ready"] and not worker["restore"] and bool(seen)
            time.sleep(0.2)
        assert seen, f"no restore progress was reported: {looks[:40]}"
        changelog = {r["changelog"] for r in seen}
        assert len(changelog) == 1 and next(iter(changelog)).endswith("-sow-big-changelog")
        assert all(r["partition"] == 0 and r["end"] >= RECORDS - 1 for r in seen)
        assert any(0 <= r["offset"] < r["end"] for r in seen), seen  # caught in the middle
        assert ready, "the worker did not report ready with its restore done"
        assert live_while_restoring and set(live_while_restoring) == {200}, live_while_restoring
        count = sum(1 for m in client.sow("big", batch_size=1000) if m.command == "sow")
        assert count == RECORDS
