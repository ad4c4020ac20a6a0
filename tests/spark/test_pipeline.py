"""The Spark pipeline against a real engine and broker: rebuild, point in time, aggregates, seeds.

Each answer Spark computes from the transaction log is compared with the engine's answer for
the same log, so the two folds (per SowKey on Spark, per batch in the engine) must agree.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pyspark.sql import SparkSession

from sowstream.client import Client
from sowstream.config import SowstreamConfig, load_config
from sowstream.errors import PipelineError, UnknownTopicError
from sowstream.pipeline.aggregate import aggregate_state
from sowstream.pipeline.columns import filter_column
from sowstream.pipeline.rebuild import rebuild
from sowstream.pipeline.seed import write_seed
from sowstream.sow.aggregate import parse_aggregation
from sowstream.sow.timestamps import format_timestamp
from tests.support.engine import REPO, EngineProcesses, running_engine

pytestmark = pytest.mark.integration

TOPICS: list[dict[str, Any]] = [
    {"Name": "orders", "Key": ["/id"], "HashIndex": [["/customer"]], "Partitions": 4},
    {"Name": "quotes", "Key": ["/id"], "Expiration": "enabled", "Partitions": 4},
    {"Name": "hist", "Key": ["/id"], "History": {"Window": "1d"}, "Partitions": 4},
    {"Name": "scratch", "Key": ["/id"], "Durability": "transient", "Partitions": 2},
    {
        "Name": "desks",
        "KeyGenerator": {
            "Module": "sowstream.sow.keygen:joined",
            "Options": {"Fields": "/desk,/id"},
        },
        "Partitions": 2,
    },
    {
        "Name": "enriched",
        "Key": ["/key"],
        "Partitions": 2,
        "Preprocessing": ["CONCAT(/desk, '-', /id) AS /key"],
        "Enrichment": [
            "COALESCE(/n OF PREVIOUS, 0) + 1 AS /n",
            "IF(/qty < 0, /qty OF PREVIOUS, /qty) AS /qty",
            "UNIX_TIMESTAMP() AS /at",
        ],
    },
]
PROJECTION = "[/customer, COUNT(/id) AS /n, SUM(/qty) AS /qty, AVG(/px) AS /px, MAX(/v) AS /v]"


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    workdir = tmp_path_factory.mktemp("pipeline")
    with running_engine(kafka_bootstrap, workdir, TOPICS, workers=("w1",)) as procs:
        yield procs


@pytest.fixture(scope="module")
def config(engine: EngineProcesses) -> SowstreamConfig:
    return load_config(engine.config)


def sow_state(client: Client, topic: str, **kw: Any) -> dict[str, Any]:
    return {m.sow_key: m.json() for m in client.sow(topic, **kw) if m.command == "sow"}


def spark_state(rows: list[Any]) -> dict[str, Any]:
    return {r.sow_key: orjson.loads(r.data) for r in rows}


def load_orders(client: Client) -> None:
    for i in range(400):
        client.publish(
            "orders",
            {"id": i % 90, "customer": f"c{i % 7}", "qty": i % 13, "px": 1.5 * (i % 5), "v": i},
        )
    for i in range(0, 90, 4):
        client.delta_publish("orders", {"id": i, "qty": 100 + i, "extra": {"flag": True}})
    client.sow_delete("orders", filter="/customer = 'c3' AND /v > 300")
    client.sow_delete("orders", data={"id": 5})
    seven = [m.sow_key for m in client.sow("orders", "/id = 9") if m.command == "sow"]
    assert len(seven) == 1
    client.sow_delete("orders", sow_keys=seven)


def test_rebuild_equals_the_engine(
    spark: SparkSession, engine: EngineProcesses, config: SowstreamConfig
) -> None:
    with engine.client() as client:
        load_orders(client)
        for i in range(20):
            client.publish("quotes", {"id": i, "px": i}, expiration=1 if i % 2 else 0)
        client.delta_publish("quotes", {"id": 2, "px": -2})
        expected = sow_state(client, "orders")
        time.sleep(2.5)  # odd quotes expire
        quotes = sow_state(client, "quotes")
    assert len(quotes) == 10 and len(expected) > 50
    orders = rebuild(spark, config, "orders", engine.bootstrap)
    assert spark_state(orders.state.collect()) == expected
    assert orders.log_range.records > 400
    assert spark_state(rebuild(spark, config, "quotes", engine.bootstrap).state.collect()) == quotes
    # a filter on Spark columns selects what the engine's filter selects
    with engine.client() as client:
        wanted = sow_state(client, "orders", filter="/qty > 50 OR /extra/flag = true")
    picked = orders.state.where(filter_column("/qty > 50 OR /extra/flag = true", "data"))
    assert spark_state(picked.collect()) == wanted


def test_a_key_generator_keys_the_engine_and_the_rebuild_alike(
    spark: SparkSession, engine: EngineProcesses, config: SowstreamConfig
) -> None:
    with engine.client() as client:
        for i in range(30):
            client.publish("desks", {"desk": f"d{i % 3}", "id": i % 6, "qty": i})
        client.delta_publish("desks", {"desk": "d1", "id": 1, "note": "merged"})
        client.sow_delete("desks", data={"desk": "d2", "id": 2})
        expected = sow_state(client, "desks")
    assert expected == {
        "d0|0": {"desk": "d0", "id": 0, "qty": 24},
        "d1|1": {"desk": "d1", "id": 1, "qty": 25, "note": "merged"},
        "d0|3": {"desk": "d0", "id": 3, "qty": 27},
        "d1|4": {"desk": "d1", "id": 4, "qty": 28},
        "d2|5": {"desk": "d2", "id": 5, "qty": 29},
    }
    desks = rebuild(spark, config, "desks", engine.bootstrap)
    assert spark_state(desks.state.collect()) == expected


def test_preprocessing_and_enrichment_rebuild_as_the_engine_applied_them(
    spark: SparkSession, engine: EngineProcesses, config: SowstreamConfig
) -> None:
    """Each record's Enrichment reads the one before it (a counter, a kept value) and the log
    time: the rebuild folds every key's whole log and finds what the engine stored."""
    with engine.client() as client:
        for i in range(60):
            qty = -1 if i % 7 == 0 else i
            client.publish("enriched", {"desk": f"d{i % 2}", "id": i % 9, "qty": qty})
        for i in range(0, 9, 2):
            client.delta_publish("enriched", {"desk": "d0", "id": i, "note": "merged", "qty": -5})
        client.sow_delete("enriched", data={"desk": "d1", "id": 1})
        expected = sow_state(client, "enriched")
    assert max(r["n"] for r in expected.values()) > 3
    assert any(r.get("note") == "merged" for r in expected.values())
    rebuilt = rebuild(spark, config, "enriched", engine.bootstrap)
    assert spark_state(rebuilt.state.collect()) == expected


def test_point_in_time_and_aggregates_agree_with_engine_history(
    spark: SparkSession, engine: EngineProcesses, config: SowstreamConfig
) -> None:
    with engine.client() as client:
        for i in range(60):
            client.publish(
                "hist", {"id": i, "customer": f"c{i % 4}", "qty": i, "px": i / 2, "v": 0}
            )
        list(client.sow("hist", top_n=0))
        time.sleep(0.05)
        t1 = int(time.time() * 1000)
        time.sleep(0.05)
        for i in range(0, 60, 3):
            client.delta_publish("hist", {"id": i, "v": 1, "qty": 1000})
        client.sow_delete("hist", filter="/customer = 'c1'")
        then = sow_state(client, "hist", bookmark=format_timestamp(t1))
        now = sow_state(client, "hist")
        engine_then = [
            m.json()
            for m in client.sow(
                "hist", grouping="[/customer]", projection=PROJECTION, bookmark=format_timestamp(t1)
            )
            if m.command == "sow"
        ]
        engine_now = [
            m.json()
            for m in client.sow("hist", grouping="[/customer]", projection=PROJECTION)
            if m.command == "sow"
        ]
    past = rebuild(spark, config, "hist", engine.bootstrap, until_ms=t1)
    assert spark_state(past.state.collect()) == then
    current = rebuild(spark, config, "hist", engine.bootstrap)
    assert spark_state(current.state.collect()) == now
    aggregation = parse_aggregation("[/customer]", PROJECTION)
    assert aggregate_state(past.state, aggregation) == engine_then
    assert aggregate_state(current.state, aggregation) == engine_now
    # from a time: only what happened after it is folded (as a RecoveryPoint would), so the
    # deltas start records of their own and the filter delete finds no customer in them
    later = rebuild(spark, config, "hist", engine.bootstrap, start=t1)
    assert sorted(spark_state(later.state.collect()).values(), key=lambda r: r["id"]) == [
        {"id": i, "v": 1, "qty": 1000} for i in range(0, 60, 3)
    ]


def test_rebuild_errors(
    spark: SparkSession, engine: EngineProcesses, config: SowstreamConfig
) -> None:
    with pytest.raises(UnknownTopicError, match="'nope'"):
        rebuild(spark, config, "nope", engine.bootstrap)
    started = time.monotonic()
    with pytest.raises(PipelineError, match=r"cannot reach Kafka at 127\.0\.0\.1:1"):
        rebuild(spark, config, "orders", "127.0.0.1:1")
    assert time.monotonic() - started < 30
    scratch = rebuild(spark, config, "scratch", engine.bootstrap)
    with pytest.raises(PipelineError, match="keeps no persistent SOW"):
        write_seed(spark, config, scratch, "scratch", engine.bootstrap, engine.workdir / "x")
    orders = rebuild(spark, config, "orders", engine.bootstrap)
    with pytest.raises(PipelineError, match="running: stop them before writing a seed"):
        write_seed(spark, config, orders, "orders", engine.bootstrap, engine.workdir / "x")


def test_a_worker_that_lost_its_state_starts_from_a_seed(
    spark: SparkSession, engine: EngineProcesses, config: SowstreamConfig
) -> None:
    with engine.client() as client:
        expected = sow_state(client, "orders")
        indexed = sow_state(client, "orders", filter="/customer = 'c1'")
    assert expected and indexed
    engine.stop_all()
    shutil.rmtree(engine.data_dir("w1"))
    seeds = engine.workdir / "seeds"
    result = rebuild(spark, config, "orders", engine.bootstrap)
    manifest = write_seed(spark, config, result, "orders", engine.bootstrap, seeds)
    assert sum(p["entries"] for p in manifest.partitions.values()) > len(expected)
    assert json.loads((seeds / "orders" / "seed.json").read_text())["topic"] == "orders"

    engine.start("w1", "--seed-dir", str(seeds))
    engine.wait_ready([t["Name"] for t in TOPICS])
    assert "seeded" in (engine.workdir / "w1.log").read_text()
    with engine.client() as client:
        assert sow_state(client, "orders") == expected
        assert sow_state(client, "orders", filter="/customer = 'c1'") == indexed
        client.publish("orders", {"id": 5000, "customer": "c1"})
        expected = sow_state(client, "orders")
    # the changelog agrees with the seed: a worker restoring from it sees the same SOW
    engine.stop_all()
    engine.start("w2")
    engine.wait_ready([t["Name"] for t in TOPICS])
    with engine.client() as client:
        assert sow_state(client, "orders") == expected
    engine.stop_all()
    engine.start("w1")
    engine.wait_ready([t["Name"] for t in TOPICS])


def test_cli_asof_and_rebuild(engine: EngineProcesses, tmp_path: Path) -> None:
    with engine.client() as client:
        expected = sow_state(client, "orders", filter="/customer = 'c2'")
    env_cmd = [sys.executable, "-m", "sowstream", "pipeline"]
    common = ["--config", str(engine.config), "--topic", "orders", "--bootstrap", engine.bootstrap]
    done = subprocess.run(
        [*env_cmd, "asof", *common, "--filter", "/customer = 'c2'", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert {line["sow_key"]: line["data"] for line in lines} == expected
    out = tmp_path / "parquet"
    done = subprocess.run(
        [*env_cmd, "rebuild", *common, "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "tasks" in done.stderr and "written to" in done.stderr  # progress, then the summary
    assert any(out.glob("*.parquet"))
    bad = subprocess.run(
        [*env_cmd, "asof", *common, "--time", "whenever"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert bad.returncode == 1 and "'whenever' is not a timestamp" in bad.stderr
