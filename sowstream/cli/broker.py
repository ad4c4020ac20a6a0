"""``sowstream broker``: provision, start, stop and inspect the embedded local Kafka broker."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from sowstream.broker.local import LocalBroker
from sowstream.broker.provision import KAFKA_VERSION, ensure_kafka_jars
from sowstream.errors import BrokerError

broker_app = typer.Typer(no_args_is_help=True, help="The embedded single-node Kafka broker.")
err = Console(stderr=True, soft_wrap=True)  # errors name paths: never break them

Home = Annotated[Path | None, typer.Option(help="Broker directory (default .sowstream/broker).")]


def _fail(exc: BrokerError) -> typer.Exit:
    err.print(f"[red]error:[/red] {exc}", highlight=False)
    return typer.Exit(1)


@broker_app.command()
def provision() -> None:
    """Download Kafka's jars from Maven Central (done once, cached in ~/.cache/sowstream)."""
    try:
        libs = ensure_kafka_jars()
    except BrokerError as exc:
        raise _fail(exc) from exc
    err.print(f"Apache Kafka {KAFKA_VERSION}: {libs}")


@broker_app.command()
def start(
    port: Annotated[int | None, typer.Option(help="Broker port (default: a free one).")] = None,
    home: Home = None,
) -> None:
    """Start the broker in the background and wait until it answers."""
    try:
        bootstrap = LocalBroker(home).start(port)
    except BrokerError as exc:
        raise _fail(exc) from exc
    err.print(f"[green]Kafka {KAFKA_VERSION} is running on {bootstrap}[/green]")
    err.print(f"Point other tools at it with: export SOWSTREAM_BOOTSTRAP={bootstrap}")


@broker_app.command()
def stop(home: Home = None) -> None:
    """Stop the broker."""
    if LocalBroker(home).stop():
        err.print("broker stopped")
    else:
        err.print("no broker was running")


@broker_app.command()
def status(home: Home = None) -> None:
    """Show whether the broker runs, where, and where its files are."""
    s = LocalBroker(home).status()
    table = Table(show_header=False)
    table.add_row("running", "[green]yes[/green]" if s.running else "[red]no[/red]")
    table.add_row("bootstrap", s.bootstrap or "-")
    table.add_row("pid", str(s.pid or "-"))
    table.add_row("version", s.version)
    table.add_row("data", str(s.data_dir))
    table.add_row("log", str(s.log_file))
    Console().print(table)
    if not s.running:
        raise typer.Exit(3)
