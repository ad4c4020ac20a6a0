"""A live progress bar for Spark jobs, from Spark's own status tracker."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

POLL_S = 0.5


@contextmanager
def spark_progress(
    spark: SparkSession, title: str, console: Console | None = None
) -> Iterator[None]:
    """Show completed/total tasks of the session's running stages until the block ends.

    Spark only knows a stage's task count once it starts, so the bar tracks tasks of the stages
    seen so far; it never blocks the job (a daemon thread reads the tracker).
    """
    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} tasks"),
        TimeElapsedColumn(),
        console=console or Console(stderr=True),
        transient=False,
    )
    task = progress.add_task(title, total=None)
    seen: dict[int, tuple[int, int]] = {}

    def poll() -> None:
        while not stop.wait(POLL_S):
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    seen[stage_id] = (info.numCompletedTasks, info.numTasks)
            done = sum(c for c, _ in seen.values())
            total = sum(n for _, n in seen.values())
            progress.update(task, completed=done, total=total or None)

    thread = threading.Thread(target=poll, name="spark-progress", daemon=True)
    with progress:
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            total = sum(n for _, n in seen.values())
            progress.update(task, completed=total, total=total or 1)
