"""``sowstream queue``: lease messages from a queue, acknowledge them, and see how queues stand.

A thin layer over :class:`~sowstream.client.Client`: ``subscribe`` leases and prints, ``ack``,
``cancel`` and ``expire`` act on bookmarks, ``status`` sums each queue's counters over its
partitions. Errors become one red line and exit status 2.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections import deque
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Annotated, Any, TypeVar

import orjson
import typer
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sowstream.cli.common import Bootstrap, client_auth, err, out
from sowstream.client import Client, Message
from sowstream.client.client import TopicInfo
from sowstream.client.cluster import queue_row
from sowstream.config import ConfigError
from sowstream.errors import InvalidCommandError, SowstreamError
from sowstream.filters import FilterError

queue_app = typer.Typer(
    no_args_is_help=True,
    help="Queues: lease messages, acknowledge, return or expire them, show depth and counters.",
)

F = TypeVar("F", bound=Callable[..., Any])

Prefix = Annotated[str, typer.Option(help="Topic prefix of the engine.")]
QueueArg = Annotated[str, typer.Argument(help="Queue name.")]
Bookmarks = Annotated[
    list[str],
    typer.Argument(help="Bookmarks (topic|partition|offset), separate or comma-separated."),
]

# Rows the live table keeps: the newest messages only, so a long run does not grow without end.
TABLE_ROWS = 200


def queue_errors(fn: F) -> F:
    """Our errors become one red line on stderr and exit status 2, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (SowstreamError, FilterError, ConfigError) as exc:
            # Text, not markup: bookmarks and filters may hold square brackets.
            line = " ".join(str(exc).split())
            err.print(Text.assemble(("error: ", "red"), line), soft_wrap=True)
            raise typer.Exit(2) from exc

    return wrapper  # type: ignore[return-value]


def _queue_info(client: Client, name: str) -> TopicInfo:
    """The meta-topic record of queue ``name``; a clear error when it is unknown or not a queue."""
    info = client.topics.get(name) or client.refresh_topics().get(name)
    if info is None:
        known = sorted(t.name for t in client.topics.values() if t.queue)
        hint = f" (queues: {', '.join(known)})" if known else " (no queues are defined)"
        raise InvalidCommandError(f"unknown queue {name!r}{hint}")
    if not info.queue:
        raise InvalidCommandError(f"{name!r} is a topic, not a queue")
    return info


def _split_bookmarks(values: list[str]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def _lease_text(lease_expires: int | None) -> str:
    """When a lease ends, in local time to the millisecond ("never" without LeasePeriod)."""
    if lease_expires is None:
        return "never"
    return datetime.fromtimestamp(lease_expires / 1000).strftime("%H:%M:%S.%f")[:-3]


def _json_line(queue: str, msg: Message) -> str:
    return orjson.dumps(
        {
            "queue": queue,
            "bookmark": msg.bookmark,
            "deliveries": msg.deliveries,
            "lease_expires": msg.lease_expires,
            "timestamp": msg.timestamp,
            "data": msg.json(),
        }
    ).decode()


class LeaseView:
    """The messages leased so far (the newest ones), as a table."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.rows: deque[tuple[str, str, str, str, str]] = deque(maxlen=TABLE_ROWS)
        self.seen = 0
        self.acked = 0

    def add(self, msg: Message) -> None:
        self.seen += 1
        data = msg.data.decode("utf-8", "replace")
        self.rows.append(
            (msg.bookmark, str(msg.deliveries), _lease_text(msg.lease_expires), data, "")
        )

    def mark_acked(self) -> None:
        self.acked += 1
        bookmark, deliveries, lease, data, _ = self.rows[-1]
        self.rows[-1] = (bookmark, deliveries, lease, data, "yes")

    def table(self) -> Table:
        table = Table(title=f"{self.queue}: {self.seen} message(s) leased, {self.acked} acked")
        table.add_column("bookmark", style="dim", no_wrap=True)
        table.add_column("deliveries", justify="right")
        table.add_column("lease expires", no_wrap=True)
        table.add_column("data")
        table.add_column("acked")
        for row in self.rows:
            table.add_row(*row)
        return table


@contextlib.contextmanager
def _null() -> Iterator[None]:
    yield None


@queue_app.command()
@queue_errors
def subscribe(
    queue: QueueArg,
    filter: Annotated[
        str | None, typer.Option("--filter", "-f", help="Only lease messages matching this.")
    ] = None,
    max_backlog: Annotated[
        int | None,
        typer.Option(
            help="Messages held unacknowledged at once (capped by MaxPerSubscriptionBacklog).",
        ),
    ] = None,
    ack: Annotated[
        bool,
        typer.Option(
            "--ack/--no-ack",
            help="Acknowledge each message once printed; with --no-ack leases go back on exit.",
        ),
    ] = True,
    count: Annotated[int | None, typer.Option(help="Stop after this many messages.")] = None,
    idle: Annotated[
        float | None, typer.Option(help="Stop after this many seconds without a message.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table.")] = False,
    identity: Annotated[str, typer.Option(help="Identity for entitlements.")] = "",
    bootstrap: Bootstrap = None,
    prefix: Prefix = "sowstream",
) -> None:
    """Lease messages from a queue and print them, until --count, --idle or Ctrl-C."""
    if max_backlog is not None and max_backlog < 1:
        raise typer.BadParameter("--max-backlog must be at least 1")
    options = f"max_backlog={max_backlog}" if max_backlog is not None else None
    with Client(bootstrap, prefix=prefix, identity=identity, auth=client_auth(identity)) as client:
        _queue_info(client, queue)
        sub = client.subscribe(queue, filter, options=options)
        view = LeaseView(queue)
        # A live table on a terminal; piped, the final table only (Live leaves no newline there).
        live = None
        if not as_json and out.is_terminal:
            live = Live(view.table(), console=out, auto_refresh=False)
        try:
            with live if live is not None else _null():
                while count is None or view.seen < count:
                    msg = sub.next(timeout=idle if idle is not None else 1.0)
                    if msg is None:
                        if idle is not None:
                            break
                        continue
                    view.add(msg)
                    if as_json:
                        sys.stdout.write(_json_line(queue, msg) + "\n")
                        sys.stdout.flush()
                    if ack:
                        # Synchronous: once the engine answered, the ack is durable, so what was
                        # printed before the command exits is never delivered again.
                        if client.ack(queue, [msg.bookmark]):
                            view.mark_acked()
                        else:
                            err.print(
                                f"note: acknowledging {msg.bookmark} changed nothing (already "
                                "acknowledged or expired, or leased to another client under "
                                "strict leasing)",
                                markup=False,
                                highlight=False,
                                soft_wrap=True,
                            )
                    if live is not None:
                        live.update(view.table(), refresh=True)
        except KeyboardInterrupt:
            pass
        finally:
            sub.close()  # leases not acknowledged go back to the queue
    if not as_json and live is None:
        out.print(view.table())
    if as_json:
        done = "acknowledged" if ack else "not acknowledged (returned to the queue)"
        err.print(f"{view.seen} message(s) from {queue}, {view.acked} {done}", highlight=False)


def _acknowledge(
    action: str,
    queue: str,
    bookmarks: list[str] | None,
    filter: str | None,
    bootstrap: str | None,
    prefix: str,
) -> None:
    marks = _split_bookmarks(bookmarks or [])
    if filter is None and not marks:
        raise InvalidCommandError("give at least one bookmark (topic|partition|offset)")
    if filter is not None and marks:
        raise InvalidCommandError("give bookmarks or --filter, not both")
    with Client(bootstrap, prefix=prefix, auth=client_auth()) as client:
        _queue_info(client, queue)
        count = client.ack(queue, marks or None, action=action, filter=filter)
    verb = {"": "acknowledged", "cancel": "returned", "expire": "expired"}[action]
    asked = f" of {len(marks)} bookmark(s)" if marks else f" matching {filter!r}"
    out.print(f"{verb} {count} message(s){asked} on {queue}", markup=False, highlight=False)


@queue_app.command("ack")
@queue_errors
def ack_(
    queue: QueueArg,
    bookmarks: Annotated[
        list[str] | None,
        typer.Argument(help="Bookmarks (topic|partition|offset), separate or comma-separated."),
    ] = None,
    filter: Annotated[
        str | None,
        typer.Option("--filter", "-f", help="Acknowledge every message matching this instead."),
    ] = None,
    bootstrap: Bootstrap = None,
    prefix: Prefix = "sowstream",
) -> None:
    """Acknowledge messages: they leave the queue."""
    _acknowledge("", queue, bookmarks, filter, bootstrap, prefix)


@queue_app.command()
@queue_errors
def cancel(
    queue: QueueArg,
    bookmarks: Bookmarks,
    bootstrap: Bootstrap = None,
    prefix: Prefix = "sowstream",
) -> None:
    """Return leased messages to the queue now (each counts as a cancel, see MaxCancels)."""
    _acknowledge("cancel", queue, bookmarks, None, bootstrap, prefix)


@queue_app.command()
@queue_errors
def expire(
    queue: QueueArg,
    bookmarks: Bookmarks,
    bootstrap: Bootstrap = None,
    prefix: Prefix = "sowstream",
) -> None:
    """Expire messages now (reason forced_expire): they are not delivered again."""
    _acknowledge("expire", queue, bookmarks, None, bootstrap, prefix)


def _seconds_text(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds else "-"


def _expired_text(expired: dict[str, int]) -> str:
    if not expired:
        return "0"
    reasons = ", ".join(f"{reason} {n}" for reason, n in expired.items())
    return f"{sum(expired.values())} ({reasons})"


@queue_app.command()
@queue_errors
def status(
    queues: Annotated[
        list[str] | None, typer.Argument(help="Queues to show (default: every queue).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON line per queue instead of a table.")
    ] = False,
    bootstrap: Bootstrap = None,
    prefix: Prefix = "sowstream",
) -> None:
    """Depth, leases and counters of queues, summed over their partitions.

    Counters start when a worker takes a partition, so they restart after a rebalance.
    """
    with Client(bootstrap, prefix=prefix, auth=client_auth()) as client:
        if queues:
            names = [_queue_info(client, name).name for name in queues]
        else:
            names = sorted(info.name for info in client.topics.values() if info.queue)
        rows = [queue_row(name, client.queue_status(name)) for name in names]
    if as_json:
        for row in rows:
            sys.stdout.write(orjson.dumps(row).decode() + "\n")
        return
    if not rows:
        err.print(f"no queues are defined under prefix {prefix!r}", highlight=False)
        return
    table = Table(title="queues")
    table.add_column("queue")
    for column in ("depth", "leased", "delivered", "acked"):
        table.add_column(column, justify="right")
    table.add_column("expired")
    table.add_column("returned", justify="right")
    # How each queue keeps up, apart: one table of both would not fit 80 columns.
    ages = Table(title="how they keep up")
    ages.add_column("queue")
    ages.add_column("behind", justify="right")  # seconds_behind
    ages.add_column("oldest lease", justify="right")  # age_of_oldest_lease
    ages.add_column("priorities", justify="right")  # priority_count
    for row in rows:
        returned = row["returned"]
        table.add_row(
            row["queue"],
            *(str(row[c]) for c in ("depth", "leased", "delivered", "acked")),
            _expired_text(row["expired"]),
            "-" if returned is None else str(returned),
        )
        ages.add_row(
            row["queue"],
            _seconds_text(row["seconds_behind"]),
            _seconds_text(row["age_of_oldest_lease"]),
            str(row["priority_count"]),
        )
    out.print(table)
    out.print(ages)
