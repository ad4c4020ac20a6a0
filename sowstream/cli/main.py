"""The ``sowstream`` command line: broker, worker, publish, delta-publish, sow, subscribe, delete.

Every subcommand is a thin layer over the client or the engine; errors become one red line.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.live import Live
from rich.table import Table

from sowstream.cli.broker import broker_app
from sowstream.cli.common import (
    Bootstrap,
    MessageTypeOpt,
    body_value,
    client_auth,
    err,
    friendly_errors,
    out,
    payload_for,
    print_records,
    show_logs,
)
from sowstream.cli.console import register as register_console
from sowstream.cli.pipeline import pipeline_app
from sowstream.cli.processes import Supervisor, child_commands
from sowstream.cli.queue import queue_app
from sowstream.cli.records import record_table
from sowstream.client import Client, Message, QueueSubscription, Subscription
from sowstream.config import load_config
from sowstream.messagetypes.changes import merge_delta

app = typer.Typer(
    help="sowstream: a State-of-the-World engine on Apache Kafka.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(broker_app, name="broker", help="Run the embedded local Kafka broker.")
app.add_typer(pipeline_app, name="pipeline", help="Spark jobs over the transaction log.")
app.add_typer(queue_app, name="queue", help="Lease, acknowledge and inspect queue messages.")
register_console(app)


@app.callback()
def verbosity(
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Log to stderr, librdkafka's own lines included (before the command: "
            "sowstream -v sow TOPIC).",
        ),
    ] = False,
) -> None:
    """Options before the command; without -v no log line reaches the terminal."""
    if verbose:
        show_logs()


Prefix = Annotated[str, typer.Option(help="Topic prefix of the engine.")]


@app.command()
@friendly_errors
def worker(
    config: Annotated[Path, typer.Option("--config", "-c", help="YAML or AMPS XML config.")],
    bootstrap: Bootstrap = None,
    name: Annotated[str | None, typer.Option(help="Worker name; keeps its RocksDB dir.")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Overrides engine.data_dir.")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "info",
    skip_unsupported: Annotated[
        bool,
        typer.Option(
            help="Skip AMPS topics/elements sowstream does not support yet, with a warning."
        ),
    ] = False,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Serve Prometheus metrics and the /live, /ready and /status probes on PORT."
        ),
    ] = None,
    metrics_host: Annotated[
        str,
        typer.Option(help="Address the metrics port listens on (0.0.0.0 in a container)."),
    ] = "127.0.0.1",
    seed_dir: Annotated[
        Path | None,
        typer.Option(help="Start partitions without local state from 'pipeline rebuild --seed'."),
    ] = None,
    static_membership: Annotated[
        bool,
        typer.Option(
            help="Join the group as a static member named after the worker (Kafka's "
            "group.instance.id): a quick restart keeps its partitions without a rebalance."
        ),
    ] = False,
    kafka_wait: Annotated[
        float,
        typer.Option(
            help="Seconds to keep retrying while no Kafka broker answers at start "
            "(0: retry until one does).",
            min=0,
        ),
    ] = 0.0,
    session_timeout: Annotated[
        float,
        typer.Option(
            help="Kafka consumer group session timeout in seconds: how long the group waits "
            "for a worker that stopped answering (a crashed one) before its partitions move "
            "(the broker allows 6 to 1800 by default).",
            min=1,
        ),
    ] = 10.0,
    processes: Annotated[
        int,
        typer.Option(
            help="Run N worker processes sharing the partitions (one per core), named "
            "NAME-0..NAME-<N-1>, metrics on PORT..PORT+N-1; signals reach all of them.",
            min=1,
        ),
    ] = 1,
) -> None:
    """Run a worker: it takes a share of the SOW partitions and serves them until stopped."""
    from sowstream.broker.bootstrap import resolve_bootstrap
    from sowstream.engine.app import Engine

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    cfg = load_config(config, skip_unsupported=skip_unsupported)
    if processes > 1:
        # The children read the config again; loading it here fails a bad one once, up front.
        base = ["--config", str(config), "--log-level", log_level]
        base += ["--metrics-host", metrics_host, "--kafka-wait", str(kafka_wait)]
        base += ["--session-timeout", str(session_timeout)]
        if bootstrap:
            base += ["--bootstrap", bootstrap]
        if data_dir is not None:
            base += ["--data-dir", str(data_dir)]
        if seed_dir is not None:
            base += ["--seed-dir", str(seed_dir)]
        if skip_unsupported:
            base.append("--skip-unsupported")
        if static_membership:
            base.append("--static-membership")
        port = metrics_port if metrics_port is not None else cfg.engine.web_port
        commands = child_commands(base, processes, name or socket.gethostname(), port)
        err.print(f"[bold green]sowstream worker[/]: {processes} processes, config {config}")
        raise typer.Exit(Supervisor(commands).run())
    servers = resolve_bootstrap(bootstrap or cfg.engine.bootstrap_servers)
    engine = Engine(
        cfg,
        bootstrap=servers,
        worker_name=name,
        data_dir=data_dir,
        log_level=log_level,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        seed_dir=seed_dir,
        static_membership=static_membership,
        session_timeout=session_timeout,
    )
    engine.health.serve_cluster(
        functools.partial(_cluster_status, servers, engine.names.prefix, engine.config.engine.kafka)
    )
    _banner(cfg.topics[0].name if cfg.topics else "TOPIC", servers, config)
    engine.run(kafka_wait)


def _cluster_status(bootstrap: str, prefix: str, kafka: dict[str, str]) -> dict[str, Any]:
    """The worker's ``/status/cluster``: what ``sowstream status --json`` prints."""
    with Client(bootstrap, prefix=prefix, config=kafka, auth=client_auth()) as client:
        return client.cluster_status()


def _banner(topic: str, bootstrap: str, config: Path) -> None:
    err.print(f"[bold green]sowstream worker[/] on Kafka {bootstrap}, config {config}")
    err.print("In another terminal (source .venv/bin/activate first):")
    err.print(
        f'  sowstream publish {topic} \'{{"order": 1, "customer": "Ann", "qty": 5}}\'',
        highlight=False,
    )
    err.print(f'  sowstream delta-publish {topic} \'{{"order": 1, "qty": 7}}\'', highlight=False)
    err.print(
        f"  sowstream sow {topic} --filter '/qty > 1' --order-by '/order DESC'", highlight=False
    )
    err.print(f"  sowstream delete {topic} --filter '1=1'", highlight=False)


def _messages(payload: str) -> Iterator[str]:
    if payload != "-":
        yield payload
        return
    for line in sys.stdin:
        if line.strip():
            yield line.strip()


def _publish(
    command: str,
    topic: str,
    payload: str,
    bootstrap: str | None,
    prefix: str,
    sow_key: str | None,
    expiration: str | None,
    ack: bool,
    message_type: str,
    soh: str | None,
) -> None:
    with Client(bootstrap, prefix=prefix, message_type=message_type, auth=client_auth()) as client:
        send = client.publish if command == "publish" else client.delta_publish
        codec = client.topic_info(topic, declare=True).codec
        count = 0
        for body in _messages(payload):
            data = payload_for(body, codec, soh)
            key = send(topic, data, sow_key=sow_key, expiration=expiration, ack=ack)
            count += 1
        client.flush()
    err.print(
        f"{command}: {count} message(s) to {topic}" + (f", SowKey {key}" if count == 1 else "")
    )


Payload = Annotated[
    str,
    typer.Argument(
        help="The message in the topic's type (avro: a JSON object of its fields), or - to read "
        "one per line on stdin."
    ),
]
SohOpt = Annotated[
    str | None,
    typer.Option("--soh", help="A character that stands for SOH in fix/nvfix payloads, e.g. '|'."),
]
SowKeyOpt = Annotated[
    str | None, typer.Option("--sow-key", help="SowKey, for topics without Key fields.")
]
ExpirationOpt = Annotated[
    str | None, typer.Option(help="Per-message expiration in seconds (0 = never).")
]
AckOpt = Annotated[bool, typer.Option(help="Wait until the engine applied each message.")]


@app.command()
@friendly_errors
def publish(
    topic: str,
    payload: Payload,
    bootstrap: Bootstrap = None,
    prefix: Prefix = "sowstream",
    sow_key: SowKeyOpt = None,
    expiration: ExpirationOpt = None,
    ack: AckOpt = False,
    message_type: MessageTypeOpt = "json",
    soh: SohOpt = None,
) -> None:
    """Publish (insert or replace) messages."""
    _publish(
        "publish", topic, payload, bootstrap, prefix, sow_key, expiration, ack, message_type, soh
    )


@app.command("delta-publish")
@friendly_errors
def delta_publish(
    topic: str,
    payload: Payload,
    bootstrap: Bootstrap = None,
    prefix: Prefix = "sowstream",
    sow_key: SowKeyOpt = None,
    expiration: ExpirationOpt = None,
    ack: AckOpt = False,
    message_type: MessageTypeOpt = "json",
    soh: SohOpt = None,
) -> None:
    """Merge messages into the stored records (delta_publish)."""
    _publish(
        "delta_publish",
        topic,
        payload,
        bootstrap,
        prefix,
        sow_key,
        expiration,
        ack,
        message_type,
        soh,
    )


@app.command()
@friendly_errors
def sow(
    topic: Annotated[str, typer.Argument(help="SOW topic, or a regular expression over them.")],
    filter: Annotated[str | None, typer.Option("--filter", "-f", help="Content filter.")] = None,
    order_by: Annotated[str | None, typer.Option(help="e.g. '/price DESC, /id'.")] = None,
    top_n: Annotated[int | None, typer.Option(help="At most this many records.")] = None,
    skip_n: Annotated[int | None, typer.Option(help="Skip this many (needs --top-n).")] = None,
    key: Annotated[list[str] | None, typer.Option("--key", help="Only these SowKeys.")] = None,
    batch_size: Annotated[int, typer.Option(help="Records per reply message.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table.")] = False,
    bookmark: Annotated[
        str | None, typer.Option(help="The SOW as of this time (20261123T080000; History).")
    ] = None,
    grouping: Annotated[str | None, typer.Option(help="Aggregate: e.g. '\\[/region]'.")] = None,
    projection: Annotated[
        str | None, typer.Option(help="Aggregate: e.g. '\\[/region, SUM(/qty) AS /qty]'.")
    ] = None,
    bootstrap: Bootstrap = None,
    prefix: Prefix = "sowstream",
    message_type: MessageTypeOpt = "json",
) -> None:
    """Query the State of the World (now, as of a bookmark, or aggregated)."""
    with Client(bootstrap, prefix=prefix, message_type=message_type, auth=client_auth()) as client:
        messages = client.sow(
            topic,
            filter,
            order_by=order_by,
            top_n=top_n,
            skip_n=skip_n,
            sow_keys=key,
            batch_size=batch_size,
            bookmark=bookmark,
            grouping=grouping,
            projection=projection,
        )
        found = [m for m in messages if m.command == "sow"]
    rows = [(m.topic, m.sow_key, m.data) for m in found]
    print_records(topic, rows, as_json, found[0].codec if found else None)


@app.command()
@friendly_errors
def subscribe(
    topic: Annotated[str, typer.Argument(help="SOW topic, or a regular expression over them.")],
    filter: Annotated[str | None, typer.Option("--filter", "-f", help="Content filter.")] = None,
    sow: Annotated[bool, typer.Option("--sow", help="Start with the matching records.")] = False,
    delta: Annotated[bool, typer.Option("--delta", help="Updates carry changed fields.")] = False,
    oof: Annotated[bool, typer.Option("--oof", help="Tell when a record leaves.")] = False,
    options: Annotated[
        str | None, typer.Option(help="More options, e.g. 'conflation=1s,no_empties'.")
    ] = None,
    order_by: Annotated[str | None, typer.Option(help="Window order (with --top-n).")] = None,
    top_n: Annotated[int | None, typer.Option(help="Live window size (needs --sow).")] = None,
    skip_n: Annotated[int | None, typer.Option(help="Window offset (needs --top-n).")] = None,
    identity: Annotated[str, typer.Option(help="Identity for entitlements.")] = "",
    bookmark: Annotated[
        str | None,
        typer.Option(help="Replay from a time, EPOCH or a message's bookmark, then go live."),
    ] = None,
    count: Annotated[int | None, typer.Option(help="Stop after this many messages.")] = None,
    idle: Annotated[float | None, typer.Option(help="Stop after this many idle seconds.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table.")] = False,
    bootstrap: Bootstrap = None,
    prefix: Prefix = "sowstream",
    message_type: MessageTypeOpt = "json",
) -> None:
    """Subscribe: live messages (with --sow, the matching records first), until Ctrl-C."""
    opts = ",".join(o for o in ("oof" if oof else "", options or "") if o)
    with Client(
        bootstrap,
        prefix=prefix,
        identity=identity,
        message_type=message_type,
        auth=client_auth(identity),
    ) as client:
        sub: Subscription | QueueSubscription
        if sow:
            place = client.sow_and_delta_subscribe if delta else client.sow_and_subscribe
            sub = place(
                topic,
                filter,
                options=opts,
                order_by=order_by,
                top_n=top_n,
                skip_n=skip_n,
                bookmark=bookmark,
            )
        else:
            if top_n is not None:
                raise typer.BadParameter("--top-n needs --sow")
            place_live = client.delta_subscribe if delta else client.subscribe
            sub = place_live(topic, filter, options=opts, bookmark=bookmark)
        view = LiveView(topic)
        seen = 0
        live = None if as_json else Live(view.table(), console=out, auto_refresh=False)
        try:
            with live if live is not None else _null():
                while count is None or seen < count:
                    msg = sub.next(timeout=idle if idle is not None else 1.0)
                    if msg is None:
                        if idle is not None:
                            break
                        continue
                    if msg.command in ("group_begin", "group_end"):
                        continue
                    seen += 1
                    if as_json:
                        sys.stdout.write(_json_line(msg) + "\n")
                        sys.stdout.flush()
                    elif live is not None:
                        view.apply(msg)
                        live.update(view.table(), refresh=True)
        except KeyboardInterrupt:
            pass
        finally:
            sub.close()


class LiveView:
    """The subscriber's picture of the topic: records by SowKey, deltas merged, oofs removed."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.records: dict[str, Any] = {}

    def apply(self, msg: Message) -> None:
        body = msg.fields() if msg.codec is None or msg.codec.has_fields else {"data": msg.data}
        if msg.command == "oof":
            self.records.pop(msg.sow_key, None)
        elif msg.delta and msg.sow_key in self.records:
            self.records[msg.sow_key] = merge_delta(self.records[msg.sow_key], body)
        else:
            self.records[msg.sow_key] = body

    def table(self) -> Table:
        return record_table(self.topic, list(self.records.items()), out.width)


@contextlib.contextmanager
def _null() -> Iterator[None]:
    yield None


def _json_line(msg: Message) -> str:
    return orjson.dumps(
        {
            "command": msg.command,
            "topic": msg.topic,
            "sow_key": msg.sow_key,
            "reason": msg.reason or None,
            "delta": msg.delta,
            "bookmark": msg.bookmark or None,
            "data": body_value(msg.data, msg.codec, delta=msg.delta),
        },
        default=str,
    ).decode()


@app.command()
@friendly_errors
def delete(
    topic: str,
    filter: Annotated[str | None, typer.Option("--filter", "-f", help="'1=1' deletes all.")] = None,
    key: Annotated[list[str] | None, typer.Option("--key", help="SowKey to delete.")] = None,
    data: Annotated[
        str | None, typer.Option(help="Delete the record this message keys to.")
    ] = None,
    bootstrap: Bootstrap = None,
    prefix: Prefix = "sowstream",
    message_type: MessageTypeOpt = "json",
) -> None:
    """Delete records from the SOW (sow_delete) by filter, SowKeys or data."""
    with Client(bootstrap, prefix=prefix, message_type=message_type, auth=client_auth()) as client:
        count = client.sow_delete(topic, filter=filter, sow_keys=key, data=data)
    out.print(f"deleted {count} record(s) from {topic}")


@app.command()
@friendly_errors
def status(
    topic: Annotated[
        str | None,
        typer.Argument(help="Limit partitions, topics and queues to a topic or regex."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON document (docs/deploy.md#status).")
    ] = False,
    wait: Annotated[
        float, typer.Option(help="Seconds to wait for the workers' answers.", min=0.1)
    ] = 5.0,
    bootstrap: Bootstrap = None,
    prefix: Prefix = "sowstream",
) -> None:
    """The cluster: workers, their partitions, restore progress, log lag, records,
    subscriptions, queues and dead letters. Workers that do not answer are shown as such."""
    with Client(bootstrap, prefix=prefix, auth=client_auth()) as client:
        doc = client.cluster_status(wait, topic=topic)
    if as_json:
        sys.stdout.write(orjson.dumps(doc).decode() + "\n")
        return
    for table in status_tables(doc):
        out.print(table)


# Columns of the partitions table: (title, how to show a row's value). Add columns here.
STATUS_COLUMNS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("topic", lambda row: str(row["topic"])),
    ("partition", lambda row: str(row["partition"])),
    ("worker", lambda row: str(row.get("worker") or "-")),
    ("answered", lambda row: "yes" if row["answered"] else "[red]no[/]"),
    ("watermark", lambda row: _dash(row["watermark"])),
    ("log end", lambda row: _dash(row["log_end"])),
    ("lag", lambda row: _dash(row["lag"])),
    ("records", lambda row: _dash(row["records"]) if row.get("sow", True) else "(no SOW)"),
    ("warnings", lambda row: "\n".join(w["message"] for w in row.get("warnings", []))),
)


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _uptime(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def status_tables(doc: dict[str, Any]) -> list[Table]:
    """``Client.cluster_status`` as rich tables: workers, partitions, topics, queues, dead
    letters."""
    workers = Table(title=f"{len(doc['workers'])} worker(s)")
    for title in ("worker", "host", "pid", "uptime", "state", "partitions", "restoring"):
        workers.add_column(title)
    for w in doc["workers"]:
        if not w["answering"]:
            state = f"[red]not answering[/] (last seen {w['last_seen_s']:.0f}s ago)"
        elif w["ready"]:
            state = "[green]ready[/]"
        else:
            state = f"[yellow]not ready[/]: {w['reason']}"
        restoring = "\n".join(
            f"{r['changelog']}/{r['partition']}: {r['offset'] + 1}/{r['end'] + 1}"
            for r in w["restore"]
        )
        workers.add_row(
            str(w["worker"]),
            str(w["host"]),
            str(w["pid"]),
            _uptime(w["uptime_s"]),
            state,
            " ".join(w["partitions"]),
            restoring,
        )
    rows = doc["partitions"]
    warned = sum(1 for row in rows if row.get("warnings"))
    silent = sum(1 for row in rows if not row["answered"])
    parts = Table(
        title=f"{len(rows)} partition(s), {warned} with warnings, {silent} without an answer"
    )
    for title, _ in STATUS_COLUMNS:
        parts.add_column(title, style="red" if title == "warnings" else None)
    for row in rows:
        parts.add_row(*(show(row) for _, show in STATUS_COLUMNS))
    topics = Table(title="topics")
    # Conflated topics add a column: changes taken in per record written (in/out).
    conflated = any(t.get("conflation") for t in doc["topics"])
    titles = ["topic", "type", "partitions", "records", "lag", "subscriptions"]
    for title in titles + (["conflation ratio"] if conflated else []):
        topics.add_column(title)
    for t in doc["topics"]:
        records = _dash(t["records"]) if t["sow"] else "(no SOW)"
        cells = [
            t["topic"],
            t["message_type"],
            str(t["partitions"]),
            records,
            str(t["lag"]),
            str(t["subscriptions"]),
        ]
        if conflated:
            c = t.get("conflation")
            cells.append(f"{_dash(c['ratio'])} ({c['incoming']}/{c['published']})" if c else "")
        topics.add_row(*cells)
    tables = [workers, parts, topics]
    if doc["queues"]:
        queues = Table(title="queues")
        for title in ("queue", "depth", "leased", "delivered", "acked", "expired"):
            queues.add_column(title)
        for q in doc["queues"]:
            if "error" in q:
                queues.add_row(q["queue"], f"[red]{q['error']}[/]")
                continue
            expired = sum(q["expired"].values())
            queues.add_row(
                q["queue"],
                *(str(q[c]) for c in ("depth", "leased", "delivered", "acked")),
                str(expired),
            )
        tables.append(queues)
    dead = doc["dead_letters"]
    letters = Table(title=f"{dead['count']} dead letter(s)")
    letters.add_column("reason")
    letters.add_column("records")
    for reason, count in sorted((dead["by_reason"] or {}).items()):
        letters.add_row(reason, str(count))
    tables.append(letters)
    return tables


def main() -> None:
    """Entry point for ``python -m sowstream``."""
    app()
