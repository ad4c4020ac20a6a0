"""What every ``sowstream`` subcommand shares: consoles, the bootstrap option, error handling."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

import orjson
import typer
from rich.console import Console
from rich.table import Table

from sowstream.config import ConfigError
from sowstream.errors import SowstreamError
from sowstream.filters import FilterError

err = Console(stderr=True)
out = Console()

F = TypeVar("F", bound=Callable[..., Any])

Bootstrap = Annotated[
    str | None,
    typer.Option(
        "--bootstrap",
        "-b",
        envvar="SOWSTREAM_BOOTSTRAP",
        help="Kafka bootstrap servers (default: the local broker).",
    ),
]


def friendly_errors(fn: F) -> F:
    """Turn our errors into one red line and exit status 1 instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (SowstreamError, FilterError, ConfigError) as exc:
            err.print(f"[red]error:[/red] {exc}", highlight=False)
            raise typer.Exit(1) from exc

    return wrapper  # type: ignore[return-value]


def print_records(title: str, rows: Sequence[tuple[str, str, bytes | str]], as_json: bool) -> None:
    """``(topic, sow_key, JSON data)`` rows as a table, or as JSON lines for scripts."""
    if as_json:
        for topic, sow_key, data in rows:
            line = {"topic": topic, "sow_key": sow_key, "data": orjson.loads(data)}
            sys.stdout.write(orjson.dumps(line).decode() + "\n")
        return
    table = Table(title=f"{title}: {len(rows)} record(s)")
    table.add_column("SowKey", style="dim")
    table.add_column("data")
    for _, sow_key, data in rows:
        table.add_row(sow_key, data if isinstance(data, str) else data.decode("utf-8", "replace"))
    out.print(table)
