"""What every benchmark needs: a broker, a scratch workspace, a worker process to start."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from contextlib import ExitStack
from pathlib import Path


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
        "warning",
        *extra,
    ]


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
