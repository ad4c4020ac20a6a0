"""``sowstream worker --processes N``: N worker processes on one machine, one per core.

A worker applies its partitions on one core (Python's), so a machine with more cores runs more
workers. The parent starts N ordinary workers, each a member of the consumer group with its own
name (``NAME-0`` .. ``NAME-<N-1>``), RocksDB directory (named after the worker) and metrics
port (``PORT + i``); Kafka's group assignment shares the partitions among them as among workers
on different machines. The parent forwards SIGINT/SIGTERM to them and waits for them; a child
that exits on its own is reported and started again, unless it failed within
:data:`CRASH_LOOP_SECONDS` of its start (say, its metrics port in use): then the parent stops the
others and exits with the child's code.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType

log = logging.getLogger("sowstream.processes")

CRASH_LOOP_SECONDS = 10.0  # a child that fails this soon after its start is not restarted
RESTART_DELAY_SECONDS = 1.0
STOP_TIMEOUT_SECONDS = 60.0  # after a forwarded signal, before the children are killed
POLL_SECONDS = 0.2
_PR_SET_PDEATHSIG = 1


def child_commands(
    base: Sequence[str], processes: int, name: str, metrics_port: int | None
) -> list[list[str]]:
    """The command lines of the ``processes`` children of ``sowstream worker ARGS`` (``base``:
    the worker's arguments without ``--name``, ``--metrics-port`` and ``--processes``)."""
    commands = []
    for i in range(processes):
        command = [sys.executable, "-m", "sowstream", "worker", *base, "--name", f"{name}-{i}"]
        if metrics_port:
            command += ["--metrics-port", str(metrics_port + i)]
        commands.append(command)
    return commands


def _die_with_parent() -> None:
    """In a child, before exec: SIGTERM when the parent dies (Linux), so a killed parent
    leaves no workers behind holding partitions."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    """One worker process and its command line."""

    index: int
    command: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restarts: int = 0
    exited_at: float | None = field(default=None)

    def start(self) -> None:
        # Its own session: a Ctrl-C in the terminal reaches the parent only, which forwards it
        # once (a second SIGINT makes a faust worker stop without its shutdown).
        self.proc = subprocess.Popen(
            self.command, start_new_session=True, preexec_fn=_die_with_parent
        )
        self.started = time.monotonic()
        self.exited_at = None

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else -1

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)


class Supervisor:
    """Runs the children until a signal stops them (see the module's docstring)."""

    def __init__(
        self,
        commands: list[list[str]],
        *,
        crash_loop_seconds: float = CRASH_LOOP_SECONDS,
        restart_delay: float = RESTART_DELAY_SECONDS,
        stop_timeout: float = STOP_TIMEOUT_SECONDS,
    ) -> None:
        self.children = [Child(i, command) for i, command in enumerate(commands)]
        self._crash_loop = crash_loop_seconds
        self._restart_delay = restart_delay
        self._stop_timeout = stop_timeout
        self._stopping: int | None = None  # the signal being forwarded

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stopping is None:
            log.info("%s: stopping %d workers", signal.Signals(signum).name, len(self.children))
        self._stopping = signum
        for child in self.children:
            child.signal(signum)

    def run(self) -> int:
        """Start the children and supervise them; returns the exit code for the parent."""
        previous = {
            signum: signal.signal(signum, self._on_signal)
            for signum in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            for child in self.children:
                child.start()
                log.info("started worker %d (pid %d)", child.index, child.pid)
            code = self._supervise()
        finally:
            self._stop_all()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return code

    def _supervise(self) -> int:
        while self._stopping is None:
            time.sleep(POLL_SECONDS)
            now = time.monotonic()
            for child in self.children:
                if self._stopping is not None:
                    break
                code = child.poll()
                if code is None:
                    continue
                if child.exited_at is None:
                    child.exited_at = now
                    ran = now - child.started
                    log.error(
                        "worker %d (pid %d) exited with code %d after %.0fs",
                        child.index,
                        child.pid,
                        code,
                        ran,
                    )
                    if code != 0 and ran < self._crash_loop:
                        log.error("worker %d failed at start: stopping the others", child.index)
                        return code
                if now - child.exited_at >= self._restart_delay:
                    child.restarts += 1
                    child.start()
                    log.warning(
                        "restarted worker %d (pid %d, restart %d)",
                        child.index,
                        child.pid,
                        child.restarts,
                    )
        return 0

    def _stop_all(self) -> None:
        """Forward the stop (SIGTERM unless a signal came), wait, then kill what is left."""
        signum = self._stopping or signal.SIGTERM
        for child in self.children:
            child.signal(signum)
        deadline = time.monotonic() + self._stop_timeout
        for child in self.children:
            if child.proc is None:
                continue
            try:
                child.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker %d (pid %d) did not stop: killed", child.index, child.pid)
                child.proc.kill()
                child.proc.wait(10)
