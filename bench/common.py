"""What every benchmark needs: a broker, a scratch workspace, a worker process to start."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path

from sowstream.client import Client
from sowstream.errors import SowstreamError


def bench_bootstrap(stack: ExitStack) -> str:
    """$SOWSTREAM_BOOTSTRAP, or the embedded local broker for the duration of ``stack``."""
    bootstrap = os.environ.get("SOWSTREAM_BOOTSTRAP")
    if bootstrap:
        return bootstrap
    from sowstream.broker.testing import kafka_for_tests

    return stack.enter_context(kafka_for_tests())


def workspace(stack: ExitStack, name: str) -> tuple[Path, str]:
    """A scratch directory removed with ``stack`` and a fresh engine id/topic prefix."""
    work = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    stack.callback(shutil.rmtree, work, True)
    return work, f"{name[:4]}{uuid.uuid4().hex[:6]}"


def worker_command(config: Path, bootstrap: str, work: Path, *extra: str) -> list[str]:
    """``sowstream worker`` named ``bench`` with its state under ``work/data``."""
    return [
        sys.executable,
        "-m",
        "sowstream",
        "worker",
        "--config",
        str(config),
        "--bootstrap",
        bootstrap,
        "--name",
        "bench",
        "--data-dir",
        str(work / "data"),
        "--log-level",
        os.environ.get("SOWSTREAM_BENCH_LOG_LEVEL", "warning"),
        *extra,
    ]


def profiled(pid: int, out: Path, *, gil: bool = False) -> subprocess.Popen[bytes]:
    """py-spy recording process ``pid`` (100 Hz, raw format) until interrupted; with ``gil``
    only the thread holding the GIL is sampled (Python's CPU, not threads blocked in C)."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():  # installed outside the venv (``pip install py-spy`` elsewhere)
        spy = Path(shutil.which("py-spy") or spy)
    return subprocess.Popen(
        [str(spy), "record", "-p", str(pid), "-r", "100", "-f", "raw", "-o", str(out)]
        + (["--gil"] if gil else []),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """SIGTERM, then SIGKILL if it does not stop in time."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def wait_queryable(
    bootstrap: str,
    prefix: str,
    topics: Sequence[str],
    timeout: float,
    check: Callable[[], None] = lambda: None,
) -> float | None:
    """Seconds until every partition of ``topics`` answers a query, or None after ``timeout``.

    ``check`` runs between tries (e.g. to fail at once when the worker died).
    """
    started = time.perf_counter()
    with Client(bootstrap, prefix=prefix, timeout=5.0) as client:
        while time.perf_counter() - started < timeout:
            check()
            try:
                for topic in topics:
                    list(client.sow(topic, top_n=0))
                return time.perf_counter() - started
            except SowstreamError:
                time.sleep(0.2)
    return None


def paced(send: Callable[[int], object], rate: float, seconds: float) -> float:
    """Call ``send(i)`` for i = 0, 1, ... at ``rate`` per second for ``seconds`` (on a schedule,
    so a slow call is caught up on); returns the rate achieved."""
    gap = 1.0 / rate
    start = time.perf_counter()
    end = start + seconds
    next_at = start
    sent = 0
    while time.perf_counter() < end:
        send(sent)
        sent += 1
        next_at += gap
        time.sleep(max(0.0, next_at - time.perf_counter()))
    return sent / (time.perf_counter() - start)


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank; NaN when there are none)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
