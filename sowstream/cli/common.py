"""What every ``sowstream`` subcommand shares: consoles, the bootstrap option, error handling."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

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
