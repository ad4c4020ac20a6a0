"""Pipeline benchmark: rebuilding a SOW from its log on Spark vs a worker's replay, and restarts.

Run with ``make bench-pipeline`` (or ``python -m bench.pipeline_bench --updates 10000000 --keys
1000000``). It uses $SOWSTREAM_BOOTSTRAP or starts the embedded local broker. In one run it:

1. writes N updates over K keys to a 4-partition topic's log (raw producer, murmur2, SowKeys);
2. reads the whole log with a bare confluent-kafka consumer (the 1.00 of every ratio);
3. rebuilds the SOW on Spark ``local[2]`` (Kafka source, per-key fold, Parquet output);
4. lets one worker replay the whole log through the engine's apply path;
5. restarts that worker without its RocksDB, restoring from the changelog;
6. writes a seed from the Spark rebuild, and restarts the worker without its RocksDB from it.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson
import yaml
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from rich.console import Console
from rich.table import Table

from bench.common import (
    bench_bootstrap,
    stop_process,
    wait_queryable,
    worker_command,
    workspace,
)
from bench.sow_bench import free_port, scrape
from sowstream.client import Client
from sowstream.config import load_config
from sowstream.engine.app import Engine
from sowstream.sow.keys import generated_sow_key
from sowstream.wire.kafka import producer_config

console = Console(stderr=True)
PARTITIONS = 4
TOPIC = "orders"


def write_log(bootstrap: str, log_topic: str, updates: int, keys: int) -> float:
    """Produce the updates as a publisher would (keyed by SowKey, murmur2); returns seconds."""
    rng = random.Random(7)
    sow_keys = [generated_sow_key(TOPIC, TOPIC, ["/id"], {"id": k}).encode() for k in range(keys)]
    producer = Producer({**producer_config(bootstrap), "linger.ms": 50, "batch.size": 1_000_000})
    started = time.perf_counter()
    for i in range(updates):
        k = i if i < keys else rng.randrange(keys)  # every key exists, then random updates
        body = orjson.dumps(
            {"id": k, "customer": f"c{k % 1000}", "qty": rng.randrange(1000), "px": 100.5, "seq": i}
        )
        while True:
            try:
                producer.produce(log_topic, body, key=sow_keys[k])
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush(600)
    return time.perf_counter() - started


def raw_consume_rate(bootstrap: str, log_topic: str, expected: int) -> float:
    """A bare confluent-kafka consume of the whole log: records/s."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "enable.auto.commit": False,
            "fetch.max.bytes": 64 * 1024 * 1024,
        }
    )
    consumer.assign([TopicPartition(log_topic, p, 0) for p in range(PARTITIONS)])
    seen = 0
    started = time.perf_counter()
    while seen < expected:
        for msg in consumer.consume(10_000, 1.0):
            if not msg.error():
                seen += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return expected / elapsed


class WorkerProcess:
    """The one worker, started and stopped around the measurements."""

    def __init__(self, config: Path, bootstrap: str, work: Path, prefix: str) -> None:
        self.config = config
        self.bootstrap = bootstrap
        self.work = work
        self.prefix = prefix
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        return self.work / "data" / self.prefix / "bench"

    def start(self, *extra: str) -> None:
        log = open(self.work / "worker.log", "ab")  # noqa: SIM115 - owned by the process
        command = worker_command(
            self.config, self.bootstrap, self.work, "--metrics-port", str(self.port), *extra
        )
        self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, 120)
        self.proc = None

    def wait_ready(self, timeout: float = 1800) -> float | None:
        """Seconds from now until every partition answers a query (None: not within timeout)."""
        return wait_queryable(self.bootstrap, self.prefix, [TOPIC], timeout, self.check_alive)

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"the worker exited (see {self.work / 'worker.log'})")

    def applied(self) -> float:
        try:
            return scrape(self.port, "sowstream_updates_applied_total")
        except OSError:
            return 0.0


def seconds(value: float | None, args: argparse.Namespace) -> str:
    return f"{value:.1f} s" if value is not None else f"> {args.restart_cap:.0f} s (gave up)"


def wait_group_empty(bootstrap: str, group: str, timeout: float = 120) -> None:
    """Until the stopped worker has left the engine's consumer group (a seed needs that)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not admin.describe_consumer_groups([group])[group].result(10).members:
                return
        except KafkaException:
            return
        time.sleep(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--updates", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument(
        "--restart-cap", type=float, default=900, help="give up waiting for a restart (s)"
    )
    args = parser.parse_args()
    if args.keys > args.updates:
        parser.error("--keys must not exceed --updates")
    results: dict[str, Any] = {}
    with ExitStack() as stack:
        bootstrap = bench_bootstrap(stack)
        work, prefix = workspace(stack, "pipebench")
        config_path = work / "bench.yaml"
        config_path.write_text(
            yaml.safe_dump(
                {
                    "engine": {"app_id": prefix, "topic_prefix": prefix},
                    "sow": [{"Name": TOPIC, "Key": "/id", "Partitions": PARTITIONS}],
                }
            )
        )
        config = load_config(config_path)
        Engine(config, bootstrap=bootstrap).prepare()
        log_topic = f"{prefix}.log.{TOPIC}"

        console.print(f"[bold]writing {args.updates:,} updates over {args.keys:,} keys")
        results["write_s"] = write_log(bootstrap, log_topic, args.updates, args.keys)
        results["raw"] = raw_consume_rate(bootstrap, log_topic, args.updates)
        console.print(f"bare consume: {results['raw']:,.0f} rec/s")

        from sowstream.pipeline.rebuild import rebuild
        from sowstream.pipeline.seed import write_seed
        from sowstream.pipeline.session import spark_session

        t0 = time.perf_counter()
        spark = spark_session("local[2]", extra_conf={"spark.driver.memory": "4g"})
        stack.callback(spark.stop)
        results["spark_start_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        result = rebuild(spark, config, TOPIC, bootstrap)
        result.state.write.mode("overwrite").parquet(str(work / "rebuild"))
        results["spark_s"] = time.perf_counter() - t0
        results["spark_keys"] = spark.read.parquet(str(work / "rebuild")).count()
        results["spark"] = args.updates / results["spark_s"]
        console.print(f"spark rebuild: {results['spark']:,.0f} rec/s ({results['spark_keys']:,})")

        worker = WorkerProcess(config_path, bootstrap, work, prefix)
        stack.callback(worker.stop)
        worker.start()
        first: tuple[float, float] | None = None
        while (applied := worker.applied()) < args.updates:
            if applied > 0 and first is None:
                first = (time.perf_counter(), applied)
            time.sleep(0.1)
        assert first is not None
        results["worker"] = (applied - first[1]) / (time.perf_counter() - first[0])
        console.print(f"worker replay: {results['worker']:,.0f} rec/s")
        worker.wait_ready()
        with Client(bootstrap, prefix=prefix, timeout=120) as client:
            results["engine_keys"] = sum(
                1 for m in client.sow(TOPIC, batch_size=1000) if m.command == "sow"
            )
        worker.stop()

        shutil.rmtree(worker.data_dir)
        worker.start()
        results["restart_changelog_s"] = worker.wait_ready(args.restart_cap)
        console.print(f"restart from changelog: {seconds(results['restart_changelog_s'], args)}")
        worker.stop()
        wait_group_empty(bootstrap, prefix)

        t0 = time.perf_counter()
        write_seed(spark, config, result, TOPIC, bootstrap, work / "seed")
        results["seed_s"] = time.perf_counter() - t0
        shutil.rmtree(worker.data_dir)
        worker.start("--seed-dir", str(work / "seed"))
        results["restart_seed_s"] = worker.wait_ready(args.restart_cap)
        console.print(f"restart from seed: {seconds(results['restart_seed_s'], args)}")
        with Client(bootstrap, prefix=prefix, timeout=120) as client:
            results["seeded_keys"] = sum(
                1 for m in client.sow(TOPIC, batch_size=1000) if m.command == "sow"
            )
        worker.stop()

    raw = results["raw"]
    table = Table(
        title=f"sowstream pipeline benchmark: {args.updates:,} updates, {args.keys:,} keys, "
        f"{PARTITIONS} partitions"
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("ratio", justify="right")
    table.add_row("bare confluent-kafka consume of the log", f"{raw:,.0f} rec/s", "1.00")
    table.add_row(
        "Spark local[2] rebuild (read, fold per key, Parquet)",
        f"{results['spark']:,.0f} rec/s",
        f"{results['spark'] / raw:.2f}x raw",
    )
    table.add_row(
        "one worker replaying the log (apply path)",
        f"{results['worker']:,.0f} rec/s",
        f"{results['worker'] / raw:.2f}x raw",
    )
    table.add_row("Spark session start", f"{results['spark_start_s']:.1f} s", "")
    from_changelog = results["restart_changelog_s"] or args.restart_cap
    table.add_row(
        "worker restart without RocksDB: changelog",
        seconds(results["restart_changelog_s"], args),
        "1.00",
    )
    table.add_row(
        "worker restart without RocksDB: Spark seed",
        seconds(results["restart_seed_s"], args),
        (">" if results["restart_changelog_s"] is None else "")
        + f"{from_changelog / (results['restart_seed_s'] or args.restart_cap):.1f}x faster",
    )
    table.add_row(
        "writing the seed (SST files + changelog alignment)", f"{results['seed_s']:.1f} s", ""
    )
    table.add_row(
        "records: Spark rebuild / worker / served after the seed",
        f"{results['spark_keys']:,} / {results['engine_keys']:,} / {results['seeded_keys']:,}",
        "",
    )
    Console().print(table)


if __name__ == "__main__":
    main()
