"""The parent of ``sowstream worker --processes N``: children's command lines, a child that
fails at start, a child that dies later (restarted) and a stop signal (forwarded)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from sowstream.cli.processes import Supervisor, child_commands


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _signal_self_after(
    seconds: float,
    signum: int = signal.SIGTERM,
    ready: list[Path] = (),  # type: ignore[assignment]
) -> threading.Timer:
    """Send ``signum`` to this process ``seconds`` after every ``ready`` file exists (the
    children have set up their handlers: a loaded machine starts Python slowly)."""

    def fire() -> None:
        deadline = time.monotonic() + 60
        while not all(p.exists() for p in ready) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(seconds)
        os.kill(os.getpid(), signum)

    timer = threading.Timer(0, fire)
    timer.start()
    return timer


def _mark_when_lines(path: Path, lines: int) -> None:
    """Create ``<path>.third`` once ``path`` has ``lines`` lines (60 s at most)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= lines:
            break
        time.sleep(0.05)
    Path(f"{path}.third").touch()


def test_children_get_their_own_name_and_metrics_port() -> None:
    commands = child_commands(["--config", "c.yaml"], 3, "box", 9100)
    assert [c[c.index("--name") + 1] for c in commands] == ["box-0", "box-1", "box-2"]
    assert [c[c.index("--metrics-port") + 1] for c in commands] == ["9100", "9101", "9102"]
    assert all(c[1:6] == ["-m", "sowstream", "worker", "--config", "c.yaml"] for c in commands)
    assert all("--metrics-port" not in c for c in child_commands([], 2, "box", None))


def test_a_child_failing_at_start_stops_the_others_with_its_code(tmp_path: Path) -> None:
    mark = tmp_path / "stopped"
    sleeper = _python(
        "import signal, sys, time, pathlib\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(mark)!r}).touch(), "
        "sys.exit(0)))\n"
        f"pathlib.Path({str(mark) + '.ready'!r}).touch()\n"
        "time.sleep(60)"
    )
    failing = _python(
        "import os, sys, time\n"
        f"while not os.path.exists({str(mark) + '.ready'!r}): time.sleep(0.05)\n"
        "sys.exit(3)"
    )
    started = time.monotonic()
    code = Supervisor([sleeper, failing]).run()
    assert code == 3
    assert mark.exists(), "the other child was not told to stop"
    assert time.monotonic() - started < 30


def test_a_child_that_dies_later_is_restarted_until_the_parent_is_stopped(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    # Exits (as if killed) 0.3 s after each start; every start leaves a line.
    flaky = _python(
        f"open({str(starts)!r}, 'a').write('x\\n'); import time, os; time.sleep(0.3); "
        "os.kill(os.getpid(), 9)"
    )
    timer = _signal_self_after(0.0, ready=[Path(f"{starts}.third")])
    watcher = threading.Thread(target=_mark_when_lines, args=(starts, 3), daemon=True)
    watcher.start()
    try:
        code = Supervisor([flaky], crash_loop_seconds=0.0, restart_delay=0.2).run()
    finally:
        timer.cancel()
    assert code == 0
    assert len(starts.read_text().splitlines()) >= 3


def test_a_stop_signal_is_forwarded_to_every_child(tmp_path: Path) -> None:
    marks = [tmp_path / f"child{i}" for i in range(2)]
    children = [
        _python(
            "import signal, sys, time, pathlib\n"
            f"signal.signal(signal.SIGINT, lambda *a: (pathlib.Path({str(m)!r}).write_text("
            "'INT'), sys.exit(0)))\n"
            f"pathlib.Path({str(m) + '.ready'!r}).touch()\n"
            "time.sleep(60)"
        )
        for m in marks
    ]
    timer = _signal_self_after(0.2, signal.SIGINT, [Path(f"{m}.ready") for m in marks])
    started = time.monotonic()
    try:
        code = Supervisor(children).run()
    finally:
        timer.cancel()
    assert code == 0
    assert [m.read_text() for m in marks] == ["INT", "INT"]
    assert time.monotonic() - started < 30


def test_a_child_that_ignores_the_stop_is_killed(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    stubborn = _python(
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open({str(ready)!r}, 'w'); time.sleep(60)"
    )
    timer = _signal_self_after(0.2, ready=[ready])
    started = time.monotonic()
    try:
        supervisor = Supervisor([stubborn], stop_timeout=1.0)
        assert supervisor.run() == 0
    finally:
        timer.cancel()
    assert supervisor.children[0].poll() == -signal.SIGKILL
    assert time.monotonic() - started < 20


def test_processes_below_one_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("sow:\n  - {Name: orders, Key: /id}\n")
    result = subprocess.run(
        [sys.executable, "-m", "sowstream", "worker", "--config", str(config), "--processes", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 2
    assert "'--processes'" in result.stderr, result.stderr
