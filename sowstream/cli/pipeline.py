"""``sowstream pipeline``: Spark jobs over the transaction log (rebuild, point-in-time state)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import orjson
import typer

from sowstream.cli.common import Bootstrap, err, friendly_errors, print_records
from sowstream.config import SowstreamConfig, load_config
from sowstream.sow.timestamps import parse_timestamp

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pipeline_app = typer.Typer(
    no_args_is_help=True,
    help="Spark jobs over the transaction log: rebuild a SOW, or read it as of a past moment.",
)

ConfigPath = Annotated[Path, typer.Option("--config", "-c", help="YAML or AMPS XML config.")]
TopicName = Annotated[str, typer.Option("--topic", "-t", help="SOW topic.")]
Master = Annotated[str, typer.Option(help="Spark master (local[2], spark://..., yarn).")]


def _job(config: Path, topic: str, bootstrap: str | None) -> tuple[SowstreamConfig, str]:
    """The config and the bootstrap servers; fails on an unknown topic before Spark starts."""
    from sowstream.broker.bootstrap import resolve_bootstrap
    from sowstream.pipeline.rebuild import require_supported

    cfg = load_config(config)
    require_supported(cfg.topic(topic))
    return cfg, resolve_bootstrap(bootstrap or cfg.engine.bootstrap_servers)


@contextmanager
def _spark(master: str) -> Iterator[SparkSession]:
    """A session for one command, stopped when it ends (also on errors)."""
    from sowstream.pipeline.session import spark_session

    spark = spark_session(master)
    try:
        yield spark
    finally:
        spark.stop()


def _start(text: str) -> str | int:
    word = text.strip().lower()
    return word if word in ("epoch", "now") else parse_timestamp(text, "--from")


@pipeline_app.command()
@friendly_errors
def provision() -> None:
    """Fetch the Spark Kafka connector jars from Maven Central (done once, then cached)."""
    from sowstream.pipeline.connector import provision_connector

    jars = provision_connector()
    err.print(f"Spark Kafka connector: {len(jars)} jar(s) in {jars[0].parent if jars else '-'}")


@pipeline_app.command()
@friendly_errors
def rebuild(
    config: ConfigPath,
    topic: TopicName,
    start: Annotated[
        str, typer.Option("--from", help="epoch, now or a timestamp (20261123T080000).")
    ] = "epoch",
    until: Annotated[
        str | None, typer.Option("--until", help="Fold only records up to this timestamp.")
    ] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Parquet directory (default: rebuild/<topic>).")
    ] = None,
    seed: Annotated[
        Path | None,
        typer.Option(
            help="Also write a seed under this directory: workers started with --seed-dir "
            "take it instead of restoring (stop the workers first)."
        ),
    ] = None,
    bootstrap: Bootstrap = None,
    master: Master = "local[2]",
) -> None:
    """Fold a topic's transaction log into its SOW on Spark and write it as Parquet."""
    from sowstream.pipeline.progress import spark_progress
    from sowstream.pipeline.rebuild import rebuild as run_rebuild

    cfg, servers = _job(config, topic, bootstrap)
    begin = _start(start)
    until_ms = parse_timestamp(until, "--until") if until else None
    target = out_dir or Path("rebuild") / topic
    with _spark(master) as spark, spark_progress(spark, f"rebuild {topic}"):
        result = run_rebuild(spark, cfg, topic, servers, start=begin, until_ms=until_ms)
        result.state.write.mode("overwrite").parquet(str(target))
        count = spark.read.parquet(str(target)).count()
        if seed is not None:
            from sowstream.pipeline.seed import write_seed

            write_seed(spark, cfg, result, topic, servers, seed)
    err.print(
        f"[green]{topic}:[/] {count} record(s) from {result.log_range.records} log offset(s) "
        f"written to {target}" + (f", seed in {seed / topic}" if seed is not None else ""),
        highlight=False,
    )


@pipeline_app.command()
@friendly_errors
def asof(
    config: ConfigPath,
    topic: TopicName,
    time: Annotated[
        str | None,
        typer.Option("--time", help="The moment (20261123T080000 or ISO-8601); default now."),
    ] = None,
    filter: Annotated[str | None, typer.Option("--filter", "-f", help="Content filter.")] = None,
    grouping: Annotated[str | None, typer.Option(help="Aggregate: e.g. '\\[/region]'.")] = None,
    projection: Annotated[
        str | None, typer.Option(help="Aggregate: e.g. '\\[/region, SUM(/qty) AS /qty]'.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table.")] = False,
    bootstrap: Bootstrap = None,
    master: Master = "local[2]",
) -> None:
    """The SOW as it was at a moment (or aggregated), computed on Spark from the log itself.

    For moments older than a topic's History Window, or topics without History.
    """
    from sowstream.pipeline.rebuild import rebuild as run_rebuild

    cfg, servers = _job(config, topic, bootstrap)
    when = parse_timestamp(time, "--time") if time else None
    # bad options fail before Spark starts
    aggregation = None
    if grouping is not None or projection is not None:
        from sowstream.sow.aggregate import parse_aggregation

        aggregation = parse_aggregation(grouping, projection)
    if filter:
        from sowstream.filters import parse_filter

        parse_filter(filter)
    with _spark(master) as spark:
        state = run_rebuild(spark, cfg, topic, servers, until_ms=when).state
        if filter:
            from sowstream.pipeline.columns import filter_column

            state = state.where(filter_column(filter, "data"))
        if aggregation is not None:
            from sowstream.pipeline.aggregate import aggregate_state

            rows = [(topic, "", orjson.dumps(r)) for r in aggregate_state(state, aggregation)]
        else:
            rows = [
                (topic, r.sow_key, r.data)
                for r in state.orderBy("sow_key").select("sow_key", "data").collect()
            ]
    print_records(f"{topic} as of {time or 'now'}", rows, as_json)
